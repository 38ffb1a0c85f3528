"""The argument types and the groups of arguments that several commands share, and what a training run's
options become (:func:`run_settings`).

Torch-free, as the whole command line is at start-up: a ``--device`` other than cpu alone imports torch, to
check it while the arguments are parsed.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path

from .. import tasks
from ..data import set_registry
from ..options import number
from ..settings import (
    FORMULAS,
    FORMULAS_VARIABLE,
    FREEZES,
    MAX_IMAGE_SIZE,
    MAX_SEED,
    MAX_WORKERS,
    NORMALIZATIONS,
    OPTIONS,
    Settings,
    cuda_devices,
    formulas_from_environment,
    settings_of,
)

Command = Callable[..., argparse.ArgumentParser]  # command(name, help=...): a subcommand that takes --plugin


COUNT = number(int, 1, what="a whole number")  # at least 1
NONNEGATIVE = number(int, 0, what="a whole number")
SEED = number(int, 0, MAX_SEED, what="a seed")  # torch seeds are 64-bit
IMAGE_SIZE = number(int, 1, MAX_IMAGE_SIZE, what="a whole number")  # --image-size 100000 is refused here


def device(text: str) -> str:
    """A torch device this machine can hold weights on: cpu, cuda, cuda:1, ... (not meta)."""
    if text == "cpu":  # the default: no need to import torch to know it
        return text
    import torch

    parsed = _device_named(text)
    if parsed.type == "cuda" and not torch.cuda.is_available():  # before any data is read or weights built
        raise argparse.ArgumentTypeError(f"{text}: no CUDA device is available to this torch; give cpu")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text}: {cuda_devices(torch.cuda.device_count())}")
    return text


def _device_named(text: str):
    import torch

    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; give cpu, cuda or cuda:N") from None
    if parsed.type == "meta":
        raise argparse.ArgumentTypeError("meta holds no weights (use inspect for shapes and counts); give cpu or cuda")
    return parsed


def run_device(text: str) -> str:
    """A training run's device: a torch device that holds weights (not meta). Whether this machine has it is
    :func:`launcher_of`'s to check: a run sent to SLURM runs on a node's devices, not the login node's."""
    if text != "cpu":
        _device_named(text)
    return text


def _memory(text: str) -> str:
    """A memory limit: 8GB, 512MiB, 2e9 or none (checked here, applied by crate_compose.building.budget)."""
    from ..memory import parse_size

    try:
        parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory-limit",
        type=_memory,
        default=None,
        metavar="SIZE",
        help="refuse to start when the estimated memory is over SIZE (8GB, 512MiB, none); "
        "default: $CRATE_COMPOSE_MEMORY_LIMIT, else 90%% of the memory available",
    )


def plugin_arguments() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE",
        help="import your own primitives first: a module name (my_lab.steps) or a .py file (repeatable)",
    )
    return parent


def plugins_given(argv: list[str]) -> list[str]:
    """The ``--plugin`` values of a command line, read before its parser is made (a plug-in may register tasks,
    and their options are flags of train and ablate)."""
    known, _ = plugin_arguments().parse_known_args(argv)
    return known.plugins


def spec_arguments(parser: argparse.ArgumentParser, *, run: bool = False) -> None:
    if run:  # probe, evaluate, linear-probe, show: SPEC, or a run folder whose spec, data and weights are taken
        parser.add_argument(
            "spec",
            nargs="?",
            help="a spec file or a zoo preset name, or a run folder (RUN: its "
            "final/ or latest checkpoint, its spec, data and image size)",
        )
    else:
        parser.add_argument("spec", help="a spec file (specs/crate.yaml) or a zoo preset name (crate-base)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a key, e.g. sizes.d=384 or encoder.layer.sparsify.args.lambd=0.5 (repeatable); "
        "list items by index (layer.1) or step name (layer.sparsify)",
    )
    if not run:
        parser.add_argument(
            "--name",
            action=_Name,
            dest="overrides",
            metavar="NAME",
            help="name the network (its output folder's name): a spec changed by --set is otherwise "
            "named after its changes (crate-tiny.compress-tssa); the same as --set name=NAME",
        )


class _Name(argparse.Action):
    """``--name NAME``: the override ``name=NAME``, after the ``--set`` given before it."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), f"name={value}"])


def recipe_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="RECIPE",
        help="a recipe: a YAML file of training settings, or a shipped "
        "one (crate-pretrain, crate-finetune, crate-mae-pretrain, crate-mae-finetune, tost); "
        "options given here win over it",
    )


def start_arguments(parser: argparse.ArgumentParser, who: str = "") -> None:
    """``--init`` and ``--freeze``: fine-tuning (train, and every variant of an ablation)."""
    parser.add_argument(
        "--init",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"fine-tune{who}: start from the weights of the build DIR (build --out, a run's final/, "
        "a checkpoint) copied by name; a head that does not fit is left new (default: fresh weights)",
    )
    parser.add_argument(
        "--freeze",
        choices=FREEZES,
        default=None,
        help="encoder: train the head alone (every parameter not under head.); default: none",
    )


def workers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=number(int, 0, MAX_WORKERS, what="a whole number"),
        default=0,
        metavar="N",
        help="DataLoader processes that decode a folder's images (default: 0, in this process; the "
        "results are the same)",
    )


def normalize_argument(parser: argparse.ArgumentParser) -> None:
    """``--normalize`` of the commands that run trained weights on a data set's images."""
    parser.add_argument(
        "--normalize",
        choices=NORMALIZATIONS,
        default=None,
        help="standardize images with the data's own statistics or ImageNet's (default: as the "
        "weights were trained: a run's own setting; imagenet for the authors' checkpoints and "
        "builds imported from them; else data)",
    )


def formulas_argument(parser: argparse.ArgumentParser) -> None:
    """``--formulas`` of the commands that run a network without training it (evaluate, probe, ...)."""
    parser.add_argument(
        "--formulas",
        choices=FORMULAS,
        default=None,
        help="fast: the steps' fast paths; written: every step's equation as written, in plain torch "
        f"ops (the same values up to rounding; default: ${FORMULAS_VARIABLE}, else fast)",
    )


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a training run (train and ablate), made from their declarations: every
    :class:`~crate_compose.settings.Settings` field's and every registered task's own
    (:attr:`crate_compose.tasks.Task.options`). Each defaults to None, meaning "not given":
    :func:`run_settings` fills it from the run being resumed, else from the declaration's default."""
    default = Settings()
    parser.add_argument(
        "--task",
        default=None,
        choices=tasks.names(),
        help="what the run learns: "
        + ", ".join(f"{one.name} ({one.summary.split(';')[0].replace('%', '%%')})" for one in tasks.all_tasks())
        + f" (default: {default.task}; crate-compose list tasks)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="the data set: "
        + ", ".join(one.pattern for one in set_registry.all_sets())
        + f" (default: {default.data}; crate-compose list data)",
    )
    for option in (*OPTIONS.values(), *tasks.task_options().values()):
        if option.flagged and option.name not in ("task", "data"):
            option.add_to(parser)
    parser.add_argument(
        "--device",
        type=run_device,
        default="cpu",
        help="cpu, cuda, ... (default: cpu; with --launcher slurm, the nodes' devices)",
    )
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress (without a terminal, progress is a plain line every tenth of the run)",
    )


SETTING_FORMULAS = (
    "train",
    "ablate",
)  # commands whose --formulas is a run setting; others hold the switch for the command


def recipe_settings(recipe, steps_given: bool, warmup_given: bool) -> dict:
    """A recipe's settings, less its ``epochs`` when steps are given and its ``warmup_epochs`` when a
    warm-up is: steps and warm-up given anywhere win over the recipe's passes."""
    return {
        k: v
        for k, v in (recipe.settings if recipe else {}).items()
        if not (k == "epochs" and steps_given) and not (k == "warmup_epochs" and warmup_given)
    }


def run_settings(args: argparse.Namespace, base: dict | None = None) -> Settings:
    """The run settings: the options given, the rest from ``base`` (a resumed run's, a recipe's, a grid
    file's: one flat mapping, the task's options beside the fields) or the defaults."""
    names = (*OPTIONS, *tasks.task_options())
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    return settings_of({**(base or {}), **given})


def from_environment() -> dict:
    """The settings a new run takes from the environment when not given: ``$CRATE_COMPOSE_FORMULAS``."""
    return {"formulas": formulas_from_environment()}


def formulas_of(args: argparse.Namespace):
    """The switch of the modules' fast paths held for the command (its ``--formulas``), unless that is a
    run setting (train, ablate: :class:`Settings`) or not given (the environment's, read on import)."""
    given = getattr(args, "formulas", None)
    if given is None or args.command in SETTING_FORMULAS:
        return contextlib.nullcontext()
    from ..modules.paths import use_formulas

    return use_formulas(given)


def rank_zero() -> bool:
    """Under torchrun or srun only rank 0 prints (:mod:`crate_compose.training.world`); one process is rank 0."""
    from ..training import world

    return world.rank() == 0


def launcher_arguments(parser: argparse.ArgumentParser, who: str = "the runs") -> None:
    """Where ``train`` and ``ablate`` start their runs (:mod:`crate_compose.launch`)."""
    group = parser.add_argument_group(
        "launcher", f"where {who} start (docs/cluster.md); the command line wins over --launcher-config"
    )
    group.add_argument(
        "--launcher",
        choices=("in-process", "local", "slurm"),
        default=None,
        help="in-process: in this process, one after another (default); local: parallel processes on "
        "this machine; slurm: a SLURM job each (submitit), requeued on a time limit or preemption",
    )
    group.add_argument(
        "--launcher-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML file of these settings (launcher: slurm, partition: gpu, ...), written once for a cluster",
    )
    group.add_argument(
        "--jobs",
        type=COUNT,
        default=None,
        metavar="N",
        help="local: runs at a time (default: one per GPU, or 1 on the CPU; the cores are split)",
    )
    group.add_argument(
        "--gpus-per-run",
        type=NONNEGATIVE,
        default=None,
        metavar="N",
        help="local, slurm: GPUs of each run, one process each (default: 1 local on CUDA; 0 on SLURM)",
    )
    group.add_argument("--nodes", type=COUNT, default=None, metavar="N", help="slurm: nodes of each run (default: 1)")
    group.add_argument(
        "--cpus-per-task",
        type=COUNT,
        default=None,
        metavar="N",
        help="slurm: CPU cores of each task (of each GPU on a GPU run; default: 1)",
    )
    group.add_argument(
        "--tasks-per-node",
        type=COUNT,
        default=None,
        metavar="N",
        help="slurm, on the CPU: processes of each run per node (DDP over gloo; default: 1; a GPU run has one per GPU)",
    )
    group.add_argument(
        "--partition", default=None, metavar="NAME", help="slurm: the partition (default: the cluster's default)"
    )
    group.add_argument(
        "--time",
        default=None,
        metavar="LIMIT",
        help="slurm: each job's time limit: minutes, H:MM:SS or D-HH:MM:SS (default: 1-00:00:00); a "
        "run stopped by it is requeued and continues",
    )
    group.add_argument("--mem", default=None, metavar="SIZE", help="slurm: memory per node, as sbatch takes it (64G)")
    group.add_argument(
        "--slurm",
        dest="slurm_extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="slurm: any other sbatch option, e.g. --slurm account=my-lab --slurm qos=high (repeatable)",
    )
    group.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="slurm: submit and return (the board: ablate --status; the table: --resume when done)",
    )


def launcher_of(args: argparse.Namespace):
    """The launcher the options and ``--launcher-config`` describe (None: in-process)."""
    from ..launch.jobs import LaunchError
    from ..launch.launcher import make_launcher, read_launcher_file
    from ..launch.local import NO_WAIT_LOCAL

    values = read_launcher_file(args.launcher_config) if args.launcher_config else {}
    extra = dict(values.get("slurm") or {})
    for item in args.slurm_extra:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LaunchError(f"--slurm {item!r}: give KEY=VALUE, e.g. account=my-lab")
        extra[key.strip().lstrip("-")] = value
    given = {
        "launcher": args.launcher,
        "jobs": args.jobs,
        "gpus_per_run": args.gpus_per_run,
        "nodes": args.nodes,
        "cpus_per_task": args.cpus_per_task,
        "tasks_per_node": args.tasks_per_node,
        "partition": args.partition,
        "time": args.time,
        "mem": args.mem,
    }
    values = {**values, **{k: v for k, v in given.items() if v is not None}, **({"slurm": extra} if extra else {})}
    if args.time is not None:
        from ..launch.slurm import minutes

        try:
            minutes(args.time)
        except ValueError as error:
            raise LaunchError(f"--time: {error}") from None
    launcher = make_launcher(values, args.device)
    if launcher is None or launcher.name != "slurm":  # this machine's device: is it here?
        try:
            device(args.device)
        except argparse.ArgumentTypeError as error:
            raise LaunchError(f"--device {error}") from None
    if not args.wait and launcher is None:
        raise LaunchError("--no-wait: the in-process launcher trains in this command; give --launcher slurm")
    if not args.wait and launcher.name == "local":
        raise LaunchError(NO_WAIT_LOCAL)
    return launcher


def checkpoint_note(launcher, settings) -> None:
    """On SLURM, what a job killed without a warning (a node that fails) would lose, said once before anything is
    submitted: everything, when the run checkpoints only at its end; more than a job's time, when its periodic
    checkpoint comes later than the time limit (the warning's checkpoint is all that would survive a requeue)."""
    if launcher is None or launcher.name != "slurm":
        return
    import sys

    minutes = settings.checkpoint_minutes
    if not settings.checkpoint_every and not minutes:
        print(
            "note: --checkpoint-every 0 --checkpoint-minutes 0: a run keeps its steps at its end and when SLURM "
            f"stops it with a warning (its time limit, {launcher.signal_delay} s ahead; a requeue; a preemption), "
            "but a job killed without one (a node that fails) starts again from step 0",
            file=sys.stderr,
        )
    elif minutes and not settings.checkpoint_every and launcher.time <= minutes:
        print(
            f"note: --time {launcher.time} min is no longer than --checkpoint-minutes {minutes}: no periodic "
            "checkpoint is written within a job, so a job killed without SLURM's warning (a node that fails) "
            "starts again from its last requeue; give --checkpoint-minutes or --checkpoint-every N",
            file=sys.stderr,
        )

"""The argument types and the groups of arguments that several commands share, and what a training run's
options become (:func:`run_settings`).

Torch-free, as the whole command line is at start-up: a ``--device`` other than cpu alone imports torch, to
check it while the arguments are parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from .. import tasks
from ..settings import (AUGMENTATIONS, COMPILE_MODES, FORMULAS, FORMULAS_VARIABLE, FREEZES, LOGGERS, MAX_IMAGE_SIZE,
    MAX_WORKERS, NORMALIZATIONS, OPTIMIZERS, PRECISIONS, SCHEDULES, Settings, formulas_from_environment)

Command = Callable[..., argparse.ArgumentParser]  # command(name, help=...): a subcommand that takes --plugin


def number(kind, low=None, high=None, *, low_open=False, high_open=False, what="a number"):
    """An argparse type: ``kind`` (int or float), finite, within bounds; a clear message otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            if high is None:
                bound = f"greater than {low}" if low_open else f"at least {low}"
            else:
                bound = f"in [{low}, {high}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"{text}: must be {bound}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


COUNT = number(int, 1, what="a whole number")  # at least 1
NONNEGATIVE = number(int, 0, what="a whole number")
SEED = number(int, 0, 2**63 - 1, what="a seed")  # torch seeds are 64-bit
RATE = number(float, 0, low_open=True, what="a number")  # > 0
PROBABILITY = number(float, 0, 1, high_open=True, what="a number")  # [0, 1)
IMAGE_SIZE = number(int, 1, MAX_IMAGE_SIZE, what="a whole number")  # --image-size 100000 is refused here


def device(text: str) -> str:
    """A torch device this machine can hold weights on: cpu, cuda, cuda:1, ... (not meta)."""
    if text == "cpu":  # the default: no need to import torch to know it
        return text
    import torch

    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; give cpu, cuda or cuda:N") from None
    if parsed.type == "meta":
        raise argparse.ArgumentTypeError("meta holds no weights (use inspect for shapes and counts); give cpu or cuda")
    if parsed.type == "cuda" and not torch.cuda.is_available():  # before any data is read or weights built
        raise argparse.ArgumentTypeError(f"{text}: no CUDA device is available to this torch; give cpu")
    return text


def _memory(text: str) -> str:
    """A memory limit: 8GB, 512MiB, 2e9 or none (checked here, applied by crate_compose.building.budget)."""
    from ..building.budget import parse_size

    try:
        parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-limit", type=_memory, default=None, metavar="SIZE",
                        help="refuse to start when the estimated memory is over SIZE (8GB, 512MiB, none); "
                        "default: $CRATE_COMPOSE_MEMORY_LIMIT, else 90%% of the memory available")


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


def spec_arguments(parser: argparse.ArgumentParser, *, run: bool = False) -> None:
    if run:  # probe, evaluate, linear-probe, show: SPEC, or a run folder whose spec, data and weights are taken
        parser.add_argument("spec", nargs="?", help="a spec file or a zoo preset name, or a run folder (RUN: its "
                            "final/ or latest checkpoint, its spec, data and image size)")
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
        parser.add_argument("--name", action=_Name, dest="overrides", metavar="NAME",
                            help="name the network (its output folder's name): a spec changed by --set is otherwise "
                            "named after its changes (crate-tiny.compress-tssa); the same as --set name=NAME")


class _Name(argparse.Action):
    """``--name NAME``: the override ``name=NAME``, after the ``--set`` given before it."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), f"name={value}"])


def recipe_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="RECIPE", help="a recipe: a YAML file of training settings, or a shipped "
                        "one (crate-pretrain, crate-finetune, crate-mae-pretrain, crate-mae-finetune, tost); "
                        "options given here win over it")


def start_arguments(parser: argparse.ArgumentParser, who: str = "") -> None:
    """``--init`` and ``--freeze``: fine-tuning (train, and every variant of an ablation)."""
    parser.add_argument("--init", type=Path, default=None, metavar="DIR",
                        help=f"fine-tune{who}: start from the weights of the build DIR (build --out, a run's final/, "
                        "a checkpoint) copied by name; a head that does not fit is left new (default: fresh weights)")
    parser.add_argument("--freeze", choices=FREEZES, default=None,
                        help="encoder: train the head alone (every parameter not under head.); default: none")


def workers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=number(int, 0, MAX_WORKERS, what="a whole number"), default=0, metavar="N",
                        help="DataLoader processes that decode a folder's images (default: 0, in this process; the "
                        "results are the same)")


def normalize_argument(parser: argparse.ArgumentParser) -> None:
    """``--normalize`` of the commands that run trained weights on a data set's images."""
    parser.add_argument("--normalize", choices=NORMALIZATIONS, default=None,
                        help="standardize images with the data's own statistics or ImageNet's (default: as the "
                        "weights were trained: a run's own setting; imagenet for the authors' checkpoints and "
                        "builds imported from them; else data)")


def formulas_argument(parser: argparse.ArgumentParser) -> None:
    """``--formulas`` of the commands that run a network without training it (evaluate, probe, ...)."""
    parser.add_argument("--formulas", choices=FORMULAS, default=None,
                        help="fast: the steps' fast paths; written: every step's equation as written, in plain torch "
                        f"ops (the same values up to rounding; default: ${FORMULAS_VARIABLE}, else fast)")


def run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a training run (train and ablate). Each defaults to None, meaning "not given":
    :func:`run_settings` fills it from the run being resumed, else from :class:`Settings`."""
    default = Settings()
    option = functools.partial(parser.add_argument, default=None)
    option("--task", choices=tasks.names(), help="what the run learns: " + ", ".join(
        f"{one.name} ({one.summary.split(';')[0].replace('%', '%%')})" for one in tasks.all_tasks()) + f" (default: {default.task}; "
        "crate-compose list tasks)")
    option("--data", help="digits, fashion-mnist, mnist (after make data), photos, pasted-digits[:N], subspaces, text "
                          "or folder:PATH "
                          "(default: digits)")
    option("--steps", type=COUNT, help=f"optimizer steps (default: {default.steps})")
    option("--batch-size", type=COUNT, help=f"global batch size (default: {default.batch_size})")
    option("--lr", type=RATE, help=f"peak learning rate (default: {default.lr:g})")
    option("--weight-decay", type=number(float, 0, what="a number"),
           help=f"AdamW weight decay (default: {default.weight_decay:g})")
    option("--warmup", type=NONNEGATIVE, help="linear warm-up steps (default: 5%% of the steps)")
    option("--seed", type=SEED, help="seed of the weights, data order and masks (default: 0)")
    option("--eval-every", type=NONNEGATIVE, help="evaluate every N steps (default: 0, at the end)")
    option("--log-every", type=COUNT, help=f"log the loss every N steps (default: {default.log_every})")
    option("--checkpoint-every", type=NONNEGATIVE, help="checkpoint every N steps (default: 0, at the end)")
    option("--image-size", type=IMAGE_SIZE, help=f"resize images to this side (at most {MAX_IMAGE_SIZE})")
    option("--augment", choices=AUGMENTATIONS, help="shift: move each training image by up to one pixel; "
           "crop-flip: a random resized crop (8-100%% of the area) and a horizontal flip (CRATE's pre-training); "
           "randaugment: crop-flip and RandAugment (2 ops, magnitude 14; CRATE's fine-tuning) (default: none)")
    # data pipeline
    option("--workers", type=number(int, 0, MAX_WORKERS, what="a whole number"), metavar="N",
           help="DataLoader processes that decode and augment the batches (default: 0, in the training process; "
           "not part of the run: a resume may change it, the batches are the same)")
    option("--mixup", type=number(float, 0, what="a number"), metavar="ALPHA",
           help="MixUp with Beta(ALPHA, ALPHA) on every batch: soft targets (classify; default: 0, off)")
    option("--cutmix", type=number(float, 0, what="a number"), metavar="ALPHA",
           help="CutMix with Beta(ALPHA, ALPHA) (classify; with --mixup, one of the two per batch; default: 0, off)")
    option("--normalize", choices=NORMALIZATIONS, help="standardize images with the data's own statistics or "
           "ImageNet's, train and test alike (default: data)")
    option("--label-smoothing", type=PROBABILITY, help="label smoothing of the cross-entropy (default: 0)")
    option("--optimizer", choices=OPTIMIZERS, help="adamw, lion (the CRATE paper's) or sgd (with --momentum) "
           f"(default: {default.optimizer})")
    option("--beta1", type=PROBABILITY, help=f"AdamW's and Lion's first beta (default: {default.beta1})")
    option("--beta2", type=PROBABILITY, help="their second beta (default: AdamW 0.999, Lion 0.99)")
    option("--momentum", type=PROBABILITY, help=f"SGD's momentum (default: {default.momentum})")
    option("--nesterov", action=argparse.BooleanOptionalAction, help="SGD with Nesterov momentum (default: no)")
    option("--schedule", choices=SCHEDULES, help="after the warm-up: cosine decay to --min-lr, step decay "
           f"(x --lr-decay every --lr-step steps) or constant (default: {default.schedule})")
    option("--min-lr", type=number(float, 0, what="a number"), help="where the cosine ends (default: 0)")
    option("--lr-step", type=COUNT, help=f"step schedule: steps between decays (default: {default.lr_step})")
    option("--lr-decay", type=number(float, 0, 1, low_open=True, what="a number"),
           help=f"step schedule: the factor of each decay (default: {default.lr_decay})")
    option("--accumulate", type=COUNT, help="split each batch into N micro-batches and sum their gradients: the "
           "same step in less memory (default: 1)")
    option("--ema", type=number(float, 0, 1, low_open=True, high_open=True, what="a number"),
           help="keep an average of the weights with this decay (e.g. 0.9999), evaluated and saved in final-ema/")
    option("--precision", choices=PRECISIONS, help="the forward's precision: bf16 or fp16 autocast (fp16 with a "
           "gradient scaler; weights stay float32) (default: fp32)")
    option("--compile", action=argparse.BooleanOptionalAction, help="torch.compile the model (default: no)")
    option("--compile-mode", choices=COMPILE_MODES, help="with --compile, torch.compile's mode: reduce-overhead "
           "replays each step's kernels as CUDA graphs, for GPU steps bound by launching their kernels (small "
           "batches; docs/gpu.md) (default: default)")
    option("--formulas", choices=FORMULAS, help="fast: the steps' fast paths (ISTA in one product, fused "
           "attention); written: every step's equation as written, in plain torch ops (the same values up to "
           f"rounding, slower; docs/precision.md) (default: ${FORMULAS_VARIABLE}, else fast; a resumed run's own)")
    option("--drop-path", type=PROBABILITY, help="stochastic depth: drop residual branches with a probability "
           "rising to this at the last (default: 0)")
    option("--epochs", type=COUNT, help="train this many passes over the training split (sets --steps)")
    option("--warmup-epochs", type=NONNEGATIVE, help="warm up over this many passes (sets --warmup)")
    option("--logger", choices=LOGGERS, help="tensorboard: the metrics also as TensorBoard event files in "
           "RUN/tensorboard/; none: metrics.jsonl and metrics.csv only (default: tensorboard when the package is "
           "installed, else none; not part of the run: a resume may change it)")
    option("--local-crops", type=NONNEGATIVE, help=f"task dino: local crops per image (default: "
           f"{default.local_crops}, DINO's)")
    option("--teacher-temp", type=number(float, 0, low_open=True, what="a number"), help="task dino: the "
           f"teacher's temperature (default: {default.teacher_temp:g}, DINO's)")
    option("--warmup-teacher-temp", type=number(float, 0, low_open=True, what="a number"), help="task dino: the "
           f"teacher's temperature at step 0, rising linearly to --teacher-temp (default: {default.warmup_teacher_temp:g})")
    option("--warmup-teacher-temp-epochs", type=NONNEGATIVE, help="task dino: over this many epochs (default: 0)")
    parser.add_argument("--device", type=device, default="cpu", help="cpu, cuda, ... (default: cpu)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress (without a terminal, progress is a plain line every tenth of the run)")


RUN_OPTIONS = ("task", "data", "steps", "batch_size", "lr", "weight_decay", "warmup", "seed", "eval_every",
               "log_every", "checkpoint_every", "image_size", "augment", "label_smoothing", "optimizer", "beta1",
               "beta2", "momentum", "nesterov", "schedule", "min_lr", "lr_step", "lr_decay", "accumulate", "ema",
               "precision", "compile", "drop_path", "epochs", "warmup_epochs")
RUN_OPTIONS += ("workers", "mixup", "cutmix", "normalize")  # data pipeline
RUN_OPTIONS += ("compile_mode",)

RUN_OPTIONS += ("logger",)  # logging: where the metrics go besides metrics.jsonl (no part of the run's identity)
RUN_OPTIONS += ("formulas",)  # fast paths or the formulas as written (modules/paths.py)
RUN_OPTIONS += ("local_crops", "teacher_temp", "warmup_teacher_temp", "warmup_teacher_temp_epochs")  # task dino
SETTING_FORMULAS = ("train", "ablate")  # commands whose --formulas is a run setting; others hold the switch for the command


def recipe_settings(recipe, steps_given: bool, warmup_given: bool) -> dict:
    """A recipe's settings, less its ``epochs`` when steps are given and its ``warmup_epochs`` when a
    warm-up is: steps and warm-up given anywhere win over the recipe's passes."""
    return {k: v for k, v in (recipe.settings if recipe else {}).items()
            if not (k == "epochs" and steps_given) and not (k == "warmup_epochs" and warmup_given)}


def run_settings(args: argparse.Namespace, base: dict | None = None) -> Settings:
    """The run settings: the options given, the rest from ``base`` (a resumed run's) or the defaults."""
    values = {**asdict(Settings()), **(base or {})}
    values.update({name: getattr(args, name) for name in RUN_OPTIONS if getattr(args, name, None) is not None})
    return Settings(**{k: v for k, v in values.items() if k in Settings.__dataclass_fields__})


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
    """Under torchrun only rank 0 prints (its RANK variable); one process is rank 0."""
    return os.environ.get("RANK", "0") in ("", "0")

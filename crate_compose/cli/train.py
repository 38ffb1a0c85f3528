"""``crate-compose train``: a run of a spec on a data set (checkpoints, metrics, --resume; torchrun works)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import crate_compose as cc

from ..errors import WorkbenchError
from ..files import RUNS
from .arguments import (
    COUNT,
    Command,
    checkpoint_note,
    from_environment,
    launcher_arguments,
    launcher_of,
    memory_argument,
    rank_zero,
    recipe_argument,
    recipe_settings,
    run_arguments,
    run_settings,
    spec_arguments,
    start_arguments,
)


def add(command: Command) -> None:
    """Add the command train."""
    train = command("train", help="train a spec on a named data set (checkpoints, metrics, --resume; torchrun works)")
    spec_arguments(train)
    run_arguments(train)
    train.add_argument("--out", type=Path, help="run folder (default: runs/<spec name>)")
    recipe_argument(train)
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint "
        "(options not given are the run's; anything that would change the run is refused)",
    )
    train.add_argument(
        "--resume-from",
        type=COUNT,
        default=None,
        metavar="STEP",
        help="continue from the checkpoint at STEP; later checkpoints are moved to superseded/",
    )
    start_arguments(train)
    memory_argument(train)
    launcher_arguments(train, "the run")


def run_train(args: argparse.Namespace) -> int:
    from ..data.set_registry import resolve as resolve_data
    from ..spec_language.loader import read as read_spec
    from ..tasks import get as get_task
    from ..training.recipes import read_recipe
    from ..training.run_folder import preflight
    from ..training.run_folder.identity import read

    launcher = launcher_of(args)  # where the run goes, and whether its device is there: before anything is read
    recipe = read_recipe(args.config) if args.config else None
    overrides = [*(recipe.overrides if recipe else []), *args.overrides]
    resume = args.resume or args.resume_from is not None
    source = read_spec(args.spec)  # the spec file, opened once: train resolves everything from this reading
    spec = cc.load_spec(source, overrides)  # a bad spec, as train would say it, before torch loads
    out = args.out or RUNS / spec.name  # as train names it (training.preparation.default_run)
    preflight.run_folder(out)  # a file, someone else's files: refused before torch loads (exit 1)
    record = read(out) if resume and out.is_dir() else None
    given = recipe_settings(recipe, args.steps is not None, args.warmup is not None)
    base = {**(record.settings() if record is not None else from_environment()), **given}  # --steps, --warmup
    # win over epochs; a resumed run's formulas are its own (absent from its record: fast)
    init, freeze = record.start() if record is not None else (None, "none")  # --init, --freeze: the run's own
    init, freeze = args.init if args.init is not None else init, args.freeze or freeze
    settings = run_settings(args, base)
    resolve_data(settings.data)  # a data set's typo, answered before torch loads (as a spec's is)
    if launcher is not None:
        return _launched(source, settings, overrides, out, resume, args, launcher, init, freeze, recipe)
    task = get_task(settings.task)  # looked up once: the checks, the run and what is printed all take this object
    if settings.data == "text":  # other data: the task and the data's mismatch is said first, after they load
        preflight.check_task_input(spec, task)  # --task lm of an image spec, before torch loads
    preflight.check_task_head(spec, task)  # a SimDINO head trained as a classifier, before torch loads
    from ..training.description import describe
    from ..training.run import train_described

    recipe_text = recipe.text if recipe else None
    described = describe(source, settings, overrides=overrides, init=init, freeze=freeze, recipe=recipe_text, task=task)
    result = train_described(
        described,
        out=out,
        resume=resume,
        resume_from=args.resume_from,
        device=args.device,
        progress=args.progress,
        memory_limit=args.memory_limit,
    )
    if not rank_zero():
        return 0
    from ..training.metrics import said

    scores = said(result.metrics, task)  # DINO: the student's and the teacher's
    if result.already_finished:
        print(
            f"{result.run} is finished: {result.steps:,} steps"
            + (f", {scores}" if scores else "")
            + f". Nothing was changed; pass --steps N (more than {result.steps:,}) to train it longer"
        )
        return 0
    count = f"{result.trainable:,} of {result.params:,}" if freeze != "none" else f"{result.params:,}"
    print(
        f"trained {count} parameters for {result.steps} steps in {result.seconds:.0f} s: "
        f"last batch's train loss {result.train_loss:.4f}" + (f", {scores}" if scores else "")
    )
    written = ("final-ema/", "recipe.yaml", "tokenizer.json", "tokenizer.record.json", "tensorboard/")
    extra = "".join(f", {name}" for name in written if (Path(result.run) / name).exists())
    print(f"wrote {result.run}/: run.json, spec.yaml, metrics.jsonl, metrics.csv, checkpoints/, final/{extra}")
    if task.metric == "test_knn_accuracy" and task.metric in result.metrics:  # self-supervised: what it rose from
        baseline = cc.evaluate(result.run, untrained=True)  # one more k-NN evaluation, of the seed's network
        chance = f", chance {baseline['chance']:.4f}" if baseline.get("chance") else ""
        print(f"beside it: the same network untrained, {task.metric} {baseline[task.metric]:.4f}{chance}")
    return 0


def _launched(
    source, settings, overrides, out: Path, resume: bool, args: argparse.Namespace, launcher, init, freeze, recipe
) -> int:
    """``train --launcher local|slurm``: the run described here, started by the launcher (the same run, in its
    own process or SLURM job), shown until it ends (``--no-wait``: submitted)."""
    from ..launch.jobs import LAUNCH_FILE, LaunchError, forget_job, write_job
    from ..launch.status import LIVE, Display, survey
    from ..training.description import describe
    from ..training.run_folder.identity import RUN_FILE

    if args.resume_from is not None:
        raise WorkbenchError("--resume-from: continue from a chosen checkpoint in this process (leave out --launcher)")
    described = describe(
        source, settings, overrides=overrides, init=init, freeze=freeze, recipe=recipe.text if recipe else None
    )
    launcher.check()
    if (out / RUN_FILE).is_file() and not resume:
        raise WorkbenchError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    if resume and not (out / RUN_FILE).is_file():
        raise WorkbenchError(f"--resume: {out} holds no run to resume (no {RUN_FILE}); leave out --resume to start one")
    from ..launch.jobs import Job

    now = survey([Job(out, described.spec.name)])[0]
    if now.state in LIVE:
        raise WorkbenchError(f"{out} is {now.state} already (job {now.job}): watch it, or stop it first")
    checkpoint_note(launcher, settings)
    job = write_job(
        out,
        described,
        label=described.spec.name,
        device=args.device,
        memory_limit=args.memory_limit,
        plugins=tuple(args.plugins),
    )
    try:
        launcher.run([job], [job], Display(described.task.metric), args.wait, folder=out / "launch" / "slurm")
    except LaunchError:  # refused (SLURM's own words): nothing submitted, nothing of it left
        if not (job.folder / LAUNCH_FILE).exists():
            forget_job(job)
        raise
    if not args.wait:
        print(f"submitted {out} (job {survey([job])[0].job}); its state: {out}/launch/state.json", file=sys.stderr)
        return 0
    seen = survey([job])[0]
    print(seen.line(described.task.metric))
    return 0 if seen.state == "finished" else 4

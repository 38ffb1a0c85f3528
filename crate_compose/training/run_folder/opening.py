"""A run folder opened before the first step: rank 0's checks and the model they need.

A new run needs a folder that is empty or missing; a resumed one continues the run recorded there
(:mod:`.identity`) only when nothing that defines it differs, from a checkpoint that
:func:`.checkpoint.verify` passes; a finished run resumed with the same steps is returned as it is.
What comes after the checkpoint a run resumes from is moved aside, never deleted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ... import tasks
from ...building.artifacts import replaceable
from ...building.builder import compile_spec, spec_of
from ...data.sets import Data
from ...data.sets import verify as verify_data
from ...errors import TrainError
from ...files import writable, write_atomic, write_together
from ...memory import human
from ...modules.residual import stochastic_depth
from ...settings import Settings, flat
from ...spec_language import loader
from .. import finetune
from ..distributed import Distributed
from ..metrics import Result, read_metrics, rows_of
from ..optimizers import EMA, optimizer_for, state_keys
from ..preparation import fingerprint
from . import checkpoint, eventlog, identity, locks, preflight


@dataclass
class Plan:
    """What rank 0 decided after checking the run folder, shared with every process."""

    settings: Settings
    start: int = 0
    checkpoint: str | None = None
    metrics_rows: int = 0
    record: identity.Record | None = None
    finished: Result | None = None


class Opening:
    """Rank 0's checks of a run folder before the first step (:meth:`open`), and the model they need."""

    def __init__(
        self,
        run: Path,
        spec,
        data: Data,
        settings: Settings,
        task: tasks.Task,
        resume: bool,
        resume_from: int | None,
        dist: "Distributed",
        device: torch.device,
        init: finetune.Init | None = None,
        freeze: str = "none",
        recipe: str | None = None,
    ) -> None:
        self.run, self.spec, self.data, self.task, self.dist, self.device = run, spec, data, task, dist, device
        self.resume, self.resume_from = resume, resume_from
        self.spec_text = loader.dump(spec)
        self.settings = settings
        self.model = compile_spec(spec, seed=settings.seed, device=device, memory_limit="none")  # checked in train()
        self.start = finetune.start_identity(init, freeze)
        self.notes = finetune.apply_init(self.model, init) if init is not None else []  # a run from step 0 says them
        if init is not None:
            init.tensors = {}  # copied: its memory is given back before training
        self.trainable = finetune.freeze(self.model, freeze)
        self.freeze = freeze
        self.recipe = recipe  # train --config: its text, saved in the run folder
        if settings.drop_path:
            stochastic_depth(self.model, settings.drop_path)
        self.optimizer = optimizer_for(self.model, settings)
        self.ema = EMA(self.model, settings.ema) if settings.ema else None  # from the initial (or init's) weights
        # what the task keeps from step to step (DINO: the center), checked in a checkpoint like the weights
        self.session = task.session(self.model, settings, data)

    def identity(self, settings: Settings) -> dict[str, Any]:
        from ...version import __version__

        return identity.identity(
            self.spec_text, self.spec.name, settings, fingerprint(self.data), __version__, self.start
        )

    def open(self, stack: contextlib.ExitStack) -> Plan:
        run = self.run
        preflight.run_folder(run)  # a file, someone else's files: OutputError (exit 1), as the CLI checks first
        if self.resume and not (run / identity.RUN_FILE).exists():  # refused before anything is written there
            found = ", ".join(p.name for p in checkpoint.checkpoints(run).values())
            extra = f" beside its checkpoints ({found}), so they cannot be checked" if found else ""
            raise TrainError(
                f"--resume: {run} holds no run to resume (no {identity.RUN_FILE}{extra}); "
                "leave out --resume to start one in an empty folder"
            )
        created = not run.exists()
        stack.enter_context(locks.hold(run, "train into"))
        try:
            plan = self._plan(identity.read(run))
            if plan.finished is None:
                self._prepare_folder(plan)
        except BaseException:
            if created:
                shutil.rmtree(run, ignore_errors=True)  # only the lock was written there
            raise
        return plan

    def _plan(self, record: identity.Record | None) -> Plan:
        run, settings = self.run, self.settings
        if record is None:
            if self.resume:
                raise TrainError(
                    f"--resume: {run} holds no run to resume (no {identity.RUN_FILE}); leave out --resume to start one"
                )
            if any((run / name).is_file() for name in ("spec.yaml", "metrics.jsonl")) or any(
                (run / name).is_dir() for name in ("checkpoints", "final")
            ):
                raise TrainError(
                    f"{run} holds a run without a {identity.RUN_FILE} (written by an earlier crate-compose): "
                    "it cannot be checked, so it is neither resumed nor replaced; choose another --out"
                )
            settings = replace(settings, warmup=identity.warmup_of(settings))
            return Plan(settings, record=identity.new_record(self.identity(settings), settings))
        if not self.resume:
            raise TrainError(
                f"{run} already holds a run ({record.steps:,} steps, {reached(run)}): pass --resume "
                "to continue it, or choose another --out"
            )
        if settings.warmup is None:  # the warm-up the run started with, whatever its steps are now
            settings = replace(settings, warmup=record.identity["settings"].get("warmup"))
        changes = identity.differences(record.identity, self.identity(settings))
        if changes:
            recorded = (run / "spec.yaml").read_text() if (run / "spec.yaml").is_file() else ""
            raise identity.RunMismatch(
                identity.mismatch_message(run, changes, identity.spec_difference(recorded, self.spec_text))
            )
        if settings.steps < record.steps:
            raise identity.RunMismatch(
                f"--resume: steps: {record.steps:,} in the run, {settings.steps:,} now; a run's "
                "steps can grow, never shrink (a shorter run is another run: choose another --out)"
            )
        finished = finished_result(run, record.steps)
        if finished is not None and settings.steps == record.steps and self.resume_from is None:
            finished.already_finished = True
            return Plan(settings, finished=finished)
        record.steps = settings.steps
        record.cadence = {k: getattr(settings, k) for k in identity.CADENCE}
        return self._from_checkpoint(Plan(settings, record=record))

    def _from_checkpoint(self, plan: Plan) -> Plan:
        found = checkpoint.checkpoints(self.run)
        if self.resume_from is not None and self.resume_from not in found:
            listed = ", ".join(map(str, found)) or "none"
            raise TrainError(
                f"--resume-from {self.resume_from}: {self.run} has no checkpoint at that step (checkpoints: {listed})"
            )
        step = self.resume_from if self.resume_from is not None else max(found, default=None)
        if step is None:  # killed before its first checkpoint: the same run from step 0, and said so
            self.notes.append(f"--resume: {self.run} kept no checkpoint, so the run starts again from step 0")
            return plan
        rows = rows_of(read_metrics(self.run))
        trajectory = {
            k: v
            for k, v in flat(plan.settings).items()
            if k not in (*identity.CADENCE, *identity.MACHINERY, *identity.OUTPUTS, "steps")
        }
        try:
            state = checkpoint.verify(
                found[step],
                self.model,
                self.optimizer,
                ema=self.ema,
                task_state=self.session.state,
                run_hash=plan.record.hash,
                spec_text=loader.dump(spec_of(self.model)),  # as built: a derived
                settings=trajectory,
                steps=plan.settings.steps,  # decoder written out
                metrics_rows=rows,
            )
        except checkpoint.CheckpointError as error:
            earlier = [s for s in found if s < step]
            hint = (
                f"; resume from an earlier one with --resume-from STEP ({', '.join(map(str, earlier))})"
                if earlier
                else "; there is no earlier checkpoint: start a new run with another --out"
            )
            raise checkpoint.CheckpointError(f"{error}. Nothing was changed{hint}") from None
        plan.start, plan.checkpoint, plan.metrics_rows = step, str(found[step]), state["metrics_rows"]
        return plan

    def _prepare_folder(self, plan: Plan) -> None:
        """Every check that could fail later, then the record: nothing is learned late."""
        run = self.run
        preflight.kept_folders(run)  # again under the lock
        for name in ("spec.yaml", "metrics.jsonl", "metrics.csv", "result.json", identity.RUN_FILE):
            writable(run / name)
        if (run / "final").is_dir():
            replaceable(run / "final")
        verify_data(self.data)  # every image's header, every test image decoded
        self._check_disk(plan)
        if self.resume_from is not None:
            supersede(run, plan.start)
        checkpoint.prune_partial(run) if (run / "checkpoints").is_dir() else None
        identity.note_start(plan.record, plan.start, self.dist.world, str(self.device))
        write_atomic(run / "spec.yaml", self.spec_text)
        if self.recipe is not None:  # the recipe as written (what it set is in the identity, with every setting)
            write_atomic(run / "recipe.yaml", self.recipe)
        if getattr(self.data, "tokenizer", None) is not None:  # the vocabulary the ids mean (hashed in the data's
            write_together(self.data.tokenizer.save(run / identity.TOKENIZER_FILE))  # fingerprint): fill reads it
        identity.write(run, plan.record)

    def _check_disk(self, plan: Plan) -> None:
        """Free space for every checkpoint still to come and the final build, at their known size."""
        settings = plan.settings
        weights = sum(p.numel() * p.element_size() for p in self.model.state_dict().values())
        states = len([k for k in state_keys(self.optimizer) if k != "step"]) + (1 if self.ema else 0)
        each = weights * (1 + states) + 20_000  # weights, the optimizer's moments, the EMA, the small files
        every = settings.checkpoint_every
        count = 1 + (len(range(plan.start + 1, settings.steps)) // every if every else 0)
        needed = count * each + weights
        free = shutil.disk_usage(self.run).free
        if needed > free:
            raise OSError(
                errno.ENOSPC,
                "No space left on device: "
                + f"{self.run}: {count} checkpoint{'s' * (count != 1)} of {human(each)} and the final "
                f"build need about {human(needed)}; the disk has {human(free)} free (free space, "
                "checkpoint less often with --checkpoint-every, or choose another --out)",
                str(self.run),
            )


def reached(run: Path) -> str:
    found = checkpoint.checkpoints(run)
    return f"checkpoint at step {max(found):,}" if found else "no checkpoint yet"


def finished_result(run: Path, steps: int) -> Result | None:
    """The result of a finished run (result.json, final/ and its last checkpoint), else None."""
    path = run / "result.json"
    if not (path.is_file() and (run / "final").is_dir() and steps in checkpoint.checkpoints(run)):
        return None
    try:
        content = json.loads(path.read_text())
        return Result(**{**{k: v for k, v in content.items() if k in Result.__dataclass_fields__}, "run": str(run)})
    except (OSError, ValueError, TypeError):
        return None  # a damaged result: the run is finished again from its last checkpoint


def supersede(run: Path, step: int) -> None:
    """Move what came after checkpoint ``step`` aside into ``RUN/superseded/<time>/`` (never deleted)."""
    later = [path for s, path in checkpoint.checkpoints(run).items() if s > step]
    ends = [run / name for name in ("final", "result.json") if (run / name).exists()]
    if not later and not ends:
        return
    aside = run / "superseded" / time.strftime("%Y%m%d-%H%M%S")
    (aside / "checkpoints").mkdir(parents=True, exist_ok=True)
    for path in later:
        path.rename(aside / "checkpoints" / path.name)
    for path in ends:
        path.rename(aside / path.name)
    if (run / "metrics.jsonl").is_file():
        shutil.copy2(run / "metrics.jsonl", aside / "metrics.jsonl")
    if (run / eventlog.FOLDER).is_dir():  # logging: the resumed run keeps only the points up to its checkpoint
        shutil.copytree(run / eventlog.FOLDER, aside / eventlog.FOLDER)

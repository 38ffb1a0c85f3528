"""Training a built network on a named data set: one loop for a laptop and for torchrun.

``train(spec, task="classify", data="digits")`` builds the spec (its input size set from the
data), then runs AdamW with a linear warm-up and a cosine decay. Everything that varies from step
to step is a function of the run's seed and the step number: the order of the examples (a
permutation per epoch) and every random draw inside the model (the mask of a masked autoencoder
draws from a generator seeded per step). So a run resumed from a checkpoint computes exactly what
the uninterrupted run computes, and a run under ``torchrun`` sees the same global batches as a
single process.

A run folder holds::

    spec.yaml                 the resolved spec that was trained
    metrics.jsonl, .csv       one row per logged step (train loss, learning rate) and per evaluation
    tensorboard/              the same rows and the throughput as TensorBoard scalars (--logger; workbench.eventlog)
    checkpoints/step-NNNNNN/  weights, optimizer, RNG (see crate_compose.workbench.checkpoint), every N steps
    final/                    the trained build (crate_compose.load_build, crate-compose probe --weights)
    result.json               the last train loss, the evaluation, parameters and wall time

``train(..., init="runs/pretrained/final", freeze="encoder")`` fine-tunes: the spec is built as
usual, then the build's tensors are copied in by name, the head's left new where they do not fit
(:mod:`crate_compose.workbench.finetune`); the build and the freeze are part of the run's identity.

Under ``torchrun --nproc_per_node=N`` each process takes 1/N of every global batch, and
DistributedDataParallel (gloo on the CPU, NCCL on CUDA) averages the gradients, so the update
equals the single-process update on the whole batch. Only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..building import budget
from ..building.artifacts import replaceable
from ..building.artifacts import save as save_build
from ..building.budget import human
from ..building.builder import compile_spec, spec_of
from ..building.placement import step_seed
from ..errors import TrainError
from ..files import naming, writable, write_atomic
from ..language import loader
from ..modules.paths import use_formulas
from ..modules.residual import stochastic_depth
from ..settings import AUGMENTATIONS, TASKS, Settings, settings_problems
from . import checkpoint, eventlog, finetune, locks, preflight, runs
from .data import Data, load_data
from .data import verify as verify_data
from .distributed import Distributed
from .evaluation import evaluate, loss_of
from .loading import batch_indices, batches, held_batches, shift  # noqa: F401 (batch_indices, shift: their old place)
from .loading import check as check_loading
from .losses import patch_size_of
from .optimizers import EMA, autocast, float32_copies, lr_at, optimizer_for, scaler_for, state_keys
from .progress import bar as progress_bar

EMA_FOLDER = "final-ema"  # the run's averaged weights (--ema), a build folder beside final/
COLLAPSED = 50  # training steps in a row whose every example got the same output: the run is stopped


@dataclass
class Result:
    """What a run reports: the run folder, the last losses and the evaluation."""

    run: str
    steps: int
    train_loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    params: int = 0
    seconds: float = 0.0
    trainable: int = 0  # the parameters that trained (fewer than params under --freeze encoder)
    already_finished: bool = False  # resumed with the steps it had finished: nothing was trained or written

    def to_dict(self) -> dict[str, Any]:
        """What result.json holds."""
        return {k: v for k, v in asdict(self).items() if k != "already_finished"}


def _check(task: str, spec, data: Data, settings: Settings) -> None:
    if task not in TASKS:
        raise TrainError(f"unknown task '{task}'; expected one of: {', '.join(TASKS)}")
    if settings.augment not in AUGMENTATIONS:
        raise TrainError(f"unknown augmentation '{settings.augment}'; expected one of: {', '.join(AUGMENTATIONS)}")
    if settings.augment == "shift" and len(data.input_shape) != 3:
        raise TrainError(f"augment 'shift' moves images; data set '{data.name}' is not images")
    check_loading(settings, data, task)  # crop-flip, randaugment, --normalize imagenet, --mixup, --cutmix
    if data.task_hint == "tokens":  # no task has a loss for token sets: say so once, not a hint per task
        raise TrainError(f"data set '{data.name}' holds token sets labeled per token, which no task trains on "
                         f"(classify: labeled images; mae: images, with a mask step; lm: text); measure spec "
                         f"'{spec.name}' on it with crate-compose probe")
    if (task == "lm") != (data.task_hint == "lm"):
        raise TrainError(f"task '{task}' does not fit data set '{data.name}'; --task lm goes with --data text")
    if task == "lm":
        _check_language_model(spec)
    if task == "classify" and not data.classes:
        raise TrainError(f"data set '{data.name}' has no labels to classify; use --task mae")
    if settings.batch_size > len(data.train):
        raise TrainError(f"--batch-size {settings.batch_size:,} is larger than the training set of '{data.name}' "
                         f"({len(data.train):,} examples)")
    if task == "mae" and not any(step.primitive == "mask" for step in spec.preprocess):
        raise TrainError(f"spec '{spec.name}' has no mask step, so it cannot be trained as a masked autoencoder")


def _check_language_model(spec) -> None:
    if spec.input.dtype != "int64" or len(spec.input.shape) != 1:
        raise TrainError(f"spec '{spec.name}' does not take token ids (input: shape [N], dtype int64), so it is no "
                         "language model")
    vocabs = [step.args.get("vocab") for _, _, _, step in spec.stages() if "vocab" in step.args]
    if any(isinstance(v, int) and v < 256 for v in vocabs):
        raise TrainError(f"spec '{spec.name}' has a vocabulary of {min(vocabs)}; byte-level text needs 256 "
                         "(declare sizes.vocab and it is set from the data)")


class _Metrics:
    """Rows appended to metrics.jsonl and metrics.csv; a resumed run first keeps only the rows its
    checkpoint was written after (``keep``, counted in the checkpoint's state)."""

    TESTS = ("test_accuracy", "test_loss", "test_masked_mse", "test_mean_patch_mse", "test_bits_per_byte",
             "test_unigram_loss")
    FIELDS = ("step", "kind", "loss", "lr", "seconds", *TESTS, *(f"ema_{name}" for name in TESTS))  # --ema: both

    def __init__(self, run: Path, keep: int, enabled: bool, board: eventlog.Board | None = None) -> None:
        self.enabled = enabled
        self.board = board  # logging: RUN/tensorboard's scalars of each row (None: --logger none)
        self.jsonl, self.csv = run / "metrics.jsonl", run / "metrics.csv"
        self.count = keep
        if not enabled:
            return
        rows = _rows(self.jsonl.read_text())[:keep] if keep and self.jsonl.exists() else []
        write_atomic(self.jsonl, "".join(json.dumps(row) + "\n" for row in rows))
        table = io.StringIO()
        writer = csv.DictWriter(table, self.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.csv, table.getvalue())

    def add(self, row: dict[str, Any]) -> None:
        self.count += 1
        if not self.enabled:
            return
        with naming(self.jsonl), open(self.jsonl, "a") as handle:
            handle.write(json.dumps(_finite(row), allow_nan=False) + "\n")
        with naming(self.csv), open(self.csv, "a", newline="") as handle:
            csv.DictWriter(handle, self.FIELDS).writerow(row)
        if self.board is not None:
            self.board.add(row)


def _rows(text: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl; a last line cut short by a killed run (rows are appended) is dropped."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def fingerprint(data: Data) -> str:
    """SHA-256 of what a data set holds: its tensors (built-in sets), or the relative path and size of
    every file (folders), so a run resumed on other data is refused."""
    digest = hashlib.sha256(data.name.encode())
    for split in (data.train, data.test):
        files = getattr(split, "files", None)
        tensors = getattr(split, "tensors", None) or [getattr(split, name) for name in ("inputs", "targets", "tokens")
                                                       if isinstance(getattr(split, name, None), torch.Tensor)]
        if files is not None:
            for path, label in zip(files, split.labels):
                digest.update(f"{path}\0{_size(path)}\0{label}\n".encode())
            digest.update(repr(getattr(split, "size", "")).encode())
        for tensor in tensors:
            digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
            digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        digest.update(str(len(split)).encode())
    return digest.hexdigest()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


HEADLESS = ("classes",)  # the sizes only a head uses: kept the weights' where the head is not used (prepare's keep)


def prepare(spec_ref, data_name: str, overrides: Iterable[str] = (), image_size: int | None = None, seed: int = 0,
            memory_limit: str | float | None = None, *, keep: Iterable[str] = ()):
    """Load the spec and the data, the spec's input size set from the data (text: windows of the
    spec's context); images over ``memory_limit`` are refused from their headers. Sizes named in
    ``keep`` stay the spec's (``classes`` for a linear probe: the head is not used, the weights' fits)."""
    spec = loader.load(spec_ref, overrides)
    data = load_data(data_name, image_size=image_size, seed=seed, spec=spec, memory_limit=memory_limit)
    fit = [o for o in data.spec_overrides(spec) if not o.startswith(tuple(f"sizes.{k}=" for k in keep))]
    return (loader.load(spec_ref, [*fit, *overrides]) if fit else spec), data


def default_run(spec_ref, overrides: Iterable[str] = ()) -> Path:
    """``runs/<spec name>``: the spec named as written with its overrides (before it is fitted to the data)."""
    return Path("runs") / loader.load(spec_ref, list(overrides)).name


def check_run_memory(spec, settings: Settings, per_process: int, device: torch.device | str, memory_limit) -> None:
    """Refuse a run whose memory estimate is over the limit (:func:`crate_compose.building.budget.check_training`):
    the float32 copies its optimizer and EMA keep, the batch each process takes, and on the CPU the input
    batches its workers prepare ahead."""
    budget.check_training(spec, per_process, str(device), memory_limit, copies=float32_copies(settings),
                          batches=held_batches(settings, device))


def train(
    spec_ref,
    settings: Settings,
    *,
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    resume: bool = False,
    resume_from: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    memory_limit: str | float | None = None,
    init: str | Path | None = None,
    freeze: str = "none",
    notes: Callable[[str], None] | None = None,
    recipe: str | None = None,
) -> Result:
    """Train ``spec_ref`` (a path, preset or Spec) as ``settings`` says; see the module docstring.

    Before anything is allocated, the weights, AdamW's state and one batch's activations are
    estimated from the spec's shapes; a run over ``memory_limit`` (see :mod:`crate_compose.building.budget`)
    raises :class:`~crate_compose.building.budget.ResourceError` with the estimate and the limit. Before the
    first step, the run folder is locked and checked (:mod:`crate_compose.workbench.runs`): a new run needs a
    folder that is empty or missing; ``resume`` (or ``resume_from``, a checkpoint's step) continues
    the run recorded there only when nothing that defines it differs, from a checkpoint that
    :func:`crate_compose.workbench.checkpoint.verify` passes. A finished run resumed with the same steps is
    returned as it is (``Result.already_finished``), nothing written.

    ``init`` (a build folder: ``build --out``, a run's ``final/``, a checkpoint) fine-tunes: its tensors
    are copied into the new model by name, a head that does not fit is left newly initialized, and
    anything else that does not fit is refused before anything is written
    (:mod:`crate_compose.workbench.finetune`). ``freeze="encoder"`` trains the head alone. Both are part of
    the run's identity, so ``resume`` needs the same ones. ``notes`` receives each note (the head left
    new, the tensors of ``init`` not used, the parameters that train); default: printed on stderr.
    ``recipe``: the text of the recipe the settings came from (``train --config``), saved as ``recipe.yaml``.
    """
    overrides = list(overrides)
    _check_settings(settings)
    if settings.logger == "tensorboard":  # logging: a missing package is said before anything is written
        eventlog.choose(settings.logger, error=TrainError)
    finetune.check_freeze(freeze)
    spec, data = prepare(spec_ref, settings.data, overrides, settings.image_size, settings.seed, memory_limit)
    _check(settings.task, spec, data, settings)
    per_epoch = max(1, len(data.train) // settings.batch_size)  # passes over the training split, in whole batches
    if settings.epochs is not None:
        settings = replace(settings, steps=settings.epochs * per_epoch)
    if settings.warmup_epochs is not None:
        settings = replace(settings, warmup=_warmup_of_epochs(settings, per_epoch, notes or _say))
    start = finetune.read_init(init) if init is not None else None
    dist = Distributed()
    dist.check_batch(settings.batch_size)
    run = Path(out) if out is not None else default_run(spec_ref, overrides)
    device = torch.device(device if not (dist.active and device == "cuda") else f"cuda:{dist.rank}")
    check_run_memory(spec, settings, max(1, settings.batch_size // dist.world), device, memory_limit)
    dist.start(device)
    try:
        with contextlib.ExitStack() as stack:
            opening = _Opening(run, spec, data, settings, resume or resume_from is not None, resume_from, dist, device,
                               start, freeze, recipe)
            plan = dist.agree(lambda: opening.open(stack))
            if plan.finished is not None:
                return plan.finished
            return _loop(opening, plan, stack, progress, notes or _say)
    finally:
        dist.stop()


def _check_settings(settings: Settings) -> None:
    problems = settings_problems(settings)
    if problems:
        raise TrainError("; ".join(f"{name}: {message}" for name, message in problems))


@dataclass
class _Plan:
    """What rank 0 decided after checking the run folder, shared with every process."""

    settings: Settings
    start: int = 0
    checkpoint: str | None = None
    metrics_rows: int = 0
    record: runs.Record | None = None
    finished: Result | None = None


class _Opening:
    """Rank 0's checks of a run folder before the first step (:meth:`open`), and the model they need."""

    def __init__(self, run: Path, spec, data: Data, settings: Settings, resume: bool, resume_from: int | None,
                 dist: "Distributed", device: torch.device, init: finetune.Init | None = None,
                 freeze: str = "none", recipe: str | None = None) -> None:
        self.run, self.spec, self.data, self.dist, self.device = run, spec, data, dist, device
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

    def identity(self, settings: Settings) -> dict[str, Any]:
        from .. import __version__

        return runs.identity(self.spec_text, self.spec.name, settings, fingerprint(self.data), __version__,
                             self.start)

    def open(self, stack: contextlib.ExitStack) -> _Plan:
        run = self.run
        preflight.run_folder(run)  # a file, someone else's files: OutputError (exit 1), as the CLI checks first
        if self.resume and not (run / runs.RUN_FILE).exists():  # refused before anything is written there
            found = ", ".join(p.name for p in checkpoint.checkpoints(run).values())
            extra = f" beside its checkpoints ({found}), so they cannot be checked" if found else ""
            raise TrainError(f"--resume: {run} holds no run to resume (no {runs.RUN_FILE}{extra}); "
                             "leave out --resume to start one in an empty folder")
        created = not run.exists()
        stack.enter_context(locks.hold(run, "train into"))
        try:
            plan = self._plan(runs.read(run))
            if plan.finished is None:
                self._prepare_folder(plan)
        except BaseException:
            if created:
                shutil.rmtree(run, ignore_errors=True)  # only the lock was written there
            raise
        return plan

    def _plan(self, record: runs.Record | None) -> _Plan:
        run, settings = self.run, self.settings
        if record is None:
            if self.resume:
                raise TrainError(f"--resume: {run} holds no run to resume (no {runs.RUN_FILE}); "
                                 "leave out --resume to start one")
            if any((run / name).is_file() for name in ("spec.yaml", "metrics.jsonl")) or \
                    any((run / name).is_dir() for name in ("checkpoints", "final")):
                raise TrainError(f"{run} holds a run without a {runs.RUN_FILE} (written by an earlier crate-compose): "
                                 "it cannot be checked, so it is neither resumed nor replaced; choose another --out")
            settings = replace(settings, warmup=runs.warmup_of(settings))
            return _Plan(settings, record=runs.new_record(self.identity(settings), settings))
        if not self.resume:
            raise TrainError(f"{run} already holds a run ({record.steps:,} steps, {_reached(run)}): pass --resume "
                             "to continue it, or choose another --out")
        if settings.warmup is None:  # the warm-up the run started with, whatever its steps are now
            settings = replace(settings, warmup=record.identity["settings"].get("warmup"))
        changes = runs.differences(record.identity, self.identity(settings))
        if changes:
            recorded = (run / "spec.yaml").read_text() if (run / "spec.yaml").is_file() else ""
            raise runs.RunMismatch(runs.mismatch_message(run, changes, runs.spec_difference(recorded, self.spec_text)))
        if settings.steps < record.steps:
            raise runs.RunMismatch(f"--resume: steps: {record.steps:,} in the run, {settings.steps:,} now; a run's "
                                   "steps can grow, never shrink (a shorter run is another run: choose another --out)")
        finished = _finished_result(run, record.steps)
        if finished is not None and settings.steps == record.steps and self.resume_from is None:
            finished.already_finished = True
            return _Plan(settings, finished=finished)
        record.steps = settings.steps
        record.cadence = {k: getattr(settings, k) for k in runs.CADENCE}
        return self._from_checkpoint(_Plan(settings, record=record))

    def _from_checkpoint(self, plan: _Plan) -> _Plan:
        found = checkpoint.checkpoints(self.run)
        if self.resume_from is not None and self.resume_from not in found:
            listed = ", ".join(map(str, found)) or "none"
            raise TrainError(f"--resume-from {self.resume_from}: {self.run} has no checkpoint at that step "
                             f"(checkpoints: {listed})")
        step = self.resume_from if self.resume_from is not None else max(found, default=None)
        if step is None:
            return plan  # killed before its first checkpoint: the same run from step 0
        rows = _rows(_read_metrics(self.run))
        trajectory = {k: v for k, v in asdict(plan.settings).items()
                      if k not in (*runs.CADENCE, *runs.MACHINERY, *runs.OUTPUTS, "steps")}
        try:
            state = checkpoint.verify(found[step], self.model, self.optimizer, ema=self.ema, run_hash=plan.record.hash,
                                      spec_text=loader.dump(spec_of(self.model)),  # as built: a derived
                                      settings=trajectory, steps=plan.settings.steps,  # decoder written out
                                      metrics_rows=rows)
        except checkpoint.CheckpointError as error:
            earlier = [s for s in found if s < step]
            hint = (f"; resume from an earlier one with --resume-from STEP ({', '.join(map(str, earlier))})"
                    if earlier else "; there is no earlier checkpoint: start a new run with another --out")
            raise checkpoint.CheckpointError(f"{error}. Nothing was changed{hint}") from None
        plan.start, plan.checkpoint, plan.metrics_rows = step, str(found[step]), state["metrics_rows"]
        return plan

    def _prepare_folder(self, plan: _Plan) -> None:
        """Every check that could fail later, then the record: nothing is learned late."""
        run = self.run
        preflight.kept_folders(run)  # again under the lock
        for name in ("spec.yaml", "metrics.jsonl", "metrics.csv", "result.json", runs.RUN_FILE):
            writable(run / name)
        if (run / "final").is_dir():
            replaceable(run / "final")
        verify_data(self.data)  # every image's header, every test image decoded
        self._check_disk(plan)
        if self.resume_from is not None:
            _supersede(run, plan.start)
        checkpoint.prune_partial(run) if (run / "checkpoints").is_dir() else None
        runs.note_start(plan.record, plan.start, self.dist.world, str(self.device))
        write_atomic(run / "spec.yaml", self.spec_text)
        if self.recipe is not None:  # the recipe as written (what it set is in the identity, with every setting)
            write_atomic(run / "recipe.yaml", self.recipe)
        runs.write(run, plan.record)

    def _check_disk(self, plan: _Plan) -> None:
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
            raise OSError(errno.ENOSPC, "No space left on device: " + f"{self.run}: {count} checkpoint{'s' * (count != 1)} of {human(each)} and the final "
                             f"build need about {human(needed)}; the disk has {human(free)} free (free space, "
                             "checkpoint less often with --checkpoint-every, or choose another --out)", str(self.run))


def _reached(run: Path) -> str:
    found = checkpoint.checkpoints(run)
    return f"checkpoint at step {max(found):,}" if found else "no checkpoint yet"


def _read_metrics(run: Path) -> str:
    path = run / "metrics.jsonl"
    return path.read_text(errors="replace") if path.is_file() else ""


def _finished_result(run: Path, steps: int) -> Result | None:
    """The result of a finished run (result.json, final/ and its last checkpoint), else None."""
    path = run / "result.json"
    if not (path.is_file() and (run / "final").is_dir() and steps in checkpoint.checkpoints(run)):
        return None
    try:
        content = json.loads(path.read_text())
        return Result(**{**{k: v for k, v in content.items() if k in Result.__dataclass_fields__}, "run": str(run)})
    except (OSError, ValueError, TypeError):
        return None  # a damaged result: the run is finished again from its last checkpoint


def _supersede(run: Path, step: int) -> None:
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


def _say(note: str) -> None:
    print(f"note: {note}", file=sys.stderr)


def _warmup_of_epochs(settings: Settings, per_epoch: int, notes: Callable[[str], None]) -> int:
    """The warm-up ``warmup_epochs`` give; when the run's length is given in steps (a recipe's run shortened
    with ``--steps``) and that warm-up would be more than half of it, the default 5% instead, and a note
    says so. A run given in epochs warms up as many epochs as it says."""
    warmup = settings.warmup_epochs * per_epoch
    if settings.epochs is not None or warmup <= settings.steps // 2:
        return warmup
    shorter = max(1, settings.steps // 20)
    notes(f"warmup_epochs {settings.warmup_epochs} would be {warmup:,} of this run's {settings.steps:,} steps: "
          f"warming up for {shorter:,} (5%) instead; --warmup N to choose")
    return shorter


def _loop(opening: _Opening, plan: _Plan, stack: contextlib.ExitStack, progress: bool,
          notes: Callable[[str], None]) -> Result:
    run, data, dist, device = opening.run, opening.data, opening.dist, opening.device
    settings, model, optimizer = plan.settings, opening.model, opening.optimizer
    writer = dist.rank == 0
    params = sum(p.numel() for p in model.parameters())
    if writer:
        for note in opening.notes if plan.start == 0 else []:  # a resumed run's weights are its checkpoint's
            notes(note)
        if opening.freeze != "none":
            notes(f"--freeze {opening.freeze}: {opening.trainable:,} of {params:,} parameters train (the head's)")
    patch = patch_size_of(model) if settings.task == "mae" else None
    ema, scaler = opening.ema, scaler_for(settings, device)
    if plan.checkpoint is not None:
        checkpoint.load_checkpoint(Path(plan.checkpoint), model, optimizer, ema=ema, scaler=scaler)
    board = eventlog.open_board(run, settings.logger, plan.start, settings.batch_size, notes) if writer else None
    metrics = _Metrics(run, plan.metrics_rows, writer, stack.enter_context(board) if board else None)  # logging
    stack.enter_context(use_formulas(settings.formulas))  # the run's formulas: fast paths or as written
    net = torch.nn.parallel.DistributedDataParallel(model) if dist.active else model
    if settings.compile:
        net = torch.compile(net)
    model.train()
    before = _seconds_before(run) if plan.start else 0.0  # a resumed run's clock goes on from its checkpoint
    if writer and plan.start:
        notes(f"resumed at step {plan.start:,} of {settings.steps:,} from {run / 'checkpoints'}/step-{plan.start:06d} "
              f"({before:,.0f} s of training before)")
    if writer and settings.compile:
        notes("--compile: the first step compiles the network (minutes on a CPU, with nothing printed meanwhile); "
              "the time left is estimated from the steps after it")
        stack.enter_context(warnings.catch_warnings())  # torch's own deprecation inside its compiler, twice a run
        warnings.filterwarnings("ignore", message=r"`torch\._prims_common\.check` is deprecated", category=FutureWarning)
    bar = stack.enter_context(contextlib.closing(progress_bar(settings.steps, plan.start, enabled=progress and writer,
                                                              elapsed=before)))
    began, loss_value, evaluation, constant = time.perf_counter() - before, float("nan"), {}, 0
    loading = stack.enter_context(contextlib.closing(batches(data, settings, plan.start, dist, device)))
    for step in range(plan.start + 1, settings.steps + 1):
        x, y = next(loading)  # decoded and augmented, seeded per step (in --workers processes)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss, same = _update(net, model, optimizer, scaler, ema, x, y, step, settings, patch, dist.rank, device)
        loss_value = dist.mean(loss)
        if not math.isfinite(loss_value):
            raise _diverged(run, step, loss_value)
        constant = constant + 1 if dist.mean(same) == 1.0 else 0  # steps in a row, on every process
        if constant >= COLLAPSED:
            raise _collapsed(run, step - constant + 1, step, loss_value)
        if step % settings.log_every == 0 or step == settings.steps:
            metrics.add({"step": step, "kind": "train", "loss": loss_value, "lr": lr_at(step, settings),
                         "seconds": round(time.perf_counter() - began, 3)})
        if writer and settings.compile and step == plan.start + 1:
            notes(f"compiled, and took the first step, in {time.perf_counter() - began - before:,.0f} s")
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}")
        last = step == settings.steps
        if writer and (last or (settings.eval_every and step % settings.eval_every == 0)):
            evaluation = _evaluate(model, ema, data, settings, patch)
            metrics.add({"step": step, "kind": "eval", **evaluation})
            bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluation.items()))
        if writer and (last or (settings.checkpoint_every and step % settings.checkpoint_every == 0)):
            checkpoint.save_checkpoint(run, step, model, optimizer, asdict(settings), run_hash=plan.record.hash,
                                       metrics_rows=metrics.count, ema=ema, scaler=scaler)
    if plan.start == settings.steps:  # its last checkpoint, but result.json or final/ was lost: finish it again
        loss_value = next((r["loss"] for r in reversed(_rows(_read_metrics(run))) if r.get("kind") == "train"),
                          float("nan"))
        evaluation = _evaluate(model, ema, data, settings, patch) if writer else {}
    result = Result(str(run), settings.steps, loss_value, evaluation, params, time.perf_counter() - began,
                    opening.trainable)
    if writer:
        save_build(model, run / "final", extra={"seed": str(settings.seed), "steps": str(settings.steps)})
        if ema is not None:  # the averaged weights beside the weights: a build folder of their own
            with ema.swapped_in(model):
                save_build(model, run / EMA_FOLDER, extra={"seed": str(settings.seed), "steps": str(settings.steps),
                                                           "ema": str(settings.ema)})
        write_atomic(run / "result.json", json.dumps(_finite(result.to_dict()), indent=2, allow_nan=False) + "\n")
    return result


def _seconds_before(run: Path) -> float:
    """The training seconds the rows kept from a resumed run's checkpoint record (its last ``seconds``)."""
    return next((float(r["seconds"]) for r in reversed(_rows(_read_metrics(run))) if "seconds" in r), 0.0)


def _update(net, model, optimizer, scaler, ema, x, y, step: int, settings: Settings, patch, rank: int,
            device: torch.device) -> torch.Tensor:
    """One optimizer step on the batch ``(x, y)``: the learning rate of ``step``; ``settings.accumulate``
    equal micro-batches, each forward under the precision's autocast with the step's own random draws
    (masks, dropped paths), the gradients summed (and synchronized once, after the last); clipping, the
    optimizer (through the fp16 scaler), and the EMA. Returns the batch's loss (detached) and whether
    every example of the last micro-batch got the same output (:func:`_same_for_every_example`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, settings)
    optimizer.zero_grad(set_to_none=True)
    parts = settings.accumulate
    unsynced = getattr(net, "no_sync", None) or getattr(getattr(net, "_orig_mod", None), "no_sync", None)
    total = torch.zeros((), device=device)
    for part, (xs, ys) in enumerate(zip(x.chunk(parts), y.chunk(parts))):
        name = f"step/{step}/rank/{rank}" + (f"/part/{part}" if parts > 1 else "")
        sync = unsynced() if unsynced is not None and part < parts - 1 else contextlib.nullcontext()
        with sync, torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(step_seed(settings.seed, name))  # the run's own draws, whatever ran before
            with autocast(settings, device):
                outputs = net(xs)
                loss = loss_of(settings.task, outputs, xs, ys, patch, settings.label_smoothing) / parts
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach()
    same = _same_for_every_example(outputs["output"].detach())
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients
    if settings.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    if scaler is not None:
        scaler.step(optimizer)  # skipped when a gradient overflowed; the scale adapts
        scaler.update()
    else:
        optimizer.step()
    if ema is not None:
        ema.update(model)
    return total, same


def _same_for_every_example(output: torch.Tensor) -> torch.Tensor:
    """1.0 when every example of the (micro-)batch got exactly the same output, else 0.0 (a batch of one
    example says nothing): the network no longer depends on its input."""
    if len(output) < 2:
        return torch.zeros((), device=output.device)
    return (output == output[:1]).all().float()


def _evaluate(model, ema, data: Data, settings: Settings, patch) -> dict[str, float]:
    """The test metrics of the weights, and of their average (``ema_`` before each name) when kept."""
    found = evaluate(model, settings.task, data, settings, patch)
    if ema is not None:
        with ema.swapped_in(model):
            found.update({f"ema_{k}": v for k, v in evaluate(model, settings.task, data, settings, patch).items()})
    return found


def _kept(run: Path, step: int) -> str:
    found = [s for s in checkpoint.checkpoints(run) if s < step]
    return f"its checkpoints up to step {max(found):,} are intact" if found else "no checkpoint was written"


def _diverged(run: Path, step: int, loss: float) -> TrainError:
    error = TrainError(f"the loss is {loss} at step {step:,}: the run diverged and was stopped ({_kept(run, step)}); "
                       "lower --lr or raise --warmup, and start a new run with another --out")
    error.shared = True
    return error


def _collapsed(run: Path, since: int, step: int, loss: float) -> TrainError:
    before = [s for s in checkpoint.checkpoints(run) if s < since]
    last = f"the last from before step {since:,} is step {max(before):,}" if before else "none is from before it"
    error = TrainError(f"every example has had exactly the same output since step {since:,} ({COLLAPSED} steps in a "
                       f"row; loss {loss:.4f}): the network no longer depends on its input (a layer gives the same "
                       f"tokens, or only zeros, whatever it is given), so it cannot learn; the run was stopped "
                       f"({_kept(run, step + 1)}; {last}); lower --lr or raise --warmup, and start a new run with another --out")
    error.shared = True
    return error


def _finite(value: Any) -> Any:
    """JSON has no NaN: a value that is not finite is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value

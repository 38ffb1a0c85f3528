"""Training a built network on a named data set: one loop for a laptop and for torchrun.

``train(spec, Settings(task="classify", data="digits"), out="runs/x")`` builds the spec (its input size
set from the data), then runs the settings' optimizer (AdamW by default) with a linear warm-up and a
cosine decay. Everything that varies from step
to step is a function of the run's seed and the step number: the order of the examples (a
permutation per epoch) and every random draw inside the model (the mask of a masked autoencoder
draws from a generator seeded per step). So a run resumed from a checkpoint computes exactly what
the uninterrupted run computes, and a run under ``torchrun`` sees the same global batches as a
single process.

A run folder holds::

    spec.yaml                 the resolved spec that was trained
    metrics.jsonl, .csv       one row per logged step (train loss, learning rate) and per evaluation
    tensorboard/              the same rows and the throughput as TensorBoard scalars (--logger; training.eventlog)
    checkpoints/step-NNNNNN/  weights, optimizer, RNG (see crate_compose.training.run_folder.checkpoint), every N steps
    final/                    the trained build (crate_compose.load_build, crate-compose probe --weights)
    result.json               the last train loss, the evaluation, parameters and wall time

``train(spec, settings, init="runs/pretrained/final", freeze="encoder")`` fine-tunes: the spec is built as
usual, then the build's tensors are copied in by name, the head's left new where they do not fit
(:mod:`crate_compose.training.finetune`); the build and the freeze are part of the run's identity.

Under ``torchrun --nproc_per_node=N`` each process takes 1/N of every global batch, and
DistributedDataParallel (gloo on the CPU, NCCL on CUDA) averages the gradients, so the update
equals the single-process update on the whole batch. Only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

import torch

from .. import tasks
from ..building.artifacts import save as save_build
from ..data.batches import batches
from ..data.sets import Data
from ..errors import Stopped, TrainError
from ..files import write_atomic
from ..modules.paths import use_formulas
from ..seeds import step_seed
from ..settings import MAX_STEPS, Settings, flat, plausibility_notes
from . import finetune
from .description import RunDescription, describe
from .distributed import Distributed
from .metrics import Metrics, Result, finite, read_metrics, rows_of, said
from .optimizers import autocast, bf16_note, lr_at, scaler_for
from .preparation import Loaded, as_recorded, check_run, check_run_memory, default_run
from .progress import bar as progress_bar
from .run_folder import checkpoint, eventlog
from .run_folder.opening import Opening, Plan

EMA_FOLDER = "final-ema"  # the run's averaged weights (--ema), a build folder beside final/
COLLAPSED = 50  # training steps in a row whose every example got the same output: the run is stopped


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
    """Train ``spec_ref`` (a spec file, a zoo preset, or a reading of one, :func:`crate_compose.spec_language.loader.read`)
    as ``settings`` says; see the module docstring. The names are resolved once (:func:`.description.describe`),
    then :func:`train_described` trains the run.

    ``init`` (a build folder: ``build --out``, a run's ``final/``, a checkpoint) fine-tunes: its tensors
    are copied into the new model by name, a head that does not fit is left newly initialized, and
    anything else that does not fit is refused before anything is written
    (:mod:`crate_compose.training.finetune`). ``freeze="encoder"`` trains the head alone. Both are part of
    the run's identity, so ``resume`` needs the same ones. ``notes`` receives each note (the head left
    new, the tensors of ``init`` not used, the parameters that train); default: printed on stderr.
    ``recipe``: the text of the recipe the settings came from (``train --config``), saved as ``recipe.yaml``.
    """
    described = describe(spec_ref, settings, overrides=overrides, init=init, freeze=freeze, recipe=recipe)
    return train_described(
        described,
        out=out,
        resume=resume,
        resume_from=resume_from,
        device=device,
        progress=progress,
        memory_limit=memory_limit,
        notes=notes,
    )


def train_described(
    described: RunDescription,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    resume_from: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    memory_limit: str | float | None = None,
    notes: Callable[[str], None] | None = None,
    loaded: Loaded | None = None,
) -> Result:
    """Train the run ``described`` (:class:`.description.RunDescription`) into ``out`` (default
    ``runs/<spec name>``). ``loaded``: data sets (and specs fitted to them) the calling command has loaded
    already (an ablation's).

    Before anything is allocated, the weights, AdamW's state and one batch's activations are
    estimated from the spec's shapes; a run over ``memory_limit`` (see :mod:`crate_compose.building.budget`)
    raises :class:`~crate_compose.building.budget.ResourceError` with the estimate and the limit. Before the
    first step, the run folder is locked and checked (:mod:`crate_compose.training.run_folder.identity`): a new run needs a
    folder that is empty or missing; ``resume`` (or ``resume_from``, a checkpoint's step) continues
    the run recorded there only when nothing that defines it differs, from a checkpoint that
    :func:`crate_compose.training.run_folder.checkpoint.verify` passes. A finished run resumed with the same steps is
    returned as it is (``Result.already_finished``), nothing written. A SIGTERM (or SLURM's SIGUSR2) while
    the steps run (in the main thread) stops the run at the next step's start, keeps the steps done in a
    checkpoint and raises :class:`~crate_compose.errors.Stopped` naming it (the CLI's exit status 143).
    """
    settings, task = described.settings, described.task
    for note in plausibility_notes(settings):
        (notes or _say)(note)
    if settings.logger == "tensorboard":  # logging: a missing package is said before anything is written
        eventlog.choose(settings.logger, error=TrainError)
    finetune.check_freeze(described.freeze)
    spec, data = (loaded or Loaded()).prepare(described, memory_limit)
    check_run(task, spec, data, settings)
    per_epoch = max(1, len(data.train) // settings.batch_size)  # passes over the training split, in whole batches
    if settings.epochs is not None:
        settings = replace(settings, steps=settings.epochs * per_epoch)
        if settings.steps > MAX_STEPS:
            raise TrainError(
                f"--epochs {settings.epochs:,} of {per_epoch:,} steps are {settings.steps:,} steps, more "
                f"than the {MAX_STEPS:,} a run may take: give fewer epochs"
            )
    if settings.warmup_epochs is not None:
        settings = replace(settings, warmup=_warmup_of_epochs(settings, per_epoch, notes or _say))
    start = finetune.read_init(described.init) if described.init is not None else None
    dist = Distributed()
    dist.check_batch(settings.batch_size)
    run = Path(out) if out is not None else default_run(described.spec)
    if resume or resume_from is not None:  # a run recorded when the data's overrides renamed the spec keeps its name
        spec = as_recorded(spec, described, data, run)
    device = torch.device(device if not (dist.active and device == "cuda") else f"cuda:{dist.local}")
    check_run_memory(spec, settings, max(1, settings.batch_size // dist.world), device, memory_limit)
    slow = bf16_note(settings, device)
    if slow and dist.rank == 0:
        (notes or _say)(slow)
    dist.start(device)
    try:
        with contextlib.ExitStack() as stack:
            opening = Opening(
                run,
                spec,
                data,
                settings,
                task,
                resume or resume_from is not None,
                resume_from,
                dist,
                device,
                start,
                described.freeze,
                described.recipe,
            )
            plan = dist.agree(lambda: opening.open(stack))
            if plan.finished is not None:
                return plan.finished
            return _loop(opening, plan, stack, progress, notes or _say)
    finally:
        dist.stop()


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
    notes(
        f"warmup_epochs {settings.warmup_epochs} would be {warmup:,} of this run's {settings.steps:,} steps: "
        f"warming up for {shorter:,} (5%) instead; --warmup N to choose"
    )
    return shorter


def _loop(
    opening: Opening, plan: Plan, stack: contextlib.ExitStack, progress: bool, notes: Callable[[str], None]
) -> Result:
    run, data, dist, device = opening.run, opening.data, opening.dist, opening.device
    settings, model, optimizer = plan.settings, opening.model, opening.optimizer
    writer = dist.rank == 0
    params = sum(p.numel() for p in model.parameters())
    if writer:
        for note in opening.notes if plan.start == 0 else []:  # a resumed run's weights are its checkpoint's
            notes(note)
        if opening.freeze != "none":
            notes(f"--freeze {opening.freeze}: {opening.trainable:,} of {params:,} parameters train (the head's)")
    task, session = opening.task, opening.session
    session.settings = settings  # as the plan resolved them (a resumed run's warm-up)
    ema, scaler = opening.ema, scaler_for(settings, device)
    if plan.checkpoint is not None:
        checkpoint.load_checkpoint(
            Path(plan.checkpoint), model, optimizer, ema=ema, scaler=scaler, task_state=session.state
        )
    board = eventlog.open_board(run, settings.logger, plan.start, settings.batch_size, notes) if writer else None
    metrics = Metrics(run, plan.metrics_rows, writer, stack.enter_context(board) if board else None)  # logging
    stack.enter_context(use_formulas(settings.formulas))  # the run's formulas: fast paths or as written
    net = torch.nn.parallel.DistributedDataParallel(model) if dist.active else model
    if settings.compile:
        net = torch.compile(net, mode=None if settings.compile_mode == "default" else settings.compile_mode)
    model.train()
    before = _seconds_before(run) if plan.start else 0.0  # a resumed run's clock goes on from its checkpoint
    if writer and plan.start:
        notes(
            f"resumed at step {plan.start:,} of {settings.steps:,} from {run / 'checkpoints'}/step-{plan.start:06d} "
            f"({before:,.0f} s of training before)"
        )
    if writer and settings.compile:
        notes(
            "--compile: the first step compiles the network (minutes on a CPU, with nothing printed meanwhile); "
            "the time left is estimated from the steps after it"
        )
        stack.enter_context(warnings.catch_warnings())  # torch's own deprecation inside its compiler, twice a run
        warnings.filterwarnings(
            "ignore", message=r"`torch\._prims_common\.check` is deprecated", category=FutureWarning
        )
    bar = stack.enter_context(
        contextlib.closing(progress_bar(settings.steps, plan.start, enabled=progress and writer, elapsed=before))
    )
    began, loss_value, evaluation, constant = time.perf_counter() - before, float("nan"), {}, 0
    loading = stack.enter_context(contextlib.closing(batches(data, settings, plan.start, dist, device)))
    stop = stack.enter_context(Termination())  # SIGTERM: the run stops at the next step's start
    saved = time.monotonic()  # the last checkpoint's time (--checkpoint-minutes)

    def save(step: int) -> None:
        nonlocal saved
        checkpoint.save_checkpoint(
            run,
            step,
            model,
            optimizer,
            flat(settings),
            run_hash=plan.record.hash,
            metrics_rows=metrics.count,
            ema=ema,
            scaler=scaler,
            task_state=session.state,
        )
        saved = time.monotonic()

    for step in range(plan.start + 1, settings.steps + 1):
        if stop.agreed(dist, device):  # the steps done so far kept, then stopped (a requeued job goes on from here)
            if writer and step - 1 > plan.start and step - 1 not in checkpoint.checkpoints(run):
                save(step - 1)
            raise _stopped(run, step - 1, settings.steps, stop.signal)
        x, y = next(loading)  # decoded and augmented, seeded per step (in --workers processes)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss, same = _update(net, model, optimizer, scaler, ema, x, y, step, settings, session, dist.rank, device)
        loss_value = dist.mean(loss)
        if not math.isfinite(loss_value):
            raise _diverged(run, step, loss_value, task, settings)
        constant = constant + 1 if dist.mean(same) == 1.0 else 0  # steps in a row, on every process
        if constant >= COLLAPSED:
            raise _collapsed(run, step - constant + 1, step, loss_value)
        logs = session.logs()  # DINO: the teacher's entropy and its KL to uniform, watched for collapse
        if step % settings.log_every == 0 or step == settings.steps:
            metrics.add(
                {
                    "step": step,
                    "kind": "train",
                    "loss": loss_value,
                    "lr": lr_at(step, settings),
                    "seconds": round(time.perf_counter() - began, 3),
                    **logs,
                }
            )
        if writer and settings.compile and step == plan.start + 1:
            notes(f"compiled, and took the first step, in {time.perf_counter() - began - before:,.0f} s")
        # this step's loss (and measures) first: the line the update draws is this step's
        bar.set_postfix(loss=f"{loss_value:.4f}", **{k: f"{v:.3f}" for k, v in logs.items()}, refresh=False)
        bar.update(1)
        last = step == settings.steps
        if writer and (last or (settings.eval_every and step % settings.eval_every == 0)):
            evaluation = _evaluate(model, ema, data, settings, task)
            metrics.add({"step": step, "kind": "eval", **evaluation})
            bar.write(f"step {step}: " + said(evaluation, task))
        if writer and (
            last
            or (settings.checkpoint_every and step % settings.checkpoint_every == 0)
            or (settings.checkpoint_minutes and time.monotonic() - saved >= 60 * settings.checkpoint_minutes)
        ):
            save(step)
    if stop.agreed(dist, device):  # after the last step's checkpoint: final/ and result.json are left to --resume
        raise _stopped(run, settings.steps, settings.steps, stop.signal)
    stop.restore()  # the handler SIGTERM had before the loop, from here on
    if plan.start == settings.steps:  # its last checkpoint, but result.json or final/ was lost: finish it again
        loss_value = next(
            (r["loss"] for r in reversed(rows_of(read_metrics(run))) if r.get("kind") == "train"), float("nan")
        )
        evaluation = _evaluate(model, ema, data, settings, task) if writer else {}
    result = Result(
        str(run), settings.steps, loss_value, evaluation, params, time.perf_counter() - began, opening.trainable
    )
    if writer:
        save_build(model, run / "final", extra={"seed": str(settings.seed), "steps": str(settings.steps)})
        if ema is not None:  # the averaged weights beside the weights: a build folder of their own
            with ema.swapped_in(model):
                save_build(
                    model,
                    run / EMA_FOLDER,
                    extra={"seed": str(settings.seed), "steps": str(settings.steps), "ema": str(settings.ema)},
                )
        write_atomic(run / "result.json", json.dumps(finite(result.to_dict()), indent=2, allow_nan=False) + "\n")
    return result


def _seconds_before(run: Path) -> float:
    """The training seconds the rows kept from a resumed run's checkpoint record (its last ``seconds``)."""
    return next((float(r["seconds"]) for r in reversed(rows_of(read_metrics(run))) if "seconds" in r), 0.0)


def _update(
    net,
    model,
    optimizer,
    scaler,
    ema,
    x,
    y,
    step: int,
    settings: Settings,
    session: tasks.Session,
    rank: int,
    device: torch.device,
) -> torch.Tensor:
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
                loss, output = session.loss(net, model, xs, ys, step, ema)
                loss = loss / parts
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach()
    same = _same_for_every_example(output.detach())
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients
    if settings.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    session.before_update(model, optimizer, step)  # DINO: the last layer frozen in the first epoch, the decay
    if scaler is not None:
        scaler.step(optimizer)  # skipped when a gradient overflowed; the scale adapts
        scaler.update()
    else:
        optimizer.step()
    session.after_update(model, optimizer, step)
    if ema is not None:
        decay = session.ema_decay(step)  # DINO: the teacher's momentum, rising to 1
        if decay is not None:
            ema.decay = decay
        ema.update(model)
    return total, same


def _same_for_every_example(output: torch.Tensor) -> torch.Tensor:
    """1.0 when every example of the (micro-)batch got exactly the same output, else 0.0 (a batch of one
    example says nothing): the network no longer depends on its input."""
    if len(output) < 2:
        return torch.zeros((), device=output.device)
    return (output == output[:1]).all().float()


def _evaluate(model, ema, data: Data, settings: Settings, task: tasks.Task) -> dict[str, float]:
    """The test metrics of the weights, and of their average (``ema_`` before each name) when kept."""
    found = task.evaluate(model, data, settings)
    if ema is not None:
        with ema.swapped_in(model):
            found.update({f"ema_{k}": v for k, v in task.evaluate(model, data, settings).items()})
    return found


def _kept(run: Path, step: int) -> str:
    found = [s for s in checkpoint.checkpoints(run) if s < step]
    return f"its checkpoints up to step {max(found):,} are intact" if found else "no checkpoint was written"


def _diverged(run: Path, step: int, loss: float, task: tasks.Task, settings: Settings) -> TrainError:
    error = TrainError(
        f"the loss is {loss} at step {step:,}: the run diverged and was stopped ({_kept(run, step)}); "
        f"lower --lr or raise --warmup{_own_options(task, settings)}, and start a new run with another "
        "--out"
    )
    error.shared = True
    return error


def _own_options(task: tasks.Task, settings: Settings) -> str:
    """``, or check task dino's --teacher-temp 0.04, ...``: the task's own options with the run's values (they
    can make a loss diverge too); nothing for a task that declares none."""
    if not task.options:
        return ""
    values = ", ".join(f"{one.flag} {_value(task.option(settings, one.name))}" for one in task.options)
    return f", or check task {task.name}'s {values}"


def _value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)  # Ctrl-C; SIGUSR2: SLURM's warning before a time limit


class Termination:
    """Ctrl-C (SIGINT), SIGTERM or SIGUSR2 (which SLURM sends ahead of a time limit when asked to) during the
    training loop, as a request to stop: while entered (in the main thread; elsewhere a signal cannot be
    caught, and nothing changes), the first such signal is noted (:attr:`signal`) and the loop stops at the
    start of its next step (:meth:`agreed`), writing a checkpoint of the steps done unless one holds them
    already; a second one meets the handler the process had before (Ctrl-C: KeyboardInterrupt, the process
    ends at once, its last complete checkpoint intact). The handlers are restored on exit, or earlier by
    :meth:`restore`. ``signals``: those it takes (the local launcher's queue: Ctrl-C and SIGTERM)."""

    def __init__(self, signals: tuple[int, ...] = STOPPING) -> None:
        self.signals = signals
        self.signal: int | None = None
        self.previous: dict[int, object] = {}
        self.installed = False

    def __enter__(self) -> "Termination":
        if threading.current_thread() is threading.main_thread():
            self.previous = {number: signal.signal(number, self._note) for number in self.signals}
            self.installed = True
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def _note(self, number: int, frame) -> None:
        if self.signal is None:
            self.signal = number
        signal.signal(number, self._previous(number))  # a second one: what it did before

    def _previous(self, number: int):
        found = self.previous.get(number)
        return found if found is not None else signal.SIG_DFL  # None: a handler not set from Python

    def restore(self) -> None:
        """The handlers the signals had before (once; again on exit, nothing)."""
        if self.installed:
            self.installed = False
            for number in self.signals:
                signal.signal(number, self._previous(number))

    def agreed(self, dist: Distributed, device: torch.device) -> bool:
        """Whether the run stops here: under torchrun, when any process got SIGTERM (every process asks at the
        same step, so all stop together)."""
        asked = self.signal is not None
        if dist.active:
            asked = dist.mean(torch.tensor(float(asked), device=device)) > 0
        return asked


def _stopped(run: Path, step: int, steps: int, number: int | None) -> Stopped:
    """The run stopped by a signal after ``step``: the last checkpoint kept, and how to continue."""
    found = [s for s in checkpoint.checkpoints(run) if s <= step]
    name = signal.Signals(number).name if number is not None else "SIGTERM"
    state = f"stopped by {name} after step {step:,} of {steps:,}"
    if found:
        state += f": the last checkpoint kept is step {max(found):,} ({run / 'checkpoints'}/step-{max(found):06d})"
        advice = f"crate-compose train ... --out {run} --resume continues from it"
    else:
        state += ": no checkpoint was written yet"
        advice = f"crate-compose train ... --out {run} --resume starts the run again from step 0"
    error = Stopped(state, advice, signal=number or signal.SIGTERM)
    error.shared = True
    return error


def _collapsed(run: Path, since: int, step: int, loss: float) -> TrainError:
    before = [s for s in checkpoint.checkpoints(run) if s < since]
    last = f"the last from before step {since:,} is step {max(before):,}" if before else "none is from before it"
    error = TrainError(
        f"every example has had exactly the same output since step {since:,} ({COLLAPSED} steps in a "
        f"row; loss {loss:.4f}): the network no longer depends on its input (a layer gives the same "
        f"tokens, or only zeros, whatever it is given), so it cannot learn; the run was stopped "
        f"({_kept(run, step + 1)}; {last}); lower --lr or raise --warmup, and start a new run with another --out"
    )
    error.shared = True
    return error

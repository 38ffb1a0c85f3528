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
    checkpoints/step-NNNNNN/  weights, optimizer, RNG (see crate_compose.checkpoint), every N steps
    final/                    the trained build (crate_compose.load, crate-compose probe --weights)
    result.json               the last train loss, the evaluation, parameters and wall time

Under ``torchrun --nproc_per_node=N`` each process takes 1/N of every global batch, and
DistributedDataParallel (gloo on the CPU, NCCL on CUDA) averages the gradients, so the update
equals the single-process update on the whole batch. Only rank 0 writes files.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from . import budget, checkpoint, loader
from .artifacts import save as save_build
from .files import write_atomic
from .builder import compile_spec
from .errors import WorkbenchError
from .data import Data, load_data
from .objectives import masked_reconstruction_loss, patch_size_of
from .modules.embed import patchify
from .settings import AUGMENTATIONS, METRIC, TASKS, Settings
from .shapes import step_seed

EVAL_WINDOWS = 1024  # held-out windows a language model is evaluated on (the first ones, always the same)


@dataclass
class Result:
    """What a run reports: the run folder, the last losses and the evaluation."""

    run: str
    steps: int
    train_loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    params: int = 0
    seconds: float = 0.0


class TrainError(WorkbenchError):
    """A run that cannot start (bad task, data or resume request); the CLI prints it in one line."""


def lr_at(step: int, settings: Settings) -> float:
    """Linear warm-up to ``lr``, then cosine decay to 0 (step counts from 1)."""
    warmup = settings.warmup if settings.warmup is not None else max(1, settings.steps // 20)
    if step <= warmup:
        return settings.lr * step / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    return settings.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def batch_indices(step: int, size: int, settings: Settings) -> torch.Tensor:
    """The examples of global batch ``step`` (from 1): a seeded permutation per epoch, drop-last."""
    per_epoch = max(1, size // settings.batch_size)
    epoch, position = divmod(step - 1, per_epoch)
    generator = torch.Generator().manual_seed(step_seed(settings.seed, f"epoch/{epoch}"))
    order = torch.randperm(size, generator=generator)
    return order[position * settings.batch_size : (position + 1) * settings.batch_size]


def _batch(dataset, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[0][indices], tensors[1][indices]
    items = [dataset[int(i)] for i in indices]
    targets = [y for _, y in items]
    targets = torch.stack(targets) if isinstance(targets[0], torch.Tensor) else torch.as_tensor(targets)
    return torch.stack([x for x, _ in items]), targets


class _Distributed:
    """Rank and world size under torchrun (one process otherwise)."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.active = self.world > 1

    def start(self, device: torch.device) -> None:
        if self.active and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def stop(self) -> None:
        if self.active and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def shard(self, indices: torch.Tensor) -> torch.Tensor:
        if len(indices) % self.world:
            raise TrainError(f"batch size {len(indices)} is not divisible by the {self.world} processes")
        per = len(indices) // self.world
        return indices[self.rank * per : (self.rank + 1) * per]


def shift(images: torch.Tensor, generator: torch.Generator, most: int = 1) -> torch.Tensor:
    """Move each image by up to ``most`` pixels in each direction, filling with 0 (the standardized mean)."""
    padded = F.pad(images, (most, most, most, most))
    h, w = images.shape[-2:]
    offsets = torch.randint(0, 2 * most + 1, (len(images), 2), generator=generator)
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


def loss_of(task: str, outputs: dict, x: torch.Tensor, y: torch.Tensor, patch: int | None, smoothing: float = 0.0):
    """The task's loss on one batch: cross-entropy of the class or of every next token, or MSE on
    masked patches (001 App. B.1)."""
    if task == "classify":
        return F.cross_entropy(outputs["output"].float(), y, label_smoothing=smoothing)
    if task == "lm":
        return F.cross_entropy(outputs["output"].float().flatten(0, 1), y.flatten(), label_smoothing=smoothing)
    return masked_reconstruction_loss(outputs["output"].float(), x.float(), outputs["mask"], patch)


def _check(task: str, spec, data: Data, settings: Settings) -> None:
    if task not in TASKS:
        raise TrainError(f"unknown task '{task}'; expected one of: {', '.join(TASKS)}")
    if settings.augment not in AUGMENTATIONS:
        raise TrainError(f"unknown augmentation '{settings.augment}'; expected one of: {', '.join(AUGMENTATIONS)}")
    if settings.augment == "shift" and len(data.input_shape) != 3:
        raise TrainError(f"augment 'shift' moves images; data set '{data.name}' is not images")
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


def evaluate(model: nn.Module, task: str, data: Data, settings: Settings, patch: int | None) -> dict[str, float]:
    """Test metrics: accuracy and loss (classify), or the MSE on hidden patches and that of the mean-patch
    baseline, which predicts every hidden patch as the mean of the same image's visible patches (mae)."""
    model.eval()
    device = next(model.parameters()).device
    if task == "lm":
        return _evaluate_lm(model, data, device)
    total, correct, loss_sum, baseline_sum = 0, 0, 0.0, 0.0
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(step_seed(settings.seed, "evaluation"))  # the same masks at every evaluation
        for start in range(0, len(data.test), 256):
            x, y = _batch(data.test, torch.arange(start, min(start + 256, len(data.test))))
            x, y = x.to(device), y.to(device)
            outputs = model(x)
            n = len(x)
            loss_sum += loss_of(task, outputs, x, y, patch).item() * n
            if task == "classify":
                correct += (outputs["output"].argmax(-1) == y).sum().item()
            else:  # predicting every hidden patch by the mean of the image's visible patches
                patches, visible = patchify(x.float(), patch), (1 - outputs["mask"]).unsqueeze(-1)
                mean_patch = (patches * visible).sum(1, keepdim=True) / visible.sum(1, keepdim=True).clamp_min(1)
                baseline = mean_patch.expand_as(patches)
                baseline_sum += masked_reconstruction_loss(baseline, x.float(), outputs["mask"], patch).item() * n
            total += n
    model.train()
    if task == "classify":
        return {"test_accuracy": correct / total, "test_loss": loss_sum / total}
    return {"test_masked_mse": loss_sum / total, "test_mean_patch_mse": baseline_sum / total}


def _evaluate_lm(model: nn.Module, data: Data, device: torch.device) -> dict[str, float]:
    """Held-out cross-entropy per byte (nats and bits) on the first windows, and the unigram baseline."""
    count = min(len(data.test), EVAL_WINDOWS)
    loss_sum = 0.0
    with torch.no_grad():
        for start in range(0, count, 64):
            x, y = _batch(data.test, torch.arange(start, min(start + 64, count)))
            outputs = model(x.to(device))
            loss_sum += loss_of("lm", outputs, x, y.to(device), None).item() * len(x)
    model.train()
    loss = loss_sum / count
    return {"test_loss": loss, "test_bits_per_byte": loss / math.log(2), "test_unigram_loss": data.unigram_loss}


class _Metrics:
    """Rows appended to metrics.jsonl and metrics.csv; a resumed run first drops rows after its checkpoint."""

    FIELDS = ("step", "kind", "loss", "lr", "seconds", "test_accuracy", "test_loss", "test_masked_mse",
              "test_mean_patch_mse", "test_bits_per_byte", "test_unigram_loss")

    def __init__(self, run: Path, keep_until: int, enabled: bool) -> None:
        self.enabled = enabled
        self.jsonl, self.csv = run / "metrics.jsonl", run / "metrics.csv"
        if not enabled:
            return
        rows = []
        if keep_until and self.jsonl.exists():
            rows = [row for row in _rows(self.jsonl.read_text()) if row["step"] <= keep_until]
        write_atomic(self.jsonl, "".join(json.dumps(row) + "\n" for row in rows))
        table = io.StringIO()
        writer = csv.DictWriter(table, self.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.csv, table.getvalue())

    def add(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.jsonl, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        with open(self.csv, "a", newline="") as handle:
            csv.DictWriter(handle, self.FIELDS).writerow(row)


def _rows(text: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl; a last line cut short by a killed run (rows are appended) is dropped."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def prepare(spec_ref, data_name: str, overrides: Iterable[str] = (), image_size: int | None = None, seed: int = 0):
    """Load the spec and the data, the spec's input size set from the data (text: windows of the
    spec's context)."""
    spec = loader.load(spec_ref, overrides)
    data = load_data(data_name, image_size=image_size, seed=seed, spec=spec)
    fit = data.spec_overrides(spec)  # [] for a spec written for this data
    return (loader.load(spec_ref, [*fit, *overrides]) if fit else spec), data


def train(
    spec_ref,
    settings: Settings,
    *,
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    resume: bool = False,
    device: str = "cpu",
    progress: bool = True,
    memory_limit: str | float | None = None,
) -> Result:
    """Train ``spec_ref`` (a path, preset or Spec) as ``settings`` says; see the module docstring.

    Before anything is allocated, the weights, AdamW's state and one batch's activations are
    estimated from the spec's shapes; a run over ``memory_limit`` (see :mod:`crate_compose.budget`)
    raises :class:`~crate_compose.budget.ResourceError` with the estimate and the limit.
    """
    overrides = list(overrides)
    spec, data = prepare(spec_ref, settings.data, overrides, settings.image_size, settings.seed)
    _check(settings.task, spec, data, settings)
    run = Path(out) if out is not None else Path("runs") / spec.name
    dist = _Distributed()
    device = torch.device(device if not (dist.active and device == "cuda") else f"cuda:{dist.rank}")
    budget.check_training(spec, max(1, settings.batch_size // dist.world), str(device), memory_limit)
    dist.start(device)
    writer = dist.rank == 0
    try:
        return _loop(spec, data, settings, run, resume, device, dist, writer, progress)
    finally:
        dist.stop()


def _loop(spec, data, settings, run, resume, device, dist, writer, progress) -> Result:
    model = compile_spec(spec, seed=settings.seed, device=device, memory_limit="none")  # checked in train()
    patch = patch_size_of(model) if settings.task == "mae" else None
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    other = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=settings.lr,
    )
    start = 0
    if resume:
        latest = checkpoint.latest_checkpoint(run)
        if latest is None:
            raise TrainError(f"--resume: no complete checkpoint in {run / 'checkpoints'}")
        state = checkpoint.load_checkpoint(latest, model, optimizer)
        saved = {k: v for k, v in state["settings"].items()}
        if saved != asdict(settings):
            changed = sorted(k for k in saved if saved[k] != asdict(settings).get(k))
            raise TrainError(f"--resume: the run in {run} was started with other settings ({', '.join(changed)})")
        start = state["step"]
    elif writer and (run / "checkpoints").exists() and checkpoint.latest_checkpoint(run) is not None:
        raise TrainError(f"{run} already holds a run: pass --resume to continue it, or choose another --out")
    if writer:
        run.mkdir(parents=True, exist_ok=True)
        checkpoint.prune_partial(run) if (run / "checkpoints").exists() else None
        write_atomic(run / "spec.yaml", loader.dump(spec))
    metrics = _Metrics(run, start, writer)
    net = torch.nn.parallel.DistributedDataParallel(model) if dist.active else model
    model.train()
    bar = _progress(settings.steps, start, enabled=progress and writer)
    began, loss_value, evaluation = time.perf_counter(), float("nan"), {}
    for step in range(start + 1, settings.steps + 1):
        indices = dist.shard(batch_indices(step, len(data.train), settings))
        x, y = _batch(data.train, indices)
        if settings.augment == "shift":
            x = shift(x, torch.Generator().manual_seed(step_seed(settings.seed, f"augment/{step}/{dist.rank}")))
        x, y = x.to(device), y.to(device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, settings)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(step_seed(settings.seed, f"step/{step}/rank/{dist.rank}"))  # masks: the run's own draws
            outputs = net(x)
        loss = loss_of(settings.task, outputs, x, y, patch, settings.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if settings.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        loss_value = _global_mean(loss.detach(), dist)
        if step % settings.log_every == 0 or step == settings.steps:
            metrics.add({"step": step, "kind": "train", "loss": loss_value, "lr": lr_at(step, settings),
                         "seconds": round(time.perf_counter() - began, 3)})
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}")
        last = step == settings.steps
        if writer and (last or (settings.eval_every and step % settings.eval_every == 0)):
            evaluation = evaluate(model, settings.task, data, settings, patch)
            metrics.add({"step": step, "kind": "eval", **evaluation})
            bar.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluation.items()))
        if writer and (last or (settings.checkpoint_every and step % settings.checkpoint_every == 0)):
            checkpoint.save_checkpoint(run, step, model, optimizer, asdict(settings))
    bar.close()
    params = sum(p.numel() for p in model.parameters())
    result = Result(str(run), settings.steps, loss_value, evaluation, params, time.perf_counter() - began)
    if writer:
        save_build(model, run / "final", extra={"seed": str(settings.seed), "steps": str(settings.steps)})
        write_atomic(run / "result.json", json.dumps(asdict(result), indent=2))
    return result


def _global_mean(value: torch.Tensor, dist: _Distributed) -> float:
    if dist.active:
        value = value.clone()
        torch.distributed.all_reduce(value)
        value /= dist.world
    return value.item()


def _progress(total: int, initial: int, *, enabled: bool):
    """A tqdm progress bar with the running loss (tqdm: a well-kept bar that degrades to plain lines)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True, leave=True)

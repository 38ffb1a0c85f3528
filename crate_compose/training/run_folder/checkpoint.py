"""Training checkpoints: a build directory plus the optimizer, the schedule position and the RNG.

A checkpoint is ``RUN/checkpoints/step-000200/``::

    spec.yaml, model.safetensors, code.py, summary.txt   a build (``crate_compose.load_build`` reads it)
    optimizer.safetensors                               the optimizer's state (AdamW's moments and step
                                                        counts, Lion's or SGD's momentum), the torch RNG
    ema.safetensors                                     the average of the weights (runs with --ema)
    state.json                                          step, the run's hash, settings, param-group
                                                        hyper-parameters, metrics rows written so far,
                                                        fp16's gradient scaler

Nothing is pickled: tensors go through safetensors, everything else through JSON. A checkpoint is
written under a temporary name and renamed into place, so a run killed while writing one (even with
SIGKILL) leaves the previous checkpoint intact and no partial one that could be resumed from.

Before a run resumes from a checkpoint, :func:`verify` checks it as a whole, and nothing is loaded
or written until it passes: the step agrees with the folder's name, the run's steps and its
metrics; ``state.json`` has every key with the right type and the run's hash and settings; its
``spec.yaml`` is the run's; every tensor of the weights, the optimizer state and the RNG state has
the shape and dtype the model and AdamW give it, and every value is finite. A checkpoint that fails
is named with the reason and left as it is (never deleted).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import fx

from ...building.artifacts import SPEC_FILE, WEIGHTS_FILE, first_mismatch, read_weights
from ...building.artifacts import save as save_build
from ...building.builder import spec_of
from ...building.plan import tied
from ...errors import WorkbenchError
from ...files import save_tensors, staged_folder, write_atomic
from ..optimizers import EMA, state_keys
from .identity import LATER

STATE_FILE, OPTIMIZER_FILE, EMA_FILE = "state.json", "optimizer.safetensors", "ema.safetensors"
TASK_FILE = "task.safetensors"  # what a task keeps from step to step (DINO's center), when it keeps anything
RNG_KEY = "rng.torch"
CUDA_RNG_KEY = "rng.cuda"  # the generator of the CUDA device the model is on (stochastic depth, masks drawn there)
MAX_STATE_BYTES = 1_000_000  # state.json is a few kB
_STEP = re.compile(r"^step-([0-9]{6,18})$")  # digits 0-9 only (int() reads "٣" too), never too many for int()


class CheckpointError(WorkbenchError):
    """A checkpoint that cannot be resumed from; the message names it and what is wrong."""


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The optimizer state as flat tensors ``"{param index}.{name}"`` and its param groups as JSON."""
    state = optimizer.state_dict()
    tensors = {
        f"{index}.{name}": value.detach().cpu().contiguous()
        for index, entries in state["state"].items()
        for name, value in entries.items()
        if isinstance(value, torch.Tensor)
    }
    return tensors, state["param_groups"]


def save_checkpoint(
    run: Path,
    step: int,
    model: fx.GraphModule,
    optimizer: torch.optim.Optimizer,
    settings: dict[str, Any],
    *,
    run_hash: str = "",
    metrics_rows: int = 0,
    ema: EMA | None = None,
    scaler: torch.amp.GradScaler | None = None,
    task_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``RUN/checkpoints/step-NNNNNN`` atomically and return it."""
    final = run / "checkpoints" / f"step-{step:06d}"
    with staged_folder(final) as staging:  # an OSError names the file at its place in the checkpoint
        save_build(model, staging)
        tensors, groups = _optimizer_tensors(optimizer)
        tensors[RNG_KEY] = torch.get_rng_state()
        device = _cuda_device(model)
        if device is not None:
            tensors[CUDA_RNG_KEY] = torch.cuda.get_rng_state(device)
        save_tensors(tensors, staging / OPTIMIZER_FILE)
        if ema is not None:
            save_tensors({k: v.detach().cpu().contiguous() for k, v in ema.tensors.items()}, staging / EMA_FILE)
        if task_state:
            save_tensors({k: v.detach().cpu().contiguous() for k, v in task_state.items()}, staging / TASK_FILE)
        state = {
            "step": step,
            "identity": run_hash,
            "settings": settings,
            "param_groups": groups,
            "metrics_rows": metrics_rows,
            **({"scaler": scaler.state_dict()} if scaler is not None else {}),
        }
        write_atomic(staging / STATE_FILE, json.dumps(state, indent=2, default=str))
    return final


def _cuda_device(model: torch.nn.Module) -> torch.device | None:
    """The CUDA device ``model``'s weights are on, or None (CPU): its generator is saved with the CPU one's, so
    a run resumed on a GPU draws what the run that went on would have drawn."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None and parameter.device.type == "cuda" else None


def checkpoints(run: Path) -> dict[int, Path]:
    """Every checkpoint folder of ``run`` by the step its name gives (complete or not), in order."""
    folder = run / "checkpoints"
    found = {}
    for entry in folder.iterdir() if folder.is_dir() else []:
        match = _STEP.match(entry.name)
        if match:
            found[int(match.group(1))] = entry
    return dict(sorted(found.items()))


def latest_checkpoint(run: Path) -> Path | None:
    """The checkpoint with the highest step, or None (whether it is sound is :func:`verify`'s to say)."""
    found = checkpoints(run)
    return found[max(found)] if found else None


# ---------------------------------------------------------------- verification


def verify(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    run_hash: str,
    spec_text: str,
    settings: dict[str, Any],
    steps: int,
    metrics_rows: list[dict],
    ema: EMA | None = None,
    task_state: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Check the checkpoint at ``path`` as a whole against the run (see the module docstring);
    return its state. Raises :class:`CheckpointError` naming the checkpoint and the first problem."""
    try:
        state = _verified_state(path, optimizer, run_hash, settings, steps, metrics_rows)
        text = _read_text(path / SPEC_FILE)
        if text != spec_text:
            from .identity import spec_difference

            raise ValueError(f"{SPEC_FILE} is not the run's spec ({spec_difference(spec_text, text)})")
        _verify_weights(path, model)
        _verify_optimizer(path, model, optimizer, state["step"])
        if ema is not None:
            _verify_ema(path, ema)
        if task_state:
            _verify_task_state(path, task_state)
    except ValueError as error:
        raise CheckpointError(f"checkpoint {path} cannot be resumed from: {error}") from None
    return state


def _read_text(path: Path, limit: int = 10_000_000) -> str:
    if not path.is_file():
        raise ValueError(f"{path.name} is missing" if not path.exists() else f"{path.name} is not a regular file")
    if path.stat().st_size > limit:
        raise ValueError(f"{path.name} is {path.stat().st_size:,} bytes, more than a checkpoint's file holds")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path.name} cannot be read ({error})") from None


def _verified_state(path: Path, optimizer, run_hash: str, settings: dict, steps: int, rows: list[dict]) -> dict:
    try:
        state = json.loads(_read_text(path / STATE_FILE, MAX_STATE_BYTES))
    except json.JSONDecodeError as error:
        raise ValueError(f"{STATE_FILE} is not JSON ({error})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{STATE_FILE} is not a JSON object")
    expected = {"step": int, "identity": str, "settings": dict, "param_groups": list, "metrics_rows": int}
    for key, kind in expected.items():
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{STATE_FILE}: '{key}' is {_kind(value)}, expected {kind.__name__}")
    step, named = state["step"], int(_STEP.match(path.name).group(1))
    if step != named:
        raise ValueError(f"{STATE_FILE} says step {step}, the folder's name says {named}")
    if not 1 <= step <= steps:
        raise ValueError(f"step {step} is outside the run's steps 1..{steps}")
    if state["identity"] != run_hash:
        raise ValueError(
            f"{STATE_FILE} belongs to another run (hash {state['identity'][:12]}, the run's is {run_hash[:12]})"
        )
    saved = {**LATER, **state["settings"]}  # a checkpoint written before a setting existed had its default
    changed = sorted(k for k in settings if saved.get(k) != settings[k])
    if changed:
        key = changed[0]
        raise ValueError(f"{STATE_FILE}: settings.{key} is {saved.get(key)!r}, the run's is {settings[key]!r}")
    _verify_metrics(state["metrics_rows"], step, rows)
    _verify_groups(state["param_groups"], optimizer.state_dict()["param_groups"])
    return state


def _kind(value: Any) -> str:
    return "missing" if value is None else f"{type(value).__name__} {json.dumps(value)[:40]}"


def _verify_metrics(count: int, step: int, rows: list[dict]) -> None:
    """The metrics file holds the rows written up to this checkpoint, the last of them at or before it."""
    if count < 0:
        raise ValueError(f"{STATE_FILE}: metrics_rows is {count}")
    if len(rows) < count:
        raise ValueError(f"metrics.jsonl has {len(rows)} rows, the checkpoint was written after {count}")
    if count and not (isinstance(rows[count - 1].get("step"), int) and rows[count - 1]["step"] <= step):
        raise ValueError(
            f"metrics.jsonl row {count} is at step {rows[count - 1].get('step')!r}, after the checkpoint's step {step}"
        )


def _verify_groups(saved: list, current: list[dict]) -> None:
    """Param groups: the optimizer's own keys and parameter lists, its hyper-parameters, a finite lr."""
    if len(saved) != len(current):
        raise ValueError(f"{STATE_FILE}: {len(saved)} param groups, the optimizer has {len(current)}")
    for index, (group, own) in enumerate(zip(saved, current)):
        if not isinstance(group, dict) or set(group) != set(own):
            keys = sorted(group) if isinstance(group, dict) else _kind(group)
            raise ValueError(f"{STATE_FILE}: param group {index} has keys {keys}, AdamW's are {sorted(own)}")
        lr = group["lr"]
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"{STATE_FILE}: param group {index}: lr is {lr!r}")
        own = json.loads(json.dumps(own, default=str))  # as saved: tuples become lists
        for key in sorted(own):
            if key != "lr" and group[key] != own[key]:
                raise ValueError(
                    f"{STATE_FILE}: param group {index}: {key} is {group[key]!r}, the run's is {own[key]!r}"
                )


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ValueError(f"{path.name} is missing")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise ValueError(f"{path.name} is not a readable safetensors file ({str(error)[:200]})") from None


def _verify_weights(path: Path, model: torch.nn.Module) -> None:
    if not (path / WEIGHTS_FILE).is_file():
        raise ValueError(f"{WEIGHTS_FILE} is missing")
    tensors = read_weights(path / WEIGHTS_FILE, tied(spec_of(model)))
    expected = model.state_dict()
    mismatch = first_mismatch(expected, tensors)
    if mismatch:
        raise ValueError(f"{WEIGHTS_FILE}: {mismatch}")
    for name, tensor in tensors.items():
        if tensor.dtype != expected[name].dtype:
            raise ValueError(f"{WEIGHTS_FILE}: {name} is {tensor.dtype}, the run's is {expected[name].dtype}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(f"{WEIGHTS_FILE}: {name} holds NaN or infinite values")


def _verify_optimizer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """The optimizer's state: for each parameter either nothing (it never had a gradient) or every tensor
    the optimizer keeps (AdamW: a step count in 1..step and two moments; Lion: one moment; SGD: the
    momentum) of the parameter's shape and dtype, all finite; the torch RNG state."""
    tensors = _read_tensors(path / OPTIMIZER_FILE)
    rng = tensors.pop(RNG_KEY, None)
    reference = torch.get_rng_state()
    if rng is None or rng.dtype != reference.dtype or rng.shape != reference.shape:
        found = "missing" if rng is None else f"{rng.dtype} {tuple(rng.shape)}"
        raise ValueError(
            f"{OPTIMIZER_FILE}: {RNG_KEY} is {found}, torch's RNG state is {reference.dtype} {tuple(reference.shape)}"
        )
    cuda_rng = tensors.pop(CUDA_RNG_KEY, None)  # a run on a GPU's; checkpoints of CPU runs have none
    if cuda_rng is not None and (cuda_rng.dtype != torch.uint8 or cuda_rng.ndim != 1):
        raise ValueError(
            f"{OPTIMIZER_FILE}: {CUDA_RNG_KEY} is {cuda_rng.dtype} {tuple(cuda_rng.shape)}, a CUDA "
            "generator's state is uint8 bytes"
        )
    groups = optimizer.param_groups
    parameters = dict(enumerate(itertools.chain.from_iterable(group["params"] for group in groups)))
    names = {id(p): n for n, p in model.named_parameters()}
    seen = set()
    keys = state_keys(optimizer)
    for index, parameter in parameters.items():
        present = [k for k in keys if f"{index}.{k}" in tensors]
        if present and len(present) != len(keys):
            missing = sorted(set(keys) - set(present))
            raise ValueError(f"{OPTIMIZER_FILE}: {index}.{missing[0]} is missing ({names.get(id(parameter))})")
        for key in present:
            seen.add(f"{index}.{key}")
            _check_moment(tensors[f"{index}.{key}"], key, index, parameter, names.get(id(parameter)), step)
    extra = sorted(set(tensors) - seen)
    if extra:
        raise ValueError(
            f"{OPTIMIZER_FILE}: {extra[0]} is not a tensor {type(optimizer).__name__} keeps for this model"
        )


def _verify_ema(path: Path, ema: EMA) -> None:
    """The average of the weights: every tensor the run averages, of its shape, float32 and finite."""
    _verify_kept(path, EMA_FILE, ema.tensors, "the run keeps an average of its weights", "a tensor of this model")


def _verify_task_state(path: Path, task_state: dict[str, torch.Tensor]) -> None:
    """What the task keeps (DINO's center): every tensor, of its shape and dtype, finite, and nothing else."""
    _verify_kept(
        path,
        TASK_FILE,
        task_state,
        f"the run's task keeps {', '.join(task_state)} from step to step",
        "a tensor the run's task keeps",
    )


def _verify_kept(path: Path, file: str, expected: dict[str, torch.Tensor], why: str, what: str) -> None:
    """``path / file`` holds every tensor of ``expected``, of its shape and dtype, finite, and nothing else
    (``why``: why the file must be there; ``what``: what each of its tensors must be)."""
    if not (path / file).is_file():
        raise ValueError(f"{file} is missing ({why})")
    tensors = _read_tensors(path / file)
    for name, reference in expected.items():
        found = tensors.get(name)
        if found is None or found.shape != reference.shape or found.dtype != reference.dtype:
            shown = "missing" if found is None else f"{found.dtype} {tuple(found.shape)}"
            kind = str(reference.dtype).removeprefix("torch.")
            raise ValueError(f"{file}: {name} is {shown}, the run's is {kind} {tuple(reference.shape)}")
        if not torch.isfinite(found).all():
            raise ValueError(f"{file}: {name} holds NaN or infinite values")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise ValueError(f"{file}: {extra[0]} is not {what}")


def _check_moment(tensor: torch.Tensor, key: str, index: int, parameter: torch.Tensor, name: str, step: int) -> None:
    label = f"{OPTIMIZER_FILE}: {index}.{key} ({name})"
    if key == "step":
        if tensor.shape != () or not tensor.is_floating_point():
            raise ValueError(f"{label} is {tensor.dtype} {tuple(tensor.shape)}, a step count is a float scalar")
        count = float(tensor)
        if not (math.isfinite(count) and count == int(count) and 1 <= count <= step):
            raise ValueError(f"{label} counts {count:g} steps, outside 1..{step}")
        return
    if tensor.shape != parameter.shape or tensor.dtype != parameter.dtype:
        raise ValueError(
            f"{label} is {tensor.dtype} {tuple(tensor.shape)}, the parameter is {parameter.dtype} "
            f"{tuple(parameter.shape)}"
        )
    if not torch.isfinite(tensor).all() or (key == "exp_avg_sq" and (tensor < 0).any()):
        raise ValueError(f"{label} holds NaN, infinite or (a second moment) negative values")


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    ema: EMA | None = None,
    scaler: torch.amp.GradScaler | None = None,
    task_state: dict[str, torch.Tensor] | None = None,
) -> None:
    """Load weights, optimizer state, RNG, the EMA and the scaler from a checkpoint :func:`verify` has passed."""
    model.load_state_dict(read_weights(path / WEIGHTS_FILE, tied(spec_of(model))), strict=True)
    state = json.loads((path / STATE_FILE).read_text())
    tensors = load_file(path / OPTIMIZER_FILE)
    torch.set_rng_state(tensors.pop(RNG_KEY))
    cuda_rng, device = tensors.pop(CUDA_RNG_KEY, None), _cuda_device(model)
    if cuda_rng is not None and device is not None:
        torch.cuda.set_rng_state(cuda_rng, device)
    entries: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        entries.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": entries, "param_groups": state["param_groups"]})
    if ema is not None:
        for name, value in load_file(path / EMA_FILE).items():
            ema.tensors[name].copy_(value)
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    if task_state:
        for name, value in load_file(path / TASK_FILE).items():
            task_state[name].copy_(value)


# A checkpoint is filled under ``.step-NNNNNN.XXXXXXXX.partial`` (files.staged_folder), and the build inside it
# under a staging sibling of that, ``..step-NNNNNN.XXXXXXXX.partial.YYYYYYYY.partial`` (artifacts.save): one
# leading dot per staging level, one ``.RANDOM.partial`` each (mkdtemp's names: [a-z0-9_]).
_STAGING = re.compile(r"^(\.+)step-\d{6,}((?:\.[a-z0-9_]{1,32}\.partial)+)$")


def staging_leftover(name: str) -> bool:
    """Whether ``name`` is a staging folder a checkpoint writer makes in ``RUN/checkpoints`` (nested ones
    included), never a name a user or a complete checkpoint has."""
    match = _STAGING.match(name)
    return match is not None and len(match.group(1)) == match.group(2).count(".partial")


def prune_partial(run: Path) -> None:
    """Remove checkpoints a killed run left half-written: every staging folder of ``RUN/checkpoints``
    (:func:`staging_leftover`), nested ones included; never a complete checkpoint, a link or a user's file."""
    folder = run / "checkpoints"
    for entry in folder.iterdir() if folder.is_dir() else []:
        if staging_leftover(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)

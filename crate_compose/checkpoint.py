"""Training checkpoints: a build directory plus the optimizer, the schedule position and the RNG.

A checkpoint is ``RUN/checkpoints/step-000200/``::

    spec.yaml, model.safetensors, code.py, summary.txt   a build (``crate_compose.load`` reads it)
    optimizer.safetensors                               AdamW's moments and step counts, the torch RNG
    state.json                                          step, run settings, param-group hyper-parameters

Nothing is pickled: tensors go through safetensors, everything else through JSON. A checkpoint is
written under a temporary name and renamed into place, so a run killed while writing one (even with
SIGKILL) leaves the previous checkpoint intact and no partial one that could be resumed from.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import fx

from .artifacts import load as load_build
from .artifacts import save as save_build
from .errors import SpecError, WorkbenchError
from .files import replace_folder

STATE_FILE, OPTIMIZER_FILE = "state.json", "optimizer.safetensors"
_STEP = re.compile(r"^step-(\d+)$")


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
    run: Path, step: int, model: fx.GraphModule, optimizer: torch.optim.Optimizer, settings: dict[str, Any]
) -> Path:
    """Write ``RUN/checkpoints/step-NNNNNN`` atomically and return it."""
    folder = run / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{step:06d}"
    staging = folder / f".step-{step:06d}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    save_build(model, staging)
    tensors, groups = _optimizer_tensors(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    save_file(tensors, staging / OPTIMIZER_FILE)
    state = {"step": step, "settings": settings, "param_groups": groups}
    (staging / STATE_FILE).write_text(json.dumps(state, indent=2, default=str))
    replace_folder(staging, final)
    return final


def latest_checkpoint(run: Path) -> Path | None:
    """The complete checkpoint with the highest step, or None; partial ones are ignored."""
    folder = run / "checkpoints"
    steps = []
    for entry in folder.iterdir() if folder.is_dir() else []:
        match = _STEP.match(entry.name)
        if match and (entry / STATE_FILE).is_file() and (entry / OPTIMIZER_FILE).is_file():
            steps.append((int(match.group(1)), entry))
    return max(steps)[1] if steps else None


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load weights, optimizer state and RNG from a checkpoint into ``model`` and ``optimizer``.
    A checkpoint that cannot be read (edited, truncated) raises :class:`WorkbenchError` naming it."""
    try:
        weights = load_build(path).state_dict()
        model.load_state_dict(weights, strict=True)
        state = json.loads((path / STATE_FILE).read_text())
        tensors = load_file(path / OPTIMIZER_FILE)
        torch.set_rng_state(tensors.pop("rng.torch"))
    except (SpecError, OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:
        reason = str(error).splitlines()[-1].strip() if str(error) else type(error).__name__
        raise WorkbenchError(f"--resume: the checkpoint {path} cannot be read ({reason}); remove it to resume from "
                             "the one before") from None
    entries: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        entries.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": entries, "param_groups": state["param_groups"]})
    return state


def prune_partial(run: Path) -> None:
    """Remove checkpoints a killed run left half-written."""
    for entry in (run / "checkpoints").glob(".step-*.partial"):
        shutil.rmtree(entry, ignore_errors=True)

"""Saving and loading built models: the resolved spec plus a safetensors state dict. No pickle.

A build directory holds::

    spec.yaml           the resolved spec (no extends, no references, every default written)
    model.safetensors   the weights (``extra`` strings, e.g. the CLI's seed and dtype, in its metadata)
    code.py             the generated forward (for reading; never executed on load)
    summary.txt         the step table printed by ``crate-compose build``

The directory is written to a temporary sibling and renamed into place, so a failed build never
leaves a half-written output.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import fx

from . import loader
from .builder import compile_spec, spec_of
from .errors import Location, Problem, SpecError
from .summary import summarize

SPEC_FILE, WEIGHTS_FILE, CODE_FILE, SUMMARY_FILE = "spec.yaml", "model.safetensors", "code.py", "summary.txt"


def save(module: fx.GraphModule, directory: str | Path, *, extra: dict[str, str] | None = None) -> Path:
    """Write ``module`` to ``directory`` (replaced atomically if it exists). Returns the path."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        (staging / SPEC_FILE).write_text(loader.dump(spec_of(module)))
        tensors = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
        save_file(tensors, staging / WEIGHTS_FILE, metadata={"format": "pt", **(extra or {})})
        (staging / CODE_FILE).write_text(module.code.lstrip() + "\n")
        (staging / SUMMARY_FILE).write_text(summarize(module).table() + "\n")
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with open(handle, "w") as file:
            file.write(text)
        Path(staging).replace(path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def load(directory: str | Path, *, device: str | torch.device = "cpu") -> fx.GraphModule:
    """Rebuild the graph from ``spec.yaml`` and load ``model.safetensors`` into it (strict)."""
    directory = Path(directory)
    for name in (SPEC_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise SpecError([Problem(f"not a crate-compose build: {name} is missing", (), Location(str(directory)))])
    spec = loader.load(directory / SPEC_FILE)
    tensors = load_file(directory / WEIGHTS_FILE)
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    module = compile_spec(spec, device="cpu", dtype=dtype)
    try:
        module.load_state_dict(tensors, strict=True)
    except RuntimeError as error:
        raise SpecError([Problem(f"weights do not match the spec: {error}", (), Location(str(directory)))]) from None
    return module.to(device)

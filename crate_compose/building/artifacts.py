"""Saving and loading built models: the resolved spec plus a safetensors state dict. No pickle.

A build directory holds::

    spec.yaml           the resolved spec (no extends, no references, every default written)
    model.safetensors   the weights (``extra`` strings, e.g. the CLI's seed and dtype, in its metadata)
    code.py             the generated forward (for reading; never executed on load)
    summary.txt         the step table printed by ``crate-compose build``

The directory is written to a temporary sibling and renamed into place, so a failed build never
leaves a half-written output. An existing directory is replaced only when it is empty or an earlier
build (nothing in it but the files above and a diagram): ``--out .`` or ``--out ~`` never deletes
anybody's files.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import fx

from ..errors import Location, Problem, SpecError
from ..files import naming, save_tensors, staged_folder, write_atomic
from ..spec_language import loader
from .builder import compile_spec, spec_of
from .outputs import BUILD_FILES, CODE_FILE, SPEC_FILE, SUMMARY_FILE, WEIGHTS_FILE, OutputExistsError, replaceable  # noqa: F401 (the build folder's names, read from here too)
from .plan import tied
from .summary import summarize
from .ties import retie, untie


def save(module: fx.GraphModule, directory: str | Path, *, extra: dict[str, str] | None = None) -> Path:
    """Write ``module`` to ``directory`` (replaced atomically if it exists). Returns the path.

    A file that cannot be written (a full disk, a read-only folder) raises an ``OSError`` naming it
    as the caller gave the folder (``out/x/model.safetensors``); nothing is left behind and an earlier
    build is left as it was (:func:`crate_compose.files.staged_folder`)."""
    given = Path(directory)
    directory = given.resolve()
    replaceable(directory)
    state = untie(module.state_dict(), tied(spec_of(module)))  # a tied tensor once, under its source's name
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with naming(given, directory), staged_folder(directory) as staging:
        write_atomic(staging / SPEC_FILE, loader.dump(spec_of(module)))
        save_tensors(tensors, staging / WEIGHTS_FILE, metadata={"format": "pt", **(extra or {})})
        write_atomic(staging / CODE_FILE, readable_code(module))
        write_atomic(staging / SUMMARY_FILE, summarize(module).table() + "\n")
    return directory


def readable_code(module: fx.GraphModule) -> str:
    """The generated forward as ``code.py`` holds it: one call per step, without the ``;  x = None`` that
    torch.fx appends to free each value after its last use (the module runs its own code, not this text)."""
    lines = [re.sub(r"(;\s+\w+ = None)+$", "", line.rstrip()) for line in module.code.strip("\n").splitlines()]
    return "\n".join(line for line in lines if line.strip()) + "\n"


def read_weights(path: Path, tied_names: dict[str, str]) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, tied names completed (:mod:`crate_compose.building.ties`).
    Raises ``ValueError`` for a file that is not safetensors (a pickle, a truncated file)."""
    try:
        tensors = load_file(path)
    except Exception as error:  # safetensors' own error types; nothing in the file is ever executed
        raise ValueError(f"{path} is not a readable safetensors file ({type(error).__name__}: {error})") from None
    return retie(tensors, tied_names)


def first_mismatch(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> str | None:
    """The first tensor (in the network's order) that is missing, extra or of another shape, with both
    shapes; None when every tensor fits."""
    for name, tensor in expected.items():
        if name not in found:
            return f"{name} is missing from the file (the spec has {tuple(tensor.shape)})"
        if found[name].shape != tensor.shape:
            return f"{name} is {tuple(found[name].shape)} in the file, {tuple(tensor.shape)} in the spec"
        if found[name].is_floating_point() != tensor.is_floating_point():
            return f"{name} is {found[name].dtype} in the file, {tensor.dtype} in the spec"
    extra = sorted(set(found) - set(expected))
    return f"{extra[0]} is in the file ({tuple(found[extra[0]].shape)}) but not in the spec" if extra else None


def load_build(directory: str | Path, *, device: str | torch.device = "cpu") -> fx.GraphModule:
    """Rebuild the graph from ``spec.yaml`` and load ``model.safetensors`` into it (strict)."""
    directory = Path(directory)
    for name in (SPEC_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise SpecError([Problem(f"not a crate-compose build: {name} is missing", (), Location(str(directory)))])
    spec = loader.load(directory / SPEC_FILE)
    where = Location(str(directory / WEIGHTS_FILE))
    try:
        tensors = read_weights(directory / WEIGHTS_FILE, tied(spec))
    except ValueError as error:
        raise SpecError([Problem(str(error), (), where)]) from None
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    module = compile_spec(spec, device="cpu", dtype=dtype)
    mismatch = first_mismatch(module.state_dict(), tensors)
    if mismatch:
        raise SpecError([Problem(f"weights do not match the spec: {mismatch}", (), where)])
    module.load_state_dict(tensors, strict=True)
    return module.to(device)

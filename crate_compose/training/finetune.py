"""Fine-tuning: a run that starts from the weights of another build (``train --init DIR [--freeze encoder]``).

``DIR`` is a build folder (``spec.yaml`` and ``model.safetensors``): the output of
``crate-compose build --out``, a run's ``final/`` or a checkpoint. The run builds its own spec as
usual (with its ``--set`` overrides and the sizes the data sets), then copies ``DIR``'s tensors
into it by name (:func:`apply_init`):

* every tensor of the new model that ``DIR`` holds with the same shape is copied;
* a tensor of the head (the spec's ``head`` part, names under ``head.``) that ``DIR`` lacks or
  holds with another shape (another number of classes) keeps its fresh initialization, with a note;
* any other tensor of the new model that ``DIR`` lacks or holds with another shape, and a tensor of
  ``DIR`` left over inside a step the new model takes from it (a step is taken whole or not at
  all), is an error naming the weights file, the tensor and both shapes, before anything is written;
* the steps of ``DIR`` that the new model does not have (a masked autoencoder's decoder and mask
  token when its encoder is fine-tuned with a classifier head, as the papers do) are not used, with
  a note: the check is on tensors, not on the two specs.

``--freeze encoder`` (:func:`freeze`) trains the head alone: every parameter not under ``head.`` gets
``requires_grad = False`` and is not given to the optimizer.

The initialization is part of the run's identity (:mod:`crate_compose.training.run_folder.identity`): the resolved
path of ``DIR`` and the SHA-256 of its weights file, and the freeze choice, so a run resumed from
another ``DIR``, or after ``DIR``'s weights changed, or with another freeze, is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..building.artifacts import SPEC_FILE, WEIGHTS_FILE, read_weights
from ..building.builder import spec_of
from ..building.plan import part_of, target, tied
from ..building.ties import untie
from ..errors import TrainError
from ..files import sha256_of
from ..settings import FREEZES
from ..spec_language import loader

HEAD = "head."  # the module paths of the spec's head part
SHOWN = 5  # tensors named in one error before "and N more"


@dataclass
class Init:
    """The build a run starts from: its folder as given, its weights file, their SHA-256, and the
    tensors (tied names completed from the folder's spec) until :func:`apply_init` has used them."""

    folder: Path
    weights: Path
    sha256: str
    tensors: dict[str, torch.Tensor] = field(repr=False)
    stored: frozenset[str] = frozenset()  # the names the file holds (a tied tensor once)
    steps: frozenset[str] = frozenset()  # the module path of every step of the folder's spec

    def identity(self) -> dict[str, str]:
        """What the run records: the folder's resolved path and the SHA-256 of its weights file."""
        return {"path": str(self.folder.resolve()), "sha256": self.sha256}


def check_freeze(freeze: str) -> None:
    if freeze not in FREEZES:
        raise TrainError(f"--freeze {freeze!r}: expected one of: {', '.join(FREEZES)}")


def start_identity(init: Init | None, freeze: str) -> dict[str, Any]:
    """The keys a fine-tuning run adds to its identity: ``init`` (path, SHA-256) when it starts from a
    build, ``freeze`` when a part is frozen; nothing for a run from fresh weights, whose identity (and
    hash) is the one it always had."""
    out: dict[str, Any] = {}
    if init is not None:
        out["init"] = init.identity()
    if freeze != "none":
        out["freeze"] = freeze
    return out


def read_init(folder: str | Path) -> Init:
    """Read the build folder ``folder`` (its spec for the ties and the steps, its weights and their
    SHA-256); :class:`TrainError` (or the spec's located ``SpecError``) when it is not one."""
    folder = Path(folder)
    where = f"--init {folder}"
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a folder"
        raise TrainError(
            f"{where} {what}: give a build folder (spec.yaml and model.safetensors: the output of "
            "crate-compose build --out, a run's final/ or a checkpoint)"
        )
    for name in (SPEC_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise TrainError(
                f"{where}: no {name} there, so it is not a build folder (give the output of "
                "crate-compose build --out, a run's final/ or a checkpoint)"
            )
    spec = loader.load(folder / SPEC_FILE)
    weights = folder / WEIGHTS_FILE
    try:
        sha256 = sha256_of(weights)
        tensors = read_weights(weights, tied(spec))
        with safe_open(weights, "pt") as handle:
            stored = frozenset(handle.keys())
    except OSError as error:
        raise TrainError(f"{where}: {weights} cannot be read ({error.strerror or error})") from None
    except ValueError as error:
        raise TrainError(f"{where}: {error}") from None
    return Init(folder, weights, sha256, tensors, stored, frozenset(step_paths(spec)))


def step_paths(spec) -> list[str]:
    """The module path of every step of ``spec`` (``preprocess.mask``, ``encoder.layer_0.compress``)."""
    return [target(role, layer, part_of(path), step.name) for role, layer, path, step in spec.stages()]


def _step_of(name: str, steps: frozenset[str] | set[str]) -> str | None:
    """The step a tensor belongs to: the longest step path that is a prefix of its name."""
    owners = [step for step in steps if name.startswith(step + ".")]
    return max(owners, key=len) if owners else None


def _shape(tensor: torch.Tensor) -> str:
    return str(tuple(tensor.shape))


@dataclass
class Fit:
    """How ``init``'s tensors meet a model's (:func:`fit_init`): the copies ``(name, ours, theirs)``,
    the head tensors left new by step, and init's tensors not used by step."""

    copies: list[tuple[str, torch.Tensor, torch.Tensor]]
    fresh: dict[str, list[tuple[str, torch.Tensor, torch.Tensor | None]]]
    unused: dict[str, list[str]]
    own: dict[str, torch.Tensor]
    steps: set[str]


def apply_init(model: torch.nn.Module, init: Init) -> list[str]:
    """Copy ``init``'s tensors into ``model`` by name (see the module docstring); return the notes
    (head tensors left newly initialized, tensors of ``init`` not used). Raises :class:`TrainError`
    listing every tensor that does not fit, before ``model`` is changed."""
    fit = fit_init(model, init)
    with torch.no_grad():
        for _, tensor, theirs in fit.copies:
            tensor.copy_(theirs)
    return _fit_notes(fit, init, spec_of(model).name)


def fit_init(model: torch.nn.Module, init: Init) -> Fit:
    """Match ``init``'s tensors to ``model``'s by name and shape, ``model`` untouched (its tensors may be
    on the meta device: an ablation checks every variant so before any trains); :class:`TrainError`
    listing every tensor that does not fit (see the module docstring)."""
    spec = spec_of(model)
    ties = tied(spec)
    own = untie(model.state_dict(), ties)  # a tied tensor once, under its source's name
    steps = set(step_paths(spec))
    found, weights, folder = init.tensors, init.weights, init.folder
    copies: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    used: set[str] = set()  # names of init's tensors accounted for
    problems: list[str] = []
    fresh: dict[str, list[tuple[str, torch.Tensor, torch.Tensor | None]]] = {}  # head step -> its new tensors
    for name, tensor in own.items():
        theirs = found.get(name)
        if theirs is not None:
            used.add(name)
        if (
            theirs is not None
            and theirs.shape == tensor.shape
            and theirs.is_floating_point() == tensor.is_floating_point()
        ):
            if theirs.is_floating_point() and not torch.isfinite(theirs).all():
                problems.append(f"{name} holds NaN or infinite values in {weights} (a diverged run?)")
            copies.append((name, tensor, theirs))
        elif name.startswith(HEAD):
            fresh.setdefault(_step_of(name, steps) or name, []).append((name, tensor, theirs))
        elif theirs is None:
            problems.append(f"{name} {_shape(tensor)} is not in {weights}")
        elif theirs.shape != tensor.shape:
            problems.append(f"{name} is {_shape(theirs)} in {weights}, {_shape(tensor)} here")
        else:
            problems.append(f"{name} is {theirs.dtype} in {weights}, {tensor.dtype} here")
    taken = {_step_of(name, steps) for name, _, _ in copies}  # the steps the model takes from init
    unused: dict[str, list[str]] = {}
    for name in sorted(init.stored - used):
        step = _step_of(name, steps)
        if step is not None and step in taken and name not in ties and not name.startswith(HEAD):
            problems.append(
                f"{name} {_shape(found[name])} is in {weights}, but step {step} here has no such "
                "tensor (a step is taken whole: the two specs' primitives differ there)"
            )
        else:
            unused.setdefault(_step_of(name, init.steps) or name.rsplit(".", 1)[0], []).append(name)
    if problems:
        more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        count = f"{len(problems)} tensor{'s' * (len(problems) != 1)}"
        raise TrainError(
            f"--init {folder}: {count} of the weights do not fit spec '{spec.name}' (only the head's "
            "may differ; it is then newly initialized): " + "; ".join(problems[:SHOWN]) + more + ". Nothing was written"
        )
    return Fit(copies, fresh, unused, own, steps)


def _fit_notes(fit: Fit, init: Init, spec_name: str) -> list[str]:
    """What :func:`apply_init` says: head steps left new, and init's tensors the model does not use."""
    own, steps, folder, unused = fit.own, fit.steps, init.folder, fit.unused
    notes = []
    for step, new in fit.fresh.items():
        whole = [name for name in own if _step_of(name, steps) == step]
        if len(whole) > 1 and len(new) == len(whole) and all(theirs is None for _, _, theirs in new):
            notes.append(f"{step} ({len(whole)} tensors) is not in {folder}: left newly initialized")
            continue
        for name, tensor, theirs in new:
            said = (
                f"{name} {_shape(tensor)} is not in {folder}"
                if theirs is None
                else f"{name} is {_shape(tensor)} here, {_shape(theirs)} in {folder}"
                if theirs.shape != tensor.shape
                else f"{name} is {tensor.dtype} here, {theirs.dtype} in {folder}"
            )
            notes.append(f"{said}: left newly initialized")
    if unused:
        groups = ", ".join(
            f"{step} ({len(names)} tensor{'s' * (len(names) != 1)})" if names != [step] else step
            for step, names in _grouped(unused, init.stored).items()
        )
        total = sum(len(names) for names in unused.values())
        notes.append(f"{total} tensor{'s' * (total != 1)} of {folder} not used by spec '{spec_name}': {groups}")
    return notes


def _grouped(unused: dict[str, list[str]], stored: frozenset[str]) -> dict[str, list[str]]:
    """Unused tensors by step, the steps of one part said as ``part.*`` when none of the tensors
    ``stored`` under that part is used (``decoder.layer_0.inverse_compress``, ... -> ``decoder.*``)."""
    parts: dict[str, list[str]] = {}
    for step in unused:
        parts.setdefault(step.split(".", 1)[0], []).append(step)
    out: dict[str, list[str]] = {}
    for part, listed in parts.items():
        names = {name for step in listed for name in unused[step]}
        if len(listed) > 1 and {name for name in stored if name.split(".", 1)[0] == part} <= names:
            out[f"{part}.*"] = sorted(names)
        else:
            out.update({step: unused[step] for step in listed})
    return out


def freeze(model: torch.nn.Module, what: str) -> int:
    """Freeze every parameter not under ``head.`` (``what == "encoder"``; ``"none"``: nothing);
    return the parameters that train. :class:`TrainError` when nothing would train."""
    check_freeze(what)
    if what == "encoder":
        for name, parameter in model.named_parameters():
            if not name.startswith(HEAD):
                parameter.requires_grad_(False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if what == "encoder" and not trainable:
        name = spec_of(model).name
        heads = [n for n, _ in model.named_parameters() if n.startswith(HEAD)]
        why = "has no head" if not heads else "has a head without its own parameters (tied to frozen ones)"
        raise TrainError(
            f"--freeze encoder: spec '{name}' {why}, so nothing would train; train it whole (--freeze none)"
        )
    return trainable

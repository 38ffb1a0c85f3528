"""The correspondence between a built network's tensors and a family's checkpoint names.

:func:`correspond` walks the network's plan (every step in execution order, with its module path)
and finds, for each tensor of each step, the authors' name and layout change (:mod:`.families`).
:func:`check` compares a checkpoint with it and lists every tensor that is missing, extra or of
another shape, naming both sides; :func:`to_ours` and :func:`to_theirs` convert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from ..building.plan import PlannedStep
from .families import Family, Layout


@dataclass(frozen=True)
class Pair:
    """One tensor: our name, the authors' name, how the layout changes, and the step it belongs to."""

    ours: str
    theirs: str
    layout: Layout
    step: PlannedStep


def correspond(
    steps: Iterable[PlannedStep], ours: dict[str, torch.Tensor], family: Family
) -> tuple[list[Pair], list[str]]:
    """The pairs for every tensor of ``ours`` (a state dict of the network planned as ``steps``), and a
    problem for each step or tensor the family has no place for."""
    pairs: list[Pair] = []
    problems: list[str] = []
    owners = sorted(steps, key=lambda s: -len(s.target))  # the longest module path owns a tensor
    for name in ours:
        step = next((s for s in owners if name.startswith(s.target + ".")), None)
        if step is None:
            problems.append(f"{name} belongs to no step of the spec")
            continue
        primitive = step.step.primitive
        place = family.place(step.role, step.part, primitive)
        where = f"{step.target} ({primitive}, {_position(step)})"
        if place is None:
            problems.append(f"{where} has no counterpart in {family.name} checkpoints ({family.code})")
            continue
        found = place.theirs(name[len(step.target) + 1 :], step.layer)
        if found is None:
            problems.append(
                f"{name}: {family.name}'s {primitive} steps have no such tensor (they have {', '.join(place.tensors)})"
            )
            continue
        pairs.append(Pair(name, found[0], found[1], step))
    return pairs, _unique(problems)


def _position(step: PlannedStep) -> str:
    if step.layer is not None:
        return f"{step.role} layer {step.layer}"
    return step.role + (f" {step.part}" if step.part and step.part != "layer" else "")


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def check(
    pairs: list[Pair],
    ours: dict[str, torch.Tensor],
    theirs: dict[str, torch.Tensor],
    family: Family,
    tied: dict[str, str],
) -> tuple[list[str], list[str]]:
    """Every way ``theirs`` does not fit ``ours`` (missing, extra, other shapes, tied tensors that differ),
    and the authors' tensors left out on purpose (their forward never reads them), as text."""
    problems: list[str] = []
    for pair in pairs:
        want = tuple(ours[pair.ours].shape)
        if pair.theirs not in theirs:
            problems.append(f"{pair.theirs} is missing from the checkpoint (it would fill {pair.ours}, {want})")
            continue
        got = tuple(pair.layout.to_ours(theirs[pair.theirs]).shape)
        if got != want:
            shape = tuple(theirs[pair.theirs].shape)
            problems.append(
                f"{pair.theirs} is {shape} in the checkpoint; {pair.ours} is {want} in the spec"
                + (f" (after {pair.layout.name}: {got})" if got != shape else "")
            )
    used = {pair.theirs for pair in pairs}
    skipped = []
    for name in theirs:
        if name in used:
            continue
        why = family.is_unused(name)
        if why:
            skipped.append(f"{name}: {why}")
        else:
            problems.append(f"{name} {tuple(theirs[name].shape)} is in the checkpoint but has no place in the spec")
    by_ours = {pair.ours: pair.theirs for pair in pairs}
    for own, source in tied.items():  # a tied pair of ours must come from one tensor of theirs
        a, b = by_ours.get(own), by_ours.get(source)
        if (
            a
            and b
            and a != b
            and a in theirs
            and b in theirs
            and theirs[a].shape == theirs[b].shape
            and not theirs[a].is_meta
            and not torch.equal(theirs[a], theirs[b])
        ):
            problems.append(f"{own} is tied to {source} in the spec, but the checkpoint's {a} and {b} differ")
    return problems, skipped


def to_ours(pairs: list[Pair], theirs: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our state dict from the authors' tensors (floating tensors cast to ``dtype``)."""
    state = {}
    for pair in pairs:
        tensor = pair.layout.to_ours(theirs[pair.theirs])
        state[pair.ours] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return state


def to_theirs(pairs: list[Pair], ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The authors' state dict from ours (each tensor its own contiguous copy)."""
    return {pair.theirs: pair.layout.to_theirs(ours[pair.ours].detach()).contiguous().clone() for pair in pairs}


def notes_on_arguments(pairs: list[Pair], family: Family) -> list[str]:
    """A note for each argument of a step that differs from the value the authors' code fixes."""
    notes, seen = [], set()
    for pair in pairs:
        step = pair.step
        place = family.place(step.role, step.part, step.step.primitive)
        if step.target in seen or place is None or step.args is None:
            continue
        seen.add(step.target)
        for key, value in place.args.items():
            have = getattr(step.args, key, None)
            if have != value:
                notes.append(f"{step.target} has {key}={have!r}; {family.name}'s code computes with {value!r}")
    return notes

"""Weight ties: one tensor shared by two steps.

A step's ``tie`` maps one of its own parameters to an earlier step's, by module path::

    head:
      - name: lm_head
        primitive: lm_head
        args: {vocab: 50257}
        tie: {weight: preprocess.embed.weight}   # GPT-2 and causal CRATE: head = token embedding

The builder makes the two names refer to one ``nn.Parameter`` (:func:`apply`), so parameter counts
count it once, an optimizer updates it once, and moving or casting the model keeps it shared.
Weights files hold it once, under the source's name (:func:`untie` before saving, :func:`retie`
after loading; :func:`crate_compose.building.plan.tied` lists a spec's ties): safetensors refuses two
names for one storage, and one name is the honest layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

if TYPE_CHECKING:
    from .plan import Tie


def apply(module: nn.Module, step_name: str, ties: Iterable[Tie], built: dict[str, nn.Module]) -> None:
    """Make ``module``'s parameters named in ``ties`` (resolved by the plan,
    :class:`crate_compose.building.plan.Tie`) the very parameters of earlier steps (``built``: module
    path -> module, the steps placed so far). Raises ``ValueError`` saying what does not fit."""
    for tie in ties:
        own, source = tie.own, tie.source
        mine = _parameter(module, own, f"step '{step_name}' has no parameter '{own}'")
        if tie.owner is None:
            earlier = ", ".join(sorted(built)) or "none"
            raise ValueError(
                f"tie {own}: {source}: no earlier step is '{source.rsplit('.', 1)[0]}'; earlier: {earlier}"
            )
        theirs = _parameter(
            built[tie.owner], tie.parameter, f"tie {own}: {source}: '{tie.owner}' has no parameter '{tie.parameter}'"
        )
        if mine.shape != theirs.shape:
            raise ValueError(
                f"tie {own}: {source}: shapes differ, {tuple(mine.shape)} here and {tuple(theirs.shape)} there"
            )
        parent, _, leaf = own.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, leaf, theirs)


def _parameter(module: nn.Module, name: str, message: str) -> nn.Parameter:
    try:
        return module.get_parameter(name)
    except AttributeError:
        names = ", ".join(n for n, _ in module.named_parameters()) or "none"
        raise ValueError(f"{message}; its parameters: {names}") from None


def untie(tensors: dict[str, torch.Tensor], tied: dict[str, str]) -> dict[str, torch.Tensor]:
    """A state dict with each tied tensor once, under its source's name (for saving); ``tied`` is
    :func:`crate_compose.building.plan.tied` of the spec."""
    return {name: value for name, value in tensors.items() if name not in tied}


def retie(tensors: dict[str, torch.Tensor], tied: dict[str, str]) -> dict[str, torch.Tensor]:
    """A saved state dict completed with the tied names (for ``load_state_dict(strict=True)``)."""
    out = dict(tensors)
    for name, source in tied.items():
        if source in out and name not in out:
            out[name] = out[source]
    return out

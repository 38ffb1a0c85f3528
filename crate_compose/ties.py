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
after loading; :func:`crate_compose.footprints.tied` lists a spec's ties): safetensors refuses two
names for one storage, and one name is the honest layout.
"""

from __future__ import annotations

import torch
from torch import nn


def apply(module: nn.Module, step_name: str, tie: dict[str, str], built: dict[str, nn.Module]) -> None:
    """Make ``module``'s parameters named in ``tie`` the very parameters of earlier steps (``built``:
    module path -> module, the steps placed so far). Raises ``ValueError`` saying what does not fit."""
    for own, source in tie.items():
        mine = _parameter(module, own, f"step '{step_name}' has no parameter '{own}'")
        owner_path, _, param_path = _split(source, built)
        if owner_path is None:
            earlier = ", ".join(sorted(built)) or "none"
            raise ValueError(f"tie {own}: {source}: no earlier step is '{source.rsplit('.', 1)[0]}'; earlier: {earlier}")
        theirs = _parameter(built[owner_path], param_path, f"tie {own}: {source}: '{owner_path}' has no "
                            f"parameter '{param_path}'")
        if mine.shape != theirs.shape:
            raise ValueError(
                f"tie {own}: {source}: shapes differ, {tuple(mine.shape)} here and {tuple(theirs.shape)} there"
            )
        parent, _, leaf = own.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, leaf, theirs)


def _split(source: str, built: dict[str, nn.Module]) -> tuple[str | None, str, str]:
    """``preprocess.embed.weight`` -> (``preprocess.embed``, ``.``, ``weight``): the longest module path."""
    words = source.split(".")
    for end in range(len(words) - 1, 0, -1):
        owner = ".".join(words[:end])
        if owner in built:
            return owner, ".", ".".join(words[end:])
    return None, "", ""


def _parameter(module: nn.Module, name: str, message: str) -> nn.Parameter:
    try:
        return module.get_parameter(name)
    except AttributeError:
        names = ", ".join(n for n, _ in module.named_parameters()) or "none"
        raise ValueError(f"{message}; its parameters: {names}") from None


def untie(tensors: dict[str, torch.Tensor], tied: dict[str, str]) -> dict[str, torch.Tensor]:
    """A state dict with each tied tensor once, under its source's name (for saving); ``tied`` is
    :func:`crate_compose.footprints.tied` of the spec."""
    return {name: value for name, value in tensors.items() if name not in tied}


def retie(tensors: dict[str, torch.Tensor], tied: dict[str, str]) -> dict[str, torch.Tensor]:
    """A saved state dict completed with the tied names (for ``load_state_dict(strict=True)``)."""
    out = dict(tensors)
    for name, source in tied.items():
        if source in out and name not in out:
            out[name] = out[source]
    return out

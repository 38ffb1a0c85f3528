"""Where each family of the authors' code keeps the tensors of each kind of step.

A :class:`Family` is a table, one :class:`Place` per kind of step: the step's role in the network
(``encoder``, ``decoder``, a stack's name...), its primitive, and for each of its tensors the
authors' name (``{layer}`` is the layer's index) and the :class:`Layout` change between the two. The
tables are written from the authors' public code, named in ``Family.code``; the tests build state
dicts with those names from an independent reading of the same code and compare outputs.

Steps are matched by role and primitive, never by the step's name in the spec, so a spec may call
its steps anything. The families themselves are declared, each registering itself
(:func:`.catalog.family`), in :mod:`.authors` (the papers' authors' code bases) and :mod:`.peers` (the
baselines' own releases).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the tables are read by the command line before torch is imported
    import torch


@dataclass(frozen=True)
class Layout:
    """How a tensor's layout differs between the authors' code and ours."""

    name: str
    to_ours: Callable[[torch.Tensor], torch.Tensor]
    to_theirs: Callable[[torch.Tensor], torch.Tensor]


SAME = Layout("same", lambda t: t, lambda t: t)
TRANSPOSED = Layout("transposed", lambda t: t.t(), lambda t: t.t())
BATCHED = Layout("a leading axis of 1", lambda t: t.unsqueeze(0), lambda t: t.squeeze(0))  # (n, d) <-> (1, n, d)


@dataclass(frozen=True)
class Place:
    """The authors' names of one kind of step's tensors: ``tensors`` maps our name inside the step
    (``subspaces.weight``) to theirs (``transformer.layers.{layer}.0.fn.qkv.weight``), or to
    ``(theirs, layout)``. ``part`` narrows a stack role to its ``pre``, ``layer`` or ``post`` steps;
    ``args`` are values the authors' code fixes (a spec that differs gets a note)."""

    role: str
    primitive: str
    tensors: dict[str, str | tuple[str, Layout]]
    part: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def matches(self, role: str, part: str | None, primitive: str) -> bool:
        return self.role == role and self.primitive == primitive and (self.part is None or self.part == part)

    def theirs(self, ours: str, layer: int | None) -> tuple[str, Layout] | None:
        entry = self.tensors.get(ours)
        if entry is None:
            return None
        name, layout = (entry, SAME) if isinstance(entry, str) else entry
        return name.format(layer=layer), layout


@functools.cache
def _resolved_sizes(preset: str) -> dict[str, Any]:
    # imported on first use: importing the families parses no YAML
    from ..spec_language.loader import load
    from ..spec_language.zoo import presets

    return dict(load(presets()[preset]).sizes)


def preset_sizes(preset: str, keys: Iterable[str]) -> dict[str, Any]:
    """The sizes ``keys`` of the zoo preset ``preset`` as it resolves (its spec's defaults filled in), in
    the order of ``keys``; each preset is read once."""
    sizes, keys = _resolved_sizes(preset), tuple(keys)
    missing = [k for k in keys if k not in sizes]
    if missing:
        raise KeyError(f"the zoo preset {preset} gives no {', '.join(missing)}")
    return {k: sizes[k] for k in keys}


class Published(Mapping[str, dict[str, Any]]):
    """The sizes of the models a family's code registers by name, as ``table()`` gives them, in the order
    the code registers them. ``presets`` maps the names whose model is a zoo preset to the preset, whose
    sizes the table takes (:func:`preset_sizes`). The table is made on first reading, so importing the
    families (the command line does, before torch) parses no YAML."""

    def __init__(self, table: Callable[[], dict[str, dict[str, Any]]], presets: dict[str, str] | None = None):
        self.presets = dict(presets or {})
        self._make = table
        self._table: dict[str, dict[str, Any]] | None = None

    def _read(self) -> dict[str, dict[str, Any]]:
        if self._table is None:
            self._table = self._make()
        return self._table

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return f"Published({self._read()!r})"


@dataclass(frozen=True)
class Family:
    """One code base's checkpoints: where each step's tensors are (``places``), the tensors its forward
    never reads (``unused``: a pattern and why; skipped on import, written on export by ``fill``),
    the key its training script nests the weights under (``nest``), the spec that builds its models
    (``spec``), how to read the sizes from a checkpoint's shapes (``sizes``) and from the arguments its
    training script recorded beside the weights (``recorded``: given :attr:`.reading.Checkpoint.recorded`),
    and the sizes of the models its code registers by name (``published``: a :class:`Published` where some
    are zoo presets)."""

    name: str
    code: str
    spec: str
    marker: str | Callable[[dict[str, torch.Tensor]], bool]  # a tensor name only this family's checkpoints hold,
    # or a test of the names (how a file's family is told)
    places: tuple[Place, ...]
    sizes: Callable[[dict[str, torch.Tensor]], dict[str, int]]
    unused: dict[str, str] = field(default_factory=dict)
    fill: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    nest: str | None = None
    recorded: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    published: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    # the names one layout of the family's files uses, given the other's (a hub's files that drop a prefix)
    canonical: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    declared_in: str = ""  # the module that registered it (crate_compose.interop.catalog.family)

    def place(self, role: str, part: str | None, primitive: str) -> Place | None:
        return next((p for p in self.places if p.matches(role, part, primitive)), None)

    def holds(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Whether ``tensors`` are named as this family's code names them (:attr:`marker`)."""
        return self.marker(tensors) if callable(self.marker) else self.marker in tensors

    def is_unused(self, name: str) -> str | None:
        return next((why for pattern, why in self.unused.items() if re.fullmatch(pattern, name)), None)

    def model(self, name: str, where: str) -> dict[str, Any]:
        """The sizes of the published model ``name`` (as the family's code registers it), for ``where``
        (what recorded the name); an unknown name is refused with the known ones."""
        if name not in self.published:
            raise ValueError(
                f"{where} is {name!r}, which {self.code} does not define (it defines {', '.join(self.published)})"
            )
        return dict(self.published[name])

    def matching(self, sizes: dict[str, Any]) -> list[str]:
        """The published models whose sizes agree with every size in ``sizes`` they give."""
        return [
            name for name, known in self.published.items() if all(known[k] == v for k, v in sizes.items() if k in known)
        ]


def pair(ours: str, theirs: str, *suffixes: str) -> dict[str, str]:
    """``{ours.weight: theirs.weight, ours.bias: theirs.bias}`` (or the given suffixes)."""
    return {f"{ours}.{s}" if ours else s: f"{theirs}.{s}" for s in (suffixes or ("weight", "bias"))}


def layer_count(tensors: dict[str, torch.Tensor], pattern: str) -> int:
    """How many distinct layer indices ``pattern`` (with one group) finds among the keys."""
    return len({m.group(1) for k in tensors if (m := re.match(pattern, k))})


def image_side(positions: torch.Tensor, patch: int) -> int:
    """The image side a position table (1, 1 + side^2, d) with a class token's row implies."""
    return math.isqrt(positions.shape[1] - 1) * patch


def conv_patch_sizes(weight: torch.Tensor, positions: torch.Tensor) -> dict[str, int]:
    """Width, patch size, channels and image side from a strided patch convolution and the position table."""
    d, patch = weight.shape[0], weight.shape[-1]
    return {"d": d, "patch_size": patch, "channels": weight.shape[1], "image_size": image_side(positions, patch)}


def head_sizes(inner: int) -> dict[str, int]:
    """One shared projection of ``K*p x d`` rows does not give the heads ``K``: ``inner`` is ``K*p``,
    resolved by the recorded arguments, a published model of the same shapes, or ``--set sizes.heads``
    (:func:`.exchange.infer_sizes`)."""
    return {"inner": inner}


def gpt2_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    vocab, d = t["transformer.wte.weight"].shape
    return {
        "vocab": vocab,
        "d": d,
        "context": t["transformer.wpe.weight"].shape[0],
        "depth": layer_count(t, r"transformer\.h\.(\d+)\."),
    }


LM_EMBEDDINGS = (
    Place("preprocess", "token_embed", {"weight": "transformer.wte.weight"}),
    Place("preprocess", "positions", {"embedding": ("transformer.wpe.weight", BATCHED)}),
    Place("head", "lm_head", {"weight": "lm_head.weight"}),
)

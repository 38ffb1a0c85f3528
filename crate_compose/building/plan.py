"""The plan of a network: every step of a spec in execution order, with where it goes. No torch.

A spec says *what* each step is; the plan adds *where*: for each step of the unrolled network its
role (``preprocess``, ``encoder``, ``decoder``, a stack's name, ``head``), its layer, its spec path,
its arguments validated once against the primitive's model, the module path it is installed at
(``encoder.layer_3.compress``) and the name of its fx node (``compress_3``). Weight ties are
resolved once here, by module path.

Everything downstream reads this one plan: the march (:mod:`crate_compose.building.march`) follows
it through the footprints (``validate``, ``inspect``, derivation, the memory budget) or through the
modules it builds (``build``), and the saved artifacts name their tensors by its module paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import registry
from ..spec_language.spec import Spec, Step

if TYPE_CHECKING:
    from ..registry import Args, Primitive

ROLES_WITHOUT_LAYERS = ("preprocess", "head")
STACK_PARTS = ("pre", "layer", "post")


def target(role: str, layer: int | None, part: str | None, name: str) -> str:
    """The submodule path: ``preprocess.patch_embed``, ``encoder.layer_3.compress``, ``encoder.norm``."""
    if role in ROLES_WITHOUT_LAYERS:
        return f"{role}.{name}"
    return f"{role}.layer_{layer}.{name}" if part == "layer" else f"{role}.{name}"


def part_of(path: tuple) -> str | None:
    """``pre``, ``layer`` or ``post`` for a step inside a stack; ``None`` in preprocess and head."""
    return path[-2] if isinstance(path[-2], str) and path[-2] in STACK_PARTS else None


def node_name(role: str, layer: int | None, name: str) -> str:
    """The fx node of a step: ``patch_embed``, ``compress_3``, ``decoder_compress_0``."""
    if role in ROLES_WITHOUT_LAYERS:
        return name
    base = name if role == "encoder" else f"{role}_{name}"
    return base if layer is None else f"{base}_{layer}"


@dataclass(frozen=True)
class Tie:
    """A tied parameter, resolved: the step's own parameter ``own`` is the tensor ``source`` names,
    the parameter ``parameter`` of the earlier step at module path ``owner`` (``None`` when no
    earlier step is a prefix of ``source``)."""

    own: str
    source: str
    owner: str | None
    parameter: str


@dataclass(frozen=True)
class PlannedStep:
    """One step of the unrolled network and where it goes.

    ``args`` is the step's arguments validated against its primitive's model (``None`` when the
    primitive is unknown or the arguments do not validate: the loader reports both, so a plan of a
    loaded spec has neither). ``ties``: each tied parameter of the step and the tensor it shares,
    resolved against the steps before it (:class:`Tie`)."""

    role: str
    layer: int | None
    part: str | None
    path: tuple
    step: Step
    primitive: Primitive | None
    args: Args | None
    target: str
    node: str
    ties: tuple[Tie, ...] = ()

    @property
    def where(self) -> str:
        """``encoder layer 3``, ``head``: how messages name the step's place."""
        return f"{self.role} layer {self.layer}" if self.layer is not None else self.role


def plan(spec: Spec) -> list[PlannedStep]:
    """Every step of ``spec`` (its decoder already explicit) in execution order, each argument
    model validated once."""
    planned: list[PlannedStep] = []
    for role, layer, path, step in spec.stages():
        planned.append(_planned(role, layer, path, step, {p.target for p in planned}))
    return planned


def _planned(role: str, layer: int | None, path: tuple, step: Step, earlier: set[str]) -> PlannedStep:
    primitive = registry.get(step.primitive)
    args = None
    if primitive is not None:
        try:
            args = primitive.args.model_validate(step.args)
        except ValueError:  # the loader reports it where the spec writes it
            args = None
    part = part_of(path)
    return PlannedStep(
        role,
        layer,
        part,
        path,
        step,
        primitive,
        args,
        target(role, layer, part, step.name),
        node_name(role, layer, step.name),
        tuple(resolve(own, source, earlier) for own, source in step.tie.items()),
    )


def resolve(own: str, source: str, earlier: set[str]) -> Tie:
    """``preprocess.embed.weight`` -> owner ``preprocess.embed``, parameter ``weight``: the longest
    earlier module path that prefixes ``source``."""
    words = source.split(".")
    for end in range(len(words) - 1, 0, -1):
        owner = ".".join(words[:end])
        if owner in earlier:
            return Tie(own, source, owner, ".".join(words[end:]))
    return Tie(own, source, None, "")


def tied(spec: Spec) -> dict[str, str]:
    """Every tied parameter of ``spec``: ``{its name: the name of the tensor it shares}``, as module
    paths (``head.lm_head.weight: preprocess.embed.weight``); see :mod:`crate_compose.building.ties`."""
    return {
        f"{target(role, layer, part_of(path), step.name)}.{own}": source
        for role, layer, path, step in spec.stages()
        for own, source in step.tie.items()
    }

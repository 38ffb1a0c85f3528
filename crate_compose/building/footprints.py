"""Shapes without torch: a spec walked step by step through the primitives' footprints.

Each registered primitive may declare a *footprint* (:class:`~crate_compose.registry.Footprint`):
its output shape, parameter shapes, published shapes and residual form, as plain arithmetic on
its arguments and input shape. When every step of a spec has one, :func:`walk` follows the token
stream through the whole network in a few milliseconds, and ``validate`` answers without
importing torch (a tenth of the time of ``import torch`` alone).

The walk is the march (:mod:`crate_compose.building.march`) with the :class:`Footprints`
evaluator. It only ever *certifies* a spec. Anything it cannot settle with certainty (a plugin
primitive without a footprint, a zero-size shape, a weight tie that does not fit, a swap's hint
that needs a primitive without a footprint) makes it return ``None``, and the caller places the
steps on the meta device instead (:func:`crate_compose.building.placement.place`), which reports
the problem where the spec wrote it. A step whose footprint refuses its input is certain, and is
reported by the march exactly as placement reports it. Placement checks every footprint against
the module it builds, so a footprint that disagrees with its module is an error there, not a
silent difference.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from .. import registry
from ..registry import Context, Shape
from ..spec_language.spec import Spec
from .march import Marched, Unfit, Unsettled, candidates, march
from .plan import PlannedStep, Tie

ADDRESSABLE = 2**63  # torch addresses a tensor's bytes with 64 bits
# The walk settles shapes whose every axis is below this, so that any tensor a step makes inside (at
# most three axes' worth: K x n x n scores, C x H x W feature maps) is addressable for a batch of two
# in float64: (2^19)^3 * 16 bytes < 2^63. Beyond it, placement on the meta device has the last word.
MAX_AXIS = 2**19


def walk(spec: Spec, steps: list[PlannedStep] | None = None) -> list[Marched] | None:
    """Every step of ``spec`` (its decoder already explicit) with its footprint, in execution
    order; ``None`` when some step cannot be settled without building it (see the module docstring).
    ``steps``: its plan, when the caller made it already."""
    try:
        return list(march(spec, Footprints(), steps))
    except Unsettled:
        return None


class Footprints:
    """The march's torch-free evaluator: each step's footprint, declared by its primitive."""

    builds = None  # a swap's hint that needs a primitive without a footprint is left to placement

    def begin(self, spec: Spec, shape: Shape) -> Shape:
        self.spec = spec
        if not _settled([shape]):
            raise Unsettled
        return shape

    def evaluate(
        self, planned: PlannedStep, value: Any, shape: Shape, context: Context, consumed: list[Shape]
    ) -> Marched:
        primitive, args = planned.primitive, planned.args
        if primitive is None or primitive.footprint is None or args is None:
            raise Unsettled
        takes_ids = primitive.example is not None and primitive.example.vocab is not None  # token_embed
        if context.ids != takes_ids:
            raise Unsettled  # ids into a step for tokens, or tokens into an embedding of ids: left to torch
        context.ids = False
        try:
            footprint = primitive.footprint(args, shape, context, *consumed)
        except ValueError as error:  # the step cannot take its input: certain, as the factory checks the same
            if _hint_needs_torch(self.spec, planned.path):
                raise Unsettled from None
            raise Unfit(str(error)) from None
        except Exception:  # a footprint's own failure: placement has the last word
            raise Unsettled from None
        shapes = [footprint.output, *footprint.publishes, *footprint.parameters.values()]
        if len(footprint.publishes) != len(primitive.publishes) or not _settled(shapes):
            raise Unsettled
        if planned.step.layer_scale is not None:
            if not footprint.residual:
                raise Unsettled
            footprint = replace(footprint, parameters={**footprint.parameters, "layer_scale": (shape[-1],)})
        return Marched(
            planned,
            shape,
            footprint,
            output=footprint.output,
            published=dict(zip(primitive.publishes, footprint.publishes)),
        )

    def tie(self, spec: Spec, marched: Marched, earlier: dict[str, Marched]) -> None:
        parameters = {place: step.footprint.parameters for place, step in earlier.items()}
        if not _ties_fit(marched.planned.ties, marched.footprint.parameters, parameters):
            raise Unsettled


def _hint_needs_torch(spec: Spec, path: tuple) -> bool:
    """A swapped step's hint tries every primitive of its kind: one without a footprint needs torch."""
    swap = spec.swaps().get(path)
    kind = registry.get(swap.primitive).kind if swap is not None and registry.get(swap.primitive) else None
    return kind is not None and any(p.footprint is None for _, p in candidates(kind))


def _settled(shapes: list[Shape]) -> bool:
    """Every axis above zero (zero-size tensors are left to torch) and below :data:`MAX_AXIS`."""
    return all(0 < size < MAX_AXIS for shape in shapes for size in shape) and all(
        math.prod(shape) * 16 < ADDRESSABLE for shape in shapes
    )


def _ties_fit(ties: tuple[Tie, ...], mine: dict[str, Shape], earlier: dict[str, dict[str, Shape]]) -> bool:
    """Every tie names one of the step's parameters and an earlier step's of the same shape."""
    return all(
        tie.own in mine and tie.owner is not None and earlier[tie.owner].get(tie.parameter) == mine[tie.own]
        for tie in ties
    )

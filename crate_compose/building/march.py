"""The march: one pass over a network's plan, each step given to an evaluator.

:func:`march` follows the plan (:func:`crate_compose.building.plan.plan`) in execution order and
owns everything that flows between steps: the per-sample shape of the token stream, the build
:class:`~crate_compose.registry.Context` earlier steps established (the patch grid), the values
steps publish for later ones to consume (``mask``, ``restore``), what each earlier step holds (for
weight ties), and where a step that cannot take its input is reported. What a step *does* is the
evaluator's:

* :class:`~crate_compose.building.footprints.Footprints` reads each primitive's footprint, plain
  arithmetic without torch (``validate``, ``inspect``, derivation, the memory budget). It only ever
  certifies: what it cannot settle raises :class:`Unsettled`, and the caller places the spec instead;
* :class:`~crate_compose.building.placement.Placement` builds each step's module and runs it on meta
  tensors (``build``), checking the module against its footprint.

Both yield one record type, :class:`Marched`, so every reader (the builder, ``inspect``'s summary,
derivation, the budget) reads the same fields whichever evaluator produced them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from .. import registry
from ..errors import Problem, SpecError
from ..registry import Context, Footprint, Shape
from ..spec_language.spec import Spec, Step
from .plan import PlannedStep, plan

if TYPE_CHECKING:
    from torch import nn


class Unsettled(Exception):
    """The evaluator cannot be certain of this step without building it (see the module docstring)."""


class Unfit(Exception):
    """The step cannot take its input; ``reason`` says why (the primitive's own words)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Marched:
    """One step of a marched network: its place (``planned``), the per-sample shape it takes, and its
    footprint (output shape, every parameter's shape including LayerScale's ``layer_scale``, the shapes
    it publishes, residual form, frozen parameters): declared by the primitive, or read off the module.

    A placement also gives the ``module`` built, its ``output`` and ``published`` values (meta tensors,
    or real ones for a real build) and the bytes its forward pass created for the placed batch."""

    planned: PlannedStep
    input_shape: Shape
    footprint: Footprint
    module: nn.Module | None = None
    output: Any = None
    published: dict[str, Any] = field(default_factory=dict)
    activation_bytes: int = 0

    role = property(lambda self: self.planned.role)
    layer = property(lambda self: self.planned.layer)
    part = property(lambda self: self.planned.part)
    path = property(lambda self: self.planned.path)
    step = property(lambda self: self.planned.step)
    primitive = property(lambda self: self.planned.primitive)
    target = property(lambda self: self.planned.target)
    node = property(lambda self: self.planned.node)

    @property
    def consumes(self) -> list[str]:
        return list(self.planned.primitive.consumes)

    @property
    def output_shape(self) -> Shape:
        return self.footprint.output


class Evaluator(Protocol):
    """What a step does, for :func:`march` (see the module docstring)."""

    builds: Callable[..., bool] | None  # tries a primitive without a footprint, for a swap's hint

    def begin(self, spec: Spec, shape: Shape) -> Any:
        """The value the first step takes (a shape, or a meta tensor of the input)."""

    def evaluate(
        self, planned: PlannedStep, value: Any, shape: Shape, context: Context, consumed: list[Any]
    ) -> Marched:
        """The step on ``value``; raises :class:`Unfit` when it cannot take it, :class:`Unsettled`
        when it cannot be sure."""

    def tie(self, spec: Spec, marched: Marched, earlier: dict[str, Marched]) -> None:
        """Make (or check) the step's weight ties to the earlier steps' parameters."""


def start(spec: Spec) -> tuple[Shape, Context]:
    """The per-sample input shape and the build context the first step sees."""
    shape = tuple(spec.input.shape)
    ids = spec.input.dtype == "int64"
    return shape, Context(image=shape if len(shape) == 3 and not ids else None, ids=ids)


def march(spec: Spec, evaluator: Evaluator, steps: list[PlannedStep] | None = None) -> Iterator[Marched]:
    """Every step of ``spec`` (its decoder already explicit) evaluated in execution order; ``steps``:
    its plan, when the caller made it already (a build marches twice over one plan)."""
    shape, context = start(spec)
    value = evaluator.begin(spec, shape)
    named: dict[str, Any] = {}  # values published so far, by name
    earlier: dict[str, Marched] = {}  # module path -> the step there, for ties
    for planned in plan(spec) if steps is None else steps:
        consumes = planned.primitive.consumes if planned.primitive is not None else ()
        missing = [name for name in consumes if name not in named]
        if missing:
            message = f"step '{planned.step.name}' ({planned.step.primitive}) needs {missing}, which no earlier step publishes"
            raise SpecError([Problem(message, planned.path, spec.locate(planned.path))])
        before = replace(context)
        try:
            marched = evaluator.evaluate(planned, value, shape, context, [named[name] for name in consumes])
        except Unfit as error:
            raise unfit(spec, planned, shape, before, error.reason, evaluator.builds) from None
        evaluator.tie(spec, marched, earlier)
        earlier[planned.target] = marched
        named.update(marched.published)
        yield marched
        value, shape = marched.output, marched.footprint.output


def unfit(
    spec: Spec,
    planned: PlannedStep,
    shape: Shape,
    context: Context,
    reason: str,
    builds: Callable[..., bool] | None = None,
) -> SpecError:
    """The problem of a step that cannot take its input, located where the spec wrote the step, or
    at the override that swapped its primitive (with the primitives of its kind that fit there);
    otherwise naming the sizes given in another file or ``--set``. ``builds(primitive, args, shape,
    context)`` tries a primitive without a footprint (on the meta device)."""
    step, path = planned.step, planned.path
    message = f"step '{step.name}' ({step.primitive}, {planned.where}) cannot take input of shape {shape}: {reason}"
    hint = fitting(spec, path, step, shape, context, builds) or spec.sizes_given_elsewhere(path)
    located = (*path, "primitive") if path in spec.swaps() else path
    return SpecError([Problem(message, path, spec.locate(located), hint)])


def fitting(
    spec: Spec, path: tuple, step: Step, shape: Shape, context: Context, builds: Callable[..., bool] | None = None
) -> str:
    """For a swapped step that cannot take its input: the primitives of the same kind that can."""
    swap = spec.swaps().get(path)
    if swap is None or registry.get(swap.primitive) is None:
        return ""
    swapped, kind = swap.primitive, registry.get(swap.primitive).kind
    offered = {**swap.args, **step.args}
    fits = [name for name, primitive in candidates(kind) if _fits(primitive, offered, shape, context, builds)]
    return f"swapped from {swapped}; {kind} steps that fit here: {', '.join(fits) or 'none'}"


def candidates(kind: str) -> list[tuple[str, registry.Primitive]]:
    """The primitives a step of ``kind`` may be swapped for (those that take the token stream alone)."""
    return [(n, p) for n, p in registry.all_primitives().items() if p.kind == kind and not p.consumes]


def _fits(
    primitive: registry.Primitive, offered: dict, shape: Shape, context: Context, builds: Callable[..., bool] | None
) -> bool:
    try:
        args = primitive.args.model_validate({k: v for k, v in offered.items() if k in primitive.args.model_fields})
        if primitive.footprint is not None:
            primitive.footprint(args, shape, replace(context))
            return True
    except Exception:
        return False
    return builds is not None and builds(primitive, args, shape, context)

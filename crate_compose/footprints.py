"""Shapes without torch: a spec walked step by step through the primitives' footprints.

Each registered primitive may declare a *footprint* (:class:`~crate_compose.registry.Footprint`):
its output shape, parameter shapes, published shapes and residual form, as plain arithmetic on
its arguments and input shape. When every step of a spec has one, :func:`walk` follows the token
stream through the whole network in a few milliseconds, and ``validate`` answers without
importing torch (a tenth of the time of ``import torch`` alone).

The walk only ever *certifies* a spec. Anything it cannot settle with certainty (a plugin
primitive without a footprint, a footprint that refuses the input, a zero-size shape, a weight
tie that does not fit) makes it return ``None``, and the caller places the steps on the meta
device instead (:func:`crate_compose.shapes.place`), which reports the problem where the spec
wrote it. Placement checks every footprint against the module it builds, so a footprint that
disagrees with its module is an error there, not a silent difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from dataclasses import replace

from . import registry
from .errors import Problem, SpecError
from .registry import Context, Footprint, Shape
from .spec import Spec, Step

ADDRESSABLE = 2**63  # torch addresses a tensor's bytes with 64 bits
# The walk settles shapes whose every axis is below this, so that any tensor a step makes inside (at
# most three axes' worth: K x n x n scores, C x H x W feature maps) is addressable for a batch of two
# in float64: (2^19)^3 * 16 bytes < 2^63. Beyond it, placement on the meta device has the last word.
MAX_AXIS = 2**19


def target(role: str, layer: int | None, part: str | None, name: str) -> str:
    """The submodule path: ``preprocess.patch_embed``, ``encoder.layer_3.compress``, ``encoder.norm``."""
    if role == "preprocess" or role == "head":
        return f"{role}.{name}"
    return f"{role}.layer_{layer}.{name}" if part == "layer" else f"{role}.{name}"


def part_of(path: tuple) -> str | None:
    """``pre``, ``layer`` or ``post`` for a step inside a stack; ``None`` in preprocess and head."""
    return path[-2] if isinstance(path[-2], str) and path[-2] in ("pre", "layer", "post") else None


def node_name(role: str, layer: int | None, name: str) -> str:
    """The fx node of a step: ``patch_embed``, ``compress_3``, ``decoder_compress_0``."""
    if role in ("preprocess", "head"):
        return name
    base = name if role == "encoder" else f"{role}_{name}"
    return base if layer is None else f"{base}_{layer}"


def tied(spec: Spec) -> dict[str, str]:
    """Every tied parameter of ``spec``: ``{its name: the name of the tensor it shares}``, as module
    paths (``head.lm_head.weight: preprocess.embed.weight``); see :mod:`crate_compose.ties`."""
    out: dict[str, str] = {}
    for role, layer, path, step in spec.stages():
        for own, source in step.tie.items():
            out[f"{target(role, layer, part_of(path), step.name)}.{own}"] = source
    return out


def start(spec: Spec) -> tuple[Shape, Context]:
    """The per-sample input shape and the build context the first step sees."""
    shape = tuple(spec.input.shape)
    ids = spec.input.dtype == "int64"
    return shape, Context(image=shape if len(shape) == 3 and not ids else None, ids=ids)


@dataclass(frozen=True)
class Walked:
    """One step of a walked network: where it is, what it takes and its footprint (parameters
    including LayerScale's ``gamma``)."""

    role: str
    layer: int | None
    path: tuple
    step: Step
    target: str
    input_shape: Shape
    footprint: Footprint


def walk(spec: Spec) -> list[Walked] | None:
    """Every step of ``spec`` (its decoder already explicit) with its footprint, in execution
    order; ``None`` when some step cannot be settled without building it (see the module docstring)."""
    shape, context = start(spec)
    if not _settled([shape]):
        return None
    named: dict[str, Shape] = {}
    parameters: dict[str, dict[str, Shape]] = {}  # module path -> its parameter shapes, for ties
    walked: list[Walked] = []
    for role, layer, path, step in spec.stages():
        before = replace(context)
        try:
            footprint = _footprint(step, shape, context, named)
        except ValueError as error:  # the step cannot take its input: certain, as the factory checks the same
            if _hint_needs_torch(spec, path):
                return None
            raise unfit(spec, role, layer, path, step, shape, before, str(error)) from None
        if footprint is None:
            return None
        place = target(role, layer, part_of(path), step.name)
        if not _ties_fit(step, footprint.parameters, parameters):
            return None
        parameters[place] = footprint.parameters
        named.update(zip(registry.get(step.primitive).publishes, footprint.publishes))
        walked.append(Walked(role, layer, path, step, place, shape, footprint))
        shape = footprint.output
    return walked


def _footprint(step: Step, shape: Shape, context: Context, named: dict[str, Shape]) -> Footprint | None:
    primitive = registry.get(step.primitive)
    if primitive is None or primitive.footprint is None:
        return None
    takes_ids = primitive.example is not None and primitive.example.vocab is not None  # token_embed
    if context.ids != takes_ids or any(name not in named for name in primitive.consumes):
        return None  # ids into a step for tokens, or tokens into an embedding of ids: left to torch
    context.ids = False
    try:
        args = primitive.args.model_validate(step.args)
    except ValueError:  # the loader checked them: left to placement
        return None
    try:
        footprint = primitive.footprint(args, shape, context, *(named[name] for name in primitive.consumes))
    except ValueError:
        raise  # the input does not fit
    except Exception:  # a footprint's own failure: placement has the last word
        return None
    shapes = [footprint.output, *footprint.publishes, *footprint.parameters.values()]
    if len(footprint.publishes) != len(primitive.publishes) or not _settled(shapes):
        return None
    if step.layer_scale is not None:
        if not footprint.residual:
            return None
        footprint = replace(footprint, parameters={**footprint.parameters, "layer_scale": (shape[-1],)})
    return footprint


def unfit(spec: Spec, role: str, layer: int | None, path: tuple, step: Step, shape: Shape, context: Context,
          reason: str, builds: Callable[..., bool] | None = None) -> SpecError:
    """The problem of a step that cannot take its input, located where the spec wrote the step, or
    at the override that swapped its primitive (with the primitives of its kind that fit there);
    otherwise naming the sizes given in another file or ``--set``. ``builds(primitive, args, shape,
    context)`` tries a primitive without a footprint (on the meta device)."""
    where = f"{role} layer {layer}" if layer is not None else role
    message = f"step '{step.name}' ({step.primitive}, {where}) cannot take input of shape {shape}: {reason}"
    hint = fitting(spec, path, step, shape, context, builds) or spec.sizes_given_elsewhere(path)
    located = (*path, "primitive") if path in spec.swaps() else path
    return SpecError([Problem(message, path, spec.locate(located), hint)])


def fitting(spec: Spec, path: tuple, step: Step, shape: Shape, context: Context,
            builds: Callable[..., bool] | None = None) -> str:
    """For a swapped step that cannot take its input: the primitives of the same kind that can."""
    swap = spec.swaps().get(path)
    if swap is None or registry.get(swap.primitive) is None:
        return ""
    swapped, kind = swap.primitive, registry.get(swap.primitive).kind
    offered = {**swap.args, **step.args}
    fits = [name for name, primitive in _candidates(kind) if _fits(primitive, offered, shape, context, builds)]
    return f"swapped from {swapped}; {kind} steps that fit here: {', '.join(fits) or 'none'}"


def _candidates(kind: str) -> list[tuple[str, registry.Primitive]]:
    return [(n, p) for n, p in registry.all_primitives().items() if p.kind == kind and not p.consumes]


def _hint_needs_torch(spec: Spec, path: tuple) -> bool:
    """A swapped step's hint tries every primitive of its kind: one without a footprint needs torch."""
    swap = spec.swaps().get(path)
    kind = registry.get(swap.primitive).kind if swap is not None and registry.get(swap.primitive) else None
    return kind is not None and any(p.footprint is None for _, p in _candidates(kind))


def _fits(primitive: registry.Primitive, offered: dict, shape: Shape, context: Context,
          builds: Callable[..., bool] | None) -> bool:
    try:
        args = primitive.args.model_validate({k: v for k, v in offered.items() if k in primitive.args.model_fields})
        if primitive.footprint is not None:
            primitive.footprint(args, shape, replace(context))
            return True
    except Exception:
        return False
    return builds is not None and builds(primitive, args, shape, context)


def _settled(shapes: list[Shape]) -> bool:
    """Every axis above zero (zero-size tensors are left to torch) and below :data:`MAX_AXIS`."""
    return all(0 < size < MAX_AXIS for shape in shapes for size in shape) and \
        all(math.prod(shape) * 16 < ADDRESSABLE for shape in shapes)


def _ties_fit(step: Step, mine: dict[str, Shape], earlier: dict[str, dict[str, Shape]]) -> bool:
    """Every tie of ``step`` names one of its parameters and an earlier step's of the same shape."""
    for own, source in step.tie.items():
        words = source.split(".")
        owners = [".".join(words[:end]) for end in range(len(words) - 1, 0, -1) if ".".join(words[:end]) in earlier]
        if own not in mine or not owners:
            return False
        theirs = earlier[owners[0]].get(".".join(words[len(owners[0].split(".")):]))
        if theirs != mine[own]:
            return False
    return True

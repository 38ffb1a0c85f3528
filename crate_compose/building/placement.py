"""Placing steps: build each step's module and infer its output shape, in execution order.

Placement is the march (:mod:`crate_compose.building.march`) with the :class:`Placement`
evaluator. Each new module runs once on meta tensors (no data, no FLOPs, its weights untouched),
so the next primitive knows its input shape (``d``, the number of tokens) and the
:class:`~crate_compose.registry.Context` earlier steps set (the patch grid); each module is checked
against its primitive's footprint. The builder turns the placed steps into fx nodes.

Initial weights are *per step*: each step's module is initialized from its own random stream,
seeded by the build seed and the step's place in the network (``encoder.layer_3.compress``), so
swapping one step's primitive leaves every other step's initial weights bit-identical.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from .. import registry
from ..errors import Problem, SpecError
from ..modules.residual import Residual
from ..seeds import step_seed
from ..spec_language.spec import Spec, Step
from . import ties
from .footprints import ADDRESSABLE
from .march import Marched, Unfit, march
from .plan import PlannedStep

META_BATCH = 2  # batch size of the meta tensors used to infer shapes
Shape = tuple[int, ...]


@contextlib.contextmanager
def _meta_without_dynamo() -> Iterator[None]:
    """Spare shape inference the import of ``torch._dynamo`` (1.6 s of a 2.5 s ``validate``).

    Many meta kernels are Python references (``torch._refs``) wrapped in ``torch._disable_dynamo``,
    which imports ``torch._dynamo`` on its first call only to mark the reference as not traceable
    by ``torch.compile``. Nothing is being compiled while a spec's shapes are inferred, so for that
    span each wrapped reference is given itself as its "disabled" form (the attribute the wrapper
    caches), and the marks are removed after. When ``torch._dynamo`` is already imported, or a
    future torch wraps differently, this does nothing and inference is only slower.
    """
    if "torch._dynamo" in sys.modules:
        yield
        return
    marked = _mark_references()
    try:
        yield
    finally:
        for function in marked:
            with contextlib.suppress(AttributeError):
                delattr(function, "__dynamo_disable")


def _mark_references() -> list:
    import torch._compile

    code = torch._compile._disable_dynamo(lambda: 0).__code__  # the wrapper's code, shared by every wrapped ref
    if "fn" not in code.co_freevars:
        return []
    slot = code.co_freevars.index("fn")
    prefixes = ("torch._refs", "torch._prims", "torch._decomp", "torch._meta_registrations")
    todo = [
        v
        for name, module in list(sys.modules.items())
        if name.startswith(prefixes) and module is not None
        for v in list(vars(module).values())
        if hasattr(v, "__code__")
    ]
    todo += [v for table in (torch._decomp.decomposition_table, torch._decomp.meta_table) for v in table.values()]
    seen: set[int] = set()
    marked = []
    while todo:  # walk each reference's chain of wrappers (functools.wraps and closures)
        function = todo.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        if getattr(function, "__code__", None) is code:
            wrapped = function.__closure__[slot].cell_contents
            if getattr(wrapped, "__dynamo_disable", None) is None:
                wrapped.__dynamo_disable = wrapped
                marked.append(wrapped)
        cells = [c.cell_contents for c in getattr(function, "__closure__", None) or () if _filled(c)]
        todo += [v for v in (getattr(function, "__wrapped__", None), *cells) if hasattr(v, "__code__")]
    return marked


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # a closure variable not yet bound
        return False
    return True


class Tally(TorchFunctionMode):
    """Adds up the bytes of every tensor a forward pass creates, counted at the level of torch
    functions (``layer_norm`` is one tensor, as its kernel keeps it, not the dozen of the meta
    reference that computes its shape); views and in-place results hold no new memory and are
    not counted. On meta tensors: the activations of a forward pass, without memory."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {id(t) for t in tree_leaves((args, kwargs))}
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor) and value._base is None and id(value) not in given:
                self.bytes += value.numel() * value.element_size()
        return out


def infer(module: nn.Module, *inputs: torch.Tensor, tally: Tally | None = None) -> Any:
    """Run ``module`` on meta tensors: output shapes without data, FLOPs or touching its weights
    (with a :class:`Tally`: also the bytes its forward pass creates)."""
    state = {name: t.to("meta") for name, t in [*module.named_parameters(), *module.named_buffers()]}
    with tally if tally is not None else contextlib.nullcontext():
        return functional_call(module, state, inputs)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Initialize float64 weights in float64 (not in float32 and cast); half types init in float32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(_init_dtype(dtype))
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _init_dtype(dtype: torch.dtype) -> torch.dtype:
    """Weights are initialized in float64 for float64 builds, in float32 otherwise (half types cast later)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def input_value(spec: Spec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A meta input batch, as the model sees it after its input cast."""
    dtype = torch.int64 if spec.input.dtype == "int64" else _init_dtype(dtype)
    return torch.empty((META_BATCH, *spec.input.shape), dtype=dtype, device="meta")


def place(
    spec: Spec,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    meta: bool = True,
    steps: list[PlannedStep] | None = None,
) -> Iterator[Marched]:
    """Build every step of ``spec`` (its decoder already explicit) in execution order.

    ``meta=True`` builds on the meta device: shapes and parameter counts, no memory, no init cost.
    The global random state is left as it was. ``steps``: its plan, when the caller made it already.
    """
    device = torch.device("meta") if meta else contextlib.nullcontext()
    with torch.random.fork_rng(devices=[]), device, _default_dtype(dtype), _meta_without_dynamo():
        yield from march(spec, Placement(seed, dtype), steps)


def builds_on_meta(primitive: registry.Primitive, args: registry.Args, shape: Shape, context: registry.Context) -> bool:
    """Whether a primitive without a footprint builds and runs on this input (on meta tensors)."""
    try:
        with torch.device("meta"):
            module = primitive.build(args, shape, replace(context))
        infer(module, torch.empty((META_BATCH, *shape), device="meta"))
    except Exception:
        return False
    return True


class Placement:
    """The march's evaluator that builds: each step's module, initialized from its own stream
    (:func:`crate_compose.seeds.step_seed`), run on the value before it; the result checked against the footprint."""

    builds = staticmethod(builds_on_meta)

    def __init__(self, seed: int, dtype: torch.dtype) -> None:
        self.seed, self.dtype = seed, dtype
        self.built: dict[str, nn.Module] = {}  # module path -> module, for weight ties

    def begin(self, spec: Spec, shape: Shape) -> torch.Tensor:
        if math.prod(shape) * META_BATCH * 8 >= ADDRESSABLE:
            message = f"an input of shape {list(shape)} holds {math.prod(shape):.3g} values per sample: more than a tensor can address"
            raise SpecError(
                [
                    Problem(
                        message,
                        ("input", "shape"),
                        spec.locate(("input", "shape")),
                        spec.sizes_given_elsewhere(("input", "shape")),
                    )
                ]
            )
        self.spec = spec
        return input_value(spec, self.dtype)

    def evaluate(
        self,
        planned: PlannedStep,
        value: torch.Tensor,
        shape: Shape,
        context: registry.Context,
        consumed: list[torch.Tensor],
    ) -> Marched:
        primitive, step = planned.primitive, planned.step
        args = planned.args if planned.args is not None else primitive.args.model_validate(step.args)
        torch.manual_seed(step_seed(self.seed, planned.target))
        shapes = tuple(tuple(v.shape[1:]) for v in consumed)
        before = replace(context)
        try:
            module = primitive.build(args, shape, context, shapes)
            _layer_scale(module, step, shape)
            tally = Tally()
            output = infer(module, value, *consumed, tally=tally)
        except Exception as error:  # a shape the primitive cannot take, reported where the step is written
            raise Unfit(
                str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {_first_line(error)}"
            ) from error
        published: dict[str, torch.Tensor] = {}
        if primitive.publishes:  # the step returns (tokens, *published)
            output, *values = output
            published = dict(zip(primitive.publishes, values))
        built = _footprint_of(module, output, published)
        if primitive.footprint is not None:
            _agrees(primitive.footprint(args, shape, before, *shapes), built, planned, self.spec)
        if step.layer_scale is not None:
            built = replace(built, parameters={**built.parameters, "layer_scale": (shape[-1],)})
        return Marched(planned, shape, built, module, output, published, tally.bytes)

    def tie(self, spec: Spec, marched: Marched, earlier: dict[str, Marched]) -> None:
        step, path = marched.step, marched.path
        try:
            ties.apply(marched.module, step.name, marched.planned.ties, self.built)
        except ValueError as error:
            raise SpecError([Problem(str(error), (*path, "tie"), spec.locate((*path, "tie")))]) from None
        self.built[marched.target] = marched.module


def _footprint_of(module: nn.Module, output: torch.Tensor, published: dict[str, torch.Tensor]) -> registry.Footprint:
    """The footprint of a module as built and run (LayerScale's ``layer_scale`` left out)."""
    return registry.Footprint(
        tuple(output.shape[1:]),
        {name: tuple(p.shape) for name, p in module.named_parameters() if name != "layer_scale"},
        tuple(tuple(value.shape[1:]) for value in published.values()),
        _has_residual(module),
        frozenset(name for name, p in module.named_parameters() if not p.requires_grad),
    )


def _agrees(footprint: registry.Footprint, built: registry.Footprint, planned: PlannedStep, spec: Spec) -> None:
    """The module built and run agrees with its primitive's footprint (shapes, parameters, form);
    ``validate`` trusts footprints, so a disagreement is a bug of the primitive's declaration, reported
    as a spec problem at the step that names it, with the plug-in that registered it (docs/primitives.md,
    "A footprint: shapes without torch")."""
    if built != footprint:
        differs = "; ".join(
            f"{name} {getattr(footprint, name)!r} declared, {getattr(built, name)!r} built"
            for name in ("output", "parameters", "publishes", "residual", "frozen")
            if getattr(footprint, name) != getattr(built, name)
        )
        primitive, step = planned.primitive, planned.step
        origin = primitive.plugin or primitive.factory.__module__
        message = (
            f"step '{step.name}' ({step.primitive}, from {origin}): the primitive's footprint disagrees with "
            f"the module it builds: {differs}"
        )
        where = (*planned.path, "primitive")
        hint = "a bug in the primitive's declaration, not the spec"
        raise SpecError([Problem(message, where, spec.locate(where), hint)])


def _first_line(error: Exception) -> str:
    """An error's message without the C++ stack torch appends to some (``Exception raised from ...``)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _layer_scale(module: nn.Module, step: Step, shape: Shape) -> None:
    if step.layer_scale is None:
        return
    if not _has_residual(module):
        with_residual = sorted(n for n, p in registry.all_primitives().items() if _is_residual(p))
        raise ValueError(
            f"layer_scale needs a residual step (Z + f(Z)), and {step.primitive} has none; "
            f"primitives with one: {', '.join(with_residual)}"
        )
    module.enable_layer_scale(shape[-1], step.layer_scale)


def _is_residual(primitive: registry.Primitive) -> bool:
    if primitive.example is None:
        return False
    try:
        with torch.device("meta"):
            module = primitive.build(primitive.args.model_validate(primitive.example.args), primitive.example.shape)
    except Exception:
        return False
    return _has_residual(module)


def _has_residual(module: nn.Module) -> bool:
    return isinstance(module, Residual) and module.adds_skip

"""Footprints: each primitive's torch-free shape calculus agrees with the module it builds.

``validate`` trusts footprints (crate_compose/building/footprints.py), so for every registered primitive
with one, over its example and over arguments, shapes and build contexts drawn by hypothesis:
whenever the footprint accepts an input, the module builds, runs on meta tensors, and has exactly
the declared output shape, parameter names and shapes, published shapes and residual form. The
walk over a whole spec is checked against placement on every preset, and its fallbacks (a
primitive without a footprint, a footprint that disagrees with its module) are exercised.
"""

from __future__ import annotations

import math
import os
import typing
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import Field, ValidationError

import crate_compose as cc
from crate_compose import registry
from crate_compose.building.derivation import explicit
from crate_compose.building.footprints import walk
from crate_compose.building.placement import infer, place
from crate_compose.building.summary import summarize_march
from crate_compose.modules.residual import Residual
from crate_compose.registry import Context, Footprint

WITH_FOOTPRINT = {name: p for name, p in cc.all_primitives().items() if p.footprint is not None}
BUILTIN = [name for name, p in cc.all_primitives().items() if p.factory.__module__.startswith("crate_compose.")]
EXAMPLES = int(os.environ.get("CRATE_FOOTPRINT_EXAMPLES", "40"))


def test_every_builtin_primitive_declares_a_footprint():
    assert sorted(BUILTIN) == sorted(n for n in BUILTIN if n in WITH_FOOTPRINT)


def _built(primitive: registry.Primitive, args, shape, context: Context, consumed: tuple) -> Footprint | None:
    """What the module really does: built and run on meta tensors (None: it does not build or run)."""
    try:
        with torch.device("meta"):
            module = primitive.build(args, shape, context, consumed)
        dtype = torch.int64 if primitive.example.vocab else torch.float32
        x = torch.empty((2, *shape), dtype=dtype, device="meta")
        extra = [torch.empty((2, *s), dtype=torch.int64, device="meta") for s in consumed]
        out = infer(module, x, *extra)
    except Exception:
        return None
    tokens, *published = out if primitive.publishes else (out,)
    return Footprint(
        tuple(tokens.shape[1:]),
        {n: tuple(p.shape) for n, p in module.named_parameters()},
        tuple(tuple(v.shape[1:]) for v in published),
        isinstance(module, Residual) and module.adds_skip,
        frozenset(n for n, p in module.named_parameters() if not p.requires_grad),
    )


def _declared(primitive, args, shape, context: Context, consumed: tuple) -> Footprint | None:
    try:
        return primitive.footprint(args, shape, context, *consumed)
    except ValueError:  # the only way a footprint may refuse an input
        return None


def _example_context(primitive: registry.Primitive) -> Context:
    shape = primitive.example.shape
    return Context(image=shape if len(shape) == 3 else None, ids=primitive.example.vocab is not None)


@pytest.mark.parametrize("name", sorted(WITH_FOOTPRINT))
def test_the_example_footprint_is_the_built_module(name):
    primitive = WITH_FOOTPRINT[name]
    args = primitive.args.model_validate(primitive.example.args)
    consumed = tuple((primitive.example.args["tokens"],) for _ in primitive.consumes)
    context = _example_context(primitive)
    declared = _declared(primitive, args, primitive.example.shape, replace(context), consumed)
    assert declared is not None, f"{name}'s footprint refuses its own example"
    assert _built(primitive, args, primitive.example.shape, replace(context), consumed) == declared


SIZES = st.sampled_from([1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32])  # small, and often dividing one another


def _value(draw, name: str, annotation, default):
    """A value for one argument: small sizes, every choice of a Literal, either boolean."""
    origin, choices = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return draw(st.sampled_from(choices))
    if annotation is bool:
        return draw(st.booleans())
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in choices:
        inner = next(c for c in choices if c is not type(None))
        return None if draw(st.booleans()) else _value(draw, name, inner, default)
    if annotation is int:
        return draw(SIZES)
    if typing.get_origin(annotation) is tuple:
        return (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    if annotation is float and name == "ratio":
        return draw(st.sampled_from([0.0, 0.2, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0]))
    return default  # other floats (step sizes, epsilons) change no shape


@st.composite
def _case(draw, primitive: registry.Primitive):
    values = dict(primitive.example.args)
    for name, info in primitive.args.model_fields.items():
        if draw(st.booleans()):
            values[name] = _value(draw, name, info.annotation, values.get(name, info.default))
    often = st.integers(0, 3).map(bool)  # true three times in four
    if "visible" in values and values["visible"] > values["tokens"] and draw(often):  # unmask: mostly in order
        values["visible"], values["tokens"] = values["tokens"], values["visible"]
    try:
        args = primitive.args.model_validate(values)
    except ValidationError:
        assume(False)
    rank = len(primitive.example.shape)
    grid = draw(st.none() | st.tuples(st.integers(1, 4), st.integers(1, 4)))
    given_grid = getattr(args, "grid", None) or grid
    if rank == 3:
        shape = (
            draw(st.integers(1, 3)),
            draw(st.sampled_from([8, 12, 16, 32, 48])),
            draw(st.sampled_from([8, 16, 32])),
        )
    else:  # token counts that often fit: the grid's cells, the visible tokens of an unmask (and a prefix)
        fitting = [given_grid[0] * given_grid[1]] if given_grid else []
        fitting += [args.visible + draw(st.integers(0, 1))] if "visible" in values else []
        tokens = draw(st.sampled_from(fitting)) if fitting and draw(often) else draw(st.integers(1, 12))
        shape = (tokens,) * (rank - 1) + (draw(st.integers(1, 40) | SIZES),)
    image = shape if rank == 3 and draw(often) else draw(st.none() | st.just((3, 16, 16)))
    context = Context(image=image, grid=grid, shuffled=draw(st.booleans()), ids=primitive.example.vocab is not None)
    consumed = tuple((args.tokens if draw(often) else draw(st.integers(1, 12)),) for _ in primitive.consumes)
    return args, shape, context, consumed


def _nonzero(footprint: Footprint) -> bool:
    shapes = [footprint.output, *footprint.publishes, *footprint.parameters.values()]
    return all(all(size > 0 for size in shape) for shape in shapes)


@pytest.mark.parametrize("name", sorted(WITH_FOOTPRINT))
def test_whatever_a_footprint_accepts_builds_as_declared(name):
    """Drawn arguments, input shapes and contexts: a footprint that accepts (with sizes above zero,
    which the walk requires) describes the module exactly, and leaves the same context behind."""
    primitive = WITH_FOOTPRINT[name]
    outcomes: Counter = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
    )
    @given(_case(primitive))
    def check(case):
        args, shape, context, consumed = case
        declared_context, built_context = replace(context), replace(context)
        declared = _declared(primitive, args, shape, declared_context, consumed)
        if declared is None or not _nonzero(declared):
            outcomes["refused" if declared is None else "zero size"] += 1
            return
        outcomes["accepted"] += 1
        assert _built(primitive, args, shape, built_context, consumed) == declared, (args, shape, context)
        assert built_context == declared_context

    check()
    print(f"{name}: {dict(outcomes)}")
    assert outcomes["accepted"] >= EXAMPLES // 5, f"too few drawn cases are accepted to test {name}: {outcomes}"


@pytest.mark.parametrize("name", sorted(cc.presets()))
def test_the_walk_of_every_preset_is_its_placement(name):
    """The walk settles every shipped spec, with the shapes placement infers, the parameter count of
    the built model (tied tensors once: the counts the zoo tests hold to the papers) and the same
    summary, row by row (trainable counts, ties, reference deviation, notes)."""
    spec = explicit(cc.load_spec(name))
    walked = walk(spec)
    assert walked is not None, f"{name} falls back to the meta device"
    placed = list(place(spec, meta=True))
    assert [(w.target, w.input_shape, w.footprint.output) for w in walked] == [
        (p.target, p.input_shape, tuple(p.output.shape[1:])) for p in placed
    ]
    model = cc.compile_spec(spec, meta=True)
    summary = summarize_march(spec, walked)  # what inspect prints
    assert summary.params_total == sum(p.numel() for p in model.parameters())
    assert summary.to_dict() == cc.summarize(model).to_dict()


SMALL = [
    "sizes.depth=1",
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.image_size=32",
    "sizes.patch_size=8",
]


class _ScaleArgs(cc.Args):
    factor: float = Field(default=2.0)


@pytest.fixture
def unregistered():
    """Primitives registered for one test and removed after."""
    names: list[str] = []
    yield names
    for name in names:
        registry._REGISTRY.pop(name, None)


def test_a_primitive_without_a_footprint_is_placed_on_meta(unregistered):
    class Scale(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    cc.primitive(
        "scale_nofootprint",
        args=_ScaleArgs,
        kind="norm",
        objective="none",
        equation="-",
        update="2 Z",
        description="test",
    )(lambda args, shape: Scale())
    unregistered.append("scale_nofootprint")
    swap = ["encoder.layer.sparsify.primitive=scale_nofootprint", "encoder.layer.sparsify.args={}"]
    spec = cc.load_spec("crate-tiny", SMALL + swap)
    assert walk(explicit(spec)) is None
    assert cc.validate(spec) is spec  # placed instead
    bad = cc.load_spec("crate-tiny", SMALL + ["sizes.patch_size=5", *swap])
    with pytest.raises(cc.SpecError, match="not divisible by patch_size=5"):
        cc.validate(bad)


def test_a_footprint_that_disagrees_with_its_module_is_caught_when_placed(unregistered):
    cc.primitive(
        "halve_wrongly",
        kind="norm",
        objective="none",
        equation="-",
        update="Z",
        description="test",
        footprint=lambda args, shape, context: Footprint((shape[0], shape[1] // 2)),
        example=cc.Example({}, (4, 8)),
    )(lambda args, shape: torch.nn.Identity())
    unregistered.append("halve_wrongly")
    spec = cc.load_spec(
        "crate-tiny", SMALL + ["encoder.layer.sparsify.primitive=halve_wrongly", "encoder.layer.sparsify.args={}"]
    )
    with pytest.raises(
        cc.SpecError,
        match=r"--set #7 .*: encoder.layer\[1\].primitive: step 'sparsify' "
        r"\(halve_wrongly, from test_footprints\): the primitive's footprint disagrees with the module it "
        r"builds: output \(17, 16\) declared, \(17, 32\) built",
    ) as caught:
        cc.build(spec, meta=True)
    assert caught.value.problems[0].path == ("encoder", "layer", 1, "primitive")  # the --set naming it


def _messages(run) -> str:
    with pytest.raises(cc.SpecError) as caught:
        run()
    return str(caught.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["sizes.patch_size=5"],  # a size given in --set: named in the hint
        ["encoder.layer.compress.args={heads: 3}"],  # d = 32 does not divide into 3 heads
        ["encoder.layer.compress.primitive=tssa", "sizes.heads=3"],  # a swap: the hint lists what fits
        ["encoder.layer.sparsify.primitive=classify", "encoder.layer.sparsify.args={classes: 3}"],  # (3,) into mssa
    ],
)
def test_a_step_that_does_not_fit_is_reported_by_the_walk_as_placement_reports_it(overrides):
    """The walk answers a shape error itself, with placement's message, location and hint, word for word."""
    spec = explicit(cc.load_spec("crate-tiny", SMALL + overrides))
    walked = _messages(lambda: walk(spec))
    assert walked == _messages(lambda: list(place(spec, meta=True)))
    assert "cannot take input of shape" in walked


@pytest.mark.parametrize(
    "overrides",
    [
        ["sizes.image_size=1048576", "sizes.patch_size=1"],  # 2^40 tokens: an attention matrix torch cannot address
        ["sizes.d=1048576", "sizes.heads=1", "sizes.head_dim=1"],  # an axis beyond the walk's bound
    ],
)
def test_sizes_beyond_the_walks_bound_are_left_to_placement(overrides):
    assert walk(explicit(cc.load_spec("crate-tiny", SMALL + overrides))) is None


def test_a_footprint_takes_lists_and_sets_for_tuples_and_frozensets():
    assert Footprint([4, 8], {"w": [8, 8]}, [[4]], True, ["w"]) == Footprint(
        (4, 8), {"w": (8, 8)}, ((4,),), True, frozenset({"w"})
    )


def test_the_walked_summary_counts_a_tie_once():
    spec = cc.load_spec("gpt2-small")
    walked = walk(spec)
    untied = sum(math.prod(s) for w in walked for s in w.footprint.parameters.values())
    assert untied - summarize_march(spec, walked).params_total == 50257 * 768

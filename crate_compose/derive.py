"""Derived decoders: the inverse of every encoder step, in mirror order (paper 001 Sec. 2.4-2.5).

Decoder layer ``g^l`` undoes encoder layer ``f^{L-l}``: the steps of the encoder's layer are
replaced by their inverses (from each primitive's :class:`~crate_compose.registry.Inverse` rule)
in reverse order, with fresh weights. Pre-processing is undone too: steps whose rule says
``prologue`` (position embeddings, mask tokens) are re-applied where the decoder starts, the
others (class token, patch embedding) are undone after the decoder layers, in reverse order.

This module knows each primitive's inverse only through the registry; it never creates fx nodes.
"""

from __future__ import annotations

from . import registry
from .errors import Problem, SpecError
from .spec import DecoderStack, Spec, Step


def _input_shapes(spec: Spec) -> dict[tuple, tuple[int, ...]]:
    """Per-sample input shape of each pre-processing step and of layer 0's steps (meta build)."""
    from .builder import compile_spec  # the builder calls derive_decoder: import lazily

    encoder_only = spec.model_copy(update={"decoder": None, "head": []})
    encoder_only._locations = spec._locations
    module = compile_spec(encoder_only, meta=True)
    shapes, previous = {}, tuple(spec.input.shape)
    for node in module.graph.nodes:
        if "spec_path" not in node.meta:
            continue
        if node.op == "call_module" and node.meta["layer"] in (None, 0):
            shapes[node.meta["spec_path"]] = previous
        if node.meta["shape"] is not None:  # None: a step with several outputs; its tokens node follows
            previous = tuple(node.meta["shape"][1:])
    return shapes


def derive_decoder(spec: Spec) -> DecoderStack:
    """The explicit decoder that inverts ``spec``'s pre-processing and encoder layer."""
    shapes = _input_shapes(spec)
    invertible = invertible_primitives()
    problems: list[Problem] = []
    pre: list[Step] = []
    layer: list[Step] = []
    post: list[Step] = []

    def invert(step: Step, path: tuple, owner: str) -> tuple[Step | None, str]:
        primitive = registry.get(step.primitive)
        if primitive.inverse is None:
            message = f"step '{step.name}' ({step.primitive}) has no inverse, so no decoder can be derived"
            problems.append(Problem(message, path, spec.locate(path), f"primitives with an inverse: {', '.join(invertible)}"))
            return None, "reverse"
        rule = primitive.inverse
        args = rule.args(primitive.args.model_validate(step.args), shapes[path])
        if rule.primitive is None or args is None:
            return None, rule.where
        inverse = registry.get(rule.primitive)
        args = inverse.args.model_validate(args).model_dump(mode="json")
        return Step(name=f"inverse_{step.name}", primitive=rule.primitive, args=args, inverts=owner + step.name), rule.where

    for i, step in enumerate(spec.preprocess):
        inverse, where = invert(step, ("preprocess", i), "preprocess.")
        if inverse is not None:
            (pre if where == "prologue" else post).insert(0, inverse)
    for i, step in enumerate(spec.encoder.layer):
        inverse, _ = invert(step, ("encoder", "layer", i), "encoder.layer.")
        if inverse is not None:
            layer.insert(0, inverse)
    if problems:
        raise SpecError(problems)
    if not layer:
        raise SpecError([Problem("the encoder layer has nothing to invert", ("encoder", "layer"), spec.locate(("encoder",)))])
    return DecoderStack(depth=spec.encoder.depth, layer=layer, pre=pre, post=post)


def invertible_primitives() -> list[str]:
    """Names of the primitives that have an inverse rule."""
    return sorted(name for name, p in registry.all_primitives().items() if p.inverse is not None)


"""Derived decoders: the inverse of every encoder step, in mirror order (paper 001 Sec. 2.4-2.5).

Decoder layer ``g^l`` undoes encoder layer ``f^{L-l}``: the steps of the encoder's layer are
replaced by their inverses (from each primitive's :class:`~crate_compose.registry.Inverse` rule)
in reverse order, with fresh weights. What surrounds the layers is undone too: steps whose rule
says ``prologue`` (mask tokens; positions in the ``listing3`` form) are re-applied where the
decoder starts, the others (the encoder's ``post`` and ``pre`` steps, the class token, the patch
embedding) are undone around the decoder layers in reverse order.

Two forms, chosen by ``decoder: {derive: inverse, form: ...}``: ``code`` (default) computes what
the authors' CRATE-MAE code computes; ``listing3`` is paper 001's Listing 3 (see ``docs/spec.md``,
Derived decoders). A rule may differ per form (:meth:`Inverse.form`).

This module knows each primitive's inverse only through the registry; it never creates fx nodes.
Loading a spec never derives: the builder does, when it compiles.
"""

from __future__ import annotations

from pydantic import ValidationError

from .. import registry
from ..errors import Problem, SpecError
from ..spec_language.spec import Derive, Spec, Stack, Step
from .footprints import walk

FORMS = ("code", "listing3")


def _input_shapes(spec: Spec) -> dict[tuple, tuple[int, ...]]:
    """Per-sample input shape of each step before the decoder (layer 0 for layer steps): from the
    footprints when they settle every step, else placed on the meta device."""
    encoder_only = spec.model_copy(update={"decoder": None, "stacks": {}, "head": []})
    walked = walk(encoder_only)
    if walked is None:
        from .placement import place

        walked = place(encoder_only, meta=True)
    shapes: dict[tuple, tuple[int, ...]] = {}
    for step in walked:
        shapes.setdefault(step.path, step.input_shape)
    return shapes


def derive_decoder(spec: Spec, form: str | None = None) -> Stack:
    """The explicit decoder that inverts ``spec``'s pre-processing and encoder."""
    form = form or (spec.decoder.form if isinstance(spec.decoder, Derive) else "code")
    if form not in FORMS:
        raise ValueError(f"derivation form must be one of {FORMS}, not {form!r}")
    shapes = _input_shapes(spec)
    problems: list[Problem] = []
    prologue: list[Step] = []

    def invert(steps: list[Step], prefix: tuple, owner: str) -> list[Step]:
        """The inverses of ``steps``, in reverse order; prologue steps go to the decoder's start."""
        out: list[Step] = []
        for i, step in enumerate(steps):
            path = (*prefix, i)
            primitive = registry.get(step.primitive)
            if primitive.inverse is None:
                message = f"step '{step.name}' ({step.primitive}) has no inverse, so no decoder can be derived"
                hint = f"primitives with an inverse: {', '.join(invertible_primitives())}"
                problems.append(Problem(message, path, spec.locate(path), hint))
                continue
            rule = primitive.inverse.form(form)
            args = rule.args(primitive.args.model_validate(step.args), shapes[path])
            if rule.primitive is None or args is None:
                continue
            inverse = registry.get(rule.primitive)
            try:
                args = inverse.args.model_validate(args).model_dump(mode="json")
            except ValidationError as error:  # the inverse cannot exist at this size (no visible token left)
                reasons = "; ".join(
                    f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})" for e in error.errors()
                )
                message = f"step '{step.name}' ({step.primitive}) cannot be inverted by {rule.primitive}: {reasons}"
                problems.append(Problem(message, path, spec.locate(path), spec.sizes_given_elsewhere(path)))
                continue
            derived = Step(name=f"inverse_{step.name}", primitive=rule.primitive, args=args, inverts=owner + step.name)
            (prologue if rule.where == "prologue" else out).insert(0, derived)
        return out

    encoder = spec.encoder
    undo_preprocess = invert(spec.preprocess, ("preprocess",), "preprocess.")
    undo_pre = invert(encoder.pre, ("encoder", "pre"), "encoder.pre.")
    layer = invert(encoder.layer, ("encoder", "layer"), "encoder.layer.")
    undo_post = invert(encoder.post, ("encoder", "post"), "encoder.post.")
    if problems:
        raise SpecError(problems)
    if not layer:
        raise SpecError(
            [Problem("the encoder layer has nothing to invert", ("encoder", "layer"), spec.locate(("encoder",)))]
        )
    return Stack(pre=[*prologue, *undo_post], depth=encoder.depth, layer=layer, post=[*undo_pre, *undo_preprocess])


def explicit(spec: Spec) -> Spec:
    """``spec`` with a ``{derive: inverse}`` decoder written out (the same spec when there is none)."""
    if not isinstance(spec.decoder, Derive):
        return spec
    return spec.model_copy(update={"decoder": derive_decoder(spec)})


def invertible_primitives() -> list[str]:
    """Names of the primitives that have an inverse rule."""
    return sorted(name for name, p in registry.all_primitives().items() if p.inverse is not None)

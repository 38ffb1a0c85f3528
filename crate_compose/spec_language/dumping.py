"""From a resolved :class:`~.spec.Spec` back to the plain data of a YAML spec (for ``loader.dump``).

The data has no ``extends`` and every default written out, so it is reproducible alone; what a
reader would not write (empty ``pre``/``post``/``stacks``, unset step options) is left out. With
``references=True``, a value the spec wrote as a whole ``${size}`` reference keeps it, and so does
a derived decoder step that copies such a value, so that ``--set sizes.d=...`` still changes the
whole network::

    preprocess:                                 # crate-tiny, every default written out
    - name: patch_embed
      primitive: patch_embed
      args: {patch_size: 16, dim: 384, norm: true, projection: linear}                   # references=False
      args: {patch_size: '${patch_size}', dim: '${d}', norm: true, projection: linear}   # references=True
"""

from __future__ import annotations

from typing import Any

from .source import KeyPath
from .spec import Spec


def spec_data(spec: Spec, *, references: bool = False) -> dict:
    """The resolved spec as plain data: no extends, every default, empty parts left out; with
    ``references``, values written as a whole ``${size}`` reference (and the derived steps that
    copy them) keep it."""
    data = spec.model_dump(mode="json", exclude={"extends"})
    if references:
        _restore_references(data, spec)
    _drop_empty(data)
    return data


def _drop_empty(data: dict) -> None:
    """Leave out what a reader would not write: empty ``pre``/``post``/``stacks``, unset step options."""
    for key in ("stacks", "decoder", "reference"):
        if data.get(key) in ({}, None):
            data.pop(key, None)
    stacks = [data.get("encoder"), data.get("decoder"), *(data.get("stacks") or {}).values()]
    for stack in [s for s in stacks if isinstance(s, dict)]:
        for part in ("pre", "post"):
            if stack.get(part) == []:
                del stack[part]
    lists = [data.get("preprocess"), data.get("head")] + [
        s.get(p) for s in stacks if isinstance(s, dict) for p in ("pre", "layer", "post")
    ]
    for steps in [one for one in lists if isinstance(one, list)]:
        for step in steps:
            for key in ("layer_scale", "inverts"):
                if step.get(key) is None:
                    step.pop(key, None)


def _restore_references(data: dict, spec: Spec) -> None:
    """Put ``${name}`` back where the spec wrote it, and into derived steps that copy such a value."""
    written = dict(spec._references)
    decoder = spec.decoder
    if decoder is not None and not isinstance(decoder, dict) and hasattr(decoder, "layer"):
        if ("encoder", "depth") in written and ("decoder", "depth") not in written:
            written[("decoder", "depth")] = written[("encoder", "depth")]
        for part in ("pre", "layer", "post"):
            for i, step in enumerate(getattr(decoder, part)):
                source = _step_path(spec, step.inverts) if step.inverts else None
                for key in step.args:
                    if source is not None and (*source, "args", key) in written:
                        written.setdefault(("decoder", part, i, "args", key), written[(*source, "args", key)])
    for path, name in written.items():
        if path[:1] == ("sizes",):
            continue
        owner: Any = data
        for part in path[:-1]:
            owner = owner[part] if isinstance(owner, (dict, list)) and _has(owner, part) else None
        if owner is not None and _has(owner, path[-1]) and owner[path[-1]] == spec.sizes.get(name):
            owner[path[-1]] = f"${{{name}}}"


def _has(owner: Any, key: Any) -> bool:
    return key in owner if isinstance(owner, dict) else isinstance(key, int) and 0 <= key < len(owner)


def _step_path(spec: Spec, inverts: str) -> KeyPath | None:
    """``encoder.layer.compress`` -> ``("encoder", "layer", 0)``."""
    *owner, name = inverts.split(".")
    steps: Any = spec
    for part in owner:
        steps = getattr(steps, part, None)
    if isinstance(steps, list):
        for i, step in enumerate(steps):
            if step.name == name:
                return (*owner, i)
    return None

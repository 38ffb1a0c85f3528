"""The JSON Schema of the spec language, with each primitive's arguments as a conditional branch.

Editors (e.g. VS Code's YAML extension) use it to complete keys and show every field's
description; ``crate-compose schema`` prints it.
"""

from __future__ import annotations

from typing import Any

from .. import registry
from .spec import Spec

REFERENCE_PATTERN = r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$"
_SCALARS = {"integer", "number", "boolean"}


def _allow_references(node: Any) -> None:
    """Sizes may be written '${name}' wherever a number or flag is expected."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            if key == "properties":
                for sub in value.values():
                    _referable(sub)
            _allow_references(value)
    elif isinstance(node, list):
        for item in node:
            _allow_references(item)


def _referable(sub: Any) -> None:
    """Let ``sub`` be a '${name}' reference where it takes a scalar: plain (``heads``), optional
    (``head_dim: int | None``) or an array item (``shape: [C, H, W]``, ``grid: [h, w]``)."""
    if not isinstance(sub, dict):
        return
    reference = {"type": "string", "pattern": REFERENCE_PATTERN}
    if sub.get("type") in _SCALARS:
        scalar = {k: sub.pop(k) for k in list(sub) if k not in ("description", "title", "default")}
        sub["anyOf"] = [scalar, reference]
        return
    if sub.get("type") == "array":
        _referable(sub.get("items"))
        for item in sub.get("prefixItems", []):
            _referable(item)
    branches = sub.get("anyOf", [])
    for branch in branches:
        if isinstance(branch, dict) and branch.get("type") == "array":
            _referable(branch)
    if any(isinstance(b, dict) and b.get("type") in _SCALARS for b in branches) and reference not in branches:
        branches.append(reference)


def json_schema() -> dict[str, Any]:
    schema = Spec.model_json_schema()
    defs = schema.setdefault("$defs", {})
    branches = []
    primitives = registry.all_primitives()
    for name, primitive in primitives.items():
        args = primitive.args.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(args.pop("$defs", {}))
        args["description"] = f"{primitive.description} ({primitive.equation}; update: {primitive.update_for()})"
        defs[f"args_{name}"] = args
        branches.append(
            {
                "if": {"properties": {"primitive": {"const": name}}, "required": ["primitive"]},
                "then": {
                    "properties": {"args": {"$ref": f"#/$defs/args_{name}", "description": f"Arguments of '{name}'."}}
                },
            }
        )
    step = defs["Step"]
    step["properties"]["primitive"]["enum"] = list(primitives)
    step["allOf"] = branches
    _allow_references(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "crate-compose spec"
    return schema

"""Variants: a spec that ``extends`` or ``--set`` change is not the spec it started from.

A change to anything but the cosmetic keys (:data:`COSMETIC`: ``name``, ``description``,
``reference``) makes a *variant*. Unless the change restates them, a variant drops the
``reference`` count (it no longer describes the paper's network) and gets a name of its own, so
that its default output folder differs too::

    crate-compose validate crate-tiny --set encoder.layer.sparsify.primitive=ista_soft
    # name: crate-tiny.sparsify-ista_soft (the last key that is not generic, and the value)

A file that extends another and changes its architecture is named after the file
(``my-crate.yaml`` -> ``my-crate``). Names are made safe for a folder (:func:`safe_name`); a name
over 80 characters becomes ``NAME.variant-<hash of the overrides>``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from ..errors import SpecError
from . import yamlread
from .overrides import parse_key_path
from .source import Source

COSMETIC = frozenset({"name", "description", "reference"})  # keys that do not change the network
GENERIC_KEYS = frozenset(
    {"sizes", "encoder", "decoder", "stacks", "layer", "pre", "post", "args", "primitive", "preprocess", "head"}
)


def mark_variant_of_parent(merged: Source, child: dict, path: Path, parent_path: Path) -> None:
    """The file ``path`` (its own keys ``child``) merged onto ``parent_path``: when it changes more
    than cosmetic keys, a variant, named after the file unless it names itself."""
    changed = sorted(key for key in child if key not in COSMETIC)
    if changed:  # the child is a variant of its parent, not the parent under another name
        _become_variant(merged, child, f"{path.name} changes {', '.join(changed)} of {parent_path.name}")
        if "name" not in child and isinstance(merged.data.get("name"), str):
            merged.data["name"] = safe_name(path.stem)
            merged.notes.append(f"variant name: {merged.data['name']} (after its file; set name to choose one)")


def mark_variant_by_overrides(source: Source, overrides: list[str]) -> None:
    """Overrides that change the network make a variant: unless they also set them, its name gets a
    suffix saying what changed, its description says which overrides, and its ``reference`` is dropped."""
    keys = [parse_key_path(a.partition("=")[0].strip()) for a in overrides]
    changing = [a for a, key in zip(overrides, keys) if key and key[0] not in COSMETIC]
    if changing:
        given = {key[0]: True for key in keys if key}
        _become_variant(source, given, "overrides change the network (" + ", ".join(changing) + ")")
        if "name" not in given and isinstance(source.data.get("name"), str):
            source.data["name"] = _variant_name(source.data["name"], changing)
            source.notes.append(f"variant name: {source.data['name']}")
        description = source.data.get("description")
        if "description" not in given and isinstance(description, str):
            source.data["description"] = f"{description} Variant: {'; '.join(changing)}.".strip()


def _become_variant(source: Source, given: dict, why: str) -> None:
    """The merged spec changes the architecture: a ``reference`` not restated no longer applies."""
    if "reference" not in given and source.data.get("reference") is not None:
        source.data.pop("reference")
        source.notes.append(f"reference count dropped: {why}, and a reference is not restated")


def safe_name(text: str) -> str:
    """``text`` as a name a folder can have: letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-") or "variant"
    return name if name[0].isalnum() else f"v{name}"


def _yaml_value(text: str) -> Any:
    try:
        return yamlread.parse_value(text, "--set")
    except SpecError:
        return text


def _variant_name(name: str, assignments: list[str]) -> str:
    """``crate-tiny`` + ``encoder.layer.sparsify.primitive=ista_soft`` -> ``crate-tiny.sparsify-ista_soft``."""
    parts = []
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        words = [w for w in parse_key_path(key.strip()) if w not in GENERIC_KEYS and not w.lstrip("-").isdigit()]
        label = words[-1] if words else "set"
        parts.append(safe_name(f"{label}-{value.strip()}")[:32])
    variant = f"{name}.{'.'.join(parts)}"
    if len(variant) > 80:  # the same overrides, however spaced, give the same name
        canonical = [
            f"{'.'.join(parse_key_path(a.partition('=')[0].strip()))}={_yaml_value(a.partition('=')[2])!r}"
            for a in assignments
        ]
        digest = hashlib.sha256("\n".join(canonical).encode()).hexdigest()[:8]
        variant = f"{name}.variant-{digest}"
    return variant

"""``--set path=value``: changing a loaded spec from the command line (or ``load(ref, overrides)``).

The path names keys with dots; a list item is named by its position or, in a list of steps, by
the step's name, with a dot or in brackets. The value is parsed as YAML (``8``, ``true``,
``[1, 2]``, ``{heads: 8}``)::

    --set sizes.d=384
    --set encoder.layer.0.args.heads=8
    --set encoder.layer[sparsify].primitive=ista_soft

A key the path names that does not exist yet is created. Every bad override is reported, each
located at its ``--set #N '...'``; so is a new size that nothing uses (a misspelled size).
Replacing a step's primitive records a :class:`~.reading.Swap`, so arguments the new primitive
does not take are dropped with a note rather than refused.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import Location, Problem, SpecError, did_you_mean
from . import yamlread
from .source import KeyPath, Source, Swap, is_steps, key_paths
from .spec import REFERENCE
from .substitution import reference_paths


def parse_key_path(text: str) -> list[str]:
    """``encoder.layer[1].args`` -> ``['encoder', 'layer', '1', 'args']``."""
    parts: list[str] = []
    for chunk in text.split("."):
        while "[" in chunk and chunk.endswith("]"):
            head, _, rest = chunk.partition("[")
            if head:
                parts.append(head)
            index, _, chunk = rest.partition("]")
            parts.append(index)
            if chunk.startswith("["):
                continue
            break
        else:
            if chunk:
                parts.append(chunk)
            continue
        if chunk:
            parts.append(chunk)
    return parts


def apply_overrides(source: Source, overrides: list[str]) -> None:
    """Apply every override in order; raises SpecError with the problems of all of them."""
    problems: list[Problem] = []
    declared = [str(name) for name in _sizes(source.data)]
    for i, assignment in enumerate(overrides):  # every bad override is reported, not only the first
        try:
            apply_override(source, assignment, i)
        except SpecError as error:
            problems.extend(error.problems)
    problems += _unused_new_sizes(source, declared)
    if problems:
        raise SpecError(problems)


def apply_override(source: Source, assignment: str, index: int) -> None:
    """Apply one ``path=value`` override; ``value`` is parsed as YAML (``8``, ``true``, ``[1, 2]``)."""
    shown = assignment if len(assignment) <= 80 else f"{assignment[:60]}… ({len(assignment):,} characters)"
    where = Location(f"--set #{index + 1} '{shown}'")
    if "=" not in assignment:
        raise SpecError([Problem("an override is written path=value, e.g. sizes.d=384", (), where)])
    key, _, text = assignment.partition("=")
    value = yamlread.parse_value(text, str(where))
    parts = parse_key_path(key.strip())
    if not parts:
        raise SpecError([Problem("an override needs a key path before '='", (), where)])
    if any("[" in part or "]" in part for part in parts):
        raise SpecError(
            [
                Problem(
                    f"unbalanced brackets in the key path '{key.strip()[:80]}'; an item is written layer[1] or layer.1",
                    (),
                    where,
                )
            ]
        )
    if parts[0] == "extends":
        raise SpecError(
            [
                Problem(
                    "extends is followed when a file is read, before overrides: write it in a spec file "
                    "that names its base",
                    (),
                    where,
                )
            ]
        )
    if len(parts) > yamlread.MAX_DEPTH:
        raise SpecError(
            [Problem(f"a key path of {len(parts):,} parts; a spec is at most {yamlread.MAX_DEPTH} deep", (), where)]
        )
    node: Any = source.data
    path: KeyPath = ()
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            position = _list_index(node, part, path, where)
            path += (position,)
            if last:
                node[position] = value
            else:
                node = node[position]
        elif isinstance(node, dict):
            path += (part,)
            if last:
                if part == "primitive" and is_steps([node]) and node.get("primitive") != value:
                    args = node.get("args") if isinstance(node.get("args"), dict) else {}
                    source.swaps[path[:-1]] = Swap(node.get("primitive"), dict(args), tuple(sorted(args)))
                node[part] = value
            else:
                if part not in node:  # a key this override creates: its problems are the override's
                    source.marks.setdefault(path, where)
                node = node.setdefault(part, {})
        else:
            raise SpecError([Problem(f"cannot set '{part}' inside a {type(node).__name__} value", path, where)])
    for sub in key_paths(value, path):
        source.marks[sub] = where


def _list_index(items: list, part: str, path: KeyPath, where: Location) -> int:
    """A list item by position (``1``, written in the digits 0-9: ``²`` is a name) or, for lists of steps, by
    step name (``sparsify``)."""
    if re.fullmatch("-?[0-9]+", part):
        if len(part) <= 18 and -len(items) <= int(part) < len(items):  # a longer number is out of any list
            return int(part) % len(items)
        shown = part if len(part) <= 24 else f"{part[:12]}...({len(part)} digits)"
        raise SpecError([Problem(f"index {shown} is out of range: the list has {len(items)} items", path, where)])
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if part in names:
        return names.index(part)
    hint = did_you_mean(part, [n for n in names if isinstance(n, str)])
    raise SpecError([Problem(f"no step named '{part}' in this list; it has {names}", path, where, hint)])


def _sizes(data: Any) -> dict:
    """The raw ``sizes`` mapping of spec data ({} when missing or not a mapping; validation reports that)."""
    sizes = data.get("sizes") if isinstance(data, dict) else None
    return sizes if isinstance(sizes, dict) else {}


def _unused_new_sizes(source: Source, declared: list[str]) -> list[Problem]:
    """A size that overrides create and nothing references (``--set sizes.deph=6``, a misspelled
    ``depth``) would change nothing but the variant's name: refused at its ``--set``, with the
    closest declared size. A new size another override references (``${name}``) is kept."""
    used = {
        match.group(1).strip()
        for path in reference_paths(source.data)
        for match in REFERENCE.finditer(_at(source.data, path))
    }
    problems = []
    for name in _sizes(source.data):
        if str(name) not in declared and str(name) not in used:
            path = ("sizes", name)
            spec = source.data.get("name")
            message = f"no size '{name}' in spec '{spec}'" if isinstance(spec, str) else f"no size '{name}' in the spec"
            hint = (
                did_you_mean(str(name), declared)
                or f"nothing uses ${{{name}}}; sizes declared: {', '.join(declared) or 'none'}"
            )
            problems.append(Problem(message, path, source.locate(path), hint))
    return problems


def _at(data: Any, path: KeyPath) -> Any:
    """The value at ``path`` in raw spec data."""
    for part in path:
        data = data[part]
    return data

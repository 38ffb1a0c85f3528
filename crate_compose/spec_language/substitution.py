"""``${size}`` references: values written once in ``sizes`` and used anywhere in the spec.

A string that is a whole reference takes the size's value and type; a reference inside a longer
string is interpolated as text. A size may use the sizes declared before it::

    sizes: {d: 384, heads: 6, width: "${d}"}    # width: 384
    encoder:
      layer:
        - {name: compress, primitive: mssa, args: {heads: "${heads}"}}   # heads: 6, an int
    description: "CRATE of width ${d}"                                  # "CRATE of width 384"

An unknown or not-yet-declared size is a located problem (with the closest name), and so is a
text that references would grow beyond :data:`MAX_TEXT` characters. Values that are a whole
reference are remembered (``Source.via``), so a problem with one names the size and where it was
given, and ``dump(spec, references=True)`` can write the reference back.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..errors import Problem, did_you_mean
from .source import KeyPath, Source, Swap, key_values
from .spec import REFERENCE

MAX_TEXT = 10_000  # characters a ${reference} substitution may produce


def substitute(source: Source, problems: list[Problem]) -> Any:
    """Replace ``${name}`` by ``sizes[name]``; a whole-string reference keeps the size's type."""
    data = source.data
    sizes_raw = data.get("sizes") or {}
    if not isinstance(sizes_raw, dict):  # reported by validation (at sizes); references elsewhere cannot resolve
        source.unresolved.update(p for p in reference_paths(data) if p[:1] != ("sizes",))
        return data
    sizes: dict[str, Any] = {}

    def resolve(value: Any, path: KeyPath) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v, path + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, path + (i,)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = REFERENCE.fullmatch(value.strip())
        if whole:
            source.via[path] = whole.group(1).strip()
            return lookup(source.via[path], path)
        parts = [(m, lookup(m.group(1).strip(), path)) for m in REFERENCE.finditer(value)]
        length = len(value) + sum(len(str(v)) - len(m.group(0)) for m, v in parts)
        if length > MAX_TEXT:  # sizes that double a string through references grow exponentially
            problems.append(
                Problem(
                    f"the references here make a text of {length:,} characters; at most {MAX_TEXT:,}",
                    path,
                    source.locate(path),
                )
            )
            source.unresolved.add(path)
            return None
        found = iter(str(v) for _, v in parts)
        return REFERENCE.sub(lambda m: next(found), value)

    def lookup(name: str, path: KeyPath) -> Any:
        if name in sizes:
            if ("sizes", name) in source.unresolved:  # that size's own reference failed (reported there)
                source.unresolved.add(path)
            return sizes[name]
        known = list(sizes) if path[:1] == ("sizes",) else list(sizes_raw)
        hint = did_you_mean(name, known)
        if name in sizes_raw:  # a size referring to one declared after it
            message = f"size '{name}' is used before it is declared; declare it earlier in 'sizes'"
        else:
            message = f"unknown size '${{{name}}}'; sizes declared: {', '.join(known) or 'none'}"
        problems.append(Problem(message, path, source.locate(path), hint))
        source.unresolved.add(path)
        return None

    for key, value in sizes_raw.items():  # sizes may use sizes declared before them
        sizes[key] = resolve(value, ("sizes", key))
    out = {k: v for k, v in data.items() if k != "sizes"}
    out = resolve(out, ())
    out["sizes"] = sizes
    return out


def reference_paths(data: Any) -> Iterable[KeyPath]:
    """The paths of the strings in ``data`` that contain a ``${reference}``."""
    return (path for path, value in key_values(data) if isinstance(value, str) and "${" in value)


def substitute_swap(swap: Swap, sizes: dict) -> Swap:
    """The swap with ``${size}`` references in the replaced step's arguments substituted."""

    def value(v: Any) -> Any:
        whole = REFERENCE.fullmatch(v.strip()) if isinstance(v, str) else None
        return sizes.get(whole.group(1).strip(), v) if whole else v

    return Swap(swap.primitive, {k: value(v) for k, v in swap.args.items()}, swap.inherited)

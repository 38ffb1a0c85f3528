"""Reading YAML written by anyone: plain data with the location of every key, bounded before it grows.

A spec may come from a paper, a colleague or the internet, so reading one must neither run code,
nor hang, nor exhaust memory, and every refusal is a located :class:`~crate_compose.errors.Problem`:

* only PyYAML's safe node types are ever constructed, and only plain values: strings, numbers,
  booleans, null, lists and mappings. Any other tag (``!!python/...``, ``!!binary``,
  ``!!timestamp``, a local ``!include``) is refused where it is written, and so is the merge key
  ``<<`` (``extends`` does what it would);
* the text is bounded before it is parsed (:data:`MAX_BYTES`), and the event stream, which PyYAML
  produces without recursion, is checked for nesting (:data:`MAX_DEPTH`) and size (:data:`MAX_NODES`)
  before any node tree is composed (by libyaml's C parser when PyYAML has it: a file at the limits
  is refused in a fraction of a second);
* aliases are expanded while building, against a budget of values (:data:`MAX_VALUES`), so a
  "billion laughs" stops after 10,000 values instead of filling memory;
* control characters YAML forbids (NUL, BEL, ESC, ...) are located, and never echoed raw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import Location, Problem, SpecError

KeyPath = tuple[str | int, ...]

MAX_BYTES = 2_000_000  # a spec is a few kilobytes; the largest preset is under 4 KB
MAX_DEPTH = 64  # nesting of lists and mappings
MAX_NODES = 10_000  # scalars, lists and mappings as written (the largest shipped spec has 161)
MAX_VALUES = 10_000  # values after aliases are expanded
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "seq", "map"))


@dataclass
class Parsed:
    """Plain data and the location of every key and list item (``marks``)."""

    data: Any
    marks: dict[KeyPath, Location] = field(default_factory=dict)


def _location(source: str, mark: Any) -> Location:
    return Location(source, mark.line + 1, mark.column + 1) if mark is not None else Location(source)


def _reader_problem(error: yaml.reader.ReaderError, text: str, source: str) -> Problem:
    """A forbidden character, located, and shown as its code point (never raw)."""
    before = text[: error.position]
    line, column = before.count("\n") + 1, error.position - (before.rfind("\n") + 1) + 1
    character = error.character if isinstance(error.character, str) else chr(error.character)
    return Problem(
        f"the control character U+{ord(character):04X} is not allowed in YAML text", (), Location(source, line, column)
    )


def _check_events(text: str, source: str) -> None:
    """Nesting and size, from the event stream (iterative: no recursion, no node tree yet). The C
    parser reads it when available; text it cannot parse is read again by the Python parser, whose
    messages (and the ones composing the tree gives) are the ones reported."""
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            _count_events(yaml.parse(text, Loader=fast), source)
            return
        except yaml.YAMLError:
            pass
    _count_events(yaml.parse(text, Loader=yaml.SafeLoader), source)


def _count_events(events: Any, source: str) -> None:
    depth = nodes = 0
    for event in events:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(
                    [
                        Problem(
                            f"nested more than {MAX_DEPTH} levels deep; a spec needs a handful",
                            (),
                            _location(source, event.start_mark),
                        )
                    ]
                )
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        if isinstance(event, (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent, yaml.AliasEvent)):
            nodes += 1
            if nodes > MAX_NODES:
                raise SpecError(
                    [
                        Problem(
                            f"more than {MAX_NODES:,} values; a spec has a few hundred",
                            (),
                            _location(source, event.start_mark),
                        )
                    ]
                )


def parse(text: str, source: str) -> Parsed:
    """Parse ``text`` (from ``source``, for locations) into plain data; every problem located.

    Raises :class:`SpecError` for text that is not YAML, too large, too deep, or uses anything
    but plain values; duplicate keys and alias cycles are collected and reported together.
    """
    if len(text) > MAX_BYTES:
        raise SpecError([Problem(f"{len(text):,} characters; a spec is at most {MAX_BYTES:,}", (), Location(source))])
    try:
        _check_events(text, source)
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as error:
        raise SpecError([_reader_problem(error, text, source)]) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        reason = getattr(error, "problem", None) or str(error)
        raise SpecError([Problem(f"not valid YAML: {reason}", (), _location(source, mark))]) from None
    if root is None:
        raise SpecError([Problem("the file is empty", (), Location(source))])
    return _Builder(source).run(root)


class _Builder:
    """Nodes -> plain data, expanding aliases against a budget, refusing tags other than plain ones."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.marks: dict[KeyPath, Location] = {}
        self.problems: list[Problem] = []
        self.active: set[int] = set()  # the collections being built: an alias to one of them is a cycle
        self.values = 0
        self.constructor = yaml.SafeLoader("")

    def where(self, node: yaml.Node) -> Location:
        return _location(self.source, node.start_mark)

    def run(self, root: yaml.Node) -> Parsed:
        self.marks[()] = self.where(root)
        data = self.build(root, ())
        if self.problems:
            raise SpecError(self.problems)
        return Parsed(data, self.marks)

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise SpecError(
                [
                    Problem(
                        f"the YAML expands to more than {MAX_VALUES:,} values (aliases repeating aliases?)",
                        path,
                        self.where(node),
                    )
                ]
            )
        if node.tag not in PLAIN_TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            what = (
                "merge keys (<<) are not supported: use extends, or write the keys"
                if tag == "!!merge"
                else f"the YAML tag '{tag}' is not allowed: a spec holds plain values (text, numbers, true/false, lists, "
                "mappings)"
            )
            self.problems.append(Problem(what, path, self.where(node)))
            return None
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            if id(node) in self.active:
                self.problems.append(
                    Problem("a YAML alias refers to a collection that contains it", path, self.where(node))
                )
                return None
            self.active.add(id(node))
            try:
                return self.mapping(node, path) if isinstance(node, yaml.MappingNode) else self.sequence(node, path)
            finally:
                self.active.discard(id(node))
        try:
            return self.constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, OverflowError) as error:  # '!!int twelve', '!!float abc'
            self.problems.append(
                Problem(f"not a valid {node.tag.rsplit(':', 1)[-1]}: {node.value!r} ({error})", path, self.where(node))
            )
            return None

    def mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag not in PLAIN_TAGS:  # a tagged key, or the merge key '<<'
                self.build(key_node, path)  # records the problem
                continue
            if isinstance(key_node, (yaml.MappingNode, yaml.SequenceNode)):
                self.problems.append(
                    Problem("a key must be a plain word, not a list or mapping", path, self.where(key_node))
                )
                continue
            key = self.build(key_node, path)
            key = key if isinstance(key, str) else str(key)
            self.marks[path + (key,)] = self.where(key_node)
            if key in out:
                self.problems.append(Problem(f"key '{key}' appears twice", path + (key,), self.where(key_node)))
            out[key] = self.build(value_node, path + (key,))
        return out

    def sequence(self, node: yaml.SequenceNode, path: KeyPath) -> list[Any]:
        items = []
        for i, item in enumerate(node.value):
            self.marks[path + (i,)] = self.where(item)
            items.append(self.build(item, path + (i,)))
        return items


def parse_value(text: str, source: str) -> Any:
    """A ``--set`` value: YAML (``8``, ``[1, 2]``, ``{ratio: 2}``) under the same rules, or the text
    itself when it is not YAML. Empty text is the empty string."""
    if not text.strip():
        return ""
    try:
        return parse(text, source).data
    except SpecError as error:
        if any("not valid YAML" in problem.message for problem in error.problems):
            return text
        raise

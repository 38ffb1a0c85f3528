"""From YAML files and ``--set`` overrides to a validated :class:`~crate_compose.spec.Spec`.

The pipeline, each stage collecting problems rather than stopping at the first:

1. read YAML keeping the file:line:column of every key (``read_yaml``);
2. follow ``extends:`` (a path relative to the file, or a zoo preset) and merge: mappings merge
   key by key, lists and scalars replace, and a mapping keyed by step names patches those steps
   of a list of steps (``layer: {sparsify: {primitive: ista_soft}}``);
3. apply ``--set path=value`` overrides (``encoder.layer.1.args.heads=8``,
   ``encoder.layer[sparsify].primitive=ista_soft``); a spec changed this way (or by an ``extends``
   child that changes the architecture) is a *variant*: it gets a name of its own and loses a
   ``reference`` count that no longer applies;
4. substitute ``${size}`` references from ``sizes``;
5. validate against the pydantic models and each step's primitive argument model;
6. fill in every default, so the resolved spec is explicit and reproducible.

Any problem raises :class:`~crate_compose.errors.SpecError` listing all of them.
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError

from . import registry, yamlread, zoo
from .errors import Location, Problem, SpecError, did_you_mean, format_path, one_of
from .spec import MAX_STEPS, PARTS, REFERENCE, Derive, Spec, Stack

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Swap:
    """A step whose primitive an override or a patch replaced: what it was, and which of its
    arguments came along unasked (those the new primitive does not take are dropped, with a note)."""

    primitive: str
    args: dict
    inherited: tuple[str, ...]  # sorted


@dataclass
class Source:
    """Raw spec data and where each key of it came from."""

    data: Any
    marks: dict[KeyPath, Location] = field(default_factory=dict)
    unresolved: set[KeyPath] = field(default_factory=set)  # values whose ${reference} failed
    via: dict[KeyPath, str] = field(default_factory=dict)  # values that are a whole ${size} reference
    swaps: dict[KeyPath, Swap] = field(default_factory=dict)  # steps whose primitive was replaced
    notes: list[str] = field(default_factory=list)

    def locate(self, path: KeyPath) -> Location | None:
        """The location of ``path``, or of its nearest ancestor that has one."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.marks:
                return self.marks[path[:end]]
        return None

    def origin(self, path: KeyPath) -> str:
        """`` (= ${d}, given at FILE:LINE:COL)`` for a value that came from a size, else ``""``."""
        if path not in self.via:
            return ""
        name = self.via[path]
        return f" (= ${{{name}}}, given at {self.locate(('sizes', name))})"


# ---------------------------------------------------------------- 1. YAML with locations


def read_yaml(text: str, source: str) -> Source:
    """Parse YAML keeping the location of every key and list item (:mod:`crate_compose.yamlread`:
    plain values only, bounded in size, nesting and alias expansion); duplicate keys are problems."""
    parsed = yamlread.parse(text, source)
    if not isinstance(parsed.data, dict):
        found = type(parsed.data).__name__
        raise SpecError([Problem(f"a spec is a mapping of keys; found {found}", (), parsed.marks[()])])
    return Source(parsed.data, parsed.marks)


def read_file(path: Path) -> Source:
    try:
        if not path.is_file():  # a directory, a FIFO, a device such as /dev/zero
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise SpecError([Problem(f"cannot read spec file: {kind}", (), Location(str(path)))])
        size = path.stat().st_size
        if size > yamlread.MAX_BYTES:
            raise SpecError([Problem(f"the file is {size:,} bytes; a spec is at most {yamlread.MAX_BYTES:,}", (),
                                     Location(str(path)))])
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError([Problem(f"cannot read spec file: {error.strerror}", (), Location(str(path)))]) from None
    except UnicodeDecodeError as error:
        before = error.object[: error.start]
        where = Location(str(path), before.count(b"\n") + 1, error.start - before.rfind(b"\n"))
        found = error.object[error.start : error.start + 1]
        raise SpecError([Problem(f"a spec is UTF-8 text; {error.reason} {found!r}", (), where)]) from None
    return read_yaml(text, str(path))


# ---------------------------------------------------------------- 2. extends


def merge(base: Source, over: Source) -> Source:
    """``over`` on top of ``base``: mappings merge recursively, anything else replaces; a mapping
    keyed by step names on top of a list of steps patches the steps it names."""
    problems: list[Problem] = []
    swaps: dict[KeyPath, Swap] = {}
    over_marks: dict[KeyPath, Location] = {}  # over's marks, moved from step names to list positions

    def combine(a: Any, b: Any, path: KeyPath, over_path: KeyPath) -> Any:
        if over_path in over.marks:
            over_marks[path] = over.marks[over_path]
        if isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for key, value in b.items():
                out[key] = combine(a[key], value, path + (key,), over_path + (key,)) if key in a else value
                if key not in a:
                    _move_marks(over.marks, over_path + (key,), path + (key,), over_marks)
            return out
        if _is_steps(a) and isinstance(b, dict):
            return patch(a, b, path, over_path)
        _move_marks(over.marks, over_path, path, over_marks)
        return copy.deepcopy(b)

    def patch(steps: list, patches: dict, path: KeyPath, over_path: KeyPath) -> list:
        out = list(steps)
        names = [step.get("name") for step in steps]
        for name, change in patches.items():
            where = over.marks.get(over_path + (name,))
            if name not in names:
                hint = did_you_mean(str(name), [n for n in names if isinstance(n, str)])
                problems.append(Problem(f"no step named '{name}' to patch; this list has {names}", path, where, hint))
                continue
            if not isinstance(change, dict):
                found = type(change).__name__
                problems.append(Problem(f"a step patch is a mapping of the keys to change; found {found}", path, where))
                continue
            i = names.index(name)
            old = steps[i]
            out[i] = combine(old, change, path + (i,), over_path + (name,))
            if "primitive" in change and change["primitive"] != old.get("primitive"):
                args = old.get("args") if isinstance(old.get("args"), dict) else {}
                given = change.get("args") if isinstance(change.get("args"), dict) else {}
                swaps[path + (i,)] = Swap(old.get("primitive"), dict(args), tuple(sorted(set(args) - set(given))))
        return out

    data = combine(base.data, over.data, (), ())
    if problems:
        raise SpecError(problems)
    marks: dict[KeyPath, Location] = {}
    for path in _paths(data):
        if path in over_marks:
            marks[path] = over_marks[path]
        elif path in base.marks and not _replaced(path, over.data):
            marks[path] = base.marks[path]
    return Source(data, marks, swaps=swaps)


def _is_steps(value: Any) -> bool:
    """A list of steps (mappings with a name)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) and "name" in v for v in value)


def _move_marks(marks: dict, old: KeyPath, new: KeyPath, into: dict) -> None:
    """Copy the marks under ``old`` to the same places under ``new``."""
    for sub, mark in marks.items():
        if sub[: len(old)] == old:
            into[new + sub[len(old):]] = mark


def _paths(data: Any, prefix: KeyPath = ()) -> Iterable[KeyPath]:
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


def _replaced(path: KeyPath, over: Any) -> bool:
    """True when a prefix of ``path`` was replaced wholesale (not merged) by ``over``."""
    node = over
    for part in path:
        if isinstance(node, dict):
            if part not in node:
                return False
            node = node[part]
            if not isinstance(node, dict):
                return True
        else:
            return False
    return False


def _point_at_extends(error: SpecError, at: Location | None) -> None:
    """Problems of an extended file, tied to the ``extends`` that named it: a file that cannot be
    read at all is reported there; a problem inside it keeps its place and says where it was extended."""
    if at is None:
        return
    for problem in error.problems:
        if problem.location is not None and not problem.location.line and not problem.path:  # unreadable
            problem.message = f"{problem.location.source}: {problem.message}"
            problem.path, problem.location = ("extends",), at
        elif "in the file extended at" not in problem.hint:
            problem.hint = "; ".join(filter(None, [problem.hint, f"in the file extended at {at}"]))


def load_source(ref: str | Path, _chain: tuple[Path, ...] = ()) -> Source:
    """Read a spec file or zoo preset and everything it ``extends``, merged."""
    path = zoo.locate(ref)
    if len(_chain) >= MAX_EXTENDS:
        raise SpecError([Problem(f"an extends chain of more than {MAX_EXTENDS} files", ("extends",),
                                 Location(str(_chain[-1])))])
    if path in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, path))
        raise SpecError([Problem(f"'extends' forms a cycle: {cycle}", ("extends",), Location(str(path)))])
    source = read_file(path)
    parent = source.data.get("extends")
    if parent is None:
        return source
    if not isinstance(parent, str):
        raise SpecError([Problem("'extends' must be a path or zoo name", ("extends",), source.marks.get(("extends",)))])
    try:
        parent_path = zoo.locate(parent, relative_to=path.parent)
    except SpecError as error:
        for problem in error.problems:
            problem.path, problem.location = ("extends",), source.marks.get(("extends",))
        raise
    if parent_path in (*_chain, path):  # located at the 'extends' that closes the cycle
        cycle = " -> ".join(str(p) for p in (*_chain, path, parent_path))
        raise SpecError([Problem(f"'extends' forms a cycle: {cycle}", ("extends",), source.marks.get(("extends",)))])
    try:
        base = load_source(parent_path, (*_chain, path))
    except SpecError as error:
        _point_at_extends(error, source.marks.get(("extends",)))
        raise
    del source.data["extends"]
    merged = merge(base, source)
    changed = sorted(key for key in source.data if key not in COSMETIC)
    if changed:  # the child is a variant of its parent, not the parent under another name
        _become_variant(merged, source.data, f"{path.name} changes {', '.join(changed)} of {parent_path.name}")
        if "name" not in source.data and isinstance(merged.data.get("name"), str):
            merged.data["name"] = _safe_name(path.stem)
            merged.notes.append(f"variant name: {merged.data['name']} (after its file; set name to choose one)")
    merged.swaps.update(base.swaps)
    merged.notes = [*base.notes, *merged.notes]
    return merged


COSMETIC = frozenset({"name", "description", "reference"})  # keys that do not change the network


def _become_variant(source: Source, given: dict, why: str) -> None:
    """The merged spec changes the architecture: a ``reference`` not restated no longer applies."""
    if "reference" not in given and source.data.get("reference") is not None:
        source.data.pop("reference")
        source.notes.append(f"reference count dropped: {why}, and a reference is not restated")


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-") or "variant"
    return name if name[0].isalnum() else f"v{name}"


# ---------------------------------------------------------------- 3. --set overrides


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
        raise SpecError([Problem(f"unbalanced brackets in the key path '{key.strip()[:80]}'; an item is written "
                                 "layer[1] or layer.1", (), where)])
    if parts[0] == "extends":
        raise SpecError([Problem("extends is followed when a file is read, before overrides: write it in a spec file "
                                 "that names its base", (), where)])
    if len(parts) > yamlread.MAX_DEPTH:
        raise SpecError([Problem(f"a key path of {len(parts):,} parts; a spec is at most {yamlread.MAX_DEPTH} deep",
                                 (), where)])
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
                if part == "primitive" and _is_steps([node]) and node.get("primitive") != value:
                    args = node.get("args") if isinstance(node.get("args"), dict) else {}
                    source.swaps[path[:-1]] = Swap(node.get("primitive"), dict(args), tuple(sorted(args)))
                node[part] = value
            else:
                if part not in node:  # a key this override creates: its problems are the override's
                    source.marks.setdefault(path, where)
                node = node.setdefault(part, {})
        else:
            raise SpecError([Problem(f"cannot set '{part}' inside a {type(node).__name__} value", path, where)])
    for sub in _paths(value, path):
        source.marks[sub] = where


def _list_index(items: list, part: str, path: KeyPath, where: Location) -> int:
    """A list item by position (``1``) or, for lists of steps, by step name (``sparsify``)."""
    if part.lstrip("-").isdigit():
        position = int(part)
        if -len(items) <= position < len(items):
            return position % len(items)
        raise SpecError([Problem(f"index {position} is out of range: the list has {len(items)} items", path, where)])
    names = [item.get("name") for item in items if isinstance(item, dict)]
    if part in names:
        return names.index(part)
    hint = did_you_mean(part, [n for n in names if isinstance(n, str)])
    raise SpecError([Problem(f"no step named '{part}' in this list; it has {names}", path, where, hint)])


# ---------------------------------------------------------------- 4. ${size} references


MAX_TEXT = 10_000  # characters a ${reference} substitution may produce
MAX_EXTENDS = 32  # files an extends chain may pass through


def substitute(source: Source, problems: list[Problem]) -> Any:
    """Replace ``${name}`` by ``sizes[name]``; a whole-string reference keeps the size's type."""
    data = source.data
    sizes_raw = data.get("sizes") or {}
    if not isinstance(sizes_raw, dict):  # reported by validation (at sizes); references elsewhere cannot resolve
        source.unresolved.update(p for p in _references(data) if p[:1] != ("sizes",))
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
            problems.append(Problem(f"the references here make a text of {length:,} characters; at most "
                                    f"{MAX_TEXT:,}", path, source.locate(path)))
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


def _references(data: Any, path: KeyPath = ()) -> Iterable[KeyPath]:
    """The paths of the strings in ``data`` that contain a ``${reference}``."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _references(value, path + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _references(value, path + (i,))
    elif isinstance(data, str) and "${" in data:
        yield path


# ---------------------------------------------------------------- 5. validation


def _pydantic_problems(error: ValidationError, prefix: KeyPath, source: Source, model: type[BaseModel]) -> list[Problem]:
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        tag = None  # the decoder's form: "stack" (written out) or "derive"
        if loc[:1] == ("decoder",) and loc[1:2] in (("stack",), ("derive",)):
            tag, loc = loc[1], loc[:1] + loc[2:]  # drop pydantic's union tag
        if prefix == () and loc[:1] == ("sizes",) and len(loc) == 3:
            loc = loc[:2]  # drop pydantic's union member (int, float, bool, str): one problem per size
            item = dict(item, type="size_type", msg="a size is a number, a flag or a string")
        path = prefix + loc
        kind = item["type"]
        if kind == "extra_forbidden" and tag and len(loc) == 2 and _other_form(tag, loc[1]):
            if not any(p.message == BOTH_FORMS for p in problems):  # once, at the first key of the other form
                problems.append(Problem(BOTH_FORMS, path, source.locate(path)))
        elif kind == "extra_forbidden":
            known = list(Derive.model_fields) if tag == "derive" and len(loc) == 2 else _fields_at(model, loc[:-1])
            message = f"unknown key '{loc[-1]}'; {one_of(known)}" if known else f"unknown key '{loc[-1]}'"
            problems.append(Problem(message, path, source.locate(path), did_you_mean(str(loc[-1]), known)))
        elif kind == "missing":
            problems.append(Problem("required key is missing", path, source.locate(path)))
        else:
            found = item.get("input")
            shown = repr(found) if not isinstance(found, (dict, list)) else type(found).__name__
            message = f"{item['msg'].removeprefix('Value error, ')}; found {shown}{source.origin(path)}"
            problems.append(Problem(message, path, source.locate(path)))
    return problems


BOTH_FORMS = ("a decoder is either derived (derive: inverse, form) or written as a stack (depth, layer, pre, post), "
              "not both")


def _other_form(tag: str, key: Any) -> bool:
    """A decoder key that belongs to the form the decoder is not (``depth`` beside ``derive``; ``form`` in a stack)."""
    other = Stack if tag == "derive" else Derive
    return key in other.model_fields


def _fields_at(model: type[BaseModel], loc: KeyPath) -> list[str]:
    """Field names of the (sub)model at ``loc``, for did-you-mean on unknown keys."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        annotation = current.model_fields[part].annotation
        current = _model_in(annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The first pydantic model inside an annotation such as ``list[Step]`` or ``Stack | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _step_lists(data: dict) -> Iterable[tuple[KeyPath, Any]]:
    """The raw lists of steps, before validation (mirrors ``Spec.step_lists``)."""
    stacks = data.get("stacks")
    paths: list[KeyPath] = [("preprocess",)]
    for stack in [("encoder",), ("decoder",), *(("stacks", name) for name in (stacks if isinstance(stacks, dict) else {}))]:
        paths.extend((*stack, part) for part in PARTS)
    paths.append(("head",))
    for path in paths:
        owner: Any = data
        for key in path:
            owner = owner.get(key) if isinstance(owner, dict) else None
        if isinstance(owner, list):
            yield path, owner


def validate_steps(data: dict, source: Source, problems: list[Problem]) -> dict[KeyPath, dict]:
    """Check each step's primitive name and arguments; returns the arguments with defaults filled."""
    filled: dict[KeyPath, dict] = {}
    names = list(registry.all_primitives())
    for prefix, steps in _step_lists(data):
        for i, step in enumerate(steps):
            if not isinstance(step, dict) or not isinstance(step.get("primitive"), str):
                continue  # the pydantic pass reports the shape of the step itself
            path = prefix + (i,)
            spec = registry.get(step["primitive"])
            if spec is None:
                where = path + ("primitive",)
                problems.append(
                    Problem(
                        f"unknown primitive '{step['primitive']}'; {one_of(names)}",
                        where,
                        source.locate(where),
                        did_you_mean(step["primitive"], names),
                    )
                )
                continue
            args = step.get("args") or {}
            if not isinstance(args, dict):
                continue
            if path in source.swaps:  # arguments the replaced primitive took and this one does not
                old, kept = source.swaps[path].primitive, source.swaps[path].inherited
                dropped = sorted(k for k in args if k in kept and k not in spec.args.model_fields)
                if dropped:
                    args = {k: v for k, v in args.items() if k not in dropped}
                    shown = ", ".join(f"{k}={step['args'][k]!r}" for k in dropped)
                    source.notes.append(
                        f"{format_path(path)}: swapped {old} -> {step['primitive']}; dropped {shown} "
                        f"({step['primitive']} does not take {'it' if len(dropped) == 1 else 'them'})"
                    )
            try:
                filled[path] = spec.args.model_validate(args).model_dump(mode="json")
            except ValidationError as error:
                problems.extend(_pydantic_problems(error, path + ("args",), source, spec.args))
    return filled


def resolve(source: Source) -> Spec:
    """Stages 4-6: references, validation, defaults. Raises SpecError with every problem."""
    references: list[Problem] = []
    data = substitute(source, references)
    problems: list[Problem] = []
    filled = validate_steps(data, source, problems)
    spec = None
    try:
        spec = Spec.model_validate(data)
    except ValidationError as error:
        problems.extend(_pydantic_problems(error, (), source, Spec))
    if references or problems or spec is None:
        raise SpecError(_dedupe(references, problems, source.unresolved))
    _bounded(spec, source)
    for _, path, steps in spec.step_lists():
        for i, step in enumerate(steps):
            step.args = filled[(*path, i)]
    spec._locations = dict(source.marks)
    spec._references = dict(source.via)
    spec._swaps = {path: _resolved(swap, spec.sizes) for path, swap in source.swaps.items()}
    spec._notes = list(source.notes)
    return spec


def _bounded(spec: Spec, source: Source) -> None:
    """At most MAX_STEPS steps once layers are unrolled (each is placed in a few milliseconds);
    reported where the largest share is written (a ``depth``, or a list of steps)."""
    counts = spec.step_counts()
    total = sum(counts.values())
    if total > MAX_STEPS:
        path, count = max(counts.items(), key=lambda item: item[1])
        message = (f"the network unrolls to {total:,} steps, {count:,} of them from here; at most {MAX_STEPS:,} "
                   "(a deeper network takes minutes to check and build)")
        raise SpecError([Problem(message, path, source.locate(path))])


def _resolved(swap: Swap, sizes: dict) -> Swap:
    """The swap with ``${size}`` references in the replaced step's arguments substituted."""

    def value(v: Any) -> Any:
        whole = REFERENCE.fullmatch(v.strip()) if isinstance(v, str) else None
        return sizes.get(whole.group(1).strip(), v) if whole else v

    return Swap(swap.primitive, {k: value(v) for k, v in swap.args.items()}, swap.inherited)


def _dedupe(references: list[Problem], problems: list[Problem], unresolved: set[KeyPath]) -> list[Problem]:
    """Drop repeats, and validation errors on (or inside) values whose reference already failed."""
    seen, out, own = set(), [], {id(p) for p in references}
    for problem in [*references, *problems]:
        key = (problem.path, problem.message)
        followup = id(problem) not in own and any(problem.path[: len(p)] == p for p in unresolved)
        if key not in seen and not followup:
            seen.add(key)
            out.append(problem)
    where = lambda p: (p.location.source, p.location.line, p.location.column) if p.location else ("", 0, 0)  # noqa: E731
    return sorted(out or [*references, *problems], key=where)  # never an error that lists nothing


def load(ref: str | Path | dict, overrides: Iterable[str] = ()) -> Spec:
    """Load a spec (file path, zoo preset name, or an already-parsed dict) with overrides.

    Overrides that change the network (anything but ``name``, ``description``, ``reference``)
    make a variant: unless they also set them, its name gets a suffix saying what changed
    (``crate-tiny.sparsify-ista_soft``: its own default output folder) and the baseline's
    ``reference`` count is dropped, so a variant never claims the paper's count.
    """
    overrides = list(overrides)
    if isinstance(ref, dict):
        source = Source(copy.deepcopy(ref))
    else:
        source = load_source(ref)
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
    return resolve(source)


def _sizes(data: Any) -> dict:
    """The raw ``sizes`` mapping of spec data ({} when missing or not a mapping; validation reports that)."""
    sizes = data.get("sizes") if isinstance(data, dict) else None
    return sizes if isinstance(sizes, dict) else {}


def _unused_new_sizes(source: Source, declared: list[str]) -> list[Problem]:
    """A size that overrides create and nothing references (``--set sizes.deph=6``, a misspelled
    ``depth``) would change nothing but the variant's name: refused at its ``--set``, with the
    closest declared size. A new size another override references (``${name}``) is kept."""
    used = {match.group(1).strip() for path in _references(source.data)
            for match in REFERENCE.finditer(_at(source.data, path))}
    problems = []
    for name in _sizes(source.data):
        if str(name) not in declared and str(name) not in used:
            path = ("sizes", name)
            spec = source.data.get("name")
            message = f"no size '{name}' in spec '{spec}'" if isinstance(spec, str) else f"no size '{name}' in the spec"
            hint = (did_you_mean(str(name), declared)
                    or f"nothing uses ${{{name}}}; sizes declared: {', '.join(declared) or 'none'}")
            problems.append(Problem(message, path, source.locate(path), hint))
    return problems


def _at(data: Any, path: KeyPath) -> Any:
    """The value at ``path`` in raw spec data."""
    for part in path:
        data = data[part]
    return data


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
        parts.append(_safe_name(f"{label}-{value.strip()}")[:32])
    variant = f"{name}.{'.'.join(parts)}"
    if len(variant) > 80:  # the same overrides, however spaced, give the same name
        canonical = [f"{'.'.join(parse_key_path(a.partition('=')[0].strip()))}={_yaml_value(a.partition('=')[2])!r}"
                     for a in assignments]
        digest = hashlib.sha256("\n".join(canonical).encode()).hexdigest()[:8]
        variant = f"{name}.variant-{digest}"
    return variant


GENERIC_KEYS = frozenset({"sizes", "encoder", "decoder", "stacks", "layer", "pre", "post", "args", "primitive", "preprocess", "head"})


def dump(spec: Spec, *, references: bool = False) -> str:
    """The resolved spec as YAML: no extends, every default written out.

    ``references=False``: every ``${size}`` substituted (a build's ``spec.yaml``, reproducible
    alone). ``references=True``: values written as a whole ``${size}`` reference keep it, and so
    do the steps derived from them (``crate-compose derive``), so ``--set sizes.d=...`` still
    changes the whole network.
    """
    data = spec.model_dump(mode="json", exclude={"extends"})
    if references:
        _restore_references(data, spec)
    _drop_empty(data)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


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
    lists = [data.get("preprocess"), data.get("head")] + [s.get(p) for s in stacks if isinstance(s, dict)
                                                           for p in ("pre", "layer", "post")]
    for steps in [l for l in lists if isinstance(l, list)]:
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

"""``extends:``: a spec written as changes to another, merged onto it.

The base is a path relative to the extending file, or a zoo preset, and may itself extend another
(at most :data:`MAX_EXTENDS` files, no cycles). Mappings merge key by key, lists and scalars
replace, and a mapping keyed by step names patches those steps of a list of steps::

    extends: crate-tiny
    sizes: {depth: 2}                            # merged into the base's sizes
    encoder:
      layer: {sparsify: {primitive: ista_soft}}  # patches the step named sparsify

Every key keeps the location of the file that last wrote it; a problem inside a base file says
where it was extended. A child that changes the architecture is a variant (:mod:`.naming`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ..errors import Location, Problem, SpecError, did_you_mean
from . import zoo
from .naming import mark_variant_of_parent
from .source import KeyPath, Source, Swap, is_steps, key_paths, read_file

MAX_EXTENDS = 32  # files an extends chain may pass through


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
        if is_steps(a) and isinstance(b, dict):
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
    for path in key_paths(data):
        if path in over_marks:
            marks[path] = over_marks[path]
        elif path in base.marks and not _replaced(path, over.data):
            marks[path] = base.marks[path]
    return Source(data, marks, swaps=swaps)


def _move_marks(marks: dict, old: KeyPath, new: KeyPath, into: dict) -> None:
    """Copy the marks under ``old`` to the same places under ``new``."""
    for sub, mark in marks.items():
        if sub[: len(old)] == old:
            into[new + sub[len(old) :]] = mark


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
        raise SpecError(
            [Problem(f"an extends chain of more than {MAX_EXTENDS} files", ("extends",), Location(str(_chain[-1])))]
        )
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
    mark_variant_of_parent(merged, source.data, path, parent_path)
    merged.swaps.update(base.swaps)
    merged.notes = [*base.notes, *merged.notes]
    return merged

"""Validation: substituted spec data into a :class:`~.spec.Spec`, every problem located.

Two passes, whose problems are reported together: each step's primitive must be registered and its
``args`` must validate against that primitive's argument model (defaults filled in), and the whole
spec must validate against the pydantic models of :mod:`.spec`. Pydantic's errors are translated
to the spec's own words, at the file:line:column where the key is written::

    extends: ../specs/crate.yaml                # mine.yaml
    encoder:
      layer:
        compress: {args: {haeds: 4}}
        sparsify: {args: {lambd: x}}

    mine.yaml:4:23: encoder.layer[0].args.haeds: unknown key 'haeds'; expected one of: bias, ... (did you mean 'heads'?)
    mine.yaml:5:23: encoder.layer[1].args.lambd: Input should be a valid number, ...; found 'x'

A value that failed a ``${reference}`` gets no second problem; a network that unrolls to more than
:data:`~.spec.MAX_STEPS` steps is refused where the largest share is written. Arguments a swapped
primitive inherited and does not take are dropped, with a note.
"""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from .. import registry
from ..errors import Problem, SpecError, did_you_mean, format_path, one_of
from .source import KeyPath, Source
from .spec import MAX_STEPS, PARTS, Derive, Spec, Stack


def validate(data: Any, source: Source, references: list[Problem]) -> Spec:
    """The substituted ``data`` as a Spec, every step's arguments with defaults filled in; raises
    SpecError with every problem, those of the ``${references}`` (already found) among them."""
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
    return spec


def _pydantic_problems(
    error: ValidationError, prefix: KeyPath, source: Source, model: type[BaseModel]
) -> list[Problem]:
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


BOTH_FORMS = (
    "a decoder is either derived (derive: inverse, form) or written as a stack (depth, layer, pre, post), not both"
)


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
    for stack in [
        ("encoder",),
        ("decoder",),
        *(("stacks", name) for name in (stacks if isinstance(stacks, dict) else {})),
    ]:
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


def _bounded(spec: Spec, source: Source) -> None:
    """At most MAX_STEPS steps once layers are unrolled (each is placed in a few milliseconds);
    reported where the largest share is written (a ``depth``, or a list of steps)."""
    counts = spec.step_counts()
    total = sum(counts.values())
    if total > MAX_STEPS:
        path, count = max(counts.items(), key=lambda item: item[1])
        message = (
            f"the network unrolls to {total:,} steps, {count:,} of them from here; at most {MAX_STEPS:,} "
            "(a deeper network takes minutes to check and build)"
        )
        raise SpecError([Problem(message, path, source.locate(path))])


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

"""The data sets ``--data NAME`` may name: one declaration each, registered as primitives and tasks are.

A set is declared once, with :func:`register` (a call, or a decorator on its loader), as a :class:`DataSet`:

* ``pattern``: how its names are written: literal text, UPPERCASE placeholders (each declared by a
  :class:`Parameter`) and ``[...]`` around an optional part: ``digits``, ``pasted-digits[:N]``,
  ``KIND[-V]:text``, ``folder:PATH``;
* ``summary``, ``source``, ``split`` and ``size``: what it is, where it comes from, how it is split and how
  many examples each split holds, in words, as ``crate-compose list data`` prints them;
* ``provides``: the kind of data it is, one of :data:`PROVIDED` (``labeled-images``, ``images``,
  ``next-byte-text``, ``tokenized-text``, ``labeled-tokens``, ``token-groups``) or a kind of your own. A task
  trains on the kinds it names (:attr:`crate_compose.tasks.Task.data_kinds`); a run that names no task gets
  the first registered task that trains on what its data provides (:func:`crate_compose.tasks.of`), so no
  loader names a task;
* ``status``, ``setup`` and ``cached``: how it comes to be on this machine (``shipped`` in an installed
  package, ``generated`` from a seed, ``your folder``), or the set-up step it needs (``make data``) and a
  function saying whether that step has been done;
* ``loader``: the function that loads it, or ``"module:function"`` (``".image_sets.shipped:load_digits"``, relative to
  this package), imported only when the set is loaded, so declaring a set imports no torch. It takes its
  parameters' values as keywords and returns a :class:`~.record.Data` whose ``provides`` is the declared one.

A name is read once, by :func:`resolve`, into a :class:`DataChoice`: the declaration that claims it (the first
registered whose pattern matches it as a whole), the loader keywords its parameters fill, and the name the
set is known by. :func:`crate_compose.data.sets.load_data` and :func:`~crate_compose.data.sets.takes` take a
name or a choice. A name no declaration claims is refused naming every form (:func:`names`) and the closest.

The built-in sets are declared in :mod:`.builtin_sets` (registered before any other, so they come first in
:func:`all_sets` and claim their names first); a plug-in (``--plugin my_sets.py``) or any module adds its
own with :func:`register` and no file of this package changes. Importing this module imports no torch
(``crate-compose list data`` answers without it).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable

from ..errors import DataError
from ..registering import Registry

if TYPE_CHECKING:
    from .record import Data

__all__ = [
    "IMAGES",
    "LABELED_IMAGES",
    "LABELED_TOKENS",
    "NEXT_BYTES",
    "PROVIDED",
    "TOKENIZED_TEXT",
    "TOKEN_GROUPS",
    "DataChoice",
    "DataSet",
    "Parameter",
    "all_sets",
    "get",
    "names",
    "provided",
    "register",
    "resolve",
    "whole",
]

# ---------------------------------------------------------------- what a set provides

LABELED_IMAGES = "labeled-images"
IMAGES = "images"
NEXT_BYTES = "next-byte-text"
TOKENIZED_TEXT = "tokenized-text"
LABELED_TOKENS = "labeled-tokens"
TOKEN_GROUPS = "token-groups"

PROVIDED = {  # the kinds the built-in sets provide, in words (the target of every example in brackets)
    LABELED_IMAGES: "labeled images (target: the class index)",
    IMAGES: "images without labels (target: -1)",
    NEXT_BYTES: "byte-level text (target: the next bytes)",
    TOKENIZED_TEXT: "tokenized text ([CLS] .. [SEP] windows of token ids; target: the same ids)",
    LABELED_TOKENS: "labeled token sequences ([CLS] snippet [SEP]; target: the class index)",
    TOKEN_GROUPS: "token sets labeled per token",
}

SEED_OR_SPEC = frozenset({"seed", "spec"})  # what a set may follow besides its name (DataChoice.takes)


def provided(kind: str) -> str:
    """The kind ``kind`` in words: :data:`PROVIDED`'s, else the identifier with its hyphens as spaces."""
    return PROVIDED.get(kind, kind.replace("-", " "))


# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Parameter:
    """One placeholder of a pattern (``N`` of ``pasted-digits[:N]``).

    ``words`` says what it is (``crate-compose list data``, refusals); ``argument`` is the loader keyword its
    value fills (None: the set's ``settle`` reads it); ``match`` the text it claims in a name, a regular
    expression (a name it claims is its set's: a bad value is refused by ``read`` in that set's terms, not
    called an unknown set); ``read`` turns the text into the value, and a ``ValueError`` it raises completes
    the refusal ``data set 'NAME': give the WORDS as FORM, PLACEHOLDER <its message>``."""

    name: str
    words: str
    argument: str | None = None
    match: str = "[^:]*"
    read: Callable[[str], Any] = str


def whole(low: int, high: int | Callable[[], int]) -> Callable[[str], int]:
    """A :attr:`Parameter.read` of a whole number from ``low`` to ``high``: a number, or a function giving it
    (called when a name is read, so a bound a loader module keeps is not imported to declare the set). The
    number is written in the digits 0-9 only: other characters Python counts as digits (``²``, ``٣``, ``𝟚``),
    a sign, spaces and a number of more digits than ``high`` has (never converted: ``int`` refuses a string
    of over 4,300 digits) are refused as out of range, with the set's own message."""

    def read(text: str) -> int:
        top = high() if callable(high) else high
        if not re.fullmatch("[0-9]+", text) or len(text.lstrip("0")) > len(str(top)) or not low <= int(text) <= top:
            raise ValueError(f"from {low} to {top:,}")
        return int(text)

    return read


@dataclass(frozen=True)
class DataSet:
    """The declaration of one data set (see the module docstring for each field).

    ``forms``: how ``names()`` and the unknown-name refusal write it (default: the pattern without its
    optional parts, and with them); ``settle(name, values)``: for a set whose parameters depend on each other,
    the loader keywords from the parameters' values (those the name gives), or another name to read instead
    (``folder:PATH`` of text files is ``bytes:folder:PATH``), refusing a bad name with a DataError;
    ``misnamed(name)``: called with a name no set claims, raises the DataError that says how this set is
    written when the name looks like one of its."""

    pattern: str
    summary: str
    source: str
    provides: str
    loader: Callable[..., "Data"] | str
    split: str = ""
    size: str = ""
    parameters: tuple[Parameter, ...] = ()
    status: str = "shipped"
    setup: str | None = None
    cached: Callable[[], bool] | None = None
    forms: tuple[str, ...] = ()
    settle: Callable[[str, dict[str, Any]], "dict[str, Any] | str"] | None = None
    misnamed: Callable[[str], None] | None = None
    # what the set holds, for its reader (docs/data-sets.md, made by :func:`markdown`): the table's "what",
    # "inputs" and "targets" cells and the paragraph about it (Markdown)
    about: str = ""
    inputs: str = ""
    targets: str = ""
    description: str = ""
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _parts(self.pattern)
        placeholders = _placeholders(parts)
        declared = [p.name for p in self.parameters]
        if sorted(placeholders) != sorted(declared) or len(set(declared)) != len(declared):
            raise ValueError(
                f"data set {self.pattern!r}: its placeholders {placeholders} are not its parameters "
                f"{declared} (each once)"
            )
        if not re.fullmatch("[a-z][a-z0-9-]*", self.provides):
            raise ValueError(
                f"data set {self.pattern!r}: provides {self.provides!r} is not a kind (lower-case "
                "letters, digits and hyphens, e.g. 'labeled-images')"
            )
        if self.setup is not None and self.cached is None:
            raise ValueError(f"data set {self.pattern!r}: a set-up step ({self.setup}) needs its cached() check")
        by_name = {p.name: p for p in self.parameters}
        object.__setattr__(self, "regex", re.compile(_regex(parts, by_name), re.DOTALL))
        if not self.forms:
            bare, full = _form(parts, set()), _form(parts, set(by_name))
            object.__setattr__(self, "forms", tuple(dict.fromkeys((bare, full))))

    def form(self, placeholder: str) -> str:
        """The pattern written with the optional parts that hold ``placeholder`` and without the others:
        ``pasted-digits:N`` for ``N``."""
        return _form(_parts(self.pattern), {placeholder})

    def load_function(self) -> Callable[..., "Data"]:
        """The loader itself (a ``"module:function"`` loader is imported now)."""
        if callable(self.loader):
            return self.loader
        module, _, attribute = self.loader.partition(":")
        return getattr(
            import_module(module, __package__) if module.startswith(".") else import_module(module), attribute
        )

    def availability(self) -> str:
        """Whether it is on this machine: ``cached`` or ``not cached (run SETUP)`` for a set with a set-up
        step, else its :attr:`status` (``shipped``, ``generated``, ``your folder``)."""
        if self.setup is None:
            return self.status
        return "cached" if self.cached() else f"not cached (run {self.setup})"


@dataclass(frozen=True)
class DataChoice:
    """A data set name read once (:func:`resolve`): ``data_set`` (the declaration that claims it), ``name`` (the
    name the set is known by: ``bytes:folder:PATH`` for ``folder:PATH`` of text files) and ``arguments`` (the
    loader keywords its parameters fill, as pairs)."""

    data_set: DataSet
    name: str
    arguments: tuple[tuple[str, Any], ...] = ()

    @property
    def provides(self) -> str:
        return self.data_set.provides

    def loader(self) -> Callable[..., "Data"]:
        """The loader with this name's keywords filled in."""
        function = self.data_set.load_function()
        return functools.partial(function, **dict(self.arguments)) if self.arguments else function

    @property
    def takes(self) -> frozenset[str]:
        """What the set follows besides its name and image size: ``"seed"`` (its random draws) and ``"spec"``
        (a set that fits itself to the spec: text, its context; subspaces, its sizes); a set that takes neither
        is the same for every spec and seed, so a command loads it once. Read from the loader's signature."""
        return frozenset(inspect.signature(self.data_set.load_function()).parameters) & SEED_OR_SPEC

    def __str__(self) -> str:
        return self.name


# ---------------------------------------------------------------- patterns


def _parts(pattern: str) -> list:
    """``pattern`` as a tree: literal strings, placeholders (1-tuples of their names) and optional parts (lists)."""
    stack: list[list] = [[]]
    for token in re.split(r"(\[|\]|[A-Z]+)", pattern):
        if token == "[":
            stack.append([])
        elif token == "]":
            if len(stack) == 1:
                raise ValueError(f"data set pattern {pattern!r}: a ']' closes no '['")
            inner = stack.pop()
            stack[-1].append(inner)
        elif re.fullmatch("[A-Z]+", token):
            stack[-1].append((token,))
        elif token:
            stack[-1].append(token)
    if len(stack) != 1 or not stack[0]:
        raise ValueError(f"data set pattern {pattern!r}: empty, or a '[' is never closed")
    return stack[0]


def _placeholders(parts: list) -> list[str]:
    found = []
    for part in parts:
        if isinstance(part, tuple):
            found.append(part[0])
        elif isinstance(part, list):
            found += _placeholders(part)
    return found


def _regex(parts: list, parameters: dict[str, Parameter]) -> str:
    out = []
    for part in parts:
        if isinstance(part, tuple):
            out.append(f"(?P<{part[0]}>{parameters[part[0]].match})")
        elif isinstance(part, list):
            out.append(f"(?:{_regex(part, parameters)})?")
        else:
            out.append(re.escape(part))
    return "".join(out)


def _form(parts: list, keep: set[str]) -> str:
    """The pattern written plainly, with the optional parts holding a placeholder in ``keep`` and without the
    others."""
    out = []
    for part in parts:
        if isinstance(part, tuple):
            out.append(part[0])
        elif isinstance(part, list):
            if set(_placeholders(part)) & keep:
                out.append(_form(part, keep))
        else:
            out.append(part)
    return "".join(out)


# ---------------------------------------------------------------- the registry

BUILTIN = (f"{__package__}.builtin_sets",)  # the modules declaring the built-in sets, registered before any other
_SETS: Registry[DataSet] = Registry("data set", BUILTIN, lambda held: _origin(held.loader))


def _origin(loader: Any) -> str:
    """Where a loader is defined; registering a pattern again from the same place (a re-run notebook cell, a
    plug-in imported twice) replaces its declaration."""
    if isinstance(loader, str):
        return loader
    return f"{getattr(loader, '__module__', '?')}.{getattr(loader, '__qualname__', repr(loader))}"


def register(
    pattern: str,
    *,
    summary: str,
    source: str,
    provides: str,
    loader: Callable[..., "Data"] | str | None = None,
    **declared: Any,
) -> Any:
    """Register the data set ``pattern`` (a :class:`DataSet`; ``declared``: its other fields). Given a
    ``loader``, the declaration is returned; without one, a decorator registering the function it decorates
    as the loader (and returning it)::

        @register("stripes[:N]", summary="horizontal or vertical stripes", source="generated",
                  provides=LABELED_IMAGES, status="generated",
                  parameters=(Parameter("N", "training images", "count", read=whole(2, 10_000)),))
        def load_stripes(*, count: int = 64, seed: int = 0) -> Data: ...

    A pattern is registered once; registering it again from another loader is a ValueError."""

    def add(function: Callable[..., "Data"] | str) -> Callable[..., "Data"] | str:
        _SETS.add(pattern, DataSet(pattern, summary, source, provides, function, **declared))
        _RESOLVED.clear()  # a name read before may be claimed otherwise now
        return function

    if loader is None:
        return add
    add(loader)
    return _SETS[pattern]


def all_sets() -> list[DataSet]:
    """Every registered set, in registration order (the built-in ones first)."""
    return list(_SETS.values())


def get(pattern: str) -> DataSet:
    """The set registered under ``pattern`` (``"pasted-digits[:N]"``); another pattern is a DataError."""
    if pattern not in _SETS:
        raise DataError(f"no data set is registered as {pattern!r}; registered: {', '.join(_SETS)}")
    return _SETS[pattern]


def markdown() -> str:
    """``docs/data-sets.md``: a table of every registered set (its name, what it is, inputs, targets, train / test
    sizes and split) and a section per set (its description, source, what it provides, its parameters), in
    registration order, made from the declarations alone (``crate-compose list data --markdown``)."""
    lines = [
        "# Data sets",
        "",
        "Every data set `--data NAME` reads, as each declares itself where it is registered "
        "(`crate_compose/data/builtin_sets.py`; a plug-in's set appears here when its module is loaded). "
        "This page is made from those declarations by `crate-compose list data --markdown`, and a test keeps "
        "it so; `crate-compose list data` says which sets are on this machine.",
        "",
        "| name | what | inputs | targets | train / test |",
        "| --- | --- | --- | --- | --- |",
    ]
    sets = all_sets()
    for one in sets:
        held = "; ".join(part for part in (one.size, one.split) if part)
        lines.append(f"| `{one.pattern}` | {one.about or one.summary} | {one.inputs} | {one.targets} | {held} |")
    for one in sets:
        lines += [
            "",
            f"## `{one.pattern}`",
            "",
            one.description or one.summary,
            "",
            f"Source: {one.source}. Provides `{one.provides}`: {provided(one.provides)}.",
        ]
        if one.parameters:
            lines.append("Parameters: " + "; ".join(f"`{p.name}`, {p.words}" for p in one.parameters) + ".")
    return "\n".join(lines) + "\n"


def names() -> list[str]:
    """How the registered sets are written (each set's forms, in registration order): the names ``load_data``
    accepts, a placeholder standing for a value (``folder:PATH``, ``KIND-V:text``)."""
    return [form for one in all_sets() for form in one.forms]


def resolve(name: "str | DataChoice") -> DataChoice:
    """The :class:`DataChoice` of ``name`` (a choice is returned as it is): the first registered set whose
    pattern matches the whole name, its parameters read (:attr:`Parameter.read`, then the set's ``settle``).
    A name no set claims is a DataError naming every form and the closest (``did you mean 'digits'?``),
    unless a set's ``misnamed`` says how its names are written."""
    if isinstance(name, DataChoice):
        return name
    if not isinstance(name, str):
        raise DataError(f"{name!r} is not a data set name")
    if name not in _RESOLVED:  # each name read once per process, however many checks ask (a refusal is not kept)
        _RESOLVED[name] = _claim(name, redirected=False)
    return _RESOLVED[name]


_RESOLVED: dict[str, DataChoice] = {}  # the names read so far (cleared when a set registers)


def _claim(name: str, redirected: bool) -> DataChoice:
    sets = all_sets()
    for one in sets:
        match = one.regex.fullmatch(name)
        if match is None:
            continue
        values = {}
        for parameter in one.parameters:
            text = match.group(parameter.name)
            if text is None:  # in an optional part the name leaves out
                continue
            try:
                values[parameter.name] = parameter.read(text)
            except ValueError as error:
                raise DataError(
                    f"data set '{name}': give the {parameter.words} as {one.form(parameter.name)}, "
                    f"{parameter.name} {error}"
                ) from None
        if one.settle is None:
            arguments = {p.argument: values[p.name] for p in one.parameters if p.argument and p.name in values}
        else:
            arguments = one.settle(name, values)
            if isinstance(arguments, str):  # another name for it
                if redirected:
                    raise DataError(
                        f"data set '{name}': {one.pattern} names it {arguments!r}, which is read as another name again"
                    )
                return _claim(arguments, redirected=True)
        return DataChoice(one, name, tuple(arguments.items()))
    for one in sets:
        if one.misnamed is not None:
            one.misnamed(name)
    forms = names()
    close = difflib.get_close_matches(name, forms, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    raise DataError(f"unknown data set '{name}': expected one of {', '.join(forms)}{hint}")

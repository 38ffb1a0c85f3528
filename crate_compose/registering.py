"""One way to register everything a spec, a run or a command names: primitives, tasks, data sets, and the
checkpoint families ``import`` and ``export`` read.

Each entry is declared where it is written, by one call of its registry (the ``@primitive`` decorator of
:mod:`crate_compose.registry`, the ``@task`` decorator of :mod:`crate_compose.tasks.task_registry`,
:func:`crate_compose.data.set_registry.register`, :func:`crate_compose.interop.catalog.family`), and a
plug-in registers with the same call. A :class:`Registry` holds one kind of entry. It imports the modules
that declare the built-in entries (:attr:`Registry.builtin`, a tuple of module names) the first time it is
read, so no package ``__init__`` imports every family up front and the built-in entries come first (a
plug-in that takes a built-in name is the one refused). An entry registered again from the same place (a
re-run notebook cell, a plug-in imported twice) replaces itself; another one under a taken name is a
ValueError naming where the first was declared.

Declaring imports no torch: what needs it is imported where it is used (a primitive's factory, a data
set's loader), so every name is read and checked before torch loads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module
from typing import Callable, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T]):
    """Entries of one kind by name, in the order they were registered (the built-in ones first): a mapping,
    read-only but for :meth:`add` and :meth:`pop` (a test removing what it registered).

    ``what`` names the kind in messages ("primitive", "data set"); ``builtin`` are the modules whose import
    registers the built-in entries; ``origin`` says where an entry was declared (a function's module and name):
    registering a name again from the same origin replaces the entry."""

    def __init__(self, what: str, builtin: tuple[str, ...], origin: Callable[[T], str]) -> None:
        self.what, self.builtin, self._origin = what, builtin, origin
        self._entries: dict[str, T] = {}
        self._loaded = False

    def add(self, name: str, entry: T, *, owner: Callable[[T], str | None] | None = None) -> T:
        """Register ``entry`` as ``name``; ``owner`` says, for the message refusing a taken name, who holds it (a
        built-in entry, a plug-in). An entry from outside the built-in modules is registered after them
        (:meth:`load`), so that it is the one refused when it takes a built-in name; a built-in module registering
        while another imports it does not load the rest (they may import it in turn)."""
        if not self.is_builtin(entry):
            self.load()
        held = self._entries.get(name)
        if held is not None and self._origin(held) != self._origin(entry):
            said = owner(held) if owner is not None else None
            raise ValueError(
                f"{self.what} {name!r} is already registered by {self._origin(held)}"
                f"{f' ({said})' if said else ''}; register yours under another name"
            )
        self._entries[name] = entry
        if self.is_builtin(entry):  # the built-in entries first, in their modules' order
            ordered = sorted(self._entries.items(), key=lambda item: self._rank(item[1]))
            self._entries.clear()
            self._entries.update(ordered)
        return entry

    def _rank(self, entry: T) -> int:
        """The place of the built-in module that declared ``entry`` in :attr:`builtin`; past them for another."""
        origin = self._origin(entry)
        return next((i for i, module in enumerate(self.builtin) if origin.startswith(module + ".")), len(self.builtin))

    def registered(self) -> dict[str, T]:
        """The entries registered so far, without importing the built-in modules (a registration in progress)."""
        return dict(self._entries)

    def load(self) -> dict[str, T]:
        """Every entry by name, the built-in modules imported first, once."""
        if not self._loaded:
            self._loaded = True  # first: a built-in module registering while imported must not recurse
            for module in self.builtin:
                import_module(module)
        return self._entries

    def copy(self) -> "Registry[T]":
        """A registry of the same kind holding the same entries (loaded), which registering into leaves this one
        as it was (a test's own registry)."""
        made: Registry[T] = Registry(self.what, self.builtin, self._origin)
        made._entries, made._loaded = dict(self.load()), True
        return made

    def restore(self, entries: dict[str, T]) -> None:
        """Hold exactly ``entries`` again (a test undoing what it, or a plug-in it loaded, registered)."""
        self._entries.clear()
        self._entries.update(entries)

    def is_builtin(self, entry: T) -> bool:
        """Whether ``entry`` was declared in one of the built-in modules."""
        return self._rank(entry) < len(self.builtin)

    def pop(self, name: str, *default: T | None) -> T | None:
        return self.load().pop(name, *default)

    def __delitem__(self, name: str) -> None:
        del self.load()[name]

    def __getitem__(self, name: str) -> T:
        return self.load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.load()))

    def __len__(self) -> int:
        return len(self.load())

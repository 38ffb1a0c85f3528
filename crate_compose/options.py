"""Declared options: one declaration per run setting gives its command-line flag, its check and its place in
a run's identity.

An :class:`Option` says what a setting is (its type, default, bounds or choices, help) and what it is to a
run (:attr:`Option.role`): part of what the run learns (recorded in ``run.json`` and checked on resume), its
cadence (what is logged and saved), its length (which may grow on resume), or machinery and outputs that
never change what is computed (free on resume). From it come the ``train``/``ablate`` flag
(:meth:`Option.add_to`), the message for a value a run cannot take (:meth:`Option.problem`, the same for the
command line, a recipe, a grid file and the Python API) and whether a run recorded before the option existed
still resumes (:attr:`Option.later`: left out of the identity at its default).

The general settings declare theirs on :class:`crate_compose.settings.Settings`'s fields (:func:`setting`);
a task declares its own in :attr:`crate_compose.tasks.Task.options`. Torch-free.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from typing import Any

ROLES = ("learned", "cadence", "length", "machinery", "output")
# learned: part of the run's identity, refused changed on resume; cadence: logged and saved, may change (kept in
# the record's history); length: may grow once the run is finished; machinery, output: how fast and where the
# results are written, never what is computed: no part of the identity, free on resume


def number(kind, low=None, high=None, *, low_open=False, high_open=False, what="a number"):
    """An argparse type: ``kind`` (int or float), finite, within bounds; a clear message otherwise."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            if high is None:
                bound = f"greater than {low}" if low_open else f"at least {low}"
            else:
                bound = f"in [{low}, {high}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"{text}: must be {bound}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


@dataclass(frozen=True)
class Option:
    """One run setting (see the module docstring). ``kind`` is ``int``, ``float``, ``bool`` or ``str``; a
    number lies in ``[low, high]`` (either end open by ``low_open``/``high_open``, ``None``: unbounded); a
    ``str`` is one of ``choices``; ``optional``: ``None`` is a value (derived from others: the warm-up from
    the steps). ``task``: the task that declares it (None: every run's)."""

    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    role: str = "learned"
    later: bool = False  # added after runs were first recorded: left out of their identity at its default
    flagged: bool = True  # whether train and ablate take it as a flag (a derived setting may not)
    name: str = ""
    task: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"option {self.name or '?'}: role {self.role!r} is not one of {', '.join(ROLES)}")
        if self.kind not in (int, float, bool, str):
            raise ValueError(f"option {self.name or '?'}: kind {self.kind!r} is not int, float, bool or str")

    @property
    def flag(self) -> str:
        """``--teacher-temp`` for ``teacher_temp``."""
        return "--" + self.name.replace("_", "-")

    def named(self, name: str, task: str | None = None) -> "Option":
        return replace(self, name=name, task=task)

    # ------------------------------------------------------------------ checks

    def problem(self, value: Any) -> str | None:
        """Why ``value`` cannot be this option's (a sentence about the value), or None when it can."""
        if self.optional and value is None:
            return None
        null = " (or null)" if self.optional else ""
        if self.kind is bool:
            return None if isinstance(value, bool) else f"{value!r} is not true or false"
        if self.kind is str:
            if self.choices and value not in self.choices:
                return f"{value!r} is not one of: {', '.join(self.choices)}"
            return None if isinstance(value, str) and value else f"{value!r} is not a name"
        if self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and self._within(value)
            if not ok:
                low, high = int(self.low or 0), None if self.high is None else int(self.high)
                bound = f"a whole number >= {low}" if high is None else f"a whole number in [{low}, {high}]"
                return f"{value!r} is not {bound}{null}"
            return None
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and self._within(value)
        )
        if not ok:
            bound = "" if self.low is None else f" {'>' if self.low_open else '>='} {self.low:g}"
            if self.high is not None:
                bound += f"{' and' if bound else ''} {'<' if self.high_open else '<='} {self.high:g}"
            return f"{value!r} is not a finite number{bound}{null}"
        return None

    def _within(self, value: float) -> bool:
        low = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return low and high

    # ------------------------------------------------------------------ the flag

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add :attr:`flag` to ``parser``, defaulting to None ("not given": the run's own, else :attr:`default`)."""
        said = self.help
        if "default:" not in said and self.default is not None:  # said in words where it is not a plain value
            shown = (
                ("yes" if self.default else "no")
                if self.kind is bool
                else f"{self.default:g}"
                if self.kind is float
                else self.default
            )
            said += f" (default: {shown})"
        said = said.replace("%", "%%")
        if self.task is not None:
            said = f"task {self.task}: {said}"
        kwargs: dict[str, Any] = {"default": None, "dest": self.name, "help": said}
        if self.kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif self.kind is str:
            kwargs["choices"] = self.choices or None
        else:
            what = "a whole number" if self.kind is int else "a number"
            kwargs["type"] = number(
                self.kind, self.low, self.high, low_open=self.low_open, high_open=self.high_open, what=what
            )
        if self.metavar:
            kwargs["metavar"] = self.metavar
        parser.add_argument(self.flag, **kwargs)


def setting(default: Any, help: str, kind: type | None = None, **declared: Any) -> Any:
    """A :class:`~crate_compose.settings.Settings` field declared as an :class:`Option` (its ``metadata``);
    ``kind`` defaults to the default's type."""
    kind = kind or type(default)
    option = Option(kind=kind, default=default, help=help, **declared)
    return field(default=default, metadata={"option": option})

"""Progress of long work: a live bar on a terminal, plain periodic lines in a log.

On a terminal, tqdm draws the bar (a well-kept bar with rates and an estimate of the time left).
When stderr is not a terminal (a pipe, a file, a cluster's log), redrawing a bar would write a
carriage return per update (85 kB for a 1,000-step run), so :class:`Lines` prints a plain line
at every tenth of the work and at least every ``every_s`` seconds, and one at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Lines:
    """The subset of tqdm's interface the workbench uses, as plain lines on stderr."""

    def __init__(self, total: int, initial: int = 0, *, unit: str = "step", every_s: float = 60.0) -> None:
        self.total, self.n, self.unit, self.every_s = total, initial, unit, every_s
        self.start_n, self.began = initial, time.monotonic()
        self.last_line, self.postfix = self.began, ""
        self.marks = {total * k // 10 for k in range(1, 11)}

    def update(self, count: int = 1) -> None:
        self.n += count
        now = time.monotonic()
        if self.n in self.marks or now - self.last_line >= self.every_s:
            self.last_line = now
            self._line(now)

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass

    def _line(self, now: float) -> None:
        elapsed = now - self.began
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.n) / rate if rate > 0 else float("nan")
        parts = [f"{self.unit} {self.n:,}/{self.total:,} ({100 * self.n / max(1, self.total):.0f}%)", self.postfix,
                 f"{rate:.1f} {self.unit}/s", f"{elapsed:.0f} s elapsed"]
        if self.n < self.total and left == left:
            parts.append(f"about {left:.0f} s left")
        self.write(", ".join(p for p in parts if p))


class Silent:
    """No progress (``--no-progress``, and every process but rank 0 under torchrun); what is
    written (an evaluation's result) still goes to stderr."""

    def update(self, count: int = 1) -> None:
        pass

    def set_postfix(self, **values: Any) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def bar(total: int, initial: int = 0, *, enabled: bool = True, unit: str = "step"):
    """A progress display: tqdm on a terminal, :class:`Lines` otherwise, :class:`Silent` when disabled."""
    if not enabled:
        return Silent()
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, leave=True)
    return Lines(total, initial, unit=unit)

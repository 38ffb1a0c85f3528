"""Progress of long work: a live bar on a terminal, plain periodic lines in a log.

On a terminal, tqdm draws the bar (a well-kept bar with rates and an estimate of the time left).
When stderr is not a terminal (a pipe, a file, a cluster's log), redrawing a bar would write a
carriage return per update (85 kB for a 1,000-step run), so :class:`Lines` prints a plain line
at every tenth of the work and at least every ``every_s`` seconds, and one at the end. Its rate, and
the time left, come from the last ``WINDOW_S`` seconds of updates, never from the first one (a
``--compile`` step that took minutes), so the estimate follows a machine that slows down or speeds up.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

WINDOW_S = 120.0  # the rate is measured over the updates of the last two minutes


class Lines:
    """The subset of tqdm's interface the workbench uses, as plain lines on stderr."""

    def __init__(
        self, total: int, initial: int = 0, *, unit: str = "step", every_s: float = 60.0, elapsed: float = 0.0
    ) -> None:
        self.total, self.n, self.unit, self.every_s = total, initial, unit, every_s
        self.began = time.monotonic() - elapsed  # a resumed run's clock goes on
        self.last_line, self.postfix = time.monotonic(), ""
        self.marks = {total * k // 10 for k in range(1, 11)}
        self.recent: deque[tuple[float, int]] = deque()  # (time, work done) of the updates in the window

    def update(self, count: int = 1) -> None:
        self.n += count
        now = time.monotonic()
        self.recent.append((now, self.n))
        while len(self.recent) > 2 and now - self.recent[0][0] > WINDOW_S:
            self.recent.popleft()
        if self.n in self.marks or now - self.last_line >= self.every_s:
            self.last_line = now
            self._line(now)

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        """What the next line says after the count (the loss of the step the next :meth:`update` counts);
        ``refresh`` is tqdm's (a line is printed by :meth:`update` only)."""
        self.postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass

    def rate(self) -> float:
        """Work per second over the window's updates (0.0 until there are two: the first, which may have
        compiled the network, only starts the clock)."""
        (t0, n0), (t1, n1) = self.recent[0], self.recent[-1]
        return (n1 - n0) / (t1 - t0) if len(self.recent) > 1 and t1 > t0 else 0.0

    def _line(self, now: float) -> None:
        elapsed = now - self.began
        rate = self.rate()
        left = (self.total - self.n) / rate if rate > 0 else float("nan")
        parts = [
            f"{self.unit} {self.n:,}/{self.total:,} ({100 * self.n / max(1, self.total):.0f}%)",
            self.postfix,
            f"{rate:.1f} {self.unit}/s",
            f"{elapsed:.0f} s elapsed",
        ]
        if self.n < self.total and left == left:
            parts.append(f"about {left:.0f} s left")
        self.write(", ".join(p for p in parts if p))


class Silent:
    """No progress (``--no-progress``, and every process but rank 0 under torchrun); what is
    written (an evaluation's result) still goes to stderr."""

    def update(self, count: int = 1) -> None:
        pass

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def bar(total: int, initial: int = 0, *, enabled: bool = True, unit: str = "step", elapsed: float = 0.0):
    """A progress display: tqdm on a terminal (its rate an exponential average of the recent updates),
    :class:`Lines` otherwise, :class:`Silent` when disabled; ``elapsed``: seconds already spent (a resumed
    run's)."""
    if not enabled:
        return Silent()
    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, leave=True)
    return Lines(total, initial, unit=unit, elapsed=elapsed)

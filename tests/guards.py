"""A guard for tests that feed the tool hostile input in-process (the fuzzing and the corpus).

A case that hangs or allocates without bound must fail on its own, not stop the suite.
"""

from __future__ import annotations

import resource
import signal
from contextlib import contextmanager
from typing import Iterator


class Hang(BaseException):
    """Raised by the hang guard: a BaseException, so that no ``except Exception`` of the tool eats it."""


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@contextmanager
def guarded(seconds: float, margin: int) -> Iterator[None]:
    """SIGALRM after ``seconds``; allocations beyond ``margin`` bytes of address space more than the
    process holds fail (a soft RLIMIT_AS); both undone on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + margin
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)

    def expire(signum, frame):
        raise Hang(f"no answer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)  # again every second: a handler run inside a gc
    # callback or a __del__ has its exception swallowed ("Exception ignored in ...")
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

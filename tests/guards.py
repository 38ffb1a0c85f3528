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


@contextmanager
def process_state_kept(*plugin_paths: str) -> Iterator[None]:
    """Put back, on exit, what a command run in-process may change: the environment, ``sys.path``, the
    registry and its plug-in failures, torch's default dtype, threads and grad mode, and every random
    state. Modules imported meanwhile are forgotten when they are plug-ins (named ``crate_compose_plugin_*``,
    or loaded from a file under one of ``plugin_paths``); crate_compose's own stay."""
    import os
    import random
    import sys

    import numpy as np
    import torch

    from crate_compose import registry

    environ, path, modules = dict(os.environ), list(sys.path), set(sys.modules)
    primitives, failures = dict(registry._REGISTRY), list(registry._PLUGIN_FAILURES)
    dtype, threads, grad = torch.get_default_dtype(), torch.get_num_threads(), torch.is_grad_enabled()
    rng = torch.random.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if name.startswith("crate_compose_plugin_") or (plugin_paths and file.startswith(plugin_paths)):
                del sys.modules[name]
        registry._REGISTRY.restore(primitives)
        registry._PLUGIN_FAILURES[:] = failures
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
        torch.random.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])

"""Memory sizes and limits: how ``--memory-limit`` is read and a size is said.

A limit is, in order: the ``memory_limit`` argument (``--memory-limit`` on the command line), the
``CRATE_COMPOSE_MEMORY_LIMIT`` environment variable, or what the device has: 90% of the memory the system
reports available (``MemAvailable``), or of the free memory of a CUDA device. Sizes read ``8GB``, ``512MiB``,
``2e9`` or ``none`` (no limit). What is checked against it, a build's or a run's estimate, is
:mod:`crate_compose.building.budget`'s; a data set's images, :mod:`crate_compose.data`'s.
"""

from __future__ import annotations

import os
import re

from .errors import Problem, SpecError

ENVIRONMENT = "CRATE_COMPOSE_MEMORY_LIMIT"
HEADROOM = 0.9  # of the memory the device reports available
UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str | int | float | None) -> float | None:
    """``"8GB"``, ``"512MiB"``, ``"2e9"``, ``4_000_000_000`` -> bytes; ``"none"`` / ``None`` -> no limit."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("none", "off", "unlimited")):
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        number, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).lower() not in UNITS:
            raise ValueError(f"{text!r} is not a size; give e.g. 8GB, 512MiB, 2e9 or none")
        number, unit = float(match.group(1)), match.group(2).lower()
    value = number * UNITS[unit]
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r}: a memory limit must be a positive size (or none)")
    return value


def human(size: float) -> str:
    """Bytes in the largest decimal unit that keeps a number >= 1: ``5.2 GB``."""
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= factor:
            return f"{size / factor:,.1f} {unit}"
    return f"{size:.0f} B"


def device_limit(device: str = "cpu") -> tuple[float | None, str]:
    """What the device has (the default limit), and where that number comes from."""
    if str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return HEADROOM * free, f"90% of the free memory of {device}"
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return HEADROOM * int(line.split()[1]) * 1024, "90% of the memory available on this machine"
    except OSError:
        pass
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return HEADROOM * pages * size, "90% of this machine's memory"


def resolve_limit(memory_limit: str | float | None = None, device: str = "cpu") -> tuple[float | None, str]:
    """The limit in bytes (None: none) and how it was set, for the message."""
    if memory_limit is not None:
        return parse_size(memory_limit), "--memory-limit"
    if os.environ.get(ENVIRONMENT):
        try:
            return parse_size(os.environ[ENVIRONMENT]), ENVIRONMENT
        except ValueError as error:
            raise SpecError([Problem(f"{ENVIRONMENT}: {error}", (), None)]) from None
    return device_limit(device)

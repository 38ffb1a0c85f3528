"""Facts about the machine a benchmark runs on (torch-free, so a benchmark of start-up can use them)."""

from __future__ import annotations


def cpu_stall_us() -> int | None:
    """Total time (us) some runnable task waited for a CPU (Linux PSI), or None without PSI."""
    try:
        with open("/proc/pressure/cpu") as pressure:
            return int(pressure.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None

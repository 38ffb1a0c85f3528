"""Facts about the machine a benchmark runs on (torch-free, so a benchmark of start-up can use them)."""

from __future__ import annotations


def cpu_stall_us() -> int | None:
    """Total time (us) some runnable task waited for a CPU (Linux PSI), or None without PSI."""
    try:
        with open("/proc/pressure/cpu") as pressure:
            return int(pressure.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None


def publish(text: str, out: str | None) -> None:
    """Print a benchmark's report, and append it to ``out`` (benchmarks/RESULTS.md) when given."""
    import sys

    print(text)
    if out:
        with open(out, "a") as handle:
            handle.write("\n" + text)
        print(f"appended to {out}", file=sys.stderr)

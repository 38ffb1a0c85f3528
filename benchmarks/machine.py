"""Facts about the machine a benchmark runs on, and timing on it (torch is imported only to wait for a CUDA device,
so a benchmark of start-up can use them)."""

from __future__ import annotations


def cpu_stall_us() -> int | None:
    """Total time (us) some runnable task waited for a CPU (Linux PSI), or None without PSI."""
    try:
        with open("/proc/pressure/cpu") as pressure:
            return int(pressure.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    import platform

    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def chosen_device(name: str, parser):
    """The device ``--device NAME`` asks for (``auto``: CUDA when torch sees it, else the CPU); a CUDA device
    torch does not see is refused through ``parser`` (exit 2)."""
    import torch

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device")
    return device


def synchronize(device) -> None:
    """Wait for a CUDA device's queued work (a CPU runs it as it is called)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def timed(fn, device, stall_max: float, retakes: int) -> tuple[float, float]:
    """Seconds of one call of ``fn`` on ``device`` and its CPU stall share; retaken (up to ``retakes`` times)
    while another task held the cores for more than ``stall_max`` of the time."""
    import time

    for _ in range(retakes + 1):
        stall = cpu_stall_us() if device.type == "cpu" else None
        synchronize(device)
        began = time.perf_counter()
        fn()
        synchronize(device)
        seconds = time.perf_counter() - began
        share = 0.0 if stall is None else (cpu_stall_us() - stall) / 1e6 / seconds
        if share <= stall_max:
            break
    return seconds, share


def publish(text: str, out: str | None) -> None:
    """Print a benchmark's report, and append it to ``out`` (benchmarks/RESULTS.md) when given."""
    import sys

    print(text)
    if out:
        with open(out, "a") as handle:
            handle.write("\n" + text)
        print(f"appended to {out}", file=sys.stderr)

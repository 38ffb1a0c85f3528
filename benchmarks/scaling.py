"""Scaling in the token count n: one TSSA step against one MSSA step, time and peak memory.

    .venv/bin/python benchmarks/scaling.py [--quick] [--device auto|cpu|cuda] [--out [PATH]]

Both steps are the registered primitives, built as a spec builds them, with d = 384 and 6 heads
(MSSA with head_dim 64, so both project to 384): batch 1, float32, forward pass only under
``torch.inference_mode()``, n = 256 ... 16384 tokens. Three steps are measured at each n:

* ``tssa``: token statistics self-attention (ToST), no token-token products.
* ``mssa``: MSSA as built, through ``F.scaled_dot_product_attention`` with whatever kernel PyTorch
  picks (on CPU in float32 a flash-attention kernel that never holds the n x n matrix; the kernel
  used is named in the output).
* ``mssa-math``: the same module under ``sdpa_kernel(SDPBackend.MATH)``, which materializes the
  K x n x n attention matrix as the paper's formula ``softmax(w w^T / sqrt(p)) w`` does.

Time: at each n the three steps are warmed up, then timed in interleaved rounds (tssa, mssa,
mssa-math, tssa, ...) in one process, 5 rounds (3 at n >= 8192, where one round takes seconds); the
table gives medians, so the ratios are taken in one run. On a shared machine the CPU timings need
the cores to themselves (with 2 threads on 2 cores, one competing process makes a 3 ms step take
100 ms), so each round's CPU stall share is read from Linux PSI (``/proc/pressure/cpu``: time some
task waited for a core, over the round's wall time); a round above ``--stall-max`` (3 %) is set
aside and the script waits for the machine to quiet down (``--patience`` s per n at most). The
table shows rounds kept / timed and the worst stall among those kept. CUDA timings bracket each
call with ``torch.cuda.synchronize()``.

Peak memory is the peak extra memory of one forward pass: the most bytes live at any moment during
the call above what was live when it started, the returned output included.

* CPU: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free made through
  PyTorch's CPU allocator as a signed ``[memory]`` event (``KinetoEvent.nbytes``); the script sorts
  them by time and takes the maximum of the running sum. This counts every tensor (intermediates,
  the attention matrix, kernel workspaces allocated as tensors) exactly, whatever the C allocator
  later does with freed pages. It does not see memory that libraries allocate outside PyTorch's
  allocator (e.g. BLAS packing buffers); the RSS cross-check, which sees everything, agreed with
  it within 0.4 MiB at every cell of the reference run (benchmarks/RESULTS.md).
  Cross-check (CPU, on by default, ``--no-rss-check`` to skip): each (step, n) also runs in a fresh
  subprocess with glibc's mmap threshold pinned at 64 KiB (``MALLOC_MMAP_THRESHOLD_``, which also
  turns off glibc's dynamic threshold; ``MALLOC_TRIM_THRESHOLD_=0``), so every large buffer is
  mmapped and returned to the OS when freed. After one warm-up forward the subprocess resets its
  RSS high-water mark (``5`` into ``/proc/self/clear_refs``, which also resets ``ru_maxrss``), runs
  one forward, and reports ``VmHWM`` minus ``VmRSS`` before the call. Without the pinned threshold
  glibc keeps the warm-up's freed buffers in its heap and the RSS delta undercounts (TSSA at 4096
  tokens: 12 MiB instead of 30), which is why a plain ``ru_maxrss`` before/after is not used.
* CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus
  ``memory_allocated()`` before the call (live tensor bytes, not the allocator's reserved cache).

Exponents are least-squares slopes of log(time) and log(peak memory) against log(n) over
n >= ``--fit-min`` (default 1024: below that fixed per-call overheads dominate TSSA's time). The goals
checked (and reported as they come out, whichever way): TSSA's exponents at most 1.15, MSSA's at
least 1.8, TSSA at least 10x faster than MSSA at n = 16384.

Prints markdown (the table, the exponents, the goals); ``--out`` appends the same as a section of
``benchmarks/RESULTS.md`` (writing a machine header first if the file is new); with matplotlib
installed, writes a log-log plot to ``benchmarks/scaling.png`` (``scaling-cuda.png`` for CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from machine import cpu_stall_us  # benchmarks/machine.py, beside this script
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from crate_compose import registry

HERE = Path(__file__).resolve().parent
DIM, HEADS, HEAD_DIM = 384, 6, 64
STEPS = ("tssa", "mssa", "mssa-math")
FULL_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_SIZES = (256, 1024, 2048, 4096)
GOAL_N = 16384
LARGE_N = 8192
TSSA_MAX, MSSA_MIN, SPEEDUP_MIN = 1.15, 1.8, 10.0
MiB = 2**20


def build(step: str, n: int, device: str) -> torch.nn.Module:
    """The registered primitive for ``step`` at token shape ``(n, 384)``, float32, eval mode."""
    name = "tssa" if step == "tssa" else "mssa"
    args = {"heads": HEADS} if name == "tssa" else {"heads": HEADS, "head_dim": HEAD_DIM}
    primitive = registry.get(name)
    torch.manual_seed(0)
    module = primitive.build(primitive.args.model_validate(args), (n, DIM))
    return module.to(device=device, dtype=torch.float32).eval()


def backend(step: str):
    """``mssa-math`` forces the math SDPA backend; the others run as built."""
    return sdpa_kernel(SDPBackend.MATH) if step == "mssa-math" else contextlib.nullcontext()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def quiet_stderr():
    """Silence fd 2 (the profiler's C++ side prints start/stop lines there); restored on exit."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profiled(fn):
    """Run ``fn()`` under the memory profiler; return (its result, the profiler's events)."""
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    return result, prof.profiler.kineto_results.events()


def attention_kernel(device: str) -> str:
    """The aten op ``F.scaled_dot_product_attention`` dispatches to for the built MSSA."""
    module, x = build("mssa", 256, device), torch.randn(1, 256, DIM, device=device)
    with torch.inference_mode():
        _, events = profiled(lambda: module(x))
    names = [e.name() for e in events if e.name().startswith("aten::_") and "attention" in e.name()]
    return names[0].removeprefix("aten::") if names else "unknown"


def cpu_peak(module: torch.nn.Module, step: str, x: torch.Tensor) -> int:
    """Peak extra bytes of one forward, from the profiler's allocation events (see the docstring)."""
    with backend(step):
        output, events = profiled(lambda: module(x))
    del output
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak


def cuda_peak(module: torch.nn.Module, step: str, x: torch.Tensor) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with backend(step):
        output = module(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del output
    return peak


def proc_status(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def rss_probe(step: str, n: int) -> None:
    """Subprocess side of the RSS cross-check: print the RSS peak of one forward, in bytes."""
    module, x = build(step, n, "cpu"), torch.randn(1, n, DIM)
    with torch.inference_mode(), backend(step):
        module(x)  # warm-up: one-time library initialization is not part of a forward's memory
        before = proc_status("VmRSS")
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset the high-water mark (VmHWM, ru_maxrss) to the current RSS
        output = module(x)
        peak = proc_status("VmHWM")
    del output
    print(json.dumps({"step": step, "n": n, "bytes": peak - before}))


def rss_peak(step: str, n: int) -> int | None:
    """Peak RSS growth of one forward of ``step`` at ``n``, in a fresh process (None if unavailable)."""
    if not Path("/proc/self/clear_refs").exists():
        return None
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    command = [sys.executable, __file__, "--threads", str(torch.get_num_threads()), "--rss-probe", step, str(n)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        print(f"  (rss check {step} n={n} failed: {done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["bytes"]


def cpu_busy_share(interval_s: float = 2.0) -> float | None:
    """Share of all cores busy over ``interval_s`` while this process sleeps (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total, idle = sample()
        time.sleep(interval_s)
        total2, idle2 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1 - (idle2 - idle) / max(total2 - total, 1)


def wait_for_quiet(limit_s: float) -> None:
    """Sleep (up to ``limit_s``) until other processes use under 10 % of the cores."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        busy = cpu_busy_share()
        if busy is None or busy < 0.10:
            return


def time_steps(modules: dict, x: torch.Tensor, device: str, runs: int, stall_max: float, patience_s: float) -> dict:
    """Warm up, then time rounds of the steps interleaved until ``runs`` rounds ran uncontended.

    A round is one call of each step. On CPU its stall share (Linux PSI: time some task waited for
    a core, over the round's wall time) says whether other processes competed for the cores; a
    round above ``stall_max`` is set aside and the script waits for the machine to quiet down, for
    at most ``patience_s`` in all. If too few clean rounds come in time, the least contended
    ``runs`` rounds are kept and their stall shows in the table.
    """
    with torch.inference_mode():
        for step in STEPS:  # warm-up: at least one call and 0.25 s per step
            start = time.perf_counter()
            while True:
                with backend(step):
                    modules[step](x)
                synchronize(device)
                if time.perf_counter() - start > 0.25:
                    break
        rounds: list[tuple[float, dict[str, float]]] = []
        deadline = time.monotonic() + patience_s
        while True:
            stall, wall = cpu_stall_us(), time.perf_counter()
            one = {}
            for step in STEPS:
                with backend(step):
                    synchronize(device)
                    start = time.perf_counter()
                    output = modules[step](x)
                    synchronize(device)
                    one[step] = time.perf_counter() - start
                del output
            after = cpu_stall_us()
            share = (
                0.0
                if device != "cpu" or stall is None or after is None
                else (after - stall) / 1e6 / (time.perf_counter() - wall)
            )
            rounds.append((share, one))
            clean = [r for r in rounds if r[0] <= stall_max]
            if len(clean) >= runs or (len(rounds) >= runs and time.monotonic() > deadline):
                break
            if share > stall_max:
                wait_for_quiet(max(0.0, min(30.0, deadline - time.monotonic())))
    kept = clean[:runs] if len(clean) >= runs else sorted(rounds, key=lambda r: r[0])[:runs]
    return {
        "median": {step: statistics.median(r[1][step] for r in kept) for step in STEPS},
        "min": {step: min(r[1][step] for r in kept) for step in STEPS},
        "stall": max(r[0] for r in kept) if device == "cpu" and cpu_stall_us() is not None else None,
        "runs": len(kept),
        "rounds": len(rounds),
    }


def measure(n: int, device: str, runs: int, rss_check: bool, stall_max: float, patience_s: float) -> dict:
    """Median and min times (s), peak bytes and the RSS cross-check of the three steps at ``n`` tokens."""
    modules = {"tssa": build("tssa", n, device)}
    modules["mssa"] = modules["mssa-math"] = build("mssa", n, device)
    x = torch.randn(1, n, DIM, device=device)
    timed = time_steps(modules, x, device, runs, stall_max, patience_s)
    if timed["rounds"] > timed["runs"]:
        print(f"  n={n}: {timed['rounds'] - timed['runs']} contended round(s) set aside", file=sys.stderr, flush=True)
    with torch.inference_mode():
        peaks = {step: (cpu_peak if device == "cpu" else cuda_peak)(modules[step], step, x) for step in STEPS}
    del modules, x
    rss = {step: rss_peak(step, n) for step in STEPS} if rss_check and device == "cpu" else {}
    return {"n": n, **timed, "peak": peaks, "rss": rss}


def slope(ns: list[int], values: list[float]) -> float:
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def exponents(rows: list[dict], fit_min: int) -> tuple[list[int], dict[str, dict[str, float]]]:
    fitted = [row for row in rows if row["n"] >= fit_min]
    ns = [row["n"] for row in fitted]
    if len(ns) < 2:
        return ns, {}
    return ns, {
        step: {
            "time": slope(ns, [row["median"][step] for row in fitted]),
            "memory": slope(ns, [row["peak"][step] for row in fitted]),
        }
        for step in STEPS
    }


def goals(rows: list[dict], fitted: dict[str, dict[str, float]]) -> list[str]:
    def verdict(ok: bool) -> str:
        return "**holds**" if ok else "**does not hold**"

    lines = []
    if fitted:
        for quantity in ("time", "memory"):
            e = fitted["tssa"][quantity]
            lines.append(f"TSSA {quantity} exponent <= {TSSA_MAX}: {e:.2f}, {verdict(e <= TSSA_MAX)}")
        for step in ("mssa", "mssa-math"):
            for quantity in ("time", "memory"):
                e = fitted[step][quantity]
                lines.append(f"{step} {quantity} exponent >= {MSSA_MIN}: {e:.2f}, {verdict(e >= MSSA_MIN)}")
    at_goal = [row for row in rows if row["n"] == GOAL_N]
    for step in ("mssa", "mssa-math"):
        if at_goal:
            ratio = at_goal[0]["median"][step] / at_goal[0]["median"]["tssa"]
            lines.append(
                f"TSSA >= {SPEEDUP_MIN:g}x faster than {step} at n = {GOAL_N}: "
                f"{ratio:.1f}x, {verdict(ratio >= SPEEDUP_MIN)}"
            )
        else:
            lines.append(f"TSSA >= {SPEEDUP_MIN:g}x faster than {step} at n = {GOAL_N}: not measured")
    return lines


def mib(nbytes: float | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / MiB:.1f}"


def report(rows: list[dict], device: str, kernel: str, fit_min: int) -> str:
    out = [
        f"Device {device_name(device)}; float32, batch 1, d = {DIM}, {HEADS} heads (MSSA head_dim {HEAD_DIM}); "
        f"forward only under inference_mode; times are medians of the interleaved runs after a warm-up. "
        f"`mssa` = SDPA as built (dispatches to `{kernel}`); `mssa-math` = the same module under "
        f"`sdpa_kernel(SDPBackend.MATH)` (materializes the {HEADS} x n x n attention).",
        "",
        "| n | tssa ms | mssa ms | mssa-math ms | mssa / tssa | mssa-math / tssa "
        "| tssa peak MiB | mssa peak MiB | mssa-math peak MiB | runs kept / timed | CPU stall |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        t, p = row["median"], row["peak"]
        out.append(
            f"| {row['n']} | {t['tssa'] * 1e3:.2f} | {t['mssa'] * 1e3:.2f} | {t['mssa-math'] * 1e3:.2f} "
            f"| {t['mssa'] / t['tssa']:.1f} | {t['mssa-math'] / t['tssa']:.1f} "
            f"| {mib(p['tssa'])} | {mib(p['mssa'])} | {mib(p['mssa-math'])} | {row['runs']} / {row['rounds']} "
            f"| {'n/a' if row['stall'] is None else format(row['stall'], '.0%')} |"
        )
    method = (
        "torch.profiler allocation events, max of the running sum of live bytes"
        if device == "cpu"
        else "torch.cuda.max_memory_allocated() minus memory_allocated() before the call"
    )
    out += [
        "",
        f"Peak MiB: extra memory of one forward pass, output included ({method}). "
        "Runs kept / timed: rounds (one call of each step) used for the medians / rounds timed; a round "
        "during which other processes competed for the cores (CPU stall share above the threshold) is set "
        "aside. CPU stall: the largest stall share among the kept rounds (Linux PSI: time some task waited "
        "for a CPU over the round's wall time); near 0 means the timings had the cores to themselves.",
    ]
    if any(row["rss"] for row in rows):
        out += [
            "",
            "Cross-check, fresh subprocess per cell: RSS high-water mark growth of one forward after a warm-up "
            "(glibc mmap threshold pinned at 64 KiB, `/proc/self/clear_refs` reset), MiB:",
            "",
            "| n | tssa | mssa | mssa-math |",
            "|---:|---:|---:|---:|",
        ]
        out += [f"| {row['n']} | " + " | ".join(mib(row["rss"].get(step)) for step in STEPS) + " |" for row in rows]
    ns, fitted = exponents(rows, fit_min)
    if fitted:
        out += [
            "",
            f"Fitted exponents: least-squares slope of log(value) on log(n) over n = {ns[0]} ... {ns[-1]} "
            f"({len(ns)} sizes):",
            "",
            "| step | time exponent | peak-memory exponent |",
            "|---|---:|---:|",
        ]
        out += [f"| {step} | {fitted[step]['time']:.2f} | {fitted[step]['memory']:.2f} |" for step in STEPS]
    out += ["", "Goals:", ""] + [f"- {line}" for line in goals(rows, fitted)]
    return "\n".join(out)


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda ({torch.cuda.get_device_name()})"
    return f"cpu ({cpu_model()}, {torch.get_num_threads()} threads)"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_header() -> str:
    try:
        lscpu = subprocess.run("lscpu | head", shell=True, capture_output=True, text=True).stdout.rstrip()
    except OSError:
        lscpu = "(lscpu unavailable)"
    return "\n".join(
        [
            "# Benchmark results",
            "",
            f"Machine (`lscpu | head`), {os.cpu_count()} cores, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {datetime.date.today().isoformat()}:",
            "",
            "```",
            lscpu,
            "```",
            "",
        ]
    )


def plot(rows: list[dict], fit_min: int, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    ns_fit, fitted = exponents(rows, fit_min)
    ns = [row["n"] for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for axis, key, scale, label in (
        (left, "median", 1e3, "time (ms)"),
        (right, "peak", 1 / MiB, "peak extra memory (MiB)"),
    ):
        for step, marker in zip(STEPS, "osD"):
            exponent = fitted.get(step, {}).get("time" if key == "median" else "memory")
            name = step if exponent is None else f"{step} (slope {exponent:.2f})"
            axis.loglog(ns, [row[key][step] * scale for row in rows], marker=marker, label=name)
        axis.set_xticks(ns, [str(n) for n in ns], fontsize=8)
        axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        axis.set_xlabel("tokens n")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
        if ns_fit:
            axis.axvspan(ns_fit[0], ns_fit[-1], color="grey", alpha=0.08, label=f"fit range n >= {fit_min}")
        axis.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"n in {QUICK_SIZES}, 3 runs")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cpu, then cuda too when available"
    )
    parser.add_argument("--sizes", type=int, nargs="+", help="token counts (overrides --quick's)")
    parser.add_argument("--runs", type=int, help="timed runs per step and n (default 5, --quick 3)")
    parser.add_argument(
        "--large-runs",
        type=int,
        default=3,
        help=f"timed runs at n >= {LARGE_N} unless --runs is given (default 3: one run there takes seconds)",
    )
    parser.add_argument(
        "--stall-max",
        type=float,
        default=0.03,
        help="CPU: a round whose stall share (PSI) exceeds this had competition and is set aside (default 0.03)",
    )
    parser.add_argument(
        "--patience", type=float, default=120, help="CPU: seconds per n to wait for uncontended rounds (default 120)"
    )
    parser.add_argument("--fit-min", type=int, default=1024, help="fit exponents over n >= this (default 1024)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's default)")
    parser.add_argument("--no-rss-check", action="store_true", help="skip the fresh-subprocess RSS cross-check")
    parser.add_argument(
        "--out",
        nargs="?",
        const=str(HERE / "RESULTS.md"),
        default=None,
        metavar="PATH",
        help="append a markdown section to PATH (default benchmarks/RESULTS.md)",
    )
    parser.add_argument("--plot", default=str(HERE / "scaling.png"), help="PNG path ('' for none)")
    parser.add_argument("--rss-probe", nargs=2, metavar=("STEP", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.rss_probe:
        rss_probe(args.rss_probe[0], int(args.rss_probe[1]))
        return

    sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)

    def runs_at(n: int) -> int:
        return args.runs or (3 if args.quick else args.large_runs if n >= LARGE_N else 5)

    if args.device == "auto":
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    elif args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    else:
        devices = [args.device]

    command = " ".join([".venv/bin/python", "benchmarks/scaling.py", *map(shlex.quote, sys.argv[1:])])
    sections = []
    started = time.perf_counter()
    for device in devices:
        kernel = attention_kernel(device)
        load_start = os.getloadavg()[0]
        rows = []
        for n in sizes:
            rows.append(measure(n, device, runs_at(n), not args.no_rss_check, args.stall_max, args.patience))
            t = rows[-1]["median"]
            print(
                f"  [{device}] n={n}: tssa {t['tssa'] * 1e3:.1f} ms, mssa {t['mssa'] * 1e3:.1f} ms, "
                f"mssa-math {t['mssa-math'] * 1e3:.1f} ms ({time.perf_counter() - started:.0f} s elapsed)",
                file=sys.stderr,
                flush=True,
            )
        text = report(rows, device, kernel, args.fit_min)
        text += (
            f"\n\nLoad average (1 min) {load_start:.2f} before this device's runs, "
            f"{os.getloadavg()[0]:.2f} after (this process alone adds about {torch.get_num_threads()} "
            f"on CPU; more means other work shared the cores)."
        )
        if args.plot:
            path = Path(args.plot)
            if device != "cpu":
                path = path.with_name(f"{path.stem}-{device}{path.suffix}")
            title = f"One TSSA vs one MSSA step, d={DIM}, {HEADS} heads, batch 1, float32, {device_name(device)}"
            if plot(rows, args.fit_min, path, title):
                text += f"\n\nPlot: `{path.relative_to(HERE.parent) if path.is_relative_to(HERE.parent) else path}`."
            else:
                text += "\n\n(No plot: matplotlib is not installed.)"
        heading = f"## scaling.py: one TSSA step against one MSSA step ({device})"
        sections.append(
            f"{heading}\n\n`{command}` ({datetime.datetime.now():%Y-%m-%d %H:%M}, "
            f"torch {torch.__version__}, {time.perf_counter() - started:.0f} s)\n\n{text}\n"
        )
        print(sections[-1], flush=True)
    if args.out:
        out = Path(args.out)
        prefix = "" if out.exists() and out.read_text().strip() else machine_header() + "\n"
        with out.open("a") as handle:
            handle.write(prefix + "\n".join(sections) + "\n")
        print(f"appended to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

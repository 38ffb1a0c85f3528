"""One Lion step over CRATE-B's parameters: ``lion_pytorch.Lion`` against crate-compose's multi-tensor Lion;
and torch's AdamW one parameter at a time, in multi-tensor kernels and fused, timed in the same rounds.

    .venv/bin/python benchmarks/optimizer_step.py [--device cpu|cuda|auto] [--runs N] [--warmup N]
        [--threads N] [--stall-max F] [--retakes N] [--out [PATH]]

Needs lion_pytorch (the test extra: ``pip install -e '.[dev]'``), the reference; without it the
script says so and exits 2.

The parameters: one tensor of each shape of ``crate_compose.build("crate-base")`` (read on the meta
device, so nothing is built; 22,796,008 parameters in 108 tensors), float32 on ``--device``, in the
two groups :func:`crate_compose.training.optimizers.optimizer_for` makes (weight decay 0.05 on the
matrices, none on the rest), lr 1e-4, betas (0.9, 0.99), with random gradients (standard normal). Each
optimizer gets its own copy of the same parameters and gradients.

The optimizers: ``lion_pytorch`` (``Lion``, eight operations per parameter) and
``crate_compose.training.optimizers.Lion`` both ways: ``ours, foreach`` (``foreach=True``: seven
``torch._foreach_*`` calls per group, the default on CUDA) and ``ours, per parameter``
(``foreach=False``: lion_pytorch's operations less one copy, one parameter at a time, the default on
the CPU). ``aten calls`` counts the operator calls one step dispatches (``TorchDispatchMode``): on CUDA
each is at least one kernel launch (a ``_foreach`` call launches one kernel per chunk of tensors).

Timing: after ``--warmup`` steps of each, ``--runs`` interleaved rounds (lion_pytorch, ours foreach,
ours per parameter, lion_pytorch, ...), each ``optimizer.step()`` timed alone (bracketed by
``torch.cuda.synchronize()`` on CUDA); the table gives the median and the minimum, and ``lion_pytorch /
this`` is the median over the rounds of each round's ratio (taken seconds apart on the same machine).
On CPU a step during which some task waited for a core more than ``--stall-max`` (5 %) of its wall time
(Linux PSI, ``/proc/pressure/cpu``) is retaken, at most ``--retakes`` times; ``stall`` is the worst
share among the steps kept. ``--out`` appends the report to benchmarks/RESULTS.md as a section.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from machine import chosen_device, publish, timed  # benchmarks/machine.py, beside this script
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import crate_compose as cc  # noqa: E402
from crate_compose.training.optimizers import Lion, _foreach_devices  # noqa: E402

LR, WEIGHT_DECAY, BETAS = 1e-4, 0.05, (0.9, 0.99)
NAMES = ("lion_pytorch", "ours, foreach", "ours, per parameter")
# torch's AdamW three ways, timed in the same rounds: one parameter at a time (its default on the CPU), its
# multi-tensor kernels (its default on CUDA) and its fused kernel (what train takes wherever torch has one)
ADAMW = {
    "AdamW, per parameter": {"foreach": False},
    "AdamW, foreach": {"foreach": True},
    "AdamW, fused": {"fused": True},
}


def need_lion_pytorch():
    try:
        from lion_pytorch import Lion as Reference
    except ImportError:
        print(
            "benchmarks/optimizer_step.py compares against lion_pytorch, which is not installed.\n"
            "Install the test extra:  pip install -e '.[dev]'   (or: pip install 'lion-pytorch>=0.2')",
            file=sys.stderr,
        )
        sys.exit(2)
    return Reference


def shapes(name: str = "crate-base") -> list[torch.Size]:
    model = cc.build(name, seed=0, device="meta")
    return [p.shape for p in model.parameters() if p.requires_grad]


def parameters(sizes: list[torch.Size], device: torch.device) -> list[torch.nn.Parameter]:
    """The same values each call: parameters and their gradients, standard normal."""
    generator = torch.Generator().manual_seed(0)
    params = []
    for size in sizes:
        p = torch.nn.Parameter(torch.randn(size, generator=generator).to(device))
        p.grad = torch.randn(size, generator=generator).to(device)
        params.append(p)
    return params


def groups(params: list[torch.nn.Parameter]) -> list[dict]:
    """As optimizer_for makes them: weight decay on matrices only."""
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


class Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    threads = torch.get_num_threads()
    return f"{model}, {threads} thread{'s' if threads > 1 else ''}, torch {torch.__version__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or auto (cuda when available)")
    parser.add_argument("--runs", type=int, default=None, help="timed rounds (default 31 on CPU, 101 on CUDA)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each optimizer first")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--stall-max", type=float, default=0.05)
    parser.add_argument("--retakes", type=int, default=3)
    parser.add_argument("--out", nargs="?", const=str(HERE / "RESULTS.md"), help="append the results as a section")
    args = parser.parse_args()
    Reference = need_lion_pytorch()
    device = chosen_device(args.device, parser)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.runs = args.runs or (101 if device.type == "cuda" else 31)

    began = time.perf_counter()
    sizes = shapes()
    optimizers = {
        "lion_pytorch": Reference(groups(parameters(sizes, device)), lr=LR, betas=BETAS),
        "ours, foreach": Lion(groups(parameters(sizes, device)), lr=LR, betas=BETAS, foreach=True),
        "ours, per parameter": Lion(groups(parameters(sizes, device)), lr=LR, betas=BETAS, foreach=False),
        **{
            name: torch.optim.AdamW(groups(parameters(sizes, device)), lr=LR, **options)
            for name, options in ADAMW.items()
        },
    }
    calls = {}
    for name, optimizer in optimizers.items():
        with Calls() as counter:
            optimizer.step()  # the first step creates the moments
        calls[name] = counter.count
        for _ in range(args.warmup):
            optimizer.step()
    theirs = list(optimizers["lion_pytorch"].state.values())
    same = {
        name: all(torch.equal(a["exp_avg"], b["exp_avg"]) for a, b in zip(optimizers[name].state.values(), theirs))
        for name in NAMES[1:]
    }
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    stalls: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(args.runs):
        for name, optimizer in optimizers.items():
            seconds, share = timed(optimizer.step, device, args.stall_max, args.retakes)
            times[name].append(seconds)
            stalls[name].append(share)
    wall = time.perf_counter() - began

    ratios = {name: statistics.median(a / b for a, b in zip(times["lion_pytorch"], times[name])) for name in NAMES}
    ms = (lambda s: f"{s * 1e3:,.2f}") if device.type == "cuda" else (lambda s: f"{s * 1e3:,.1f}")
    count = sum(s.numel() for s in sizes)
    lines = [
        f"## optimizer_step.py: one Lion step over CRATE-B's parameters, lion_pytorch against ours; and AdamW three ways ({device.type})",
        "",
        f"`benchmarks/optimizer_step.py --device {device.type} --runs {args.runs}"
        f"{f' --threads {args.threads}' if args.threads else ''}` "
        f"({datetime.datetime.now():%Y-%m-%d %H:%M}, {machine(device)}, Python {platform.python_version()}, "
        f"{wall:.0f} s)",
        "",
        f"{count:,} float32 parameters in {len(sizes)} tensors (CRATE-B's shapes; {sum(len(s) >= 2 for s in sizes)} "
        f"matrices with weight decay {WEIGHT_DECAY}), random gradients; `optimizer.step()` alone, {args.runs} "
        f"interleaved rounds after {args.warmup} warm-up steps. `lion_pytorch / this`: the median of each "
        "round's ratio. Stall: the largest CPU stall share of the steps kept (Linux PSI).",
        "",
        "| optimizer | step ms (median) | min ms | lion_pytorch / this | aten calls per step | stall |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in NAMES:
        lines.append(
            f"| {name} | {ms(statistics.median(times[name]))} | {ms(min(times[name]))} | {ratios[name]:.2f} | "
            f"{calls[name]:,} | {max(stalls[name]):.0%} |"
        )
    default = "ours, foreach" if device.type in _foreach_devices() else "ours, per parameter"
    lines += [
        "",
        f"`train --optimizer lion` takes `{default}` on {device.type}. The moments after "
        f"{1 + args.warmup} steps of each against lion_pytorch's: "
        + ", ".join(f"{name} {'bit-identical' if ok else 'NOT identical'}" for name, ok in same.items())
        + ".",
        "",
    ]
    lines += [
        "| optimizer | step ms (median) | min ms | per parameter / this | aten calls per step | stall |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    first = next(iter(ADAMW))
    for name in ADAMW:
        ratio = statistics.median(a / b for a, b in zip(times[first], times[name]))
        lines.append(
            f"| {name} | {ms(statistics.median(times[name]))} | {ms(min(times[name]))} | {ratio:.2f} | "
            f"{calls[name]:,} | {max(stalls[name]):.0%} |"
        )
    lines += ["", "`train --optimizer adamw` takes `AdamW, fused` (training/optimizers.py).", ""]
    publish("\n".join(lines), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

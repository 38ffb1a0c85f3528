"""Training-step speed: the built CRATE-B against timm's ViT-B/16, side by side in one process.

    .venv/bin/python benchmarks/train_step.py [--batch 8] [--size 224] [--device cpu|cuda|auto]
        [--dtypes float32,bfloat16] [--compile off,on] [--compile-mode MODE] [--forward eager|all|none]
        [--runs N] [--warmup N] [--threads N] [--onednn on,off] [--json FILE]

Needs timm, which crate-compose itself never imports: ``pip install -e '.[bench]'`` (or
``pip install 'timm>=1.0'``). timm pulls torchvision, whose build must match torch's: install the
matching one first (torch 2.13: ``torchvision==0.28.0``) so that pip does not replace torch. Without
timm the script says so and exits 2.

The models: crate-compose's CRATE-B (``crate_compose.build("crate-base")``, 22.8M parameters) and
timm's ``vit_base_patch16_224`` (86.6M), both at ``--size`` with 1000 classes, in training mode. A
training step is the forward pass, cross-entropy on random labels, the backward pass and an AdamW
step (default settings, one optimizer per model; on CUDA torch's fused kernel, as ``train`` takes it);
``bfloat16`` runs the forward and the loss under ``torch.autocast`` (the weights and the optimizer stay
float32). ``--compile on`` wraps each model in
``torch.compile`` (``--compile-mode``, default mode unless given; the optimizer step stays eager); its
first step, which compiles, is the table's ``first step s``.

Timing: for each (dtype, compile) setting both models are built, stepped once, warmed up
(``--warmup`` steps), then timed in interleaved rounds (CRATE, timm, CRATE, ...; ``--runs`` rounds): the
table gives the median and the minimum of each, so the ratios CRATE / timm are taken in one process
over one stretch of time. On CPU a step during which some task waited for a core more than
``--stall-max`` (5 %) of its wall time (Linux PSI, ``/proc/pressure/cpu``: another process competing
for the cores) is retaken, at most ``--retakes`` times; the ``stall`` column is the worst share among
the steps kept. On CUDA each step is bracketed by ``torch.cuda.synchronize()``, and float32 matrix
products stay float32 (``--tf32`` allows TF32 for both models).

FLOPs: one training step of each model (forward, loss, backward; AdamW's element-wise work is not
counted) and one forward pass, counted with ``torch.utils.flop_counter.FlopCounterMode`` in float32
under the math backend of ``scaled_dot_product_attention``, so that attention counts as the matrix
products it is on every device (the counter has no formula for PyTorch's CPU flash kernel). These are
the FLOPs the built modules execute: CRATE-B's ISTA step takes one product against
``I + eta (D - D^T D)`` (modules/sparsify.py), 273 GFLOP per step at batch 8, where its two products
(as before issue 20, and as written: ``crate_compose.formulas_as_written()``) take 308, also counted and shown beside each goal. A
step's FLOP rate is its FLOPs over its median time; ``CRATE / timm`` is the ratio of the two models'
rates (goal: >= 1).

Forward only: each model's forward pass under ``torch.no_grad()`` (same dtype and compile setting,
interleaved the same way) against a matrix product of the shape of CRATE-B's largest projection,
``torch.mm`` of ``(batch * tokens, 768) x (768, 768)`` in the setting's dtype (bfloat16 operands under
autocast); ``of mm`` is the model's forward FLOP rate over the product's (goal for CRATE: >= 0.85).
``--forward eager`` (the CPU default) times it in the eager settings only: compiling the second,
no-grad graph of each model costs about a minute per setting on 2 cores.

A CPU without native bf16 (no AVX-512 BF16, no AMX; an AVX2-only AMD EPYC, say): torch then computes bf16
matrix products with its own portable kernels instead of oneDNN's. ``--onednn off`` takes that path on any CPU
(``torch.backends.mkldnn.flags(enabled=False)``), so the slowdown can be measured where it cannot be met, and
prints the bf16 product of ``(batch * tokens, 768) x (768, 768)`` in its four layouts (each operand row-major
or a transposed view) with oneDNN and without: without it, two row-major operands are many times slower
than one transposed (``nn.Linear``'s layout), which is why every crate-compose product takes that layout in
half precision on the CPU (``crate_compose.modules.precision.linear_layout``).

Prints Markdown (the machine, both tables, the goals); ``--json FILE`` writes every timing too.
The defaults on CPU (2 dtypes x eager/compiled, 3 rounds after 1 warm-up step: fewer than the other
benchmarks' 5 to 9, because one float32 ViT-B step takes 5 s on 2 cores) took 160-175 s on 2 cores
with the compile caches warm; the first run, compiling 4 graphs, takes 2-3 minutes more; ``--compile
off`` takes about 1.5 minutes. On CUDA the defaults are 20 rounds after 5 warm-up steps; at batch 8
both models are bound by kernel launches there, so ``--batch 64`` and ``--compile-mode
reduce-overhead`` say more about the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import chosen_device, synchronize, timed  # benchmarks/machine.py, beside this script
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import crate_compose as cc
from crate_compose.modules.paths import use_formulas

MODELS = ("crate-base", "vit_base_patch16_224")
SHORT = {"crate-base": "CRATE-B", "vit_base_patch16_224": "ViT-B/16 (timm)"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
RATE_GOAL, FORWARD_GOAL = 1.0, 0.85


def need_timm():
    from crate_compose.data.batches import transforms_v2

    transforms_v2()  # torchvision first, as the training pipeline imports it: beside a CPU torch, PyPI's CUDA
    try:  # torchvision fails on import unless its missing operators are declared (timm imports it)
        import timm
    except ImportError:
        print(
            "benchmarks/train_step.py compares against timm, which is not installed.\n"
            "Install the benchmark extra:  pip install -e '.[bench]'   (or: pip install 'timm>=1.0')\n"
            "timm needs torchvision: install the one matching your torch first (torch 2.13: torchvision==0.28.0),\n"
            "so that pip does not replace torch.",
            file=sys.stderr,
        )
        sys.exit(2)
    return timm


def build(name: str, size: int, device: torch.device, timm) -> tuple[torch.nn.Module, callable]:
    """The model in training mode and its ``images -> logits``."""
    torch.manual_seed(0)
    if name == "crate-base":
        overrides = [] if size == 224 else [f"sizes.image_size={size}"]
        model = cc.build("crate-base", overrides=overrides, seed=0, device=device)
        return model.train(), (lambda m: lambda x: m(x)["output"])
    model = timm.create_model(name, img_size=size, num_classes=1000).to(device)
    return model.train(), (lambda m: m)


class Trainer:
    """One model's training step (forward, cross-entropy, backward, AdamW) and its forward pass."""

    def __init__(self, name: str, args, device: torch.device, dtype: torch.dtype, compiled: bool, timm) -> None:
        self.name, self.device, self.dtype = name, device, dtype
        self.model, logits_of = build(name, args.size, device, timm)
        self.module = torch.compile(self.model, mode=args.compile_mode) if compiled else self.model
        self.logits = logits_of(self.module)
        # torch's fused AdamW on CUDA, as `train` steps (training/optimizers.py), for both models alike
        fused = True if device.type == "cuda" else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=fused)
        generator = torch.Generator().manual_seed(1)
        self.images = torch.randn(args.batch, 3, args.size, args.size, generator=generator).to(device)
        self.labels = torch.randint(0, 1000, (args.batch,), generator=generator).to(device)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def step(self) -> None:
        with self.autocast():
            loss = F.cross_entropy(self.logits(self.images), self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def forward(self) -> None:
        with torch.no_grad(), self.autocast():
            self.logits(self.images)


def count_flops(name: str, args, device: torch.device, timm, *, fold: bool = True) -> tuple[int, int]:
    """FLOPs of one training step (forward + loss + backward) and of one forward pass, float32;
    ``fold=False``: with the formulas as written (``modules/paths.py``), whose ISTA step takes two products
    (the written attention's products are the math backend's, so only ISTA's count changes)."""
    model, logits_of = build(name, args.size, device, timm)
    logits = logits_of(model)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    labels = torch.zeros(args.batch, dtype=torch.long, device=device)
    with sdpa_kernel(SDPBackend.MATH), use_formulas("fast" if fold else "written"):
        with FlopCounterMode(display=False) as counter:
            F.cross_entropy(logits(images), labels).backward()
        step = counter.get_total_flops()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            logits(images)
        forward = counter.get_total_flops()
    del model
    return step, forward


def interleaved(calls: dict[str, callable], device, runs: int, stall_max: float, retakes: int) -> dict:
    times: dict[str, list[float]] = {name: [] for name in calls}
    stalls: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, fn in calls.items():
            seconds, share = timed(fn, device, stall_max, retakes)
            times[name].append(seconds)
            stalls[name].append(share)
    return {
        name: {
            "times_s": times[name],
            "median_s": statistics.median(times[name]),
            "min_s": min(times[name]),
            "stall_max": max(stalls[name]),
        }
        for name in calls
    }


def matrix_product(args, device: torch.device, dtype: torch.dtype, tokens: int):
    """``(batch * tokens, 768) x (768, 768)`` in ``dtype`` (bfloat16 for autocast): the call and its FLOPs."""
    rows = args.batch * tokens
    a = torch.randn(rows, 768, device=device, dtype=dtype)
    b = torch.randn(768, 768, device=device, dtype=dtype)
    return (lambda: torch.mm(a, b)), 2 * rows * 768 * 768


def layouts(args, tokens: int) -> dict[str, dict[str, float]]:
    """The bf16 product ``(batch * tokens, 768) x (768, 768)`` in its four layouts, with torch's oneDNN kernels
    and without (a CPU without native bf16): median seconds of 5 after one, per layout and setting."""
    rows = args.batch * tokens
    made = {
        "row-major x row-major": (torch.randn(rows, 768), torch.randn(768, 768)),
        "row-major x transposed (nn.Linear)": (torch.randn(rows, 768), torch.randn(768, 768).t()),
        "transposed x row-major": (torch.randn(768, rows).t(), torch.randn(768, 768)),
        "transposed x transposed": (torch.randn(768, rows).t(), torch.randn(768, 768).t()),
    }
    found: dict[str, dict[str, float]] = {}
    for label, (a, b) in made.items():
        a, b = a.bfloat16(), b.bfloat16()  # .bfloat16() keeps a transposed view's strides
        for onednn in ("on", "off"):
            with torch.backends.mkldnn.flags(enabled=onednn == "on"):
                torch.mm(a, b)
                times = []
                for _ in range(5):
                    began = time.perf_counter()
                    torch.mm(a, b)
                    times.append(time.perf_counter() - began)
            found.setdefault(label, {})[onednn] = statistics.median(times)
    return found


def configuration(args, device, dtype_name: str, compiled: bool, flops: dict, timm, onednn: str = "on") -> dict:
    """Both models' training steps in one (dtype, compile, oneDNN) setting, then (unless ``--forward`` leaves this
    setting out) their forward passes against the matrix product."""
    with torch.backends.mkldnn.flags(enabled=onednn == "on"):
        result = _configuration(args, device, dtype_name, compiled, flops, timm)
    return {**result, "onednn": onednn}


def _configuration(args, device, dtype_name: str, compiled: bool, flops: dict, timm) -> dict:
    dtype = DTYPES[dtype_name]
    trainers = {name: Trainer(name, args, device, dtype, compiled, timm) for name in MODELS}
    result: dict = {"dtype": dtype_name, "compile": compiled, "models": {}}
    compile_s = {}
    for name, trainer in trainers.items():
        began = time.perf_counter()
        trainer.step()  # the first step (compiles under --compile on)
        synchronize(device)
        compile_s[name] = time.perf_counter() - began
        for _ in range(args.warmup):
            trainer.step()
    steps = interleaved({name: t.step for name, t in trainers.items()}, device, args.runs, args.stall_max, args.retakes)
    result["models"] = {
        name: {
            "first_step_s": compile_s[name],
            "step": {
                **steps[name],
                "flops": flops[name][0],
                "gflops_per_s": flops[name][0] / steps[name]["median_s"] / 1e9,
                "images_per_s": args.batch / steps[name]["median_s"],
            },
        }
        for name in MODELS
    }
    crate, vit = (result["models"][name] for name in MODELS)
    result["rate_ratio"] = crate["step"]["gflops_per_s"] / vit["step"]["gflops_per_s"]
    result["time_ratio"] = crate["step"]["median_s"] / vit["step"]["median_s"]
    if args.forward == "none" or (compiled and args.forward == "eager"):
        return result
    for trainer in trainers.values():  # warm up the forward pass (compiles a no-grad graph)
        for _ in range(1 + args.warmup):
            trainer.forward()
    tokens = (args.size // 16) ** 2 + 1
    mm, mm_flops = matrix_product(args, device, dtype if dtype == torch.float32 else torch.bfloat16, tokens)
    for _ in range(3):
        mm()
    calls = {name: t.forward for name, t in trainers.items()}
    calls["mm"] = mm
    forwards = interleaved(calls, device, args.runs, args.stall_max, args.retakes)
    mm_rate = mm_flops / forwards["mm"]["median_s"] / 1e9
    result["mm"] = {
        **forwards["mm"],
        "flops": mm_flops,
        "gflops_per_s": mm_rate,
        "shape": [args.batch * tokens, 768, 768],
    }
    for name in MODELS:
        forward = forwards[name]
        result["models"][name]["forward"] = {
            **forward,
            "flops": flops[name][1],
            "gflops_per_s": flops[name][1] / forward["median_s"] / 1e9,
            "of_mm": flops[name][1] / forward["median_s"] / 1e9 / mm_rate,
            "images_per_s": args.batch / forward["median_s"],
        }
    return result


def release() -> None:
    """Free one configuration's models, optimizer states and compiled graphs before the next."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
        flags = next(line for line in lines if line.startswith("Flags"))
        extras = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f" {f}" in flags]
    except (OSError, subprocess.SubprocessError, StopIteration):
        model, extras = platform.processor() or "unknown CPU", []
    return (
        f"{model} ({', '.join(extras) or 'no AVX-512'}), {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )


def report(
    results: list[dict],
    args,
    device,
    flops: dict,
    two_products: tuple[int, int],
    wall_s: float,
    layout_s: dict | None = None,
) -> str:
    def ms(seconds: float) -> str:
        return f"{seconds * 1000:,.1f}"

    for r in results:  # a setting without oneDNN is named in its dtype's cell
        r["label"] = r["dtype"] + (" (no oneDNN)" if r.get("onednn") == "off" else "")

    out = [
        (
            f"{datetime.date.today()}, {machine(device)}, Python {platform.python_version()}; batch {args.batch} at "
            f"{args.size}x{args.size}, {args.runs} interleaved rounds after {args.warmup} warm-up steps; {wall_s:.0f} s "
            "wall."
        ),
        "",
        (
            "FLOPs counted (FlopCounterMode, attention as matrix products): "
            + ", ".join(
                [
                    f"{SHORT[n]} {flops[n][0] / 1e9:,.1f} GFLOP per step, {flops[n][1] / 1e9:,.1f} per forward"
                    for n in MODELS
                ]
            )
            + f" (CRATE-B with its ISTA steps as two products, as before issue 20: {two_products[0] / 1e9:,.1f} and "
            f"{two_products[1] / 1e9:,.1f}; the rates below divide the FLOPs executed)."
        ),
        "",
        "Training step (forward, cross-entropy, backward, AdamW):",
        "",
        "| dtype | compile | model | first step s | step ms (median) | min ms | images/s | GFLOP/s | CRATE / timm rate | stall |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for name in MODELS:
            m = r["models"][name]
            ratio = f"{r['rate_ratio']:.2f}" if name == MODELS[0] else ""
            out.append(
                f"| {r['label']} | {'on' if r['compile'] else 'off'} | {SHORT[name]} | {m['first_step_s']:.1f} | "
                f"{ms(m['step']['median_s'])} | {ms(m['step']['min_s'])} | {m['step']['images_per_s']:.1f} | "
                f"{m['step']['gflops_per_s']:,.0f} | {ratio} | {m['step']['stall_max']:.0%} |"
            )
    if any("mm" in r for r in results):
        out += [
            "",
            (
                "Forward only (`torch.no_grad()`), against `torch.mm` of (batch x tokens, 768) x (768, 768) in "
                "the same dtype:"
            ),
            "",
            "| dtype | compile | model | forward ms | images/s | GFLOP/s | mm GFLOP/s | of mm |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
    for r in (r for r in results if "mm" in r):
        for name in MODELS:
            f = r["models"][name]["forward"]
            out.append(
                f"| {r['label']} | {'on' if r['compile'] else 'off'} | {SHORT[name]} | {ms(f['median_s'])} | "
                f"{f['images_per_s']:.1f} | {f['gflops_per_s']:,.0f} | {r['mm']['gflops_per_s']:,.0f} | {f['of_mm']:.2f} |"
            )
    if layout_s:
        out += [
            "",
            f"The bf16 product ({args.batch} x {(args.size // 16) ** 2 + 1} tokens, 768) x (768, 768) by its "
            "operands' layout, median ms of 5:",
            "",
            "| layout | oneDNN | without oneDNN (no native bf16) |",
            "| --- | ---: | ---: |",
        ]
        out += [f"| {label} | {ms(t['on'])} | {ms(t['off'])} |" for label, t in layout_s.items()]
    out += ["", "Goals (the settings with oneDNN: without it the matrix product itself is the slow path):", ""]
    for r in (r for r in results if r.get("onednn", "on") == "on"):
        label = f"{r['label']}, compile {'on' if r['compile'] else 'off'}"
        crate = r["models"][MODELS[0]]
        ok = r["rate_ratio"] >= RATE_GOAL
        formula = r["rate_ratio"] * two_products[0] / crate["step"]["flops"]
        out.append(
            f"- {label}: CRATE-B step FLOP rate / ViT-B's >= {RATE_GOAL:g}: {r['rate_ratio']:.2f}, "
            f"**{'met' if ok else 'not met'}** ({formula:.2f} counting ISTA's two products; "
            f"step time CRATE / ViT = {r['time_ratio']:.2f})"
        )
        if "forward" not in crate:
            continue
        ok = crate["forward"]["of_mm"] >= FORWARD_GOAL
        formula = crate["forward"]["of_mm"] * two_products[1] / crate["forward"]["flops"]
        out.append(
            f"- {label}: CRATE-B forward / matrix-product rate >= {FORWARD_GOAL:g}: "
            f"{crate['forward']['of_mm']:.2f}, **{'met' if ok else 'not met'}** "
            f"({formula:.2f} counting ISTA's two products)"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224, help="image size (a multiple of 16)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or auto")
    parser.add_argument(
        "--dtypes", default="float32,bfloat16", help="comma-separated: float32 (plain), bfloat16 (autocast)"
    )
    parser.add_argument("--compile", default="off,on", help="comma-separated: off (eager), on (torch.compile)")
    parser.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode (default: its default; e.g. reduce-overhead for CUDA graphs)",
    )
    parser.add_argument(
        "--forward",
        choices=("eager", "all", "none"),
        default=None,
        help="which settings also time the forward pass (default: eager on CPU, where compiling a "
        "second, no-grad graph per model costs a minute; all on CUDA)",
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="timed rounds per configuration (default 3 on CPU, 20 on CUDA)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="warm-up steps after the first (default 1 on CPU, 5 on CUDA)"
    )
    parser.add_argument("--stall-max", type=float, default=0.05)
    parser.add_argument("--retakes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--tf32", action="store_true", help="CUDA: let float32 matrix products use TF32")
    parser.add_argument(
        "--onednn",
        default="on",
        help="comma-separated: on (torch's default), off (CPU: torch's own kernels, the bf16 path of a "
        "CPU without native bf16; also times the bf16 product by layout)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement to this file")
    args = parser.parse_args()
    timm = need_timm()
    device = chosen_device(args.device, parser)
    if args.size % 16:
        parser.error("--size must be a multiple of 16")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    compiles = [c.strip() for c in args.compile.split(",") if c.strip()]
    onednns = [o.strip() for o in args.onednn.split(",") if o.strip()]
    if not set(dtypes) <= set(DTYPES) or not set(compiles) <= {"off", "on"} or not set(onednns) <= {"off", "on"}:
        parser.error(f"--dtypes from {sorted(DTYPES)}, --compile and --onednn from off, on")
    if "off" in onednns and device.type != "cpu":
        parser.error("--onednn off is a CPU setting")
    args.runs = args.runs or (20 if device.type == "cuda" else 3)
    args.warmup = args.warmup if args.warmup is not None else (5 if device.type == "cuda" else 1)
    args.forward = args.forward or ("all" if device.type == "cuda" else "eager")
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":  # float32 means float32 unless --tf32 says otherwise (both models alike)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32

    began = time.perf_counter()
    flops = {name: count_flops(name, args, device, timm) for name in MODELS}
    two_products = count_flops(MODELS[0], args, device, timm, fold=False)
    results = []
    for onednn in onednns:
        for compiled in compiles:
            for dtype_name in dtypes:
                print(f"... {dtype_name}, compile {compiled}, oneDNN {onednn}", file=sys.stderr, flush=True)
                results.append(configuration(args, device, dtype_name, compiled == "on", flops, timm, onednn))
                release()
    layout_s = layouts(args, (args.size // 16) ** 2 + 1) if "off" in onednns else None
    wall_s = time.perf_counter() - began
    print(report(results, args, device, flops, two_products, wall_s, layout_s))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine(device),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "flops": {n: {"step": s, "forward": f} for n, (s, f) in flops.items()},
                    "crate_two_product_flops": {"step": two_products[0], "forward": two_products[1]},
                    "results": results,
                    "layouts_s": layout_s,
                    "wall_s": wall_s,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()

"""What each precision and fast path costs on whole networks: float32, bf16 and fp16 against float64.

    .venv/bin/python benchmarks/precision.py [--networks crate-base,crate-mae-base,tost-small,causal-crate-base]
        [--inputs 5] [--batch 2] [--builds] [--precisions fp32,bf16,...] [--threads 2] [--json FILE]
    .venv/bin/python benchmarks/precision.py --small      # the small networks tests/test_precision.py bounds

Each network is built once in float64 (seed 0) and its weights rounded to float32's values, so every
copy holds the same numbers; the float32 copy is that network in float32. For each of ``--inputs``
batches (images drawn from N(0, 1), or uniform token ids, with random labels) it computes, in training
mode, the task's loss (:meth:`crate_compose.tasks.Task.loss`: cross-entropy, or MSE on the
masked patches, the masks drawn from the same seed every time) and its gradients, and compares with
the float64 network computing every formula as written (the reference):

* ``fp32``: the float32 network;
* ``bf16``, ``fp16``: the float32 network under ``torch.autocast`` to that type, as ``train --precision``
  runs (weights, gradients and optimizer in float32); fp16's loss is scaled before the backward pass
  and its gradients unscaled, as ``GradScaler`` does: by its initial scale, 2^16, halved while the
  gradients are not finite (a skipped step, in training), and kept for the next input, as a run keeps
  it (it grows again only after 2,000 steps without an overflow);
* ``bf16-build``, ``fp16-build`` (``--builds``): the network built in that type (``build --dtype``),
  its parameters' gradients in that type;
* ``fp64``: the float64 network with the fast paths (the reference takes none).

Each runs with the fast paths (``fast``) and with the formulas as written (``written``:
:mod:`crate_compose.modules.paths`). Errors are norm-wise relative, ``||x - x64|| / ||x64||``, of
(a) the output (logits, reconstructed patches), (b) the gradient of the input images (token ids have
none) and (c) every parameter's gradient, concatenated. ``flips`` counts the ISTA units (entries of
every ISTA step's output) whose sign (zero or positive) differs from the reference's: a rounding
that moves a pre-activation across ``eta lambda`` flips one, and its gradient with it. The table
gives the median over the inputs and, after the slash, the largest.

Prints Markdown (the machine, the table); ``--json FILE`` writes every number. The defaults (four
base-size networks, 5 inputs of 2 examples, causal CRATE at a context of 256 tokens) take hours on 2
cores (CRATE-B/16 alone: 85 minutes); docs/precision.md has the table and what it means.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import crate_compose as cc
from crate_compose import tasks
from crate_compose.modules.paths import use_formulas
from crate_compose.modules.sparsify import ISTA, ISTAMM


@dataclass(frozen=True)
class Network:
    """A network of the table: a spec with its overrides, the task its loss is, and the batch."""

    label: str
    spec: str
    overrides: tuple[str, ...] = ()
    task: str = "classify"
    batch: int = 2


NETWORKS = {  # the table of docs/precision.md
    "crate-base": Network("CRATE-B/16", "crate-base"),
    "crate-mae-base": Network("CRATE-MAE-B/16", "crate-mae-base", task="mae"),
    "tost-small": Network("ToST-S/16", "tost-small"),
    "causal-crate-base": Network("causal CRATE-B, 256 tokens", "causal-crate-base", ("sizes.context=256",), "lm"),
}
# small members of the same families, for tests/test_precision.py: each ISTA step sees at least d tokens
# (so the fast paths fold it into one product), every family's fast path runs
SMALL = {
    "crate-digits": Network("crate-digits", "crate-digits", batch=4),
    "crate-mae-photos": Network("crate-mae-photos", "crate-mae-photos", task="mae", batch=4),
    "tost-small": Network(
        "ToST, d 64, 2 layers, 32x32",
        "tost-tiny",
        ("sizes.d=64", "sizes.depth=2", "sizes.image_size=32", "sizes.patch_size=8", "sizes.classes=10"),
    ),
    "causal-crate-bytes": Network("causal-crate-bytes, 2 layers", "causal-crate-bytes", ("sizes.depth=2",), "lm"),
}
PRECISIONS = ("fp64", "fp32", "bf16", "fp16")  # fp64: the float64 network with the fast paths
BUILDS = ("bf16-build", "fp16-build")
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16, "bf16-build": torch.bfloat16, "fp16-build": torch.float16}
LOSS_SCALE = 2.0**16  # fp16: a GradScaler's initial scale


@dataclass
class Pass:
    """One forward and backward pass: the output, the input's gradient (None for token ids), every
    parameter's gradient concatenated (float64), and each ISTA step's support (output > 0)."""

    output: torch.Tensor
    input_grad: torch.Tensor | None
    param_grad: torch.Tensor
    support: list[torch.Tensor]
    scale: float = 1.0  # the loss scale (fp16)

    def finite(self) -> bool:
        grads = [self.param_grad] + ([self.input_grad] if self.input_grad is not None else [])
        return all(torch.isfinite(g).all().item() for g in grads)


@dataclass
class Errors:
    """A pass against the reference: norm-wise relative errors, and the ISTA units whose sign flipped."""

    output: float
    input_grad: float | None
    param_grad: float
    flips: int
    units: int
    scale: float = 1.0


@dataclass
class Row:
    """One network, precision and formulas over every input."""

    network: str
    precision: str
    formulas: str
    errors: list[Errors] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values = [getattr(e, name) for e in self.errors if getattr(e, name) is not None]
        return statistics.median(values) if values else None

    def largest(self, name: str) -> float | None:
        values = [getattr(e, name) for e in self.errors if getattr(e, name) is not None]
        return max(values) if values else None


def relative(x: torch.Tensor, exact: torch.Tensor) -> float:
    """``||x - x64|| / ||x64||``, in float64."""
    exact = exact.double()
    return ((x.double() - exact).norm() / exact.norm()).item()


def build_reference(network: Network, seed: int = 0) -> torch.nn.Module:
    """The network in float64, its weights rounded to float32's values (so the float32 copy holds the same
    numbers), in training mode."""
    model = cc.build(network.spec, overrides=list(network.overrides), seed=seed, dtype="float64")
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(tensor.float().double())
    return model.train()


def inputs(model: torch.nn.Module, network: Network, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch and its targets, drawn from ``seed``: images from N(0, 1) (float32) with random classes, or
    uniform token ids with random next tokens; an autoencoder's targets are unused."""
    spec = cc.spec_of(model)
    gen = torch.Generator().manual_seed(seed)
    shape = (network.batch, *(int(s) for s in spec.input.shape))
    if spec.input.dtype == "int64":
        vocab = int(spec.sizes["vocab"])
        return torch.randint(vocab, shape, generator=gen), torch.randint(vocab, shape, generator=gen)
    classes = int(spec.sizes.get("classes", 1))
    return torch.randn(shape, generator=gen), torch.randint(classes, (network.batch,), generator=gen)


def _supports(model: torch.nn.Module) -> tuple[list[torch.Tensor], list]:
    """Forward hooks that keep each ISTA step's support (``output > 0``), and their handles."""
    found: list[torch.Tensor] = []
    hooks = [
        m.register_forward_hook(lambda module, args, out: found.append((out > 0).detach()))
        for m in model.modules()
        if isinstance(m, (ISTA, ISTAMM))
    ]
    return found, hooks


def run_pass(
    model: torch.nn.Module,
    network: Network,
    batch: tuple[torch.Tensor, torch.Tensor],
    precision: str,
    formulas: str,
    seed: int,
    scale: float = LOSS_SCALE,
) -> Pass:
    """The loss's forward and backward pass of ``model`` (already in the precision's dtype) on ``batch``,
    under the precision's autocast and the ``formulas``; the mask (an autoencoder's) drawn from ``seed``.
    fp16: the loss scaled by ``scale``, halved until the gradients are finite (``Pass.scale``)."""
    scale = scale if precision.startswith("fp16") else 1.0
    while True:
        found = _forward_backward(model, network, batch, precision, formulas, seed, scale)
        if found.finite() or scale <= 1.0:
            return found
        scale /= 2


def _forward_backward(
    model: torch.nn.Module,
    network: Network,
    batch: tuple[torch.Tensor, torch.Tensor],
    precision: str,
    formulas: str,
    seed: int,
    scale: float,
) -> Pass:
    x, y = batch
    dtype = next(model.parameters()).dtype
    if x.is_floating_point():
        x = x.to(dtype, copy=True).requires_grad_(True)  # a leaf of its own
    autocast = precision in ("bf16", "fp16")
    model.zero_grad(set_to_none=True)
    support, hooks = _supports(model)
    try:
        with use_formulas(formulas), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with torch.autocast("cpu", dtype=HALF.get(precision, torch.bfloat16), enabled=autocast):
                outputs = model(x)
                loss = tasks.get(network.task).loss(outputs, x, y, model=model)
            (loss * scale).backward()
    finally:
        for hook in hooks:
            hook.remove()
    grads = [p.grad.double().flatten() / scale for p in model.parameters() if p.grad is not None]
    param_grad = torch.cat(grads)
    input_grad = x.grad.double() / scale if x.is_floating_point() else None
    return Pass(outputs["output"].detach().double(), input_grad, param_grad, support, scale)


def compare(got: Pass, exact: Pass) -> Errors:
    flips = sum(int((a != b).sum()) for a, b in zip(got.support, exact.support))
    units = sum(s.numel() for s in exact.support)
    input_grad = relative(got.input_grad, exact.input_grad) if exact.input_grad is not None else None
    return Errors(
        relative(got.output, exact.output),
        input_grad,
        relative(got.param_grad, exact.param_grad),
        flips,
        units,
        got.scale,
    )


def copies(reference: torch.nn.Module, precisions: tuple[str, ...]) -> dict[str, torch.nn.Module]:
    """The network for each precision: the reference itself (fp64), its float32 copy (fp32 and the
    autocast ones), or a half copy (builds)."""
    models = {"fp64": reference}
    float32 = copy.deepcopy(reference).float()
    for precision in precisions:
        if precision in BUILDS:
            models[precision] = copy.deepcopy(reference).to(HALF[precision])
        elif precision != "fp64":
            models[precision] = float32
    return models


def measure(
    network: Network,
    precisions: tuple[str, ...] = PRECISIONS,
    formulas: tuple[str, ...] = ("fast", "written"),
    count: int = 5,
    seed: int = 0,
) -> list[Row]:
    """Every ``(precision, formulas)`` row of ``network`` over ``count`` inputs (seeds ``seed``, ``seed + 1``, ...)."""
    reference = build_reference(network, seed)
    models = copies(reference, precisions)
    rows = {
        (p, f): Row(network.label, p, f) for p in precisions for f in formulas if not (p == "fp64" and f == "written")
    }
    scales = dict.fromkeys(rows, LOSS_SCALE)  # fp16's loss scale, kept from input to input as a run keeps it
    for i in range(count):
        batch = inputs(reference, network, seed + i)
        exact = run_pass(reference, network, batch, "fp64", "written", seed + i)
        for (precision, chosen), row in rows.items():
            found = run_pass(models[precision], network, batch, precision, chosen, seed + i, scales[precision, chosen])
            scales[precision, chosen] = found.scale
            row.errors.append(compare(found, exact))
    return list(rows.values())


def _cell(row: Row, name: str, digits: int = 1) -> str:
    median, largest = row.median(name), row.largest(name)
    if median is None:
        return "-"
    return f"{median:.{digits}e} / {largest:.{digits}e}"


def table(rows: list[Row]) -> str:
    """Markdown: one line per network, precision and formulas."""
    lines = [
        "| network | precision | formulas | output | input gradient | parameter gradients | ISTA flips (of units) "
        "| loss scale |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        flips = [e.flips for e in row.errors]
        units = row.errors[0].units if row.errors else 0
        flipped = f"{statistics.median(flips):g} / {max(flips)} (of {units:,})" if units else "-"
        scales = sorted({int(math.log2(e.scale)) for e in row.errors})
        scale = (
            f"2^{scales[0]}" + (f"-2^{scales[-1]}" if len(scales) > 1 else "")
            if row.precision.startswith("fp16")
            else ""
        )
        lines.append(
            f"| {row.network} | {row.precision} | {row.formulas} | {_cell(row, 'output')} | "
            f"{_cell(row, 'input_grad')} | {_cell(row, 'param_grad')} | {flipped} | {scale} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else ""
    )
    return (
        f"{datetime.date.today()}, {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", default=",".join(NETWORKS), help="comma-separated: " + ", ".join(NETWORKS))
    parser.add_argument("--small", action="store_true", help="the small networks of tests/test_precision.py instead")
    parser.add_argument("--inputs", type=int, default=5, help="inputs (batches) per network (default: 5)")
    parser.add_argument("--batch", type=int, default=None, help="examples per input (default: each network's, 2)")
    parser.add_argument("--builds", action="store_true", help="also the half builds (bf16-build, fp16-build)")
    parser.add_argument(
        "--precisions",
        default=None,
        help="comma-separated subset of the rows' precisions (default: all; e.g. bf16 for one base-size "
        "network in minutes instead of an hour)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write every number to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chosen = SMALL if args.small else {name: NETWORKS[name] for name in args.networks.split(",")}
    precisions = PRECISIONS + (BUILDS if args.builds else ())
    if args.precisions:
        asked = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
        if unknown := [p for p in asked if p not in precisions]:
            parser.error(
                f"--precisions: {', '.join(unknown)} not among {', '.join(precisions)} (--builds adds the builds)"
            )
        precisions = asked
    print(f"{machine()}; {args.inputs} inputs per network\n")
    rows, seconds = [], {}
    for name, network in chosen.items():
        if args.batch:
            network = Network(
                **{**asdict(network), "batch": args.batch, "label": f"{network.label}, batch {args.batch}"}
            )
        began = time.perf_counter()
        found = measure(network, precisions, count=args.inputs)
        seconds[name] = time.perf_counter() - began
        print(table(found) + f"\n\n({name}: {seconds[name]:.0f} s)\n", flush=True)
        rows += found
        if args.json:  # after every network: a long run keeps what it measured
            args.json.write_text(
                json.dumps(
                    {
                        "machine": machine(),
                        "inputs": args.inputs,
                        "seconds": seconds,
                        "rows": [asdict(row) for row in rows],
                    },
                    indent=1,
                )
                + "\n"
            )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

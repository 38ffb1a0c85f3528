"""What one training step asks of a GPU, counted on a machine without one.

    .venv/bin/python benchmarks/kernels.py [--models crate-base,vit-base,...] [--compiled] [--json FILE] [--out]

Two censuses of one training step (forward, loss, backward, optimizer step) of every family's base
model beside its peer: ViT-B/16 for the image models, GPT-2 for the causal language models, BERT for
CRATE-BERT. Images: batch 64 at 224x224 (cross-entropy; CRATE-MAE its masked MSE); causal language
models: batch 8 at a context of 1,024 tokens (next-token cross-entropy); masked language models:
batch 16 at 512 (cross-entropy at every position: their heads compute every position's logits).
bf16 autocast, as ``train --precision bf16`` runs on a GPU (weights, gradients, optimizer in float32).

**Eager: every op's bytes and FLOPs** (``census``). The step runs once over *fake* tensors
(``FakeTensorMode``: shapes, dtypes and strides, no arithmetic and no memory; a base model's step is
counted in a second or two) under a dispatch mode that sees every ATen op the step dispatches, with
the ``nn.Module`` running it (``ModuleTracker``, forward and backward). For each op: the bytes it reads
(every input tensor, the elements its strides address: an expanded bias counts once) and writes (its
outputs), and its FLOPs (``torch.utils.flop_counter``'s formulas: matrix products, convolutions,
attention; element-wise FLOPs are not counted, they are never the bound). Views, reshapes and
allocations move no bytes and launch nothing, and are skipped. An op's lower bound on a GPU is
``max(bytes / bandwidth, FLOPs / peak)`` (:data:`GPUS`: H100 SXM and H200, the makers' dense bf16
peak and memory bandwidth), and a step's eager bound the sum over its ops (one stream: they do not
overlap); each op is one or more kernel launches, so the op count is a floor on the launches. The
ops are sorted into kinds (:func:`kind`): matrix products, attention (the fused kernel, and every
other op of an attention or TSSA step), the ISTA step (every op of an ISTA-family step but its
LayerNorm and casts), norms, casts (``_to_copy``: autocast's copies of weights and activations and the
gradients' way back), activations, the loss, other element-wise ops, and the optimizer.

The tensors are CPU fakes, because the CPU build of torch has no CUDA device to fake; the op stream
is made to be CUDA's where the two differ: autocast to bf16 lowers the same matrix products on both,
and the project's modules already compute LayerNorm, softmax and TSSA's statistics in float32 on
every device; attention goes through ``scaled_dot_product_attention`` (the CPU's bf16 shortcut,
``causal.EXPLICIT_BF16_CPU_KEYS``, is switched off), whose CPU flash kernel reads and writes what
CUDA's flash kernel does (q, k, v, the output and its log-sum-exp); the optimizer is AdamW with
torch's multi-tensor (``foreach``) kernels, as torch picks on CUDA, and beside it its ``fused`` kernel
(what ``train`` takes on CUDA and the CPU) and Lion (the CRATE recipe's optimizer, ``foreach`` as it runs on CUDA).

**Compiled: kernels per layer and graph breaks** (``--compiled``). ``torch.compile`` (inductor) of
the same step on the CPU with real tensors, at depth 1 and
depth 2: the difference is one layer's kernels (every call in the generated code: fused kernels,
matrix products and attention), its bytes (inductor's own count of what its fused kernels read and
write) and the graph breaks (Dynamo's counters). Inductor's CPU back end fuses as its GPU back end
does in the main (element-wise chains and reductions into their neighbours; the matrix products stay
library calls), but not identically: these counts are the CPU's, a guide to the GPU's. The compiled
bound: the eager census's matrix products and attention at their bound, plus the rest of inductor's
bytes at the memory bandwidth (the fused kernels are element-wise and bound by memory).

Prints Markdown (the machine, the tables, what they mean); ``--out`` appends it to
``benchmarks/RESULTS.md``; ``--json FILE`` writes every number. The eager census of all models takes
about a minute on 2 cores; ``--compiled`` about 15 more.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import cpu_name  # benchmarks/machine.py, beside this script
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.module_tracker import ModuleTracker

import crate_compose as cc
from crate_compose.modules import causal
from crate_compose.modules.sparsify import ISTA, ISTAMM, ISTAODL
from crate_compose.training.optimizers import Lion

HERE = Path(__file__).resolve().parent
aten = torch.ops.aten


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth: float  # bytes/s of HBM
    bf16: float  # dense bf16 FLOP/s of the tensor cores


GPUS = (GPU("H100 SXM", 3.35e12, 989e12), GPU("H200", 4.8e12, 989e12))  # the makers' data sheets


@dataclass(frozen=True)
class Model:
    """One model of the census: a preset or spec with overrides, its loss, its batch and its peer."""

    label: str
    ref: str
    overrides: tuple[str, ...] = ()
    loss: str = "classify"  # classify, mae, lm, mlm
    batch: int = 64
    peer: str | None = None  # the label of the model it is compared with


BASE = ("sizes.d=768", "sizes.heads=12")
MODELS = {
    m.label: m
    for m in (
        Model("ViT-B/16", "specs/vit.yaml", BASE),
        Model("CRATE-B/16", "crate-base", peer="ViT-B/16"),
        Model("CRATE-alpha-B/16", "crate-alpha-base16", peer="ViT-B/16"),
        Model("ToST-B/16", "tost-small", BASE, peer="ViT-B/16"),
        Model("AoT-B/16", "specs/aot.yaml", BASE, peer="ViT-B/16"),
        Model("CRATE-MAE-B", "crate-mae-base", loss="mae", peer="ViT-B/16"),
        Model("GPT-2", "gpt2-small", loss="lm", batch=8),
        Model("causal CRATE-B", "causal-crate-base", loss="lm", batch=8, peer="GPT-2"),
        Model("crate-lm-B", "crate-lm-base", loss="lm", batch=8, peer="GPT-2"),
        Model("ToST-LM-B", "tost-lm-base", loss="lm", batch=8, peer="GPT-2"),
        Model("BERT-B", "bert-base", loss="mlm", batch=16),
        Model("CRATE-BERT-B", "crate-bert-base", loss="mlm", batch=16, peer="BERT-B"),
    )
}
KINDS = ("matmul", "attention", "ISTA step", "norms", "casts", "activations", "loss", "element-wise", "optimizer")

# ops that move no bytes and launch nothing (views are found by their schema)
FREE = {
    aten.detach,
    aten.alias,
    aten._unsafe_view,
    aten.empty,
    aten.empty_strided,
    aten.empty_like,
    aten.new_empty,
    aten.new_empty_strided,
    aten.lift_fresh,
    aten.lift_fresh_copy,
    aten.sym_size,
    aten.sym_stride,
    aten.sym_numel,
    aten.is_same_size,
    aten._local_scalar_dense,
    aten.set_,
}
WRITE_ONLY = {aten.copy_, aten.fill_, aten.zero_, aten.zeros_like, aten.ones_like, aten.full_like}
NORMS = {
    aten.native_layer_norm,
    aten.native_layer_norm_backward,
    aten.native_group_norm,
    aten.native_group_norm_backward,
    aten.native_batch_norm,
    aten.native_batch_norm_backward,
}
MATMULS = {
    aten.mm,
    aten.addmm,
    aten.bmm,
    aten.baddbmm,
    aten.convolution,
    aten.convolution_backward,
    aten.addbmm,
    aten._convolution,
}
ACTIVATIONS = {
    aten.relu,
    aten.relu_,
    aten.threshold_backward,
    aten.gelu,
    aten.gelu_backward,
    aten.silu,
    aten.silu_backward,
    aten.tanh,
    aten.tanh_backward,
    aten.sigmoid,
    aten.sigmoid_backward,
    aten._softmax,
    aten._softmax_backward_data,
    aten.softshrink,
    aten.softshrink_backward,
}
LOSSES = {
    aten.nll_loss_forward,
    aten.nll_loss_backward,
    aten._log_softmax,
    aten._log_softmax_backward_data,
    aten.mse_loss,
    aten.mse_loss_backward,
}
CASTS = {aten._to_copy}
ISTA_STEPS = (ISTA, ISTAMM, ISTAODL)


def _attention_modules() -> tuple[type, ...]:
    from crate_compose.modules.aot import AoT
    from crate_compose.modules.compress import MSSA
    from crate_compose.modules.standard import MHSA
    from crate_compose.modules.tost import ClassAttention
    from crate_compose.modules.tssa import TSSA

    return AoT, MSSA, MHSA, ClassAttention, TSSA


def _attention_flops(func, args, out) -> int:
    """FLOPs of the CPU's flash attention (torch counts CUDA's kernels only): the same two (four
    backward) batched products as CUDA's, from the shapes."""
    shape = lambda t: tuple(t.shape)  # noqa: E731
    packet = func.overloadpacket
    if packet is aten._scaled_dot_product_flash_attention_for_cpu:
        return flop_counter.sdpa_flop_count(shape(args[0]), shape(args[1]), shape(args[2]))
    if packet is aten._scaled_dot_product_flash_attention_for_cpu_backward:
        return flop_counter.sdpa_backward_flop_count(shape(args[0]), shape(args[1]), shape(args[2]), shape(args[3]))
    return 0


def addressed_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements ``t``'s strides address (a broadcast dimension counts once)."""
    elements = math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0) if t.dim() else 1
    return elements * t.element_size() if t.numel() else 0


def _mutated(func, args, kwargs) -> list:
    """The arguments ``func`` writes into (its schema marks them: ``add_``'s self, every list of a fused
    optimizer kernel, an ``out=``), which in-place ops need not return."""
    named = dict(zip((a.name for a in func._schema.arguments), args), **kwargs)
    written = [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if func.overloadpacket in (aten._fused_adam_, aten._fused_adamw_) and named.get("grad_scale") is None:
        written.remove("grads")  # written back only when unscaled (fp16's loss scale)
    return [named[name] for name in written if name in named]


@dataclass
class Op:
    name: str
    kind: str
    read: int
    written: int
    flops: int
    phase: str  # forward, backward, optimizer


class Census(TorchDispatchMode):
    """Every ATen op under it, with its bytes, FLOPs, kind and phase (see the module's docstring)."""

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker, self.ops, self.phase = tracker, [], "forward"
        self.attention = _attention_modules()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if func.namespace != "aten" or packet in FREE or func.is_view:  # prim.device and the like: queries
            return out
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if packet in WRITE_ONLY:
            inputs = inputs[1:] if packet is aten.copy_ else []
        outputs = {
            id(o): o for o in tree_flatten((out, _mutated(func, args, kwargs)))[0] if isinstance(o, torch.Tensor)
        }
        unique = {id(t): t for t in inputs}
        read = sum(addressed_bytes(t) for t in unique.values())
        written = sum(addressed_bytes(t) for t in outputs.values())
        if packet in flop_counter.flop_registry:
            flops = flop_counter.flop_registry[packet](*args, **kwargs, out_val=out)
        else:
            flops = _attention_flops(func, args, out)
        if packet is aten.copy_ and args[0].dtype != args[1].dtype:
            packet = aten._to_copy  # a cast written into place
        self.ops.append(
            Op(str(packet).removeprefix("aten."), self.kind(packet, func), read, written, int(flops), self.phase)
        )
        return out

    def modules(self) -> list[nn.Module]:
        known = {name: module for module, name in self.tracker._known_modules.items()}
        return [known[name] for name in self.tracker.parents if name in known]

    def kind(self, packet, func) -> str:
        if self.phase == "optimizer":
            return "optimizer"
        if packet in CASTS:
            return "casts"
        if packet in NORMS:
            return "norms"
        modules = self.modules()
        if any(isinstance(m, ISTA_STEPS) for m in modules):
            return "ISTA step"
        name = str(packet)
        if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
            return "attention"
        if packet in MATMULS:
            return "matmul"
        if any(isinstance(m, self.attention) for m in modules):
            return "attention"
        if packet in LOSSES:
            return "loss"
        if packet in ACTIVATIONS:
            return "activations"
        return "element-wise"


@dataclass
class Step:
    """The census of one model's training step."""

    model: str
    params: int
    batch: int
    ops: list[Op]
    optimizers: dict[str, list[Op]] = field(default_factory=dict)  # the optimizer step's ops, by optimizer

    def total(self, what: str, optimizer: str = "adamw-fused", kinds=None) -> float:
        ops = self.ops + self.optimizers.get(optimizer, [])
        return sum(
            getattr(o, what) if what != "bytes" else o.read + o.written for o in ops if kinds is None or o.kind in kinds
        )

    def bound(self, gpu: GPU, optimizer: str = "adamw-fused") -> float:
        """Seconds: each op at the larger of its memory time and its tensor-core time, summed."""
        return sum(
            max((o.read + o.written) / gpu.bandwidth, o.flops / gpu.bf16)
            for o in self.ops + self.optimizers.get(optimizer, [])
        )

    def launches(self, optimizer: str = "adamw-fused") -> int:
        return len(self.ops) + len(self.optimizers.get(optimizer, []))


def build(model: Model, *, depth: int | None = None, meta: bool = False) -> nn.Module:
    """The model in training mode (``meta``: on the meta device, ties kept, nothing initialized)."""
    ref = str(HERE.parent / model.ref) if model.ref.endswith(".yaml") else model.ref
    overrides = list(model.overrides) + ([f"sizes.depth={depth}"] if depth else [])
    return cc.build(ref, overrides=overrides, seed=0, meta=meta).train()


def inputs(net: nn.Module, model: Model, batch: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the model's input and its targets (images and classes, or token ids and the next ids)."""
    spec = cc.spec_of(net)
    shape = (batch, *(int(s) for s in spec.input.shape))
    if spec.input.dtype == "int64":
        vocab = int(spec.sizes["vocab"])
        return torch.randint(vocab, shape, device=device), torch.randint(vocab, shape, device=device)
    classes = int(spec.sizes.get("classes", 1000))
    return torch.randn(shape, device=device), torch.randint(classes, (batch,), device=device)


def loss_of(net: nn.Module, model: Model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    from crate_compose import tasks

    outputs = net(x)
    if model.loss == "mlm":  # every position scored: what the head computes, whatever share the task scores
        return F.cross_entropy(outputs["output"].float().flatten(0, 1), y.flatten())
    return tasks.get(model.loss).loss(outputs, x, y, model=net)


@contextlib.contextmanager
def cuda_choices():
    """The op choices CUDA makes where the CPU's differ: attention through the fused kernel."""
    before = causal.EXPLICIT_BF16_CPU_KEYS
    causal.EXPLICIT_BF16_CPU_KEYS = 0
    try:
        yield
    finally:
        causal.EXPLICIT_BF16_CPU_KEYS = before


OPTIMIZERS = {
    "adamw-foreach": lambda params: torch.optim.AdamW(params, lr=1e-4, foreach=True),
    "adamw-fused": lambda params: torch.optim.AdamW(params, lr=1e-4, fused=True),
    "lion-foreach": lambda params: Lion(params, lr=1e-4, foreach=True),
}


def fake(net: nn.Module) -> nn.Module:
    """``net`` (on the meta device) with fake CPU tensors in place of its parameters and buffers, a tied
    parameter (a language model's embedding and head) still one tensor (``Module.to_empty`` unties it)."""
    made: dict[int, torch.Tensor] = {}

    def like(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            empty = torch.empty_like(t, device="cpu")
            made[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else empty
        return made[id(t)]

    for module in net.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = like(t)
    return net


@contextlib.contextmanager
def counting(phase: str = "forward"):
    """Every ATen op run inside, counted (:class:`Census`; its ``ops``), starting in ``phase``."""
    with ModuleTracker() as tracker, Census(tracker) as counted:
        counted.phase = phase
        yield counted


def census(model: Model, batch: int | None = None, depth: int | None = None) -> Step:
    """One bf16-autocast training step of ``model`` (at ``depth`` layers if given) over fake tensors, op by op."""
    batch = batch or model.batch
    net = build(model, depth=depth, meta=True)  # parameters of the right shapes, no memory
    with FakeTensorMode(allow_non_fake_inputs=True), cuda_choices():
        net = fake(net)
        x, y = inputs(net, model, batch)
        params = [p for p in net.parameters() if p.requires_grad]
        with counting() as counted:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(net, model, x, y)
            counted.phase = "backward"
            loss.backward()
        step = Step(model.label, sum(p.numel() for p in params), batch, counted.ops)
        for name, make in OPTIMIZERS.items():
            optimizer = make(params)
            optimizer.step()  # the first step makes the state: the census counts a later one
            with counting("optimizer") as counted:
                optimizer.step()
            step.optimizers[name] = counted.ops
    return step


# ------------------------------------------------------------------------------------------- compiled


CALL = re.compile(
    r"^\s+(?:[\w, ]+ = )?(cpp_fused_\w+|triton_\w+|extern_kernels\.\w+|torch\.ops\.\w+\.\w+\.\w+)\(", re.M
)


@dataclass
class Compiled:
    model: str
    depth: int
    calls: dict[str, int]  # kernel calls of the forward and backward graphs, by kind
    bytes: int  # inductor's count of the bytes its kernels read and write
    graphs: int
    graph_breaks: int
    seconds: float

    @property
    def kernels(self) -> int:
        return sum(self.calls.values())


def _calls(code: str) -> Counter:
    body = code.split("def call(", 1)[-1].split("\ndef ", 1)[0]
    found = Counter()
    for name in CALL.findall(body):
        found[
            "fused" if name.startswith(("cpp_fused", "triton")) else name.split(".")[-2 if "ops" in name else -1]
        ] += 1
    return found


def compiled(model: Model, depth: int) -> Compiled:
    """Inductor's kernels for one bf16-autocast training step (forward and backward) at ``depth``."""
    import logging

    from torch._dynamo.utils import counters
    from torch._inductor import compile_fx, metrics
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    metrics.reset()
    counters.clear()
    log = compile_fx.inductor_metrics_log  # inductor counts its kernels' bytes only when it would log them:
    log.setLevel(logging.INFO)  # it logs them here, to nowhere
    log.propagate, log.handlers = False, [logging.NullHandler()]
    began = time.perf_counter()
    with cuda_choices():
        net = build(model, depth=depth)
        x, y = inputs(net, model, model.batch)
        step = torch.compile(net)

        def train_step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(step, model, x, y)
            loss.backward()

        _, codes = run_and_get_code(train_step)
    calls = sum((_calls(code) for code in codes), Counter())
    return Compiled(
        model.label,
        depth,
        dict(calls),
        int(metrics.num_bytes_accessed),
        len(codes),
        sum(counters["graph_break"].values()),
        time.perf_counter() - began,
    )


# ------------------------------------------------------------------------------------------- report


def depth_of(model: Model) -> int:
    return int(cc.spec_of(build(model, meta=True)).sizes["depth"])


def gb(n: float) -> str:
    return f"{n / 1e9:,.2f}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def against_peer(label: str, rates: dict[str, float]) -> str:
    """``label``'s rate over its peer's (:attr:`Model.peer`), when both were counted."""
    peer = MODELS[label].peer if label in MODELS else None
    return f"{rates[label] / rates[peer]:.2f}x" if peer in rates else ""


def eager_table(steps: dict[str, Step]) -> list[str]:
    rows = [
        "| model | params | batch | ops (launches >=) | GFLOP | GB moved | H100 bound ms | H200 bound ms | "
        "images or sequences / s at the H200 bound | against its peer | FLOP-bound share |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    h100, h200 = GPUS
    rates = {label: s.batch / s.bound(h200) for label, s in steps.items()}
    for label, s in steps.items():
        flop_time = s.total("flops") / h200.bf16
        rows.append(
            f"| {s.model} | {s.params / 1e6:,.1f}M | {s.batch} | {s.launches():,} | {s.total('flops') / 1e9:,.0f} | "
            f"{gb(s.total('bytes'))} | {ms(s.bound(h100))} | {ms(s.bound(h200))} | "
            f"{rates[label]:,.0f} | {against_peer(label, rates)} | {flop_time / s.bound(h200):.0%} |"
        )
    return rows


def kinds_table(steps: dict[str, Step]) -> list[str]:
    rows = ["| model | " + " | ".join(KINDS) + " |", "| --- |" + " ---: |" * len(KINDS)]
    for s in steps.values():
        total = s.total("bytes")
        cells = [f"{s.total('bytes', kinds={k}) / total:.0%}" for k in KINDS]
        rows.append(f"| {s.model} | " + " | ".join(cells) + " |")
    return rows


def optimizer_table(steps: dict[str, Step]) -> list[str]:
    rows = [
        "| model | optimizer | ops | GB moved | H200 bound ms | share of the step's bound |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    h200 = GPUS[1]
    for s in steps.values():
        for name, ops in s.optimizers.items():
            moved = sum(o.read + o.written for o in ops)
            bound = sum((o.read + o.written) / h200.bandwidth for o in ops)
            rows.append(
                f"| {s.model} | {name} | {len(ops)} | {gb(moved)} | {ms(bound)} | {bound / s.bound(h200, name):.0%} |"
            )
    return rows


def top_ops(step: Step, count: int = 12) -> list[str]:
    """The ops of one step that take the most of its H200 bound, grouped by name and kind."""
    h200 = GPUS[1]
    groups: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for o in step.ops + step.optimizers["adamw-fused"]:
        groups[o.name, o.kind].append(o)
    total = step.bound(h200)
    ranked = sorted(
        groups.items(),
        key=lambda g: -sum(max((o.read + o.written) / h200.bandwidth, o.flops / h200.bf16) for o in g[1]),
    )
    rows = [
        "| op | kind | calls | GB moved | GFLOP | H200 bound ms | share |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (name, kind), ops in ranked[:count]:
        bound = sum(max((o.read + o.written) / h200.bandwidth, o.flops / h200.bf16) for o in ops)
        rows.append(
            f"| `{name}` | {kind} | {len(ops)} | {gb(sum(o.read + o.written for o in ops))} | "
            f"{sum(o.flops for o in ops) / 1e9:,.1f} | {ms(bound)} | {bound / total:.0%} |"
        )
    return rows


def compiled_rows(model: Model, one: Compiled, two: Compiled, step: Step) -> dict:
    """Per layer (depth 2 less depth 1) and for the whole network (depth 1 plus the other layers), beside
    the eager census's bytes counted the same way; the compiled bound of the whole step."""
    depth = depth_of(model)
    eager_one, eager_two = census(model, depth=1), census(model, depth=2)
    layer_bytes, eager_layer = two.bytes - one.bytes, eager_two.total("bytes", "") - eager_one.total("bytes", "")
    whole_bytes = one.bytes + (depth - 1) * layer_bytes
    bounds = {}
    for gpu in GPUS:  # the library kernels at their eager bound, the fused kernels at the memory bandwidth
        heavy = [o for o in step.ops if o.kind == "matmul" or o.flops]
        heavy_bytes = sum(o.read + o.written for o in heavy)
        heavy_time = sum(max((o.read + o.written) / gpu.bandwidth, o.flops / gpu.bf16) for o in heavy)
        optimizer = sum((o.read + o.written) / gpu.bandwidth for o in step.optimizers["adamw-fused"])
        bounds[gpu.name] = heavy_time + max(0.0, whole_bytes - heavy_bytes) / gpu.bandwidth + optimizer
    return {
        "depth": depth,
        "per_layer": two.kernels - one.kernels,
        "per_layer_calls": {k: two.calls.get(k, 0) - one.calls.get(k, 0) for k in set(one.calls) | set(two.calls)},
        "whole": one.kernels + (depth - 1) * (two.kernels - one.kernels),
        "layer_bytes": layer_bytes,
        "eager_layer_bytes": eager_layer,
        "whole_bytes": whole_bytes,
        "eager_whole_bytes": step.total("bytes", ""),
        "eager_layer_ops": eager_two.launches("") - eager_one.launches(""),
        "graph_breaks": max(one.graph_breaks, two.graph_breaks),
        "graphs": two.graphs,
        "bounds": bounds,
        "seconds": one.seconds + two.seconds,
    }


def compiled_table(results: dict[str, dict], steps: dict[str, Step]) -> list[str]:
    rows = [
        "| model | kernels per layer (fused / matmul / attention / other) (eager ops) | kernels per step | "
        "graph breaks | GB per layer, compiled (eager) | GB per step, compiled (eager) | H100 bound ms | "
        "H200 bound ms | per s at the H200 bound | against its peer |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rates = {label: steps[label].batch / r["bounds"]["H200"] for label, r in results.items()}
    for label, r in results.items():
        calls = r["per_layer_calls"]
        matmuls = sum(v for k, v in calls.items() if k in {"mm", "addmm", "bmm", "baddbmm", "convolution"})
        attention = sum(v for k, v in calls.items() if "attention" in k)
        other = r["per_layer"] - calls.get("fused", 0) - matmuls - attention
        rows.append(
            f"| {label} | {r['per_layer']} ({calls.get('fused', 0)} / {matmuls} / {attention} / {other}) "
            f"({r['eager_layer_ops']}) | {r['whole']:,} | {r['graph_breaks']} | {gb(r['layer_bytes'])} "
            f"({gb(r['eager_layer_bytes'])}) | {gb(r['whole_bytes'])} ({gb(r['eager_whole_bytes'])}) | "
            f"{ms(r['bounds']['H100 SXM'])} | {ms(r['bounds']['H200'])} | {rates[label]:,.0f} | "
            f"{against_peer(label, rates)} |"
        )
    return rows


def machine() -> str:
    return f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}"


def report(steps: dict[str, Step], compiled_results: dict[str, dict], seconds: float) -> str:
    gpus = "; ".join(f"{g.name}: {g.bandwidth / 1e12:.2f} TB/s, {g.bf16 / 1e12:,.0f} TFLOP/s dense bf16" for g in GPUS)
    out = [
        f"## kernels.py: what one training step asks of a GPU, counted without one ({datetime.date.today()})",
        "",
        f"`.venv/bin/python benchmarks/kernels.py{' --compiled' if compiled_results else ''}` ({machine()}; "
        f"{seconds:.0f} s). bf16 autocast; images: batch 64 at 224x224; causal language models: batch 8 x 1,024 "
        f"tokens; masked language models: batch 16 x 512. Bounds: {gpus}.",
        "",
        "Eager step (forward, loss, backward, fused AdamW), every op counted over fake tensors:",
        "",
    ]
    out += eager_table(steps)
    out += ["", "Share of the bytes moved, by kind of op (eager step, fused AdamW):", ""]
    out += kinds_table(steps)
    out += ["", "The optimizer step alone (its ops are element-wise: bound by memory):", ""]
    out += optimizer_table(steps)
    for label in ("CRATE-B/16", "ViT-B/16"):
        if label in steps:
            out += ["", f"{label}: the ops that take the most of the eager H200 bound:", ""]
            out += top_ops(steps[label])
    if compiled_results:
        out += [
            "",
            (
                "Compiled (`torch.compile`, inductor on this CPU, forward and backward; a layer is depth 2 "
                "less depth 1; the step's bytes without the optimizer; the bound with fused AdamW):"
            ),
            "",
        ]
        out += compiled_table(compiled_results, steps)
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated labels: " + ", ".join(MODELS))
    parser.add_argument("--compiled", action="store_true", help="also compile each model at depth 1 and 2 (minutes)")
    parser.add_argument("--json", type=Path, default=None, help="also write every number to this file")
    parser.add_argument("--out", nargs="?", const=str(HERE / "RESULTS.md"), help="append the section to RESULTS.md")
    args = parser.parse_args()
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in chosen if m not in MODELS]:
        parser.error(f"--models: {', '.join(unknown)} not among {', '.join(MODELS)}")
    began = time.perf_counter()
    steps, compiled_results = {}, {}
    for label in chosen:
        print(f"... {label}: eager census", file=sys.stderr, flush=True)
        steps[label] = census(MODELS[label])
    if args.compiled:
        for label in chosen:
            print(f"... {label}: compiling at depth 1 and 2", file=sys.stderr, flush=True)
            one, two = compiled(MODELS[label], 1), compiled(MODELS[label], 2)
            compiled_results[label] = compiled_rows(MODELS[label], one, two, steps[label])
    text = report(steps, compiled_results, time.perf_counter() - began)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as results:
            results.write("\n\n" + text + "\n")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "gpus": [asdict(g) for g in GPUS],
                    "steps": {
                        label: {
                            "params": s.params,
                            "batch": s.batch,
                            "ops": [asdict(o) for o in s.ops],
                            "optimizers": {k: [asdict(o) for o in v] for k, v in s.optimizers.items()},
                        }
                        for label, s in steps.items()
                    },
                    "compiled": compiled_results,
                },
                indent=0,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

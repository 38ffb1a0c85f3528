"""benchmarks/kernels.py counts what a training step asks of a GPU without one: each op's bytes and FLOPs
over fake tensors, sorted by kind, and the compiled step's kernels per layer and graph breaks.

The counts are checked against what they claim to be: an op's bytes against its tensors written out,
the FLOPs of a whole step against ``FlopCounterMode`` on a real run of the same network, the kinds
against the modules that ran the ops, and the compiled census on a small network."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import kernels  # noqa: E402  (benchmarks/kernels.py)

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = (
    "sizes.d=64",
    "sizes.heads=2",
    "sizes.head_dim=32",
    "sizes.depth=2",
    "sizes.image_size=32",
    "sizes.patch_size=4",
    "sizes.classes=10",
)
CRATE = kernels.Model("crate", "specs/crate.yaml", SMALL, batch=4)
VIT = kernels.Model("vit", "specs/vit.yaml", tuple(o for o in SMALL if "head_dim" not in o), batch=4)


def test_an_op_reads_its_inputs_and_writes_its_outputs_once_and_views_move_nothing():
    with FakeTensorMode():
        x, w = torch.empty(100, 64), torch.empty(32, 64)
        bias = torch.empty(64)
        with kernels.counting() as counted:
            y = torch.mm(x, w.t())  # w.t() is a view: no op of its own
            z = x + bias  # the bias broadcast: read once
            x.view(64, 100).transpose(0, 1)
            half = x.to(torch.bfloat16)
    mm, add, cast = counted.ops
    assert (mm.name, mm.read, mm.written, mm.flops) == ("mm", (100 * 64 + 32 * 64) * 4, 100 * 32 * 4, 2 * 100 * 64 * 32)
    assert (add.read, add.written, add.flops) == ((100 * 64 + 64) * 4, 100 * 64 * 4, 0)
    assert (cast.kind, cast.read, cast.written) == ("casts", 100 * 64 * 4, 100 * 64 * 2)
    assert y.shape == (100, 32) and z.shape == x.shape and half.dtype == torch.bfloat16


def test_the_flops_of_a_step_are_those_flop_counter_counts_on_a_real_run():
    """The census (fake tensors, bf16 autocast, the CPU's fused attention counted by CUDA's formula) against
    ``FlopCounterMode`` on real tensors in float32 with attention as the math backend's products: the same,
    but for the scores ``q k^T`` that the fused kernel's backward pass computes again (the math backend
    keeps them), one product a layer."""
    counted = kernels.census(CRATE)
    net = kernels.build(CRATE)
    x, y = kernels.inputs(net, CRATE, CRATE.batch)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as reference:
        kernels.loss_of(net, CRATE, x, y).backward()
    depth, heads, head_dim, tokens = 2, 2, 32, (32 // 4) ** 2 + 1
    scores = 2 * CRATE.batch * heads * tokens * tokens * head_dim
    assert counted.total("flops", optimizer="") == reference.get_total_flops() + depth * scores


def test_the_kinds_follow_the_modules_that_ran_the_ops():
    crate, vit = kernels.census(CRATE), kernels.census(VIT)
    for step in (crate, vit):
        assert {o.kind for o in step.ops} <= set(kernels.KINDS)
        assert {o.phase for o in step.ops} == {"forward", "backward"}
        assert all(o.kind == "optimizer" for ops in step.optimizers.values() for o in ops)
        assert step.total("bytes", kinds={"attention"}) > 0 and step.total("bytes", kinds={"norms"}) > 0
    assert crate.total("bytes", kinds={"ISTA step"}) > 0 == vit.total("bytes", kinds={"ISTA step"})
    assert vit.total("bytes", kinds={"activations"}) > 0  # ViT's GELU; CRATE's ReLU is its ISTA step's
    ista = [o for o in crate.ops if o.kind == "ISTA step"]
    assert {"mm", "addmm", "relu_", "threshold_backward"} <= {o.name for o in ista}
    # every FLOP of CRATE is a matrix product or attention, and the ISTA step's products are its own kind
    assert crate.total("flops", optimizer="", kinds={"matmul", "attention", "ISTA step"}) == crate.total(
        "flops", optimizer=""
    )


def test_the_fused_adamw_moves_fewer_bytes_than_the_multi_tensor_kernels_and_the_bound_adds_up():
    step = kernels.census(CRATE)
    moved = {name: sum(o.read + o.written for o in ops) for name, ops in step.optimizers.items()}
    params, tensors = step.params * 4, len(list(kernels.build(CRATE, meta=True).parameters()))
    # reads the weights, gradients and both moments, writes weights and moments; and each tensor's step
    # count (a float32 number: read, incremented, read again)
    assert 0 < moved["adamw-fused"] - 7 * params <= 3 * 4 * tensors
    assert moved["adamw-fused"] < moved["adamw-foreach"]
    for gpu in kernels.GPUS:
        memory = step.total("bytes") / gpu.bandwidth
        arithmetic = step.total("flops") / gpu.bf16
        assert max(memory, arithmetic) * (1 - 1e-12) <= step.bound(gpu) <= (memory + arithmetic) * (1 + 1e-12)


@pytest.mark.parametrize("model", kernels.MODELS.values(), ids=lambda m: m.label)
def test_every_model_of_the_census_is_counted_with_its_trained_parameters(model):
    step = kernels.census(model)
    assert step.params == sum(p.numel() for p in kernels.build(model, meta=True).parameters() if p.requires_grad)
    assert step.total("flops") > 0 and step.total("bytes") > 0 and step.launches() > 100
    for gpu in kernels.GPUS:
        assert step.bound(gpu) > 0


def test_the_compiled_census_counts_one_layers_kernels_without_graph_breaks():
    one, two = kernels.compiled(CRATE, 1), kernels.compiled(CRATE, 2)
    assert one.graph_breaks == two.graph_breaks == 0
    assert 0 < one.kernels < two.kernels and 0 < one.bytes < two.bytes
    layer = {k: two.calls.get(k, 0) - one.calls.get(k, 0) for k in two.calls}
    # a layer's products: MSSA's projection and output, ISTA's K and its product, each with its backward
    assert layer.get("mm", 0) + layer.get("addmm", 0) == 12 and layer.get("fused", 0) > 0
    rows = kernels.compiled_rows(CRATE, one, two, kernels.census(CRATE))
    assert rows["per_layer"] == two.kernels - one.kernels and rows["graph_breaks"] == 0
    assert rows["whole"] == one.kernels + (rows["depth"] - 1) * rows["per_layer"]


def test_the_report_has_every_table():
    steps = {m.label: kernels.census(m) for m in (CRATE, VIT)}
    text = kernels.report(steps, {}, 1.0)
    for heading in ("Eager step", "Share of the bytes moved", "The optimizer step alone"):
        assert heading in text
    rows = [line for line in text.splitlines() if line.startswith("| crate |")]
    assert len(rows) == 2 + len(kernels.OPTIMIZERS)  # the step, its kinds, and each optimizer alone
    assert "| vit | adamw-fused |" in text
    assert kernels.against_peer("CRATE-B/16", {"CRATE-B/16": 3.0, "ViT-B/16": 2.0}) == "1.50x"
    assert (
        kernels.against_peer("CRATE-B/16", {"CRATE-B/16": 3.0})
        == kernels.against_peer("ViT-B/16", {"ViT-B/16": 1.0})
        == ""
    )

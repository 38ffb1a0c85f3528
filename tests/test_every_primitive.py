"""Every registered primitive, tested for free from its registered example (the timm habit).

For each entry of the registry: the real output shape equals the one the builder infers on meta
tensors, backward gives finite gradients everywhere, float64 and float32 agree, inputs of large
magnitude give finite outputs and gradients in float32, bfloat16 and float16, the half types
agree with float32 to their precision, and ``torch.export`` captures it with the same outputs.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import crate_compose as cc
from crate_compose import registry
from crate_compose.building.placement import infer
from crate_compose.modules.residual import Residual

BATCH = 2
BUILTIN = {name: p for name, p in cc.all_primitives().items() if p.factory.__module__.startswith("crate_compose.")}


def _inputs(
    primitive: registry.Primitive, dtype: torch.dtype, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, ...]:
    """A batch for the example shape, plus the values the primitive consumes (a restoring permutation),
    drawn on the CPU (the same values on every device) and put on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    if primitive.example.vocab:  # token ids
        x = torch.randint(0, primitive.example.vocab, (BATCH, *primitive.example.shape), generator=gen)
    else:
        x = torch.randn((BATCH, *primitive.example.shape), generator=gen, dtype=torch.float64).to(dtype)
    extra = []
    for name in primitive.consumes:
        assert name == "restore", f"no test input for consumed value {name!r}"
        tokens = primitive.example.args["tokens"]
        extra.append(torch.stack([torch.randperm(tokens, generator=gen) for _ in range(BATCH)]))
    return tuple(t.to(device) for t in (x, *extra))


def _build(
    primitive: registry.Primitive, dtype: torch.dtype = torch.float32, seed: int = 0, device: torch.device | str = "cpu"
) -> torch.nn.Module:
    torch.manual_seed(seed)
    args = primitive.args.model_validate(primitive.example.args)
    module = primitive.build(
        args,
        primitive.example.shape,
        registry.Context(image=primitive.example.shape if len(primitive.example.shape) == 3 else None),
    )
    if isinstance(module, Residual):  # exercise LayerScale too: it is part of every residual step
        module.enable_layer_scale(primitive.example.shape[-1] if len(primitive.example.shape) == 2 else 1, 0.5)
    for buffer in module.buffers():  # BatchNorm running statistics: not the identity, so they are tested
        if buffer.is_floating_point() and buffer.numel() > 1:
            buffer.uniform_(0.5, 1.5)
    return module.to(dtype).to(device).eval()


def _tokens(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_primitive_has_an_example(name):
    primitive = BUILTIN[name]
    assert primitive.example is not None, f"{name} registers no example, so the registry-wide tests skip it"


WITH_EXAMPLE = sorted(n for n, p in cc.all_primitives().items() if p.example is not None)


@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_real_output_shape_equals_the_inferred_one(name):
    primitive = cc.all_primitives()[name]
    module = _build(primitive)
    inputs = _inputs(primitive, torch.float32)
    with torch.no_grad():
        real = module(*inputs)
    meta = infer(module, *(t.to("meta") for t in inputs))
    real, meta = (real, meta) if isinstance(real, tuple) else ((real,), (meta,))
    assert [tuple(t.shape) for t in real] == [tuple(t.shape) for t in meta]


@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_backward_gives_finite_gradients(name, device):
    primitive = cc.all_primitives()[name]
    module = _build(primitive, device=device).train()
    x, *extra = _inputs(primitive, torch.float32, device=device)
    x.requires_grad_(x.is_floating_point())
    out = _tokens(module(x, *extra))
    (out.square().mean() + out.mean()).backward()
    trainable = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    for pname, parameter in trainable:
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), f"{name}.{pname}"
    assert any(p.grad.abs().sum() > 0 for _, p in trainable) or not trainable, f"{name}: no parameter learns"
    assert not x.is_floating_point() or torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_float64_and_float32_agree(name, device):
    primitive = cc.all_primitives()[name]
    module = _build(primitive, torch.float64, device=device)
    single = _build(primitive, torch.float64, device=device).float()
    single.load_state_dict({k: v.float() for k, v in module.state_dict().items()})
    inputs64 = _inputs(primitive, torch.float64, device=device)
    inputs32 = tuple(t.float() if t.is_floating_point() else t for t in inputs64)
    torch.manual_seed(1)  # steps that draw randomness (the mask) draw the same in both
    with torch.no_grad():
        double = _tokens(module(*inputs64))
        torch.manual_seed(1)
        float_ = _tokens(single(*inputs32))
    scale = double.abs().max().clamp_min(1.0)
    assert (float_.double() - double).abs().max() / scale < 1e-4


# Input magnitudes far beyond a normalized token stream, per dtype (float16 ends at 65504: its
# squares overflow from 256 on, so softmax logits, LayerNorm variances and TSSA's statistics must
# be computed in float32 for these to stay finite; see crate_compose/modules/precision.py).
LARGE = {torch.float32: 1e6, torch.bfloat16: 1e4, torch.float16: 1e3}
HALF_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}  # relative to max(|float32 output|, 1)


def _half_and_reference(primitive, dtype, device):
    """A module in ``dtype`` and the same weights in float32."""
    reference = _build(primitive, torch.float32, device=device)
    module = _build(primitive, torch.float32, device=device)
    module.load_state_dict(reference.state_dict())
    return module.to(dtype), reference


@pytest.mark.parametrize("dtype", list(LARGE), ids=str)
@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_large_inputs_give_finite_outputs_and_gradients(name, dtype, device):
    primitive = cc.all_primitives()[name]
    module = _build(primitive, dtype, device=device).train()
    x, *extra = _inputs(primitive, torch.float64, device=device)
    if x.is_floating_point():
        x = (x * LARGE[dtype]).to(dtype).requires_grad_(True)
    out = _tokens(module(x, *extra))
    assert not out.is_floating_point() or out.dtype == dtype
    assert torch.isfinite(out.float()).all(), f"{name} in {dtype}: output not finite"
    out.float().mean().backward()
    for pname, parameter in module.named_parameters():
        if parameter.grad is not None:
            assert torch.isfinite(parameter.grad.float()).all(), f"{name}.{pname} in {dtype}: gradient not finite"
    assert x.grad is None or torch.isfinite(x.grad.float()).all(), f"{name} in {dtype}: input gradient not finite"


@pytest.mark.parametrize("scale", [1.0, "large"])
@pytest.mark.parametrize("dtype", list(HALF_TOLERANCE), ids=str)
@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_half_precision_follows_float32(name, dtype, scale, device):
    """The same weights and input (rounded to the half type) in float32: the half build agrees to
    the half type's precision, at ordinary and at large magnitudes."""
    primitive = cc.all_primitives()[name]
    module, reference = _half_and_reference(primitive, dtype, device)
    x, *extra = _inputs(primitive, torch.float64, device=device)
    if x.is_floating_point():
        x = (x * (LARGE[dtype] if scale == "large" else scale)).to(dtype)
    with torch.no_grad():
        torch.manual_seed(1)  # steps that draw randomness (the mask) draw the same in both
        half = _tokens(module(x, *extra)).float()
        torch.manual_seed(1)
        single = _tokens(reference(x.float() if x.is_floating_point() else x, *extra))
    error = (half - single).abs().max() / single.abs().max().clamp_min(1.0)
    assert error < HALF_TOLERANCE[dtype], f"{name} in {dtype}: relative error {error:.2e}"


PRODUCTS = {"mm", "addmm", "bmm", "baddbmm"}


@contextlib.contextmanager
def torchs_own_kernels():
    """oneDNN switched off: torch's portable CPU kernels compute the products, as on a CPU where oneDNN has no
    bf16 (torch warns, setting the flags, of a TF32 option for Intel GPUs: not this)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            yield


class RowMajorProducts(TorchDispatchMode):
    """Records each half-precision matrix product whose two operands are both row-major matrices: the layout
    for which torch's own bf16 product on a CPU without native bf16 is many times slower than for the
    layout ``nn.Linear`` gives (one operand a transposed view; ``benchmarks/train_step.py --onednn off``)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in PRODUCTS:
            a, b = [t for t in args if isinstance(t, torch.Tensor)][-2:]
            if a.dtype in HALF_TOLERANCE and all(t.stride(-1) == 1 and min(t.shape[-2:]) > 1 for t in (a, b)):
                self.found.append(f"{func.__name__} {tuple(a.shape)} @ {tuple(b.shape)}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("half", ["bf16-autocast", "bf16-build"])
@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_half_products_on_the_cpu_take_the_linear_layout(name, half):
    """Where torch's own kernels compute bf16 products on the CPU (an AVX2-only CPU; here oneDNN switched off),
    every product of the step's forward, under bf16 autocast and as a bf16 build, has one operand transposed, as
    ``nn.Linear``'s has (CRATE-B's bf16 forward took 23x its float32 time on an AVX2 CPU where ViT-B's took
    4.4x: ISTA's ``u M`` and attention's ``A w`` were row-major products), and follows float32 as closely as
    with oneDNN."""
    primitive = cc.all_primitives()[name]
    module, reference = _half_and_reference(primitive, torch.bfloat16, "cpu")
    if half == "bf16-autocast":
        module = module.float()
    x, *extra = _inputs(primitive, torch.float32)
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=half == "bf16-autocast"),
        torchs_own_kernels(),
        RowMajorProducts() as products,
    ):
        torch.manual_seed(1)  # steps that draw randomness (the mask) draw the same in both
        out = _tokens(module(x.to(torch.bfloat16) if half == "bf16-build" and x.is_floating_point() else x, *extra))
    assert not products.found, f"{name}: row-major half products {products.found}"
    with torch.no_grad():
        torch.manual_seed(1)
        single = _tokens(reference(x.to(torch.bfloat16).float() if x.is_floating_point() else x, *extra))
    error = (out.float() - single).abs().max() / single.abs().max().clamp_min(1.0)
    assert error < HALF_TOLERANCE[torch.bfloat16], f"{name} ({half}, torch's own kernels): relative error {error:.2e}"


def test_the_linear_layout_is_taken_only_where_it_pays():
    """The copy is made only for torch's own bf16 kernels; with oneDNN (where this CPU has it) the operand is
    passed as it is, and float32 never changes layout."""
    from crate_compose.modules.precision import fallback_products, linear_layout

    w = torch.randn(6, 4)
    with torchs_own_kernels():
        assert fallback_products()
        laid = linear_layout(w.bfloat16())
        assert laid.stride() == (1, 6) and torch.equal(laid, w.bfloat16())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert linear_layout(w).dtype == torch.bfloat16 and linear_layout(w).stride() == (1, 6)
        assert linear_layout(w) is w
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        half = w.bfloat16()
        assert not fallback_products() and linear_layout(half) is half


def test_half_builds_compute_statistics_in_float32():
    """Where a half build would overflow without float32 statistics: MSSA-type attention logits
    (AoT without LayerNorm), the denoiser's memberships and TSSA's moments, on float16 tokens of 1000."""
    from crate_compose.modules.precision import LayerNorm, softmax

    x = torch.full((1, 4, 8), 1000.0, dtype=torch.float16)
    assert torch.isfinite(LayerNorm(8).half()(x * torch.arange(8, dtype=torch.float16))).all()
    assert softmax(x, dim=-1).dtype == torch.float32 and softmax(x.double(), dim=-1).dtype == torch.float64
    assert torch.isinf((x.pow(2).sum(-1))).all()  # what float16 statistics would have computed


@pytest.mark.parametrize("name", WITH_EXAMPLE)
def test_export_captures_the_step(name):
    primitive = cc.all_primitives()[name]
    module = _build(primitive)
    inputs = _inputs(primitive, torch.float32)
    torch.manual_seed(2)
    exported = torch.export.export(module, inputs)
    with torch.no_grad():
        torch.manual_seed(3)
        expected = module(*inputs)
        torch.manual_seed(3)
        got = exported.module()(*inputs)
    if primitive.publishes:  # a random mask: compare what does not depend on the draw
        assert [t.shape for t in got] == [t.shape for t in expected]
    else:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

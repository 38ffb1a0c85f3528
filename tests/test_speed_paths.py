"""The fast paths of the modules compute the documented formulas (issue 20: speed of the built models).

ISTA's step is computed in one ``addmm`` against ``M = I + eta (D - D^T D)`` for a batch of at least
``d`` tokens and in two ``addmm`` otherwise; CRATE-alpha's two steps and the MM step fold their
scales and biases into ``addmm`` too; the attention steps (MSSA, MHSA, AoT, causal decoding) apply
their softmax weights through the fused ``scaled_dot_product_attention``, while their ``attention``
methods (what ``crate-compose show`` draws) write the weights out. Each fast path is checked
against the formula written out here by hand, forward and gradients: in float64 to 1e-10, in
float32 to 1e-5, and in bfloat16 and float16 (half builds, and bfloat16 autocast as
``benchmarks/train_step.py`` trains) to the tolerance ``tests/test_every_primitive.py`` gives the half
types, relative to the largest value of the float64 answer.

The switch of :mod:`crate_compose.modules.paths` (``formulas_as_written()``, ``train --formulas``) takes
every step off its fast path: with it, none of the fast kernels runs (spied on), each step is its
formula, eager and compiled, and with it off the fast paths are taken. Every other test here pins
the switch to the fast paths, whatever ``$CRATE_COMPOSE_FORMULAS`` says.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F

import crate_compose as cc
from crate_compose.modules import causal, paths, precision
from crate_compose.modules.aot import AoT
from crate_compose.modules.compress import MSSA
from crate_compose.modules.sparsify import ISTA, ISTAMM, ISTAODL, ista_step
from crate_compose.modules.standard import MHSA
from crate_compose.modules.tost import ClassAttention

pytestmark = pytest.mark.usefixtures("one_thread", "fast_paths")


@pytest.fixture
def fast_paths():
    """The fast paths on for every test (a test of the switch sets it inside)."""
    with paths.use_formulas("fast"):
        yield


TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
HALF = {torch.bfloat16: 3e-2, torch.float16: 5e-3}  # as tests/test_every_primitive.py: relative to max |exact|
ETA, LAMBDA = 0.1, 0.1


def _randomize(module: torch.nn.Module, seed: int = 11) -> torch.nn.Module:
    """Every parameter drawn (LayerNorms near 1 / 0, others ~ 1/sqrt(fan_in)), in float64."""
    gen = torch.Generator().manual_seed(seed)
    module = module.double()
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.startswith("norm"):
                p.copy_(0.3 * noise + (1.0 if name.endswith("weight") else 0.0))
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return module


def _tokens(shape, seed: int = 5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(shape, generator=gen, dtype=torch.float64) + 0.5


def _ln(x, norm):
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def _close(got: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """float64 / float32 to TOL; a half type to HALF relative to the largest |exact| (at least 1)."""
    if got.dtype in HALF:
        error = (got.double() - exact.double()).abs().max() / exact.double().abs().max().clamp_min(1.0)
        assert error < HALF[got.dtype], f"{what} [{got.dtype}]: relative error {error:.2e}"
        return
    tol = TOL[got.dtype]
    torch.testing.assert_close(got, exact.to(got.dtype), atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def _gradients(fn, inputs: list[torch.Tensor], params: list[torch.Tensor], seed: int = 3):
    """The output of ``fn()`` and the gradients of ``<fn(), G>`` (G a fixed random cotangent) w.r.t.
    ``inputs`` and ``params``."""
    for t in inputs + params:
        t.grad = None
    out = fn()
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(
        out.device
    )
    (out.double() * cotangent).sum().backward()
    grads = [t.grad.clone() for t in inputs + params]
    for t in inputs + params:
        t.grad = None
    return out.detach(), grads


# ------------------------------------------------------------------------------------------------ ISTA


def _ista_exact(u, D, eta=ETA, lambd=LAMBDA, threshold="relu"):
    """The formula of docs and primitives/sparsify.py, three products: u + eta (u D - (u D^T) D)."""
    step = u + eta * (u @ D - (u @ D.T) @ D)
    if threshold == "soft":
        return torch.sign(step) * torch.clamp(step.abs() - eta * lambd, min=0.0)
    return torch.relu(step - eta * lambd)


@pytest.mark.parametrize("threshold", ["relu", "soft"])
@pytest.mark.parametrize("folded", [False, True, None], ids=["two-products", "one-product", "by-size"])
@pytest.mark.parametrize("tokens", [5, 40], ids=["few-tokens", "many-tokens"])
def test_ista_paths_are_the_formula_with_their_gradients_in_float64(threshold, folded, tokens):
    d = 24
    u = _tokens((2, tokens, d)).requires_grad_(True)
    D = (_tokens((d, d), seed=6) / d).requires_grad_(True)
    lambd = 4.0  # eta lambda = 0.4: both thresholds zero a good part of the tokens' entries
    got, got_grads = _gradients(lambda: ista_step(u, D, ETA, lambd, threshold, folded=folded), [u], [D])
    exact, exact_grads = _gradients(lambda: _ista_exact(u, D, lambd=lambd, threshold=threshold), [u], [D])
    assert 0.05 < (exact == 0).double().mean() < 0.95  # the threshold is active
    _close(got, exact, f"ista {threshold} folded={folded}")
    for name, g, e in zip(("du", "dD"), got_grads, exact_grads):
        _close(g, e, f"ista {threshold} folded={folded} {name}")


@pytest.mark.parametrize("formulas", ["fast", "written"])
@pytest.mark.parametrize("tokens", [5, 40], ids=["5-tokens", "40-tokens"])
def test_ista_module_takes_one_product_for_a_batch_and_two_for_a_few_tokens(tokens, formulas, monkeypatch):
    """Fast: the one product (its ``M`` is an ``addmm`` of two (d, d) matrices) for at least d = 24 tokens,
    the two ``addmm`` otherwise; as written, no ``addmm`` at all. The module computes the formula either way."""
    shapes = []
    real = torch.addmm
    monkeypatch.setattr(
        torch, "addmm", lambda bias, a, b, **kw: shapes.append(tuple(a.shape)) or real(bias, a, b, **kw)
    )
    step = _randomize(ISTA(24))
    z = _tokens((2, tokens, 24))
    with paths.use_formulas(formulas):
        _close(step(z), _ista_exact(_ln(z, step.norm), step.dictionary), "ISTA module")
    if formulas == "written":
        assert not shapes
    else:
        assert ((24, 24) in shapes) == (2 * tokens >= 24), shapes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("folded", [False, True], ids=["two-products", "one-product"])
def test_ista_paths_in_lower_precision_forward_and_gradients(dtype, folded, device):
    """The same (rounded) weights and tokens: float32 to 1e-5, half types to their tolerance."""
    d = 32
    step = _randomize(ISTA(d)).to(device)
    z = _tokens((2, 20, d)).to(dtype).double().to(device)  # values the lower precision holds exactly
    with torch.no_grad():
        for p in step.parameters():
            p.copy_(p.to(dtype).double())
    low = ISTA(d).to(dtype).to(device)
    low.load_state_dict({k: v.to(dtype) for k, v in step.state_dict().items()})
    z_low = z.to(dtype).requires_grad_(True)
    z = z.requires_grad_(True)

    def run(module, x):
        return ista_step(module.norm(x), module.dictionary, ETA, LAMBDA, folded=folded)

    got, got_grads = _gradients(lambda: run(low, z_low), [z_low], [low.dictionary])
    exact, exact_grads = _gradients(lambda: _ista_exact(_ln(z, step.norm), step.dictionary), [z], [step.dictionary])
    assert got.dtype == dtype
    if dtype == torch.float32:  # gradients at the scale of the float64 ones
        _close(got, exact, "ista float32")
        for g, e in zip(got_grads, exact_grads):
            torch.testing.assert_close(g, e.float(), atol=1e-5 * e.abs().max().item(), rtol=1e-5)
        return
    _close(got, exact, f"ista {dtype}")
    for name, g, e in zip(("dz", "dD"), got_grads, exact_grads):
        _close(g / e.abs().max(), e / e.abs().max(), f"ista {dtype} {name} (scaled to its largest)")


@pytest.mark.parametrize("folded", [False, True], ids=["two-products", "one-product"])
def test_ista_under_bfloat16_autocast_follows_float64(folded, device):
    """As benchmarks/train_step.py trains: float32 weights, bfloat16 autocast."""
    d = 32
    step = _randomize(ISTA(d)).to(device)
    low = ISTA(d).to(device)
    low.load_state_dict({k: v.float() for k, v in step.state_dict().items()})
    z = _tokens((2, 20, d)).to(device)
    z_low = z.float().requires_grad_(True)
    z = z.requires_grad_(True)

    def run():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return ista_step(low.norm(z_low), low.dictionary, ETA, LAMBDA, folded=folded)

    got, got_grads = _gradients(run, [z_low], [low.dictionary])
    exact, exact_grads = _gradients(lambda: _ista_exact(_ln(z, step.norm), step.dictionary), [z], [step.dictionary])
    assert got.dtype == torch.float32  # the token stream stays in float32: only the products are lowered
    _close(got.bfloat16(), exact, "ista autocast")
    for name, g, e in zip(("dz", "dD"), got_grads, exact_grads):
        _close((g / e.abs().max()).bfloat16(), e / e.abs().max(), f"ista autocast {name}")


def test_ista_mm_is_its_formula_with_gradients():
    step = _randomize(ISTAMM(24, alpha=2.0, lambd=0.3))
    z = _tokens((2, 7, 24)).requires_grad_(True)
    params = list(step.parameters())

    def exact():
        u = _ln(z, step.norm)
        return torch.relu((1 + 4 / (9 * 3.0)) * (u @ step.dictionary) - 4 * 0.3 / (9 * 2.0))

    got, got_grads = _gradients(lambda: step(z), [z], params)
    want, want_grads = _gradients(exact, [z], params)
    _close(got, want, "ista_mm")
    for g, e in zip(got_grads, want_grads):
        _close(g, e, "ista_mm gradient")


@pytest.mark.parametrize("tied", [False, True])
def test_ista_odl_is_its_formula_with_gradients(tied):
    step = _randomize(ISTAODL(16, ratio=2, tied=tied, step_size=0.3, lambd=0.2))
    with torch.no_grad():  # a larger dictionary, so the second step moves the code
        step.dictionary.mul_(3.0)
    z = _tokens((2, 9, 16)).requires_grad_(True)
    params = list(step.parameters())

    def exact():
        eta, lambd, D = 0.3, 0.2, step.dictionary
        u = _ln(z, step.norm)
        a1 = torch.relu(eta * (u @ D) - eta * lambd)
        a2 = torch.relu(a1 - eta * ((a1 @ D.T - u) @ D) - eta * lambd)
        return z + a2 @ (D if tied else step.synthesis).T

    got, got_grads = _gradients(lambda: step(z), [z], params)
    want, want_grads = _gradients(exact, [z], params)
    assert (step.code(z) == 0).any() and (step.code(z) > 0).any()
    _close(got, want, "ista_odl")
    for g, e in zip(got_grads, want_grads):
        _close(g, e, "ista_odl gradient")


# ------------------------------------------------------------------------------------------- attention


ATTENTION = {
    "mssa": lambda: MSSA(24, 3, 8),
    "mssa-tied": lambda: MSSA(24, 3, 8, output="tied", step_size=0.5),
    "mssa-causal": lambda: MSSA(24, 3, 8, causal=True),
    "mhsa": lambda: MHSA(24, 3, 8),
    "mhsa-causal": lambda: MHSA(24, 2, 12, causal=True),
    "aot": lambda: AoT(24, 3, 8, norm=True),
    "aot-mhsa": lambda: AoT(24, 3, 8, variant="mhsa", scale=0.3),
}


def _from_weights(module, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The step's output from its explicit attention ``weights`` (B, K, n, n) and its parameters alone."""
    if isinstance(module, MSSA):
        w = module.heads_of(module.norm(x))
        return module.combine(x, module.project((weights.to(w.dtype) @ w).transpose(1, 2).flatten(2)))
    if isinstance(module, MHSA):
        _, _, v = module.project(x)
        return module.combine(x, module.out((weights.to(v.dtype) @ v).transpose(1, 2).flatten(2)))
    _, _, v, back = module._project(x)  # AoT
    return module.combine(x, module.step_size * ((weights.to(v.dtype) @ v).transpose(1, 2).flatten(2) @ back))


def _exact_weights(module, x: torch.Tensor) -> torch.Tensor:
    """``softmax(scale q k^T [+ causal mask])`` from the projections, written out (not ``attention()``)."""
    if isinstance(module, MSSA):
        q = k = module.heads_of(module.norm(x))
        scale = module.head_dim**-0.5
    elif isinstance(module, MHSA):
        q, k, _ = module.project(x)
        scale = module.head_dim**-0.5
    else:
        q, k, _, _ = module._project(x)
        scale = module.scale
    scores = q.double() @ k.double().transpose(-1, -2) * scale
    if getattr(module, "causal", False):
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1), float("-inf"))
    e = torch.exp(scores - scores.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_fused_attention_forward_and_gradients_equal_the_written_out_weights_in_float64(name, device):
    module = _randomize(ATTENTION[name]())
    if hasattr(module, "enable_layer_scale"):
        module.enable_layer_scale(24, 0.7)
        module.double()
    module = module.to(device)
    x = _tokens((2, 7, 24)).to(device).requires_grad_(True)
    params = list(module.parameters())
    got, got_grads = _gradients(lambda: module(x), [x], params)
    shown, shown_grads = _gradients(lambda: _from_weights(module, x, module.attention(x)), [x], params)
    exact, exact_grads = _gradients(lambda: _from_weights(module, x, _exact_weights(module, x)), [x], params)
    _close(got, shown, f"{name}: forward against attention()")
    _close(got, exact, f"{name}: forward against the formula")
    for g, s, e in zip(got_grads, shown_grads, exact_grads):
        _close(g, s, f"{name}: gradient against attention()")
        _close(g, e, f"{name}: gradient against the formula")


LOWER = [(torch.float32, "fused"), (torch.bfloat16, "fused"), (torch.bfloat16, "explicit"), (torch.float16, "fused")]


@pytest.fixture
def bf16_path(request, monkeypatch):
    """``explicit``: bfloat16 on CPU writes the products out (as built, for up to 1024 keys);
    ``fused``: forced through ``scaled_dot_product_attention``."""
    if request.param == "fused":
        monkeypatch.setattr(causal, "EXPLICIT_BF16_CPU_KEYS", 0)
    return request.param


@pytest.mark.parametrize(
    ("dtype", "bf16_path"), LOWER, ids=[f"{d}-{p}".removeprefix("torch.") for d, p in LOWER], indirect=["bf16_path"]
)
@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_fused_attention_in_lower_precision_follows_float64(name, dtype, bf16_path, device):
    """The same rounded weights and tokens: the forward (fused, or for bfloat16 on CPU written out)
    and the step recomputed from ``attention()`` both follow the float64 formula, gradients too
    (scaled to their largest)."""
    exact_module = _randomize(ATTENTION[name]()).to(device)
    with torch.no_grad():
        for p in exact_module.parameters():
            p.copy_(p.to(dtype).double())
    module = ATTENTION[name]().to(dtype).to(device)
    module.load_state_dict({k: v.to(dtype) for k, v in exact_module.state_dict().items()})
    x = _tokens((2, 7, 24)).to(dtype).double().to(device).requires_grad_(True)
    x_low = x.detach().to(dtype).requires_grad_(True)
    got, got_grads = _gradients(lambda: module(x_low), [x_low], list(module.parameters()))
    shown = _from_weights(module, x_low, module.attention(x_low)).detach()
    exact, exact_grads = _gradients(
        lambda: _from_weights(exact_module, x, _exact_weights(exact_module, x)), [x], list(exact_module.parameters())
    )
    assert got.dtype == dtype
    _close(got, exact, f"{name}: forward")
    _close(shown, exact, f"{name}: from attention()")
    _close(got, shown.double() if dtype in HALF else shown, f"{name}: forward against attention()")
    for g, e in zip(got_grads, exact_grads):
        scale = e.abs().max().clamp_min(1e-30)
        if dtype == torch.float32:
            torch.testing.assert_close(g.double() / scale, e / scale, atol=1e-5, rtol=1e-5)
        else:
            _close((g.double() / scale).to(dtype), e / scale, f"{name}: gradient")


@pytest.mark.parametrize("bf16_path", ["explicit", "fused"], indirect=True)
@pytest.mark.parametrize("name", ["mssa", "mssa-causal", "mhsa", "mhsa-causal", "aot"])
def test_fused_attention_under_bfloat16_autocast_follows_float64(name, bf16_path, device):
    exact_module = _randomize(ATTENTION[name]()).to(device)
    module = ATTENTION[name]().to(device)
    module.load_state_dict({k: v.float() for k, v in exact_module.state_dict().items()})
    x = _tokens((2, 9, 24)).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        got = module(x.float())
    exact = _from_weights(exact_module, x, _exact_weights(exact_module, x)).detach()
    error = (got.double() - exact).abs().max() / exact.abs().max().clamp_min(1.0)
    assert error < HALF[torch.bfloat16], f"{name} under autocast: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("new", [1, 3, 7])
def test_causal_decoding_attention_is_the_masked_formula(new, dtype, device):
    """``causal_attention`` for the last ``new`` of 7 positions (one query, several, all)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for n in (new, 7, 7))
    q, k, v = (t.to(dtype).double().to(device) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    hidden = torch.ones(new, 7, dtype=torch.bool, device=device).triu(diagonal=7 - new + 1)
    exact = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1) @ v
    got = causal.causal_attention(q.to(dtype), k.to(dtype), v.to(dtype))
    assert got.dtype == dtype
    _close(got, exact, f"causal attention, {new} new")


def test_the_written_out_bfloat16_attention_is_taken_only_where_it_is_faster(monkeypatch):
    """bfloat16 on CPU up to EXPLICIT_BF16_CPU_KEYS keys; float32, float16 and longer sequences fused."""
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(causal.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(causal, "EXPLICIT_BF16_CPU_KEYS", 16)
    for dtype, n, fused in [
        (torch.bfloat16, 16, False),
        (torch.bfloat16, 17, True),
        (torch.float32, 16, True),
        (torch.float16, 16, True),
    ]:
        calls.clear()
        w = torch.randn(1, 2, n, 8).to(dtype)
        causal.softmax_attention(w, w, w)
        assert bool(calls) == fused, (dtype, n)


# ------------------------------------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_layernorm_without_gradients_takes_the_native_kernel_with_float32_statistics(dtype):
    """Without gradients a half LayerNorm on CPU runs PyTorch's mixed-precision kernel (no float32 copy of
    the tokens): it follows float64 as closely as the float32 path taken while training, at large
    magnitudes too, and the training path's gradients (float32 inside) follow float64 as well."""
    from crate_compose.modules.precision import LayerNorm

    norm = _randomize(LayerNorm(64)).to(dtype)
    for scale in (1.0, 1e3):
        x = (_tokens((3, 11, 64)) * scale).to(dtype)
        exact = F.layer_norm(x.double(), (64,), norm.weight.double(), norm.bias.double(), norm.eps)
        with torch.no_grad():
            fast = norm(x)
        slow = norm(x)  # gradients on: the float32 copy
        assert fast.dtype == slow.dtype == dtype
        _close(fast, exact, f"LayerNorm {dtype} without gradients")
        _close(slow, exact, f"LayerNorm {dtype} with gradients")
        ulp = torch.finfo(dtype).eps * exact.abs().max()
        assert (fast.double() - slow.double()).abs().max() <= ulp
    x = _tokens((3, 11, 64)).to(dtype).requires_grad_(True)
    x64 = x.detach().double().requires_grad_(True)
    exact_norm = _randomize(LayerNorm(64))
    with torch.no_grad():
        exact_norm.weight.copy_(norm.weight.double())
        exact_norm.bias.copy_(norm.bias.double())
    _, got_grads = _gradients(lambda: norm(x), [x], list(norm.parameters()))
    _, exact_grads = _gradients(
        lambda: F.layer_norm(x64, (64,), exact_norm.weight, exact_norm.bias, norm.eps),
        [x64],
        list(exact_norm.parameters()),
    )
    for name, g, e in zip(("dx", "dweight", "dbias"), got_grads, exact_grads):
        _close((g.double() / e.abs().max()).to(dtype), e / e.abs().max(), f"LayerNorm {dtype} {name}")


# ------------------------------------------------------------------------------------ the switch


FAST_KERNELS = ("addmm", "scaled_dot_product_attention")  # what only the fast paths call

SWITCHED = {
    "ista": lambda: ISTA(24, lambd=2.0),
    "ista-soft": lambda: ISTA(24, lambd=2.0, threshold="soft"),
    "ista_mm": lambda: ISTAMM(24, alpha=2.0, lambd=0.3),
    "ista_odl": lambda: ISTAODL(24, ratio=2, step_size=0.3, lambd=0.2),
    "class_attention": lambda: ClassAttention(24, 3),
    **ATTENTION,
}


@pytest.fixture
def kernels(monkeypatch):
    """The fast kernels called (by name), and the dtypes ``torch.softmax`` was given."""
    called: dict[str, list] = defaultdict(list)
    for name, owner in (("addmm", torch), ("scaled_dot_product_attention", F)):
        real = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, lambda *a, _real=real, _name=name, **k: called[_name].append(1) or _real(*a, **k)
        )
    real_softmax = torch.softmax
    monkeypatch.setattr(
        torch, "softmax", lambda x, *a, **k: called["softmax"].append(x.dtype) or real_softmax(x, *a, **k)
    )
    return called


@pytest.mark.parametrize("name", sorted(SWITCHED))
def test_as_written_no_fast_kernel_runs_and_the_step_equals_its_fast_path(name, kernels):
    """float64, 7 tokens and a batch of 40 (ISTA folds from d = 24 tokens): as written no ``addmm`` and no
    fused attention runs, the fast path calls one of them, and both give the same values and gradients."""
    module = _randomize(SWITCHED[name]())
    for shape in ((2, 7, 24), (40, 1, 24)) if "ista" in name else ((2, 7, 24),):
        x = _tokens(shape).requires_grad_(True)
        results = {}
        for formulas in ("written", "fast"):
            kernels.clear()
            with paths.use_formulas(formulas):
                results[formulas] = _gradients(lambda x=x: module(x), [x], list(module.parameters()))
            fast_calls = [k for k in FAST_KERNELS if kernels.get(k)]
            assert bool(fast_calls) == (formulas == "fast"), (formulas, fast_calls)
        (written, written_grads), (fast, fast_grads) = results["written"], results["fast"]
        _close(written, fast, f"{name} {shape}: written against fast")
        for g, f in zip(written_grads, fast_grads):
            _close(g, f, f"{name} {shape}: gradient, written against fast")


@pytest.mark.parametrize("name", ["mssa", "mhsa-causal", "aot", "class_attention"])
def test_written_attention_takes_its_softmax_in_float32_for_bfloat16(name, kernels):
    """bfloat16 on the CPU: the fast path applies PyTorch's bfloat16 softmax (or the fused kernel),
    the written one computes the softmax in float32, as half builds do (:mod:`.precision`)."""
    module = _randomize(SWITCHED[name]()).to(torch.bfloat16)
    x = _tokens((2, 7, 24)).to(torch.bfloat16)
    with torch.no_grad(), paths.formulas_as_written():
        module(x)
    assert kernels["softmax"] and set(kernels["softmax"]) == {torch.float32}, kernels["softmax"]
    assert not kernels.get("scaled_dot_product_attention")


def test_as_written_a_half_layernorm_without_gradients_takes_the_float32_copy(monkeypatch):
    given = []
    real = F.layer_norm
    monkeypatch.setattr(precision.F, "layer_norm", lambda x, *a, **k: given.append(x.dtype) or real(x, *a, **k))
    norm = _randomize(precision.LayerNorm(16)).to(torch.bfloat16)
    x = _tokens((2, 3, 16)).to(torch.bfloat16)
    with torch.no_grad():
        fast = norm(x)
        with paths.formulas_as_written():
            written = norm(x)
    assert given == [torch.bfloat16, torch.float32]
    assert fast.dtype == written.dtype == torch.bfloat16
    assert (fast.double() - written.double()).abs().max() <= torch.finfo(torch.bfloat16).eps * written.abs().max()


def test_the_switch_is_refused_for_another_name_and_restored_after_its_block():
    assert paths.formulas() == "fast"
    with pytest.raises(ValueError, match="'slow' is not one of: fast, written"):
        paths.set_formulas("slow")
    with pytest.raises(RuntimeError):
        with paths.formulas_as_written():
            assert paths.formulas() == "written" and not paths.fast()
            raise RuntimeError
    assert paths.formulas() == "fast" and paths.fast()


def test_a_compiled_model_follows_the_switch_without_graph_breaks():
    """``torch.compile(fullgraph=True)`` of a built CRATE: the graph captured with the fast paths calls
    ``addmm`` and fused attention, the one captured as written neither (the switch change recompiles),
    and both compute what the eager model computes."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    small = [
        "sizes.depth=1",
        "sizes.d=32",
        "sizes.heads=2",
        "sizes.head_dim=16",
        "sizes.image_size=32",
        "sizes.patch_size=8",
        "sizes.classes=10",
    ]
    model = cc.build("crate-tiny", overrides=small, dtype="float64").eval()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    images = _tokens((2, 3, 32, 32))
    with torch.no_grad():
        fast = compiled(images)["output"]
        with paths.formulas_as_written():
            written = compiled(images)["output"]
            eager_written = model(images)["output"]
        eager_fast = model(images)["output"]
    assert len(graphs) == 2
    assert {"addmm", "scaled_dot_product_attention"} <= graphs[0]
    assert not {"addmm", "scaled_dot_product_attention"} & graphs[1]
    _close(fast, eager_fast, "compiled fast")
    _close(written, eager_written, "compiled as written")
    _close(written, fast, "written against fast")


@pytest.mark.parametrize("tokens", [5, 40], ids=["two-products", "one-product"])
@pytest.mark.parametrize("threshold", ["relu", "soft"])
def test_under_autocast_the_fast_ista_step_keeps_the_tokens_in_float32_as_the_written_one(tokens, threshold):
    """Under bf16 autocast both forms lower the products alone and add the float32 tokens ``u`` outside
    them, as autocast keeps every residual sum: the step's output, the token stream, stays float32, and
    the fast step's error against float64 is the products' rounding, not a bfloat16 rounding of the
    stream (which a lowered ``addmm`` with ``u`` inside it gave: about 2^-9 relative, 5x the formula's
    error on a whole CRATE-B/16)."""
    exact_step = _randomize(ISTA(24, threshold=threshold))
    z = _tokens((2, tokens, 24))
    exact = _ista_exact(_ln(z, exact_step.norm), exact_step.dictionary, threshold=threshold).detach()
    step = ISTA(24, threshold=threshold)
    step.load_state_dict({k: v.float() for k, v in exact_step.state_dict().items()})
    errors = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for formulas in ("fast", "written"):
            with paths.use_formulas(formulas):
                out = step(z.float())
            assert out.dtype == torch.float32, formulas
            errors[formulas] = ((out.double() - exact).norm() / exact.norm()).item()
        rounded_stream = ((out.bfloat16().double() - exact).norm() / exact.norm()).item()
    assert errors["fast"] <= 1.5 * errors["written"] and errors["fast"] < 2**-9, errors
    assert errors["fast"] < rounded_stream, (errors, rounded_stream)

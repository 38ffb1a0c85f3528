"""The optimization-step families beyond CRATE's two steps, each checked against its formula written out here.

Every expected value is an independent implementation of the papers' equations (docs/primitives.md)
(explicit loops over heads, einsum, the papers' column form where it differs from the code's row form), in
float64 against the module's own (randomized) weights, to 1e-10. Modules are built through the registry
(``registry.get(name).build(args, shape, context)``), never through a spec. Beyond the formulas:
parameter counts (ToST-T adds up to its published 5,769,328), the coding-rate step against autograd's
gradient of R^c, the denoiser on clean subspace tokens, and AoT's Theorem 5.1 (SNR x (1 + eta tau) per layer).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from crate_compose import registry
from crate_compose.modules.residual import Residual
from crate_compose.registry import Context

TOL = 1e-10
B, N, D = 2, 7, 24

OURS = [
    "tssa",
    "denoise",
    "coding_rate_step",
    "ista",
    "ista_soft",
    "ista_mm",
    "ista_odl",
    "aot",
    "conv_patch_embed",
    "fourier_positions",
    "class_attention",
    "class_mlp",
    "mhsa",
    "mlp",
]


def _build(name, shape=(N, D), context=None, **args):
    primitive = registry.get(name)
    module = primitive.build(primitive.args.model_validate(args), shape, context or Context())
    return module.double()


def _randomize(module, seed=3):
    """Every parameter (and BatchNorm statistic) random: LayerNorm/BatchNorm scales around 1, others ~ 1/sqrt(fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            if param.ndim == 1 and name.endswith("weight"):  # norm scales
                param.copy_(1.0 + 0.3 * noise)
            elif param.ndim == 1:  # biases
                param.copy_(0.3 * noise)
            else:
                param.copy_(noise / math.sqrt(param[0].numel()))
        for name, buf in module.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(0.2 * torch.randn(buf.shape, generator=gen, dtype=torch.float64))
            elif name.endswith("running_var"):
                buf.copy_(0.5 + torch.rand(buf.shape, generator=gen, dtype=torch.float64))
    return module


def _tokens(shape=(B, N, D), seed=5):
    gen = torch.Generator().manual_seed(seed)
    return 1.5 * torch.randn(shape, generator=gen, dtype=torch.float64) + 0.3


def _prm(module):
    return {name: p.detach() for name, p in module.named_parameters()}


def _count(module):
    return sum(p.numel() for p in module.parameters())


def _ln(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def _softmax(s, dim=-1):
    e = torch.exp(s - s.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _close(got, expected, what, tol=TOL):
    diff = (got - expected).abs().max().item()
    assert diff <= tol * (1 + expected.abs().max().item()), f"{what}: max abs diff {diff:.3e}"


# --------------------------------------------------------------------------------------------- registry entries


@pytest.mark.parametrize("name", OURS)
def test_entry_is_documented_and_its_example_builds(name):
    primitive = registry.get(name)
    assert primitive.kind in registry.KINDS
    for field in ("objective", "equation", "description"):
        assert getattr(primitive, field).strip(), f"{name} has no {field}"
    assert primitive.update_for().strip()
    for arg, info in primitive.args.model_fields.items():
        assert info.description, f"{name}.{arg} has no description"
    example = primitive.example
    assert example is not None and max(example.shape) <= 32
    module = primitive.build(primitive.args.model_validate(example.args), example.shape, Context())
    out = module(torch.randn(2, *example.shape))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "name,setting",
    [
        ("mhsa", "norm"),
        ("mlp", "norm"),
        ("aot", "norm"),
        ("ista", "norm"),
        ("tssa", "norm"),
        ("aot", "phi"),
        ("class_mlp", "patches"),
    ],
)
def test_update_strings_follow_the_settings(name, setting):
    primitive = registry.get(name)
    base = dict(primitive.example.args)
    if setting == "norm":
        other = not primitive.args.model_validate(base).norm
    else:
        other = {"phi": "threshold", "patches": "normalized"}[setting]
    assert primitive.update_for(base) != primitive.update_for({**base, setting: other})


# --------------------------------------------------------------------------------------------- TSSA


def _tssa_expected(x, prm, heads, eps=1e-5):
    w = _ln(x, prm["norm.weight"], prm["norm.bias"], eps) @ prm["qkv.weight"].T + prm["qkv.bias"]  # (B, n, d)
    p = w.shape[-1] // heads
    ws = [w[..., k * p : (k + 1) * p] for k in range(heads)]  # K x (B, n, p)
    scores = []
    for k, wk in enumerate(ws):
        norm_over_tokens = torch.sqrt((wk**2).sum(1, keepdim=True)).clamp_min(1e-12)  # (B, 1, p)
        scores.append(prm["temp"][k, 0] * ((wk / norm_over_tokens) ** 2).sum(-1))  # (B, n)
    pi = _softmax(torch.stack(scores), dim=0)  # (K, B, n): softmax over heads
    outs = []
    for k, wk in enumerate(ws):
        m = torch.einsum("bi,bij->bj", pi[k], wk**2) / (pi[k].sum(-1, keepdim=True) + 1e-8)  # (B, p)
        outs.append(-pi[k][..., None] * wk / (1 + m[:, None, :]))
    return x + torch.cat(outs, -1) @ prm["to_out.weight"].T + prm["to_out.bias"]


@pytest.mark.parametrize("heads,eps", [(3, 1e-5), (4, 1e-6)])
def test_tssa_formula(heads, eps):
    step = _randomize(_build("tssa", heads=heads, eps=eps))
    with torch.no_grad():
        step.temp.mul_(torch.linspace(0.5, 3.0, heads, dtype=torch.float64)[:, None] * 4)  # memberships not uniform
    x = _tokens()
    with torch.no_grad():
        got = step(x)
    expected = _tssa_expected(x, _prm(step), heads, eps)
    assert (expected - x).abs().max() > 1e-2
    _close(got, expected, "TSSA x + W_o concat(-Pi w / (1 + m)) + b_o")
    assert isinstance(step, Residual)


def test_tssa_parameters_match_tost():
    step = _build("tssa", shape=(196, 192), heads=4)
    shapes = {name: tuple(p.shape) for name, p in step.named_parameters()}
    assert shapes == {
        "norm.weight": (192,),
        "norm.bias": (192,),
        "qkv.weight": (192, 192),
        "qkv.bias": (192,),
        "temp": (4, 1),
        "to_out.weight": (192, 192),
        "to_out.bias": (192,),
    }
    assert _count(step) == 384 + 74_116
    assert torch.equal(step.temp, torch.ones(4, 1, dtype=torch.float64))


# --------------------------------------------------------------------------------------------- subspace denoiser


def test_denoise_formula():
    heads, p, sigma = 3, 5, 0.7
    step = _randomize(_build("denoise", heads=heads, head_dim=p, sigma=sigma))
    U = _prm(step)["subspaces.weight"].T  # (d, K*p) = [U_1 .. U_K]
    x = _tokens()
    expected = torch.zeros_like(x)
    for b in range(B):
        for i in range(N):
            z = x[b, i]
            proj = [U[:, k * p : (k + 1) * p].T @ z for k in range(heads)]
            pi = _softmax(torch.stack([(c**2).sum() / (2 * sigma**2) for c in proj]))
            expected[b, i] = sum(pi[k] * U[:, k * p : (k + 1) * p] @ proj[k] for k in range(heads))
    with torch.no_grad():
        _close(step(x), expected, "denoiser sum_k U_k pi_k U_k^T z")


def test_denoise_recovers_a_token_on_one_subspace():
    heads, p = 3, 8
    step = _build("denoise", heads=heads, head_dim=p, sigma=1.0)
    gen = torch.Generator().manual_seed(1)
    Q, _ = torch.linalg.qr(torch.randn(D, heads * p, generator=gen, dtype=torch.float64))
    with torch.no_grad():
        step.subspaces.weight.copy_(Q.T)
    for k in range(heads):
        clean = 6.0 * Q[:, k * p : (k + 1) * p] @ torch.randn(p, generator=gen, dtype=torch.float64)
        Uk = Q[:, k * p : (k + 1) * p]
        noise = 0.3 * torch.randn(D, generator=gen, dtype=torch.float64)
        noise = noise - Uk @ (Uk.T @ noise)  # off subspace k
        with torch.no_grad():
            exact = step(clean[None, None])[0, 0]
            denoised = step((clean + noise)[None, None])[0, 0]
        assert (exact - clean).norm() < 1e-8 * clean.norm(), "a token on subspace k must be reproduced"
        assert (denoised - clean).norm() < 1e-8 * noise.norm(), "noise off subspace k must be removed"


# --------------------------------------------------------------------------------------------- exact coding-rate step


def _rate(u, U, heads, p, precision):
    """R^c(u | U) = 1/2 sum_k logdet(I + a w_k^T w_k), a = p / (n eps^2), w_k = u U_k (rows)."""
    a = p / (u.shape[-2] * precision**2)
    total = 0.0
    for k in range(heads):
        wk = u @ U[:, k * p : (k + 1) * p]
        total = total + 0.5 * torch.logdet(torch.eye(p, dtype=u.dtype) + a * wk.transpose(-1, -2) @ wk).sum()
    return total


def _rate_gradient_columns(Z, U, heads, p, precision):
    """003 eq. 9 as printed, tokens as columns: a sum_k U_k U_k^T Z (I_N + a (U_k^T Z)^T U_k^T Z)^{-1}."""
    n = Z.shape[1]
    a = p / (n * precision**2)
    grad = torch.zeros_like(Z)
    for k in range(heads):
        Uk = U[:, k * p : (k + 1) * p]
        P = Uk.T @ Z  # (p, N)
        grad += a * Uk @ P @ torch.linalg.inv(torch.eye(n, dtype=Z.dtype) + a * P.T @ P)
    return grad


@pytest.mark.parametrize("norm", [False, True])
def test_coding_rate_step_is_the_papers_gradient_step(norm):
    heads, p, precision, kappa = 3, 4, 0.5, 0.3
    step = _randomize(_build("coding_rate_step", heads=heads, head_dim=p, precision=precision, kappa=kappa, norm=norm))
    prm = _prm(step)
    U = prm["subspaces.weight"].T
    x = _tokens()
    u = _ln(x, prm["norm.weight"], prm["norm.bias"]) if norm else x
    expected = torch.stack([x[b] - kappa * _rate_gradient_columns(u[b].T, U, heads, p, precision).T for b in range(B)])
    with torch.no_grad():
        got = step(x)
    assert (got - x).abs().max() > 1e-3
    _close(got, expected, "x - kappa * grad R^c (003 eq. 9, n x n inverse)")


def test_coding_rate_step_gradient_equals_autograd():
    heads, p, precision = 2, 6, 0.5
    step = _randomize(_build("coding_rate_step", heads=heads, head_dim=p, precision=precision))
    U = _prm(step)["subspaces.weight"].T
    u = _tokens(seed=8).requires_grad_(True)
    (auto,) = torch.autograd.grad(_rate(u, U, heads, p, precision), u)
    with torch.no_grad():
        ours = step.gradient(u.detach())
    assert auto.abs().max() > 1e-3
    _close(ours, auto, "coding_rate_step gradient vs autograd of 1/2 sum_k logdet(I + a w_k^T w_k)")


def test_coding_rate_step_lowers_the_coding_rate():
    heads, p, precision = 2, 6, 0.5
    step = _randomize(_build("coding_rate_step", heads=heads, head_dim=p, precision=precision, kappa=0.05, norm=False))
    U = _prm(step)["subspaces.weight"].T
    x = _tokens()
    with torch.no_grad():
        assert _rate(step(x), U, heads, p, precision) < _rate(x, U, heads, p, precision) - 1e-3
    assert _count(step) == heads * p * D  # norm: false, no LayerNorm


# --------------------------------------------------------------------------------------------- ISTA family


def _ista_expected(z, prm, eta, lambd, eps, soft=False):
    u = _ln(z, prm["norm.weight"], prm["norm.bias"], eps)
    Dm = prm["dictionary"]
    step = u + eta * (u @ Dm - (u @ Dm.T) @ Dm)
    if soft:
        return torch.sign(step) * torch.clamp(step.abs() - eta * lambd, min=0)
    return torch.relu(step - eta * lambd)


@pytest.mark.parametrize("name", ["ista", "ista_soft"])
def test_ista_layernorm_eps_is_used(name):
    step = _randomize(_build(name, eps=0.5, lambd=0.2))
    z = 0.3 * _tokens()  # small variance: the LayerNorm eps matters
    with torch.no_grad():
        got = step(z)
    prm = _prm(step)
    _close(got, _ista_expected(z, prm, 0.1, 0.2, 0.5, soft=name == "ista_soft"), f"{name} with eps 0.5")
    assert (got - _ista_expected(z, prm, 0.1, 0.2, 1e-5, soft=name == "ista_soft")).abs().max() > 1e-3


@pytest.mark.parametrize("alpha", [None, 2.5])
def test_ista_mm_formula(alpha):
    lambd, precision = 0.3, 0.5
    step = _randomize(_build("ista_mm", alpha=alpha, lambd=lambd))
    prm = _prm(step)
    z = _tokens()
    a = alpha if alpha is not None else D / (N * precision**2)  # 003 eq. 77: alpha = d / (N eps^2)
    u = _ln(z, prm["norm.weight"], prm["norm.bias"])
    Dm = prm["dictionary"]
    expected = torch.zeros_like(z)
    for b in range(B):  # 003 eq. 92 in columns: ReLU((1 + 4/(9(1+alpha))) D^* Z - 4 lambda/(9 alpha))
        expected[b] = torch.clamp((1 + 4 / (9 * (1 + a))) * Dm.T @ u[b].T - 4 * lambd / (9 * a), min=0).T
    with torch.no_grad():
        got = step(z)
    _close(got, expected, f"ista_mm (alpha={alpha})")
    assert got.min() >= 0 and (got == 0).any() and (got > 0).any()
    assert _count(step) == D * D + 2 * D
    assert registry.get("ista_mm").inverse.primitive == "dictionary"


def test_ista_odl_formula_and_parameters():
    eta, lambd, ratio = 0.2, 0.05, 3
    step = _randomize(_build("ista_odl", step_size=eta, lambd=lambd, ratio=ratio, eps=1e-6))
    prm = _prm(step)
    Dm, D1 = prm["dictionary"], prm["synthesis"]
    assert Dm.shape == D1.shape == (D, ratio * D)
    z = _tokens()
    expected = torch.zeros_like(z)
    for b in range(B):  # columns: two ISTA steps from a = 0 against the overcomplete D, decoded by D1
        u = _ln(z[b], prm["norm.weight"], prm["norm.bias"], 1e-6).T  # (d, N)
        a1 = torch.clamp(eta * Dm.T @ u - eta * lambd, min=0)  # (r d, N)
        a2 = torch.clamp(a1 - eta * Dm.T @ (Dm @ a1 - u) - eta * lambd, min=0)
        expected[b] = z[b] + (D1 @ a2).T
    with torch.no_grad():
        got = step(z)
    assert (got - z).abs().max() > 1e-3
    _close(got, expected, "ista_odl x + D1 a2")
    assert isinstance(step, Residual)
    assert registry.get("ista_odl").inverse is None
    assert _count(_build("ista_odl", shape=(197, 768))) == 2 * 2_359_296 + 2 * 768  # CRATE-alpha-B, per layer


# --------------------------------------------------------------------------------------------- AoT


def _aot_expected(x, prm, heads, p, eta, phi, tau, scale, norm, variant):
    """Book eq. 5.3.2 in columns: Z + eta sum_k U_k U_k^T Z phi(Z^T U_k U_k^T Z), phi on each column."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        Z = (_ln(x[b], prm["norm.weight"], prm["norm.bias"]) if norm else x[b]).T  # (d, N)
        total = torch.zeros_like(Z)
        for k in range(heads):
            sl = slice(k * p, (k + 1) * p)
            if variant == "mssa":
                Uk = prm["subspaces.weight"][sl].T  # (d, p)
                Qk = Kk = Vk = Ok = Uk
            else:
                W = prm["qkv.weight"]  # rows: [Q; K; V] each (K*p, d)
                hp = heads * p
                Qk, Kk, Vk = (W[i * hp : (i + 1) * hp][sl].T for i in range(3))
                Ok = prm["out.weight"][:, sl]  # (d, p)
            M = scale * Z.T @ Kk @ Qk.T @ Z  # (N, N): column i = scores of query i
            A = _softmax(M, dim=0)
            if phi == "threshold":
                A = torch.where(A > tau, torch.full_like(A, tau), torch.zeros_like(A))
            total += Ok @ Vk.T @ Z @ A
        out[b] = x[b] + eta * total.T  # the skip is the un-normalized input
    return out


@pytest.mark.parametrize(
    "variant,phi,norm,scale",
    [
        ("mssa", "softmax", False, 1.0),
        ("mssa", "threshold", False, 1.0),
        ("mssa", "softmax", True, 0.5),
        ("mhsa", "softmax", False, 1.0),
        ("mhsa", "threshold", True, 1.0),
    ],
)
def test_aot_formula(variant, phi, norm, scale):
    heads, p, eta, tau = 3, 6, 0.4, 0.55
    step = _randomize(
        _build("aot", heads=heads, head_dim=p, step_size=eta, phi=phi, tau=tau, scale=scale, norm=norm, variant=variant)
    )
    x = 2.0 * _tokens(seed=9)
    prm = _prm(step)
    with torch.no_grad():
        got = step(x)
    expected = _aot_expected(x, prm, heads, p, eta, phi, tau, scale, norm, variant)
    assert (expected - x).abs().max() > 1e-2  # the threshold lets some entries through
    _close(got, expected, f"AoT {variant}/{phi} (book eq. 5.3.2)")
    if phi == "threshold":  # and removes others: differs from the plain softmax step
        soft = _aot_expected(x, prm, heads, p, eta, "softmax", tau, scale, norm, variant)
        assert (expected - soft).abs().max() > 1e-2
    expected_count = heads * p * D if variant == "mssa" else 4 * heads * p * D
    assert _count(step) == expected_count + (2 * D if norm else 0)


def _mixture_of_subspaces(gen, K, p, d, per_group, delta):
    """Book eq. 5.3.1: token i in group k is U_k a_i + sum_{j != k} U_j e_ij, orthonormal [U_1 .. U_K]."""
    Q, _ = torch.linalg.qr(torch.randn(d, K * p, generator=gen, dtype=torch.float64))
    tokens, labels = [], []
    for k in range(K):
        for _ in range(per_group):
            codes = [torch.randn(p, generator=gen, dtype=torch.float64) * (1.0 if j == k else delta) for j in range(K)]
            tokens.append(Q @ torch.cat(codes))
            labels.append(k)
    return Q, torch.stack(tokens)[None], torch.tensor(labels)


def _snr(Z, Q, labels, K, p):
    """Book eq. 5.3.3: ||U_k U_k^T Z_k|| / ||(I - U_k U_k^T) Z_k|| for every group k."""
    out = []
    for k in range(K):
        Zk = Z[0, labels == k]  # rows
        Uk = Q[:, k * p : (k + 1) * p]
        signal = Zk @ Uk @ Uk.T
        out.append(signal.norm() / (Zk - signal).norm())
    return torch.stack(out)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_aot_threshold_steps_raise_every_subspace_snr(seed):
    """Theorem 5.1: p >~ log N, delta <~ sqrt(log N / p), 1/2 < tau <= 1/(1 + N exp(-9p/32)): each layer
    multiplies every SNR by 1 + eta tau. Here K=3, p=32, N=48 (log N = 3.9; the tau bound is 0.994), delta = 0.05,
    eta = 0.5, tau = 0.6, four layers: it holds for 100 of 100 seeds tried, so any seed is a fair draw."""
    K, p, per_group, delta, eta, tau, layers = 3, 32, 16, 0.05, 0.5, 0.6, 4
    N_ = K * per_group
    assert 0.5 < tau <= 1 / (1 + N_ * math.exp(-9 * p / 32)) and p > math.log(N_)
    gen = torch.Generator().manual_seed(seed)
    d = K * p
    Q, Z, labels = _mixture_of_subspaces(gen, K, p, d, per_group, delta)
    step = _build("aot", shape=(N_, d), heads=K, head_dim=p, phi="threshold", tau=tau, step_size=eta)
    with torch.no_grad():
        step.subspaces.weight.copy_(Q.T)  # the true subspaces
    snr = [_snr(Z, Q, labels, K, p)]
    with torch.no_grad():
        for _ in range(layers):
            Z = step(Z)
            snr.append(_snr(Z, Q, labels, K, p))
    ratios = torch.stack(snr[1:]) / torch.stack(snr[:-1])  # (layers, K)
    assert (ratios > 1).all(), f"SNR fell: {ratios}"
    torch.testing.assert_close(ratios, torch.full_like(ratios, 1 + eta * tau), rtol=1e-8, atol=0)

    # against subspaces unrelated to the data the same steps do not denoise (the check can fail)
    Q_wrong, _ = torch.linalg.qr(torch.randn(d, K * p, generator=gen, dtype=torch.float64))
    _, Z, labels = _mixture_of_subspaces(torch.Generator().manual_seed(seed), K, p, d, per_group, delta)
    with torch.no_grad():
        step.subspaces.weight.copy_(Q_wrong.T)
        before = _snr(Z, Q, labels, K, p)
        after = _snr(step(Z), Q, labels, K, p)
    assert not torch.allclose(after / before, torch.full((K,), 1 + eta * tau, dtype=torch.float64), rtol=1e-3)


# --------------------------------------------------------------------------------------------- ToST: conv patch embedding


def _bn_eval(x, prm, buffers, prefix, eps=1e-5):
    mean, var = buffers[f"{prefix}.running_mean"], buffers[f"{prefix}.running_var"]
    w, b = prm[f"{prefix}.weight"], prm[f"{prefix}.bias"]
    return (x - mean[:, None, None]) / torch.sqrt(var[:, None, None] + eps) * w[:, None, None] + b[:, None, None]


@pytest.mark.parametrize("patch,image", [(16, (3, 32, 48)), (8, (2, 16, 24))])
def test_conv_patch_embed_formula_and_grid(patch, image):
    dim = 32
    context = Context()
    step = _randomize(_build("conv_patch_embed", shape=image, context=context, dim=dim, patch_size=patch)).eval()
    c, h, w = image
    assert context.grid == (h // patch, w // patch)
    prm, buffers = _prm(step), dict(step.named_buffers())
    convs = sorted({name.rsplit(".", 2)[0] for name in prm if name.endswith("0.weight") and prm[name].ndim == 4})
    widths = [c] + [dim * 2 // patch * 2**i for i in range(len(convs))]  # C, d/8, d/4, d/2, d for patch 16
    assert [prm[f"{n}.0.weight"].shape[:2] for n in convs] == [(o, i) for i, o in zip(widths[:-1], widths[1:])]
    x = _tokens((B, *image))
    y = x
    for i, name in enumerate(convs):
        if i:
            y = _gelu(y)
        y = _bn_eval(F.conv2d(y, prm[f"{name}.0.weight"], stride=2, padding=1), prm, buffers, f"{name}.1")
    expected = y.permute(0, 2, 3, 1).reshape(B, -1, dim)  # (row, column) order
    with torch.no_grad():
        got = step(x)
    assert got.shape == (B, (h // patch) * (w // patch), dim)
    _close(got, expected, f"conv patch embedding, patch {patch}")


def test_conv_patch_embed_rejects_other_patches_and_sizes():
    with pytest.raises(ValidationError):
        registry.get("conv_patch_embed").args.model_validate({"dim": 32, "patch_size": 32})
    with pytest.raises(ValidationError):
        registry.get("conv_patch_embed").args.model_validate({"dim": 32, "patch_size": 6})
    with pytest.raises(ValueError, match="divisible"):
        _build("conv_patch_embed", shape=(3, 40, 32), dim=32)
    with pytest.raises(ValueError, match="divisible by 8"):
        _build("conv_patch_embed", shape=(3, 32, 32), dim=36)


# --------------------------------------------------------------------------------------------- ToST: Fourier positions


def _fourier_expected(x, prm, grid, hidden=32, temperature=10000.0):
    """XCiT's PositionalEncodingFourier, element by element: feature 2i = sin, 2i+1 = cos of pos / T^(2i/hidden),
    pos = 2 pi * (row or column index, 1-based) / (size + 1e-6); the y (row) features first, then the x."""
    h, w = grid
    feats = torch.zeros(h * w, 2 * hidden, dtype=torch.float64)
    for r in range(h):
        for c in range(w):
            for half, pos in enumerate([(r + 1) / (h + 1e-6) * 2 * math.pi, (c + 1) / (w + 1e-6) * 2 * math.pi]):
                for i in range(hidden):
                    angle = pos / temperature ** (2 * (i // 2) / hidden)
                    feats[r * w + c, half * hidden + i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    W = prm["token_projection.weight"][:, :, 0, 0]  # (d, 2 hidden)
    return x + feats @ W.T + prm["token_projection.bias"]


def test_fourier_positions_formula_reads_the_grid_from_the_context():
    grid = (3, 4)
    step = _randomize(_build("fourier_positions", shape=(12, D), context=Context(grid=grid)))
    x = _tokens((B, 12, D))
    with torch.no_grad():
        got = step(x)
    # the features are computed in float32, as the authors' code computes them (tests/test_import_recorded.py
    # checks them against a transcription of that code to 1e-10): float32's rounding of sin/cos, about 1e-7
    assert (got - _fourier_expected(x, _prm(step), grid)).abs().max() < 1e-6 * (1 + x.abs().max())
    # the transposed grid is a different table: the order (y first, rows outer) matters
    assert (got - _fourier_expected(x, _prm(step), (4, 3))).abs().max() > 1e-3
    assert _count(_build("fourier_positions", shape=(196, 192), context=Context(grid=(14, 14)))) == 12_480


def test_fourier_positions_needs_a_matching_grid():
    with pytest.raises(ValueError, match="grid"):
        _build("fourier_positions", shape=(12, D))
    with pytest.raises(ValueError, match="12 tokens"):
        _build("fourier_positions", shape=(12, D), context=Context(grid=(4, 4)))
    context = Context()
    _build("conv_patch_embed", shape=(3, 64, 32), context=context, dim=32)
    assert _build("fourier_positions", shape=(8, 32), context=context)(_tokens((1, 8, 32))).shape == (1, 8, 32)


# --------------------------------------------------------------------------------------------- ToST: class attention


def _class_attention_expected(x, prm, heads, eps):
    y = _ln(x, prm["norm.weight"], prm["norm.bias"], eps)
    qkv = y @ prm["qkv.weight"].T + prm["qkv.bias"]  # (B, n, 3d)
    d = x.shape[-1]
    p = d // heads
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    cls = []
    for h in range(heads):
        sl = slice(h * p, (h + 1) * p)
        scores = torch.einsum("bj,bnj->bn", q[:, 0, sl], k[..., sl]) * p**-0.5  # only the class token queries
        cls.append(torch.einsum("bn,bnj->bj", _softmax(scores), v[..., sl]))
    cls = torch.cat(cls, -1) @ prm["proj.weight"].T + prm["proj.bias"]  # (B, d)
    return cls, y


def _xcit_class_block(x, ca_prm, mlp_prm, heads, gamma1, gamma2, eps=1e-6):
    """XCiT/ToST ClassAttentionBlock.forward with tokens_norm=True, as their code writes it."""
    cls, y = _class_attention_expected(x, ca_prm, heads, eps)
    x = x + gamma1 * torch.cat([cls[:, None], y[:, 1:]], 1)
    x = _ln(x, mlp_prm["norm.weight"], mlp_prm["norm.bias"], eps)
    x_res = x
    cls_token = x[:, :1]
    hidden = _gelu(cls_token @ mlp_prm["expand.weight"].T + mlp_prm["expand.bias"])
    cls_token = gamma2 * (hidden @ mlp_prm["contract.weight"].T + mlp_prm["contract.bias"])
    return x_res + torch.cat([cls_token, x[:, 1:]], 1)


def test_class_attention_formula():
    heads = 4
    step = _randomize(_build("class_attention", heads=heads))
    x = _tokens()
    cls, y = _class_attention_expected(x, _prm(step), heads, 1e-6)
    expected = x + torch.cat([cls[:, None], y[:, 1:]], 1)
    with torch.no_grad():
        got = step(x)
    _close(got, expected, "class attention")
    changed = x.clone()
    changed[:, 0] = _tokens(seed=77)[:, 0]  # a new class token moves the class token only: patches do not query
    with torch.no_grad():
        other = step(changed)
    _close(other[:, 1:], got[:, 1:], "patch tokens do not attend")
    assert (other[:, 0] - got[:, 0]).abs().max() > 1e-2


@pytest.mark.parametrize("layer_scale", [None, 0.3])
def test_class_attention_then_class_mlp_is_xcits_block(layer_scale):
    heads = 4
    ca = _randomize(_build("class_attention", heads=heads), seed=4)
    mlp = _randomize(_build("class_mlp", ratio=2.0), seed=6)
    gamma1 = gamma2 = 1.0
    if layer_scale is not None:  # as the builder does it, generically
        ca.enable_layer_scale(D, layer_scale)
        mlp.enable_layer_scale(D, layer_scale)
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            ca.layer_scale.copy_(torch.rand(D, generator=gen, dtype=torch.float64))
            mlp.layer_scale.copy_(torch.rand(D, generator=gen, dtype=torch.float64))
        gamma1, gamma2 = ca.layer_scale.detach(), mlp.layer_scale.detach()
    x = _tokens()
    with torch.no_grad():
        got = mlp(ca(x))
    expected = _xcit_class_block(x, _prm(ca), _prm(mlp), heads, gamma1, gamma2)
    _close(got, expected, f"class_attention + class_mlp = XCiT ClassAttentionBlock (layer scale {layer_scale})")


def test_class_mlp_patch_tokens_option():
    step = _randomize(_build("class_mlp", ratio=2.0, patches="normalized"))
    x = _tokens()
    prm = _prm(step)
    y = _ln(x, prm["norm.weight"], prm["norm.bias"], 1e-6)
    cls = _gelu(y[:, 0] @ prm["expand.weight"].T + prm["expand.bias"]) @ prm["contract.weight"].T + prm["contract.bias"]
    with torch.no_grad():
        got = step(x)
    _close(got, torch.cat([(y[:, 0] + cls)[:, None], y[:, 1:]], 1), "class_mlp with normalized patches")


# --------------------------------------------------------------------------------------------- standard parts


@pytest.mark.parametrize("norm", [True, False])
def test_mhsa_formula(norm):
    heads, p, eps = 3, 5, 1e-6
    step = _randomize(_build("mhsa", heads=heads, head_dim=p, norm=norm, eps=eps))
    prm = _prm(step)
    x = _tokens()
    y = _ln(x, prm["norm.weight"], prm["norm.bias"], eps) if norm else x
    qkv = y @ prm["qkv.weight"].T + prm["qkv.bias"]
    hp = heads * p
    heads_out = []
    for h in range(heads):
        q, k, v = (qkv[..., i * hp + h * p : i * hp + (h + 1) * p] for i in range(3))
        heads_out.append(_softmax(q @ k.transpose(-1, -2) * p**-0.5) @ v)
    expected = x + torch.cat(heads_out, -1) @ prm["out.weight"].T + prm["out.bias"]
    with torch.no_grad():
        _close(step(x), expected, f"MHSA (norm={norm})")
    assert isinstance(step, Residual)
    assert set(prm) == ({"norm.weight", "norm.bias"} if norm else set()) | {
        "qkv.weight",
        "qkv.bias",
        "out.weight",
        "out.bias",
    }


@pytest.mark.parametrize("norm", [True, False])
def test_mlp_formula(norm):
    step = _randomize(_build("mlp", ratio=2.0, eps=1e-6, norm=norm))
    prm = _prm(step)
    x = _tokens()
    y = _ln(x, prm["norm.weight"], prm["norm.bias"], 1e-6) if norm else x
    expected = (
        x + _gelu(y @ prm["expand.weight"].T + prm["expand.bias"]) @ prm["contract.weight"].T + prm["contract.bias"]
    )
    with torch.no_grad():
        _close(step(x), expected, f"MLP (norm={norm})")
    assert isinstance(step, Residual)


# --------------------------------------------------------------------------------------------- ToST-T, counted


def test_tost_tiny_counts_5_769_328():
    d, depth, heads, classes = 192, 12, 4, 1000
    context = Context()
    embed = _count(_build("conv_patch_embed", shape=(3, 224, 224), context=context, dim=d))
    positions = _count(_build("fourier_positions", shape=(196, d), context=context))
    tssa = _count(_build("tssa", shape=(196, d), heads=heads, eps=1e-6))
    mlp = _count(_build("mlp", shape=(196, d), ratio=4.0, eps=1e-6))
    ca = _count(_build("class_attention", shape=(197, d), heads=heads))
    ca_mlp = _count(_build("class_mlp", shape=(197, d), ratio=4.0))
    assert (embed, positions, tssa, mlp, ca, ca_mlp) == (
        219_096,
        12_480,
        384 + 74_116,
        384 + 295_872,
        384 + 111_168 + 37_056,
        384 + 295_872,
    )
    layer_scale, class_token, final_ln, head = d, d, 2 * d, d * classes + classes  # the builder's / other steps'
    total = (
        embed
        + positions
        + depth * (tssa + layer_scale + mlp + layer_scale)
        + class_token
        + 2 * (ca + layer_scale + ca_mlp + layer_scale)
        + final_ln
        + head
    )
    assert total == 5_769_328

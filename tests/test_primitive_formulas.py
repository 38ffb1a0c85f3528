"""Each step of a built CRATE layer computes its paper's formula (docs/primitives.md), written out here by hand.

The built model is used only through ``build`` and ``get_submodule``; the expected values are computed from
the formulas (tokens as rows, ``x`` of shape (B, n, d)) with explicit LayerNorm and softmax. All parameters
of a step are randomized first (LayerNorms start at 1 / 0, which would hide a misused affine), and the
checks run in float64 with a 1e-10 tolerance (plus one float32 run at 1e-5).
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from crate_compose.building.builder import build

SIZES = dict(d=48, heads=3, head_dim=8, depth=1, image_size=16, patch_size=8, classes=5)  # K*p = 24 != d
D, K, P = SIZES["d"], SIZES["heads"], SIZES["head_dim"]
B, N = 3, 10
ETA, LAMBDA = 0.1, 0.1
LN_EPS = 1e-5
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
DEVICE = torch.device("cpu")  # the tests' --device, set for each test by _on_device


@pytest.fixture(autouse=True)
def _on_device(device, monkeypatch):
    """Every step and its tokens on ``pytest --device`` (the CPU by default)."""
    monkeypatch.setattr(sys.modules[__name__], "DEVICE", device)


def _build(*extra, dtype="float64", seed=0):
    return build(
        "crate-tiny", overrides=[f"sizes.{k}={v}" for k, v in SIZES.items()] + list(extra), seed=seed, dtype=dtype
    )


def _step(name, *extra, dtype="float64", randomize=True):
    step = _build(*extra, dtype=dtype).get_submodule(f"encoder.layer_0.{name}").to(DEVICE)
    if randomize:
        gen = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for pname, param in step.named_parameters():
                noise = torch.randn(param.shape, generator=gen).to(param.dtype).to(param.device)
                if pname.startswith("norm"):
                    param.copy_(0.3 * noise + (1.0 if pname.endswith("weight") else 0.0))
                else:  # subspaces, out, dictionary: scale ~ 1/sqrt(fan_in)
                    param.copy_(noise / param.shape[-1] ** 0.5)
    return step


def _tokens(dtype=torch.float64, seed=5, shape=(B, N, D)):
    gen = torch.Generator().manual_seed(seed)
    return (2.0 * torch.randn(shape, generator=gen) + 0.5).to(dtype).to(DEVICE)


def _params(step):
    return {name: p.detach() for name, p in step.named_parameters()}


def _ln(x, weight, bias):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as LayerNorm
    return (x - mean) / torch.sqrt(var + LN_EPS) * weight + bias


def _softmax(s):
    e = torch.exp(s - s.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def _heads_out(x, prm, causal=False):
    """concat_k softmax(w_k w_k^T p^-1/2 [+ causal mask]) w_k, with w = LN(x) U^T; shape (B, n, K*p)."""
    w = _ln(x, prm["norm.weight"], prm["norm.bias"]) @ prm["subspaces.weight"].T  # (B, n, K*p)
    n = x.shape[1]
    heads = []
    for k in range(K):
        wk = w[..., k * P : (k + 1) * P]
        scores = wk @ wk.transpose(-1, -2) * P**-0.5
        if causal:
            above = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
            scores = scores.masked_fill(above, float("-inf"))
        heads.append(_softmax(scores) @ wk)
    return torch.cat(heads, dim=-1)


def _mssa_expected(x, prm, causal=False):
    return x + _heads_out(x, prm, causal) @ prm["out.weight"].T + prm["out.bias"]


def _ista_expected(z, prm, eta=ETA, lambd=LAMBDA):
    u = _ln(z, prm["norm.weight"], prm["norm.bias"])
    Dm = prm["dictionary"]
    return torch.relu(u + eta * (u @ Dm - (u @ Dm.T) @ Dm) - eta * lambd)


def _soft(v, t):
    return torch.sign(v) * torch.clamp(v.abs() - t, min=0.0)


def _close(got, expected, what):
    tol = TOL[expected.dtype]
    diff = (got - expected).abs().max().item()
    torch.testing.assert_close(
        got, expected, atol=tol, rtol=tol, msg=lambda m: f"{what}: max abs diff {diff:.3e} (tol {tol}); {m}"
    )
    return diff


# ----------------------------------------------------------------------------------------------- MSSA


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mssa_step_formula(dtype):
    step = _step("compress", dtype=str(dtype).removeprefix("torch."))
    x = _tokens(dtype)
    with torch.no_grad():
        got = step(x)
    expected = _mssa_expected(x, _params(step))
    assert (expected - x).abs().max().item() > 1e-2  # the update is not negligible
    _close(got, expected, f"MSSA z = x + out(concat softmax(w w^T/sqrt p) w) [{dtype}]")


def test_mssa_parameters():
    step = _step("compress", randomize=False)
    shapes = {name: tuple(p.shape) for name, p in step.named_parameters()}
    assert shapes == {
        "norm.weight": (D,),
        "norm.bias": (D,),
        "subspaces.weight": (K * P, D),
        "out.weight": (D, K * P),
        "out.bias": (D,),
    }
    assert sum(p.numel() for p in step.parameters()) == D * K * P + K * P * D + D + 2 * D


def test_mssa_is_not_causal_by_default():
    step = _step("compress")
    x = _tokens()
    y = x.clone()
    y[:, -1] = _tokens(seed=99)[:, -1]  # (a constant shift of a token would be removed by the LayerNorm)
    with torch.no_grad():
        assert (step(x)[:, 0] - step(y)[:, 0]).abs().max().item() > 1e-6


def test_mssa_causal_formula_and_dependence():
    step = _step("compress", "encoder.layer.compress.args.causal=true")
    prm = _params(step)
    x = _tokens()
    with torch.no_grad():
        got = step(x)
        _close(got, _mssa_expected(x, prm, causal=True), "causal MSSA (masked softmax)")
        # differs from the unmasked formula
        assert (got - _mssa_expected(x, prm, causal=False)).abs().max().item() > 1e-4
        # token i only sees tokens <= i
        for i in (0, 3, N - 2):
            y = x.clone()
            y[:, i + 1 :] = _tokens(seed=99)[:, i + 1 :]
            out_y = step(y)
            diff = (out_y[:, : i + 1] - got[:, : i + 1]).abs().max().item()
            assert diff < 1e-12, f"tokens <= {i} changed by {diff:.3e} when only tokens > {i} changed"
            assert (out_y[:, i + 1 :] - got[:, i + 1 :]).abs().max().item() > 1e-3


def test_mssa_tied_output_with_step_size():
    step = _step("compress", "encoder.layer.compress.args.output=tied", "encoder.layer.compress.args.step_size=0.5")
    prm = _params(step)
    assert set(prm) == {"norm.weight", "norm.bias", "subspaces.weight"}, sorted(prm)
    x = _tokens()
    with torch.no_grad():
        got = step(x)
    expected = x + 0.5 * _heads_out(x, prm) @ prm["subspaces.weight"]  # (B,n,K*p) @ (K*p,d)
    _close(got, expected, "tied MSSA z = x + 0.5 concat(h) @ U")


# ----------------------------------------------------------------------------------------------- ISTA


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ista_step_formula(dtype):
    step = _step("sparsify", dtype=str(dtype).removeprefix("torch."))
    z = _tokens(dtype)
    with torch.no_grad():
        got = step(z)
    _close(got, _ista_expected(z, _params(step)), f"ISTA ReLU(u + eta(uD - (uD^T)D) - eta lambda) [{dtype}]")


def test_ista_step_formula_at_init():
    """Also with the weights exactly as built (kaiming-uniform D, LayerNorm 1 / 0)."""
    step = _step("sparsify", randomize=False)
    z = _tokens()
    with torch.no_grad():
        _close(step(z), _ista_expected(z, _params(step)), "ISTA at init")


def test_ista_output_is_non_negative_and_sparse():
    step = _step("sparsify")
    with torch.no_grad():
        out = step(_tokens())
    assert out.min().item() >= 0.0
    assert (out == 0).any() and (out > 0).any()
    zeros = (out == 0).float().mean().item()
    assert 0.05 < zeros < 0.95, zeros


def test_ista_step_size_and_lambda_are_used():
    step = _step("sparsify", "encoder.layer.sparsify.args.step_size=0.2", "encoder.layer.sparsify.args.lambd=0.5")
    z = _tokens()
    with torch.no_grad():
        got = step(z)
    prm = _params(step)
    _close(got, _ista_expected(z, prm, eta=0.2, lambd=0.5), "ISTA with eta 0.2, lambda 0.5")
    assert (got - _ista_expected(z, prm)).abs().max().item() > 1e-3


def test_ista_parameters():
    step = _step("sparsify", randomize=False)
    shapes = {name: tuple(p.shape) for name, p in step.named_parameters()}
    assert shapes == {"dictionary": (D, D), "norm.weight": (D,), "norm.bias": (D,)}
    assert sum(p.numel() for p in step.parameters()) == D * D + 2 * D
    # kaiming_uniform_ (a=0): U(-sqrt(6/fan_in), sqrt(6/fan_in)); crate-tiny's d = 384 fills the range
    dictionary = build("crate-tiny", overrides=["sizes.depth=1"]).get_submodule("encoder.layer_0.sparsify").dictionary
    bound = (6.0 / 384) ** 0.5
    assert dictionary.abs().max().item() <= bound
    assert dictionary.abs().max().item() > 0.99 * bound
    assert abs(dictionary.std().item() - bound / 3**0.5) < 0.01 * bound


def test_ista_soft_threshold_variant():
    step = _step("sparsify", "encoder.layer.sparsify.primitive=ista_soft")
    prm = _params(step)
    z = _tokens()
    with torch.no_grad():
        got = step(z)
    u = _ln(z, prm["norm.weight"], prm["norm.bias"])
    Dm = prm["dictionary"]
    expected = _soft(u + ETA * (u @ Dm - u @ Dm.T @ Dm), ETA * LAMBDA)  # columns: S(u + eta D^T (u - D u))
    _close(got, expected, "ista_soft S_{eta lambda}(u + eta(uD - uD^T D))")
    assert (got < 0).any() and (got > 0).any() and (got == 0).any()  # two-sided


# ----------------------------------------------------------------------------------------------- seeds


def test_same_seed_same_weights_other_seed_different():
    a, b, c = (_build(dtype="float32", seed=s).state_dict() for s in (0, 0, 1))
    assert list(a) == list(b) == list(c)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    random_keys = [k for k in a if a[k].numel() > 1 and a[k].std() > 0]  # LayerNorms start at 1 / 0
    assert {
        "encoder.layer_0.sparsify.dictionary",
        "encoder.layer_0.compress.subspaces.weight",
        "preprocess.positions.embedding",
        "head.classify.classifier.weight",
    } <= set(random_keys)
    for key in random_keys:
        assert not torch.equal(a[key], c[key]), f"{key} is the same for seeds 0 and 1"


def test_build_leaves_global_rng_untouched():
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    _build(dtype="float32", seed=3)
    after = torch.get_rng_state()
    assert torch.equal(before, after)
    # and the seed, not the global state, decides the weights
    torch.manual_seed(1)
    w1 = _build(dtype="float32", seed=3).state_dict()
    torch.manual_seed(2)
    w2 = _build(dtype="float32", seed=3).state_dict()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def _dino_interpolate_pos_encoding(table: torch.Tensor, side: int) -> torch.Tensor:
    """DINO's ``VisionTransformer.interpolate_pos_encoding`` (facebookresearch/dino), written out: the class row
    kept, the square grid of the table resized bicubically by the scale factor (side + 0.1) / sqrt(N)."""
    cls, grid = table[:, :1], table[:, 1:]
    n, dim = grid.shape[1], grid.shape[-1]
    if side * side == n:  # the table's own grid: DINO returns the table
        return table
    root = int(math.sqrt(n))
    w0 = h0 = side + 0.1
    grid = torch.nn.functional.interpolate(
        grid.reshape(1, root, root, dim).permute(0, 3, 1, 2),
        scale_factor=(w0 / math.sqrt(n), h0 / math.sqrt(n)),
        mode="bicubic",
    )
    return torch.cat((cls, grid.permute(0, 2, 3, 1).view(1, -1, dim)), dim=1)


@pytest.mark.parametrize("side", [2, 3, 4, 6, 9])
def test_interpolated_positions_are_dinos_table_for_every_grid(side):
    from crate_compose.modules.embed import Positions

    positions = Positions(1 + 16, 8, grid=(4, 4))
    tokens = torch.randn(2, 1 + side * side, 8)
    expected = tokens + _dino_interpolate_pos_encoding(positions.embedding.detach(), side)
    assert torch.equal(positions(tokens), expected)
    if side == 4:  # the table's own grid: the table as it is
        assert torch.equal(positions(tokens), tokens + positions.embedding)
    with pytest.raises(ValueError, match="no square patch grid"):
        positions(torch.randn(2, 1 + side * (side + 1), 8))

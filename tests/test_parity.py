"""The built CRATE agrees with an independent eager transcription of paper 003's Algorithms 1-3.

The reference (tests/reference/crate_paper.py) is written from the pseudocode alone; the built model is used
only through ``crate_compose.building.builder.build``. Same weights (copied built -> reference by an explicit key
mapping), same inputs: logits, gradients w.r.t. every parameter and w.r.t. the images must agree, in
float32 (1e-5) and in float64 (1e-10, where a formula difference cannot hide behind rounding).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference.crate_paper import CRATE, key_mapping, load_from_built

from crate_compose.building.builder import build

DTYPES = {"float32": torch.float32, "float64": torch.float64}
TOL = {"float32": 1e-5, "float64": 1e-10}

# Small configurations: K*p equal to, smaller than and larger than d; n = 16, 36 and 4 image tokens.
CONFIGS = {
    "d64-K4-p16": dict(image_size=32, patch_size=8, d=64, heads=4, head_dim=16, depth=2, classes=10),
    "d48-K3-p8": dict(image_size=24, patch_size=4, d=48, heads=3, head_dim=8, depth=3, classes=7),
    "d32-K2-p40": dict(image_size=16, patch_size=8, d=32, heads=2, head_dim=40, depth=1, classes=5),
}
TINY = dict(image_size=224, patch_size=16, d=384, heads=6, head_dim=64, depth=12, classes=1000)
TINY_PARAMS = 6_090_856


def _overrides(sizes: dict) -> list[str]:
    return [f"sizes.{k}={v}" for k, v in sizes.items()]


def _reference(sizes: dict, dtype: torch.dtype) -> CRATE:
    return CRATE(
        image_size=sizes["image_size"],
        patch_size=sizes["patch_size"],
        num_classes=sizes["classes"],
        dim=sizes["d"],
        depth=sizes["depth"],
        heads=sizes["heads"],
        dim_head=sizes["head_dim"],
        channels=3,
        pool="cls",
    ).to(dtype)


def _perturb_norms(built, seed: int = 7):
    """LayerNorms start at weight 1, bias 0, which would hide a swapped or ignored affine: randomize them."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in built.named_parameters():
            if ".norm" in name:
                noise = 0.2 * torch.randn(param.shape, generator=gen).to(param.dtype)
                param.copy_(noise + (1.0 if name.endswith("weight") else 0.0))


def _pair(sizes: dict, dtype: str, preset: str = "crate-tiny"):
    """(built, reference) with the built model's weights (norms randomized) copied into the reference."""
    built = build(preset, overrides=_overrides(sizes), seed=0, dtype=dtype)
    _perturb_norms(built)
    reference = _reference(sizes, DTYPES[dtype])
    load_from_built(reference, built.state_dict())
    return built, reference


_TINY_CACHE: dict = {}


def _tiny_pair(dtype: str):
    """crate-tiny itself (no overrides), built once per dtype for the module."""
    if dtype not in _TINY_CACHE:
        built = build("crate-tiny", seed=0, dtype=dtype)
        _perturb_norms(built)
        reference = _reference(TINY, DTYPES[dtype])
        load_from_built(reference, built.state_dict())
        _TINY_CACHE[dtype] = built, reference
    return _TINY_CACHE[dtype]


def _images(sizes: dict, batch: int, dtype: str, seed: int = 123) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    s = sizes["image_size"]
    return torch.randn(batch, 3, s, s, generator=gen).to(DTYPES[dtype])


_USED = [0.0]  # largest fraction of the allowed tolerance used so far (diff / (atol + rtol |expected|))


def _close(got: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> float:
    """assert_close with atol = rtol = tol; the message reports the observed max abs / rel diff."""
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(expected).all(), f"{what}: reference is not finite"
    diff = (got - expected).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    max_rel = (diff / expected.abs().clamp_min(tol)).max().item() if diff.numel() else 0.0
    used = (diff / (tol + tol * expected.abs())).max().item() if diff.numel() else 0.0
    _USED[0] = max(_USED[0], used)
    torch.testing.assert_close(
        got,
        expected,
        atol=tol,
        rtol=tol,
        msg=lambda m: (
            f"{what}: max abs diff {max_abs:.3e}, max rel diff {max_rel:.3e} "
            f"(|expected| max {expected.abs().max().item():.3e}, {used:.2f} of the tolerance); {m}"
        ),
    )
    return max_abs


def _check_forward(built, reference, images, tol, label):
    _USED[0] = 0.0
    built.eval(), reference.eval()
    with torch.no_grad():
        got, expected = built(images)["output"], reference(images)
    assert got.shape == (images.shape[0], reference.mlp_head[1].out_features)
    # a non-degenerate comparison: the logits vary across classes and samples
    assert expected.std().item() > 1e-3
    diff = _close(got, expected, tol, f"{label} logits")
    print(f"[parity] {label} forward max abs diff {diff:.3e}; fraction of tolerance used {_USED[0]:.2f}")
    return diff


def _check_gradients(built, reference, images, tol, label, classes):
    _USED[0] = 0.0
    built.train(), reference.train()
    labels = torch.arange(images.shape[0]) % classes

    def loss_and_grads(model):
        model.zero_grad(set_to_none=True)
        x = images.clone().requires_grad_(True)
        logits = model(x)
        logits = logits["output"] if isinstance(logits, dict) else logits  # built models return a dict
        loss = F.cross_entropy(logits, labels) + logits.square().mean()
        loss.backward()
        return loss.detach(), x.grad, {name: p.grad for name, p in model.named_parameters()}

    loss_b, xgrad_b, grads_b = loss_and_grads(built)
    loss_r, xgrad_r, grads_r = loss_and_grads(reference)
    _close(loss_b, loss_r, tol, f"{label} loss")
    worst = _close(xgrad_b, xgrad_r, tol, f"{label} d loss / d images")
    assert xgrad_r.abs().max().item() > 0
    mapping = key_mapping(len(reference.transformer.layers))
    assert set(grads_b) == set(mapping), "every built parameter must be mapped (and there are no buffers)"
    for built_key, ref_key in mapping.items():
        g_b, g_r = grads_b[built_key], grads_r[ref_key]
        assert g_b is not None and g_r is not None, f"{built_key}: no gradient"
        worst = max(worst, _close(g_b, g_r, tol, f"{label} d loss / d {built_key}"))
    print(f"[parity] {label} gradients max abs diff {worst:.3e}; fraction of tolerance used {_USED[0]:.2f}")
    return worst


# ----------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_forward_matches_reference_small(config, dtype):
    sizes = CONFIGS[config]
    built, reference = _pair(sizes, dtype)
    _check_forward(built, reference, _images(sizes, 4, dtype), TOL[dtype], f"{config}/{dtype}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_forward_matches_reference_crate_tiny(dtype):
    built, reference = _tiny_pair(dtype)
    _check_forward(built, reference, _images(TINY, 2, dtype), TOL[dtype], f"crate-tiny/{dtype}")


# ----------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_gradients_match_reference_small(config, dtype):
    sizes = CONFIGS[config]
    built, reference = _pair(sizes, dtype)
    _check_gradients(built, reference, _images(sizes, 4, dtype), TOL[dtype], f"{config}/{dtype}", sizes["classes"])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradients_match_reference_crate_tiny(dtype):
    built, reference = _tiny_pair(dtype)
    _check_gradients(built, reference, _images(TINY, 2, dtype), TOL[dtype], f"crate-tiny/{dtype}", TINY["classes"])


# ----------------------------------------------------------------------------------------------- sizes


def test_parameter_count_crate_tiny():
    built, reference = _tiny_pair("float32")
    n_built = sum(p.numel() for p in built.parameters())
    n_reference = sum(p.numel() for p in reference.parameters())
    assert n_reference == TINY_PARAMS, n_reference
    assert n_built == n_reference, (n_built, n_reference)
    # and tensor by tensor, through the mapping
    ref_state, built_state = reference.state_dict(), built.state_dict()
    for built_key, ref_key in key_mapping(TINY["depth"]).items():
        assert built_state[built_key].shape == ref_state[ref_key].shape, built_key


@pytest.mark.parametrize("config", list(CONFIGS))
def test_parameter_count_small(config):
    sizes = CONFIGS[config]
    built = build("crate-tiny", overrides=_overrides(sizes), seed=0)
    reference = _reference(sizes, torch.float32)
    assert sum(p.numel() for p in built.parameters()) == sum(p.numel() for p in reference.parameters())


# ----------------------------------------------------------------------------------------------- controls


def test_comparison_is_sensitive():
    """Negative controls: the same harness detects a changed lambda, step size or patch order."""
    sizes = CONFIGS["d64-K4-p16"]
    built, reference = _pair(sizes, "float64")
    images = _images(sizes, 4, "float64")
    with torch.no_grad():
        got = built.eval()(images)["output"]
        for ff in (layer[1].fn for layer in reference.transformer.layers):
            ff.lambd = 0.11
        assert (got - reference.eval()(images)).abs().max().item() > 1e-6
        for ff in (layer[1].fn for layer in reference.transformer.layers):
            ff.lambd, ff.step_size = 0.1, 0.11
        assert (got - reference(images)).abs().max().item() > 1e-6
        for ff in (layer[1].fn for layer in reference.transformer.layers):
            ff.step_size = 0.1
        torch.testing.assert_close(got, reference(images), atol=1e-10, rtol=1e-10)  # restored
        # patches flattened (c p1 p2) instead of (p1 p2 c)
        from einops.layers.torch import Rearrange

        reference.to_patch_embedding[0] = Rearrange(
            "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=sizes["patch_size"], p2=sizes["patch_size"]
        )
        assert (got - reference(images)).abs().max().item() > 1e-6


def test_load_from_built_rejects_a_mismatched_model():
    sizes = CONFIGS["d64-K4-p16"]
    built = build("crate-tiny", overrides=_overrides(sizes), seed=0)
    deeper = _reference(dict(sizes, depth=3), torch.float32)
    with pytest.raises(KeyError):
        load_from_built(deeper, built.state_dict())
    wider_heads = _reference(dict(sizes, head_dim=8), torch.float32)
    with pytest.raises(ValueError):
        load_from_built(wider_heads, built.state_dict())

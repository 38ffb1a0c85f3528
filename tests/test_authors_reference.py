"""The authors'-checkpoint reference (tests/reference/authors.py) describes and computes what the authors' code does.

* Layouts: for every family, the random state dict's keys and shapes equal a layout written out here by hand from
  the authors' module definitions at a small size (so a typo in either place fails), plus buffers and ties.
* Parameter counts at the published sizes (meta device): the papers' / the authors' code's exact numbers.
* Forwards in float64 at small sizes: shapes, finiteness, causality of the language models, what CRATE-MAE's mask
  does and does not change, eval-mode BatchNorm in ToST.
* Cross-checks that do not go through authors.py's functional code: CRATE against tests/reference/crate_paper.py's
  eager modules; the CRATE-MAE encoder and decoder against nn modules; crate-lm against an nn version that calls
  ``scaled_dot_product_attention`` and the authors' literal ISTA sequence.
"""

from __future__ import annotations

import math

import pytest
import torch
from reference.authors import (
    FAMILIES,
    SIZES,
    buffer_keys,
    forward,
    layout,
    mae_sincos_table,
    parameter_count,
    state_dict,
    tied_keys,
)
from reference.crate_paper import CRATE, Attention, PreNorm, Transformer
from torch import nn
from torch.nn import functional as F

VISION = dict(image_size=32, channels=3, patch_size=8, d=48, depth=2, heads=4, head_dim=16, classes=10)
SMALL = {
    "crate": VISION,
    "crate-mae": {k: v for k, v in VISION.items() if k != "classes"},
    "crate-alpha": dict(VISION, ratio=4),
    "tost": dict(VISION, patch_size=16, head_dim=12, class_depth=2),
    "tost-lm": dict(vocab=97, context=16, d=48, depth=2, heads=4),
    "crate-lm": dict(vocab=97, context=16, d=48, depth=2, heads=4),
}


# ---------------------------------------------------------------------------------------------------- layouts


def _norm(prefix, n=48):
    return {f"{prefix}.weight": (n,), f"{prefix}.bias": (n,)}


def _expected(family: str, depth: int = 2) -> dict[str, tuple]:
    """The authors' state_dict() at SMALL[family], written out from their module definitions."""
    fixed, per_layer = {}, {}
    if family == "crate":  # patch_dim = 3*8*8 = 192, 16 patches, inner = 4*16 = 64
        fixed = {
            "pos_embedding": (1, 17, 48),
            "cls_token": (1, 1, 48),
            **_norm("to_patch_embedding.1", 192),
            "to_patch_embedding.2.weight": (48, 192),
            "to_patch_embedding.2.bias": (48,),
            **_norm("to_patch_embedding.3"),
            **_norm("mlp_head.0"),
            "mlp_head.1.weight": (10, 48),
            "mlp_head.1.bias": (10,),
        }
        per_layer = {
            **_norm("transformer.layers.{i}.0.norm"),
            "transformer.layers.{i}.0.fn.qkv.weight": (64, 48),
            "transformer.layers.{i}.0.fn.to_out.0.weight": (48, 64),
            "transformer.layers.{i}.0.fn.to_out.0.bias": (48,),
            **_norm("transformer.layers.{i}.1.norm"),
            "transformer.layers.{i}.1.fn.weight": (48, 48),
        }
    elif family == "crate-mae":
        fixed = {
            "cls_token": (1, 1, 48),
            "pos_embed": (1, 17, 48),
            "patch_embed.proj.weight": (48, 3, 8, 8),
            "patch_embed.proj.bias": (48,),
            **_norm("norm"),
            "decoder_embed.weight": (48, 48),
            "decoder_embed.bias": (48,),
            "mask_token": (1, 1, 48),
            "decoder_pos_embed": (1, 17, 48),
            **_norm("decoder_norm"),
            "decoder_pred.weight": (192, 48),
            "decoder_pred.bias": (192,),
        }
        per_layer = {
            **_norm("blocks.{i}.layers.0.0.norm"),
            "blocks.{i}.layers.0.0.fn.qkv.weight": (64, 48),
            "blocks.{i}.layers.0.0.fn.to_out.0.weight": (48, 64),
            "blocks.{i}.layers.0.0.fn.to_out.0.bias": (48,),
            **_norm("blocks.{i}.layers.0.1.norm"),
            "blocks.{i}.layers.0.1.fn.weight": (48, 48),
            **_norm("decoder_blocks.{i}.layers.0.0.norm"),
            "decoder_blocks.{i}.layers.0.0.fn.weight": (48, 48),
            **_norm("decoder_blocks.{i}.layers.0.1.norm"),
            "decoder_blocks.{i}.layers.0.1.fn.qkv.weight": (64, 48),
            "decoder_blocks.{i}.layers.0.1.fn.to_out.0.weight": (48, 64),
            "decoder_blocks.{i}.layers.0.1.fn.to_out.0.bias": (48,),
        }
    elif family == "crate-alpha":
        fixed = {
            "pos_embedding": (1, 17, 48),
            "cls_token": (1, 1, 48),
            "conv1.weight": (48, 3, 8, 8),
            "conv1.bias": (48,),
            **_norm("mlp_head.0"),
            "mlp_head.1.weight": (10, 48),
            "mlp_head.1.bias": (10,),
        }
        per_layer = {
            **_norm("transformer.layers.{i}.0.norm"),
            "transformer.layers.{i}.0.fn.qkv.weight": (64, 48),
            "transformer.layers.{i}.0.fn.to_out.0.weight": (48, 64),  # bias=False
            **_norm("transformer.layers.{i}.1.norm"),
            "transformer.layers.{i}.1.fn.D": (48, 192),
            "transformer.layers.{i}.1.fn.D1": (48, 192),
        }
    elif family == "tost":  # patch 16: conv3x3 widths 3 -> 6 -> 12 -> 24 -> 48 at Sequential indices 0, 2, 4, 6
        fixed = {
            "cls_token": (1, 1, 48),
            **_norm("norm"),
            "head.weight": (10, 48),
            "head.bias": (10,),
            "pos_embeder.token_projection.weight": (48, 64, 1, 1),
            "pos_embeder.token_projection.bias": (48,),
        }
        for idx, (c_in, c_out) in zip((0, 2, 4, 6), ((3, 6), (6, 12), (12, 24), (24, 48))):
            pre = f"patch_embed.proj.{idx}"
            fixed.update(
                {
                    f"{pre}.0.weight": (c_out, c_in, 3, 3),
                    f"{pre}.1.weight": (c_out,),
                    f"{pre}.1.bias": (c_out,),
                    f"{pre}.1.running_mean": (c_out,),
                    f"{pre}.1.running_var": (c_out,),
                    f"{pre}.1.num_batches_tracked": (),
                }
            )

        def mlp(pre):
            return {
                f"{pre}.mlp.fc1.weight": (192, 48),
                f"{pre}.mlp.fc1.bias": (192,),
                f"{pre}.mlp.fc2.weight": (48, 192),
                f"{pre}.mlp.fc2.bias": (48,),
            }

        per_layer = {
            "blocks.{i}.gamma1": (48,),
            "blocks.{i}.gamma2": (48,),
            **_norm("blocks.{i}.norm1"),
            "blocks.{i}.attn.qkv.weight": (48, 48),
            "blocks.{i}.attn.qkv.bias": (48,),
            "blocks.{i}.attn.temp": (4, 1),
            "blocks.{i}.attn.to_out.0.weight": (48, 48),
            "blocks.{i}.attn.to_out.0.bias": (48,),
            **_norm("blocks.{i}.norm2"),
            **mlp("blocks.{i}"),
        }
        for j in range(2):
            pre = f"cls_attn_blocks.{j}"
            fixed.update(
                {
                    f"{pre}.gamma1": (48,),
                    f"{pre}.gamma2": (48,),
                    **_norm(f"{pre}.norm1"),
                    f"{pre}.attn.qkv.weight": (144, 48),
                    f"{pre}.attn.qkv.bias": (144,),
                    f"{pre}.attn.proj.weight": (48, 48),
                    f"{pre}.attn.proj.bias": (48,),
                    **_norm(f"{pre}.norm2"),
                    **mlp(pre),
                }
            )
    elif family == "tost-lm":
        fixed = {
            "transformer.wte.weight": (97, 48),
            "transformer.wpe.weight": (16, 48),
            **_norm("transformer.ln_f"),
            "lm_head.weight": (97, 48),
        }
        per_layer = {
            **_norm("transformer.h.{i}.ln_1"),
            "transformer.h.{i}.attn.c_attn.weight": (48, 48),
            "transformer.h.{i}.attn.c_attn.bias": (48,),
            "transformer.h.{i}.attn.c_proj.weight": (48, 48),
            "transformer.h.{i}.attn.c_proj.bias": (48,),
            "transformer.h.{i}.attn.temp": (4, 1),
            "transformer.h.{i}.attn.denom_bias": (4, 16, 1),
            **_norm("transformer.h.{i}.ln_2"),
            "transformer.h.{i}.mlp.c_fc.weight": (192, 48),
            "transformer.h.{i}.mlp.c_fc.bias": (192,),
            "transformer.h.{i}.mlp.c_proj.weight": (48, 192),
            "transformer.h.{i}.mlp.c_proj.bias": (48,),
            "transformer.h.{i}.gamma1": (48,),
            "transformer.h.{i}.gamma2": (48,),
        }
    elif family == "crate-lm":
        fixed = {
            "transformer.wte.weight": (97, 48),
            "transformer.wpe.weight": (16, 48),
            **_norm("transformer.ln_f"),
            "lm_head.weight": (97, 48),
        }
        per_layer = {
            **_norm("transformer.h.{i}.prenorm_1"),
            "transformer.h.{i}.attn.c_attn.weight": (48, 48),
            "transformer.h.{i}.attn.c_proj.weight": (48, 48),
            "transformer.h.{i}.attn.c_proj.bias": (48,),
            **_norm("transformer.h.{i}.prenorm_2"),
            "transformer.h.{i}.ista.weight": (192, 48),
        }
    out = dict(fixed)
    for i in range(depth):
        out.update({key.format(i=i): shape for key, shape in per_layer.items()})
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_state_dict_keys_and_shapes_match_the_authors_modules(family):
    state = state_dict(family, SMALL[family])
    assert {k: tuple(v.shape) for k, v in state.items()} == _expected(family)
    assert [key for key, _, _ in layout(family, SMALL[family])] == list(state)


def test_depth_and_variants_change_the_layout_as_the_authors_code_does():
    assert len(state_dict("crate", dict(VISION, depth=3))) == len(_expected("crate", depth=3))
    # Attention(heads=1, dim_head=dim) has to_out = Identity: no to_out keys at all.
    no_out = state_dict("crate", dict(VISION, heads=1, head_dim=48))
    assert not [k for k in no_out if "to_out" in k] and "transformer.layers.0.0.fn.qkv.weight" in no_out
    # ToST patch 8: three stride-2 convs 3 -> d/4 -> d/2 -> d at indices 0, 2, 4.
    p8 = state_dict("tost", dict(SMALL["tost"], patch_size=8))
    assert [tuple(p8[f"patch_embed.proj.{j}.0.weight"].shape) for j in (0, 2, 4)] == [
        (12, 3, 3, 3),
        (24, 12, 3, 3),
        (48, 24, 3, 3),
    ]
    assert "patch_embed.proj.6.0.weight" not in p8
    # tost-lm with bias=False (what train.py trains): no bias anywhere.
    unbiased = state_dict("tost-lm", dict(SMALL["tost-lm"], bias=False))
    assert set(unbiased) == {k for k in _expected("tost-lm") if not k.endswith(".bias")}


def test_buffers_ties_and_values_are_well_formed():
    tost = state_dict("tost", SMALL["tost"])
    buffers = buffer_keys("tost", SMALL["tost"])
    assert len(buffers) == 12
    assert all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in buffers)
    for key in buffers:
        if key.endswith("num_batches_tracked"):
            assert tost[key].dtype == torch.int64 and tost[key].dim() == 0
        else:
            assert tost[key].dtype == torch.float64
    assert all((tost[k] > 0).all() for k in tost if k.endswith(("running_var", "attn.temp")))
    assert abs(tost["blocks.0.gamma1"].mean().item() - 1) < 0.1  # LayerScale near 1, not 1e-5
    for family in ("tost-lm", "crate-lm"):
        state = state_dict(family, SMALL[family])
        assert tied_keys(family, SMALL[family]) == {"lm_head.weight": "transformer.wte.weight"}
        assert state["lm_head.weight"] is state["transformer.wte.weight"]
    assert state_dict("crate", VISION, seed=1)["cls_token"].ne(state_dict("crate", VISION, seed=2)["cls_token"]).all()
    assert torch.equal(
        state_dict("crate", VISION, seed=3)["mlp_head.1.weight"],
        state_dict("crate", VISION, seed=3)["mlp_head.1.weight"],
    )
    meta = state_dict("crate-mae", SIZES["crate-mae"]["base"], device="meta", dtype=torch.float32)
    assert all(t.is_meta for t in meta.values()) and meta["pos_embed"].dtype == torch.float32


def test_mae_position_tables_are_the_authors_sin_cos():
    state = state_dict("crate-mae", SMALL["crate-mae"])
    table = state["pos_embed"][0]
    assert torch.equal(table, state["decoder_pos_embed"][0]) and torch.equal(table, mae_sincos_table(48, 4))
    assert torch.count_nonzero(table[0]) == 0  # class-token row
    q = 12  # d/4 frequencies per sin or cos group; omega_k = 10000 ** (-k/q)
    for i, j in ((0, 3), (2, 1), (3, 2)):
        row = table[1 + 4 * i + j]
        # meshgrid(grid_w, grid_h): the first half encodes the COLUMN j, the second the ROW i.
        assert row[0] == pytest.approx(math.sin(j)) and row[q] == pytest.approx(math.cos(j))
        assert row[1] == pytest.approx(math.sin(j * 10000 ** (-1 / q)))
        assert row[2 * q] == pytest.approx(math.sin(i)) and row[3 * q] == pytest.approx(math.cos(i))
        assert row[4 * q - 1] == pytest.approx(math.cos(i * 10000 ** (-(q - 1) / q)))


# ---------------------------------------------------------------------------------------------------- counts

PUBLISHED = [
    ("crate", "tiny", 6_090_856),
    ("crate", "small", 13_116_328),
    ("crate", "base", 22_796_008),
    ("crate", "large", 77_641_192),  # paper 003, Table 1
    ("crate-mae", "small", 25_405_824),
    ("crate-mae", "base", 44_638_464),
    ("crate-alpha", "base", 72_328_936),
    ("tost", "tiny", 5_769_328),
    ("tost-lm", "base", 110_384_016),  # as trained: train.py's bias=False
]


@pytest.mark.parametrize("family,size,count", PUBLISHED, ids=[f"{f}-{s}" for f, s, _ in PUBLISHED])
def test_parameter_count_at_published_sizes(family, size, count):
    assert parameter_count(family, SIZES[family][size]) == count


def test_tost_lm_counts_with_and_without_bias():
    base = SIZES["tost-lm"]["base"]
    assert parameter_count("tost-lm", dict(base, bias=True)) == 110_467_728  # GPTConfig default; tie counted once
    # README: "110M / 304M / 655M" (get_num_params, i.e. without wpe). bias=True would make large 655.55M -> 656M.
    for size, millions in (("base", 110), ("medium", 304), ("large", 655)):
        z = SIZES["tost-lm"][size]
        assert round((parameter_count("tost-lm", z) - z["context"] * z["d"]) / 1e6) == millions


# ---------------------------------------------------------------------------------------------------- forwards


def _images(seed=0, n=2, size=32):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _tokens(seed=0, n=2, t=12, vocab=97):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_shapes_and_finite(family):
    z = SMALL[family]
    state = state_dict(family, z)
    if family in ("tost-lm", "crate-lm"):
        out = forward(family, state, _tokens(), z)
        assert set(out) == {"logits"} and out["logits"].shape == (2, 12, 97)
    elif family == "crate-mae":
        out = forward(family, state, _images(), z)
        assert set(out) == {"latent", "pred"}
        assert out["latent"].shape == (2, 17, 48) and out["pred"].shape == (2, 16, 192)
    else:
        out = forward(family, state, _images(), z)
        assert set(out) == {"logits"} and out["logits"].shape == (2, 10)
    for value in out.values():
        assert value.dtype == torch.float64 and torch.isfinite(value).all()
        assert value.std() > 0.1  # not degenerate (e.g. every ReLU off)


@pytest.mark.parametrize("family", ["tost-lm", "crate-lm"])
def test_language_models_are_causal(family):
    z = SMALL[family]
    state = state_dict(family, z)
    tokens = _tokens(t=12)
    full = forward(family, state, tokens, z)["logits"]
    later = tokens.clone()
    later[:, 7:] = (later[:, 7:] + 1) % 97
    changed = forward(family, state, later, z)["logits"]
    torch.testing.assert_close(changed[:, :7], full[:, :7], rtol=0, atol=1e-12)
    assert (changed[:, 7:] - full[:, 7:]).abs().amax(-1).min() > 1e-6  # every later position did change
    prefix = forward(family, state, tokens[:, :5], z)["logits"]
    torch.testing.assert_close(prefix, full[:, :5], rtol=0, atol=1e-12)


def test_tost_lm_uses_only_the_first_T_rows_of_denom_bias():
    z = SMALL["tost-lm"]
    state = state_dict("tost-lm", z)
    tokens = _tokens(t=8)
    base = forward("tost-lm", state, tokens, z)["logits"]
    state["transformer.h.0.attn.denom_bias"][:, 8:] += 5.0
    torch.testing.assert_close(forward("tost-lm", state, tokens, z)["logits"], base, rtol=0, atol=0)
    state["transformer.h.0.attn.denom_bias"][:, 3] += 0.5
    assert not torch.allclose(forward("tost-lm", state, tokens, z)["logits"], base)


def test_crate_mae_mask():
    z = SMALL["crate-mae"]
    state = state_dict("crate-mae", z)
    images = _images()
    plain = forward("crate-mae", state, images, z)
    none_masked = forward("crate-mae", state, images, z, mask=torch.zeros(2, 16, dtype=torch.bool))
    for key in plain:
        torch.testing.assert_close(none_masked[key], plain[key], rtol=0, atol=0)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, [0, 5, 6]] = True
    mask[1, [15]] = True
    masked = forward("crate-mae", state, images, z, mask=mask)
    assert not torch.allclose(masked["latent"][0], plain["latent"][0])
    # The pixels of a masked patch (row 0, column 0 of the 4x4 grid for image 0) no longer matter ...
    moved = images.clone()
    moved[0, :, 0:8, 0:8] += 3.0
    again = forward("crate-mae", state, moved, z, mask=mask)
    for key in masked:
        torch.testing.assert_close(again[key], masked[key], rtol=0, atol=1e-12)
    # ... but those of an unmasked patch of the same image do.
    moved = images.clone()
    moved[0, :, 8:16, 0:8] += 3.0  # patch (1, 0) = token 4, not masked
    assert not torch.allclose(forward("crate-mae", state, moved, z, mask=mask)["pred"], masked["pred"])
    # Masking one image leaves the other image of the batch alone.
    only_first = mask.clone()
    only_first[1] = False
    torch.testing.assert_close(
        forward("crate-mae", state, images, z, mask=only_first)["pred"][1], plain["pred"][1], rtol=0, atol=1e-12
    )


def test_crate_mae_uses_decoder_pos_embed_and_never_pos_embed_or_decoder_embed():
    z = SMALL["crate-mae"]
    state = state_dict("crate-mae", z)
    images = _images()
    base = forward("crate-mae", state, images, z)
    for key in ("pos_embed", "decoder_embed.weight", "decoder_embed.bias"):
        changed = dict(state, **{key: state[key] + torch.rand_like(state[key])})
        torch.testing.assert_close(forward("crate-mae", changed, images, z)["pred"], base["pred"], rtol=0, atol=0)
    # (a random change: a shift shared by all channels would vanish in the next LayerNorm)
    changed = dict(state, decoder_pos_embed=state["decoder_pos_embed"] + 0.1 * torch.rand_like(state["pos_embed"]))
    assert not torch.allclose(forward("crate-mae", changed, images, z)["latent"], base["latent"])


def test_tost_batchnorm_is_in_eval_mode_and_tokens_norm_matters():
    z = SMALL["tost"]
    state = state_dict("tost", z)
    images = _images(n=3)
    batch = forward("tost", state, images, z)["logits"]
    single = torch.cat([forward("tost", state, images[i : i + 1], z)["logits"] for i in range(3)])
    torch.testing.assert_close(single, batch, rtol=0, atol=1e-12)
    other = forward("tost", state, images, dict(z, tokens_norm=False))["logits"]
    assert not torch.allclose(other, batch)


# ---------------------------------------------------------------------------------------------------- cross-checks


def test_crate_matches_the_eager_paper_reference():
    z = SMALL["crate"]
    state = state_dict("crate", z)
    model = (
        CRATE(
            image_size=32, patch_size=8, num_classes=10, dim=48, depth=2, heads=4, dim_head=16, channels=3, pool="cls"
        )
        .double()
        .eval()
    )
    model.load_state_dict(state, strict=True)
    images = _images()
    with torch.no_grad():
        expected = model(images)
    torch.testing.assert_close(forward("crate", state, images, z)["logits"], expected, rtol=0, atol=1e-10)


def _load(module: nn.Module, state: dict, prefix: str):
    module.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=True)
    return module


def test_crate_mae_matches_nn_modules():
    """Encoder: crate_paper's Transformer with lambda 0.5; decoder: nn.LayerNorm + crate_paper's Attention."""
    z = SMALL["crate-mae"]
    state = state_dict("crate-mae", z)
    images = _images()
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, 3] = mask[1, 9] = True
    with torch.no_grad():
        embed = _load(nn.Conv2d(3, 48, 8, stride=8).double(), state, "patch_embed.proj.")
        tokens = embed(images).flatten(2).transpose(1, 2).clone()
        tokens[mask] = state["mask_token"][0, 0]
        x = torch.cat([state["cls_token"].expand(2, 1, 48), tokens], dim=1) + state["decoder_pos_embed"]
        encoder = Transformer(48, 2, 4, 16, 48, lambd=0.5).double()
        encoder.load_state_dict(
            {
                k.replace("blocks.", "layers.").replace(".layers.0.", "."): v
                for k, v in state.items()
                if k.startswith("blocks.")
            },
            strict=True,
        )
        latent = _load(nn.LayerNorm(48, eps=1e-6).double(), state, "norm.")(encoder(x))
        y = latent
        for i in range(2):
            pre = f"decoder_blocks.{i}.layers.0."
            ff = _load(nn.LayerNorm(48).double(), state, pre + "0.norm.")(y) @ state[pre + "0.fn.weight"].T
            attention = _load(PreNorm(48, Attention(48, heads=4, dim_head=16)).double(), state, pre + "1.")
            y = ff - attention(ff)
        y = _load(nn.LayerNorm(48, eps=1e-6).double(), state, "decoder_norm.")(y)
        pred = _load(nn.Linear(48, 192).double(), state, "decoder_pred.")(y)[:, 1:]
    out = forward("crate-mae", state, images, z, mask=mask)
    torch.testing.assert_close(out["latent"], latent, rtol=0, atol=1e-10)
    torch.testing.assert_close(out["pred"], pred, rtol=0, atol=1e-10)


def test_crate_lm_matches_sdpa_and_the_authors_literal_ista():
    z = SMALL["crate-lm"]
    state = state_dict("crate-lm", z)
    tokens = _tokens()
    with torch.no_grad():
        x = state["transformer.wte.weight"][tokens] + state["transformer.wpe.weight"][:12]
        for i in range(2):
            pre = f"transformer.h.{i}."
            h = _load(nn.LayerNorm(48).double(), state, pre + "prenorm_1.")(x)
            u = F.linear(h, state[pre + "attn.c_attn.weight"]).view(2, 12, 4, 12).transpose(1, 2)
            y = F.scaled_dot_product_attention(u, u, u, is_causal=True).transpose(1, 2).reshape(2, 12, 48)
            x = x + _load(nn.Linear(48, 48).double(), state, pre + "attn.c_proj.")(y)
            h, w = _load(nn.LayerNorm(48).double(), state, pre + "prenorm_2.")(x), state[pre + "ista.weight"]
            z_init = F.relu(0.1 * F.linear(h, w) - 0.1 * 0.1)
            grad = 0.1 * (F.linear(h, w) - F.linear(F.linear(z_init, w.t()), w)) - 0.1 * 0.1
            x = F.linear(F.relu(z_init + grad), w.t())
        logits = F.linear(_load(nn.LayerNorm(48).double(), state, "transformer.ln_f.")(x), state["lm_head.weight"])
    torch.testing.assert_close(forward("crate-lm", state, tokens, z)["logits"], logits, rtol=0, atol=1e-10)


def test_crate_alpha_matches_the_authors_einsum_form():
    """The overcomplete ISTA written with the authors' einsum strings (this pins D's and D1's orientation)."""
    z = SMALL["crate-alpha"]
    state = state_dict("crate-alpha", z)
    images = _images()
    with torch.no_grad():
        x = _load(nn.Conv2d(3, 48, 8, stride=8).double(), state, "conv1.")(images)
        x = x.reshape(2, 48, -1).permute(0, 2, 1)
        x = torch.cat([state["cls_token"].expand(2, 1, 48), x], dim=1) + state["pos_embedding"][:, :17]
        for i in range(2):
            pre = f"transformer.layers.{i}."
            attention = PreNorm(48, Attention(48, heads=4, dim_head=16))
            attention.norm = nn.LayerNorm(48, eps=1e-6)  # PreNorm eps 1e-6 here
            attention.fn.to_out = nn.Sequential(nn.Linear(64, 48, bias=False))  # to_out without bias
            x = _load(attention.double(), state, pre + "0.")(x) + x
            h = _load(nn.LayerNorm(48, eps=1e-6).double(), state, pre + "1.norm.")(x)
            big_d, big_d1 = state[pre + "1.fn.D"], state[pre + "1.fn.D1"]
            z1 = F.relu(0.1 * torch.einsum("pd,nlp->nld", big_d, h) - 0.1 * 0.1)
            lasso = torch.einsum("pd,nlp->nld", big_d, torch.einsum("dp,nlp->nld", big_d, z1) - h)
            z2 = F.relu(z1 - 0.1 * lasso - 0.1 * 0.1)
            x = torch.einsum("dp,nlp->nld", big_d1, z2) + x
        cls = _load(nn.LayerNorm(48).double(), state, "mlp_head.0.")(x[:, 0])
        logits = _load(nn.Linear(48, 10).double(), state, "mlp_head.1.")(cls)
    torch.testing.assert_close(forward("crate-alpha", state, images, z)["logits"], logits, rtol=0, atol=1e-10)


def _tost_literal(state, images, heads, tokens_norm):
    """ToST-vision in the authors' literal sequence of operations, with nn modules for the standard layers."""

    def ln(prefix):
        return _load(nn.LayerNorm(48, eps=1e-6).double(), state, prefix)

    x = images
    for j, (c_in, c_out) in enumerate(((3, 6), (6, 12), (12, 24), (24, 48))):
        conv = _load(
            nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False).double(), state, f"patch_embed.proj.{2 * j}.0."
        )
        bn = _load(nn.BatchNorm2d(c_out).double(), state, f"patch_embed.proj.{2 * j}.1.").eval()
        x = bn(conv(x))
        x = nn.GELU()(x) if j < 3 else x
    b, _, hp, wp = x.shape
    x = x.flatten(2).transpose(1, 2)
    # PositionalEncodingFourier (DETR style): the authors' cumsum and dim_t are float32 whatever the model's dtype.
    not_mask = torch.ones(b, hp, wp, dtype=torch.bool)
    y_embed, x_embed = not_mask.cumsum(1, dtype=torch.float32), not_mask.cumsum(2, dtype=torch.float32)
    y_embed = y_embed / (y_embed[:, -1:, :] + 1e-6) * 2 * math.pi
    x_embed = x_embed / (x_embed[:, :, -1:] + 1e-6) * 2 * math.pi
    dim_t = torch.arange(32, dtype=torch.float32)
    dim_t = 10000 ** (2 * (dim_t // 2) / 32)
    pos_x, pos_y = x_embed[..., None] / dim_t, y_embed[..., None] / dim_t
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).flatten(3)
    pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
    pos = _load(nn.Conv2d(64, 48, 1).double(), state, "pos_embeder.token_projection.")(pos.double())
    x = x + pos.reshape(b, -1, x.shape[1]).permute(0, 2, 1)

    def mlp(prefix):
        return nn.Sequential(
            _load(nn.Linear(48, 192).double(), state, prefix + "fc1."),
            nn.GELU(),
            _load(nn.Linear(192, 48).double(), state, prefix + "fc2."),
        )

    for i in range(2):
        pre = f"blocks.{i}."
        h = ln(pre + "norm1.")(x)
        w = _load(nn.Linear(48, 48).double(), state, pre + "attn.qkv.")(h)
        w = w.reshape(b, -1, heads, 48 // heads).permute(0, 2, 1, 3)  # b h n d
        w_sq = F.normalize(w, dim=-2) ** 2
        pi = nn.Softmax(dim=1)(torch.sum(w_sq, dim=-1) * state[pre + "attn.temp"])
        dots = torch.matmul((pi / (pi.sum(dim=-1, keepdim=True) + 1e-8)).unsqueeze(-2), w**2)
        out = -torch.mul(w.mul(pi.unsqueeze(-1)), 1.0 / (1 + dots))
        out = _load(nn.Linear(48, 48).double(), state, pre + "attn.to_out.0.")(out.permute(0, 2, 1, 3).flatten(2))
        x = x + state[pre + "gamma1"] * out
        x = x + state[pre + "gamma2"] * mlp(pre + "mlp.")(ln(pre + "norm2.")(x))
    x = torch.cat((state["cls_token"].expand(b, -1, -1), x), dim=1)
    for i in range(2):
        pre = f"cls_attn_blocks.{i}."
        h = ln(pre + "norm1.")(x)
        n = h.shape[1]
        qkv = _load(nn.Linear(48, 144).double(), state, pre + "attn.qkv.")(h)
        q, k, v = qkv.reshape(b, n, 3, heads, 48 // heads).permute(2, 0, 3, 1, 4)
        attn = ((q[:, :, 0:1] * k).sum(dim=-1) * (48 // heads) ** -0.5).softmax(dim=-1)
        cls = (attn.unsqueeze(2) @ v).transpose(1, 2).reshape(b, 1, 48)
        cls = _load(nn.Linear(48, 48).double(), state, pre + "attn.proj.")(cls)
        x = x + state[pre + "gamma1"] * torch.cat([cls, h[:, 1:]], dim=1)
        if tokens_norm:
            x = ln(pre + "norm2.")(x)
        else:
            x[:, 0:1] = ln(pre + "norm2.")(x[:, 0:1])
        x_res = x
        cls = state[pre + "gamma2"] * mlp(pre + "mlp.")(x[:, 0:1])
        x = x_res + torch.cat([cls, x[:, 1:]], dim=1)
    return _load(nn.Linear(48, 10).double(), state, "head.")(ln("norm.")(x)[:, 0])


@pytest.mark.parametrize("tokens_norm", [True, False])
def test_tost_matches_the_authors_literal_sequence(tokens_norm):
    z = dict(SMALL["tost"], tokens_norm=tokens_norm)
    state = state_dict("tost", z)
    images = _images()
    with torch.no_grad():
        expected = _tost_literal(state, images, heads=4, tokens_norm=tokens_norm)
    torch.testing.assert_close(forward("tost", state, images, z)["logits"], expected, rtol=0, atol=1e-10)

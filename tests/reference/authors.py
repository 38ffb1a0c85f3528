"""The papers' authors' released models, as state dicts and as eager functional forward passes.

For each family this module knows, independently of ``crate_compose``:

* the exact state-dict layout of the authors' ``nn.Module`` (key names, shapes, buffers, tied tensors), from
  which ``state_dict`` draws a random, well-conditioned checkpoint (or, on ``device="meta"``, a shape-only one);
* the authors' forward computation, re-written here as plain functions of such a state dict (``forward``).

The facts (names, shapes, eps values, the order of operations, the quirks) were read from the authors' public code;
the code below is a separate, functional transcription, not a copy of their classes:

=============== ===================================================================================================
``crate``        Ma-Lab-Berkeley/CRATE, ``model/crate.py`` (``CRATE_tiny/small/base/large``, ``pool='cls'``).
``crate-mae``    Ma-Lab-Berkeley/CRATE, ``model/crate_ae/{crate_ae,crate_encoder,crate_decoder,pos_embed}.py``
                 (``mae_crate_tiny/small/base/large``).
``crate-alpha``  UCSC-VLAA/CRATE-alpha, ``torch_inference/model/crate_alpha.py`` (``CRATE_base``, ``CRATE_large``).
``tost``         RobinWu218/ToST, ``tost_vision/tost.py`` (``tost_cab_*_p16`` registrations).
``tost-lm``      RobinWu218/ToST, ``tost_lang/model_TSSA.py`` with ``TSSA=True`` (``config/train_tost_*_ls.py``).
``crate-lm``     crate-lm/crate-lm, ``crate_overcomplete.py``.
=============== ===================================================================================================

Sizes dicts (``SIZES`` holds the published ones):

* vision: ``image_size``, ``channels``, ``patch_size``, ``d``, ``depth``, ``heads``, ``head_dim`` (crate, crate-mae,
  crate-alpha; defaults to ``d // heads``), ``classes`` (classifiers), ``class_depth`` (tost), ``ratio``
  (crate-alpha's overcomplete ratio, 4), ``tokens_norm`` (tost, default True as in every registration);
* language: ``vocab``, ``context`` (block_size), ``d``, ``depth``, ``heads``, ``bias`` (tost-lm's
  ``GPTConfig.bias``; default True, the dataclass default -- the published SIZES say False, see ``SIZES``).

Readings of the authors' code that a test could otherwise get wrong are spelled out where they are used; the
less obvious ones:

* crate: the ISTA step is ``relu(x + eta (x W - x W^T W) - eta lambda)`` with ``W`` the stored ``(d, d)`` matrix
  (this orientation), eta = lambda = 0.1; no residual around it.
* crate-mae: encoder ISTA lambda is 0.5 (``MaskedAutoencoderViT(lambd=0.5)``); block LayerNorms keep the default
  eps 1e-5, only ``norm``/``decoder_norm`` use 1e-6; ``decoder_pos_embed`` (not ``pos_embed``) is what is added at
  the encoder input; ``decoder_embed`` is never used; the decoder block is ``y = LN(x) W^T; x = y - MSSA(LN(y))``.
* crate-alpha: ``D``, ``D1`` are ``(d, ratio*d)``; ``z1 = relu(eta x D - eta lambda)``,
  ``z2 = relu(z1 - eta (z1 D^T - x) D - eta lambda)``, output ``z2 D1^T``; residuals around both blocks.
* tost: TSSA's ``Pi`` is a softmax over the HEAD axis (``nn.Softmax(dim=1)`` on ``(b, h, n)``) while ``w`` is
  L2-normalized over the TOKEN axis; class attention passes the (normed) patch tokens through unchanged, so the
  block adds ``gamma1 * norm1(x_patch)`` to them, and its MLP step adds the patch tokens to themselves
  (``x_res + cat(cls, x[:, 1:])``) -- both are what the authors' (XCiT-derived) code computes, so both are here.
* tost-lm: the causal TSSA also takes ``Pi`` as a softmax over heads; ``denom_bias[:, :T]`` is added to the
  per-coordinate ratio ``w^2 / cumsum(w^2)``.
* crate-lm: q = k = v = ``c_attn(x)``, causal softmax attention scaled by ``head_dim ** -0.5``; no residual around
  the ISTA block.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch.nn import functional as F

FAMILIES = ("crate", "crate-mae", "crate-alpha", "tost", "tost-lm", "crate-lm")

_IMAGENET = dict(image_size=224, channels=3, patch_size=16, classes=1000)

SIZES: dict[str, dict[str, dict]] = {
    # model/crate.py: CRATE_{tiny,small,base,large}, dim_head = dim // heads.
    "crate": {
        "tiny": dict(_IMAGENET, d=384, depth=12, heads=6, head_dim=64),
        "small": dict(_IMAGENET, d=576, depth=12, heads=12, head_dim=48),
        "base": dict(_IMAGENET, d=768, depth=12, heads=12, head_dim=64),
        "large": dict(_IMAGENET, d=1024, depth=24, heads=16, head_dim=64),
    },
    # model/crate_ae/crate_ae.py: mae_crate_*; the decoder repeats the encoder's width, depth and heads.
    "crate-mae": {
        "tiny": dict(image_size=224, channels=3, patch_size=16, d=384, depth=12, heads=6, head_dim=64),
        "small": dict(image_size=224, channels=3, patch_size=16, d=576, depth=12, heads=12, head_dim=48),
        "base": dict(image_size=224, channels=3, patch_size=16, d=768, depth=12, heads=12, head_dim=64),
        "large": dict(image_size=224, channels=3, patch_size=16, d=1024, depth=24, heads=16, head_dim=64),
    },
    # torch_inference/model/crate_alpha.py: CRATE_base (B/16), CRATE_large (L/14).
    "crate-alpha": {
        "base": dict(_IMAGENET, d=768, depth=12, heads=12, head_dim=64, ratio=4),
        "large": dict(_IMAGENET, patch_size=14, d=1024, depth=24, heads=16, head_dim=64, ratio=4),
    },
    # tost_vision/tost.py: tost_cab_{size}_{depth}_p16, 2 class-attention layers, tokens_norm=True.
    "tost": {
        "tiny": dict(_IMAGENET, d=192, depth=12, heads=4, class_depth=2, tokens_norm=True),
        "small": dict(_IMAGENET, d=384, depth=12, heads=8, class_depth=2, tokens_norm=True),
        "tiny-24": dict(_IMAGENET, d=192, depth=24, heads=4, class_depth=2, tokens_norm=True),
        "small-24": dict(_IMAGENET, d=384, depth=24, heads=8, class_depth=2, tokens_norm=True),
        "medium-24": dict(_IMAGENET, d=512, depth=24, heads=8, class_depth=2, tokens_norm=True),
        "large-24": dict(_IMAGENET, d=768, depth=24, heads=16, class_depth=2, tokens_norm=True),
    },
    # tost_lang/config/train_tost_{base,medium,large}_ls.py on top of train.py's defaults. train.py sets
    # ``bias = False`` and no config overrides it, so the trained models have no Linear/LayerNorm biases
    # (GPTConfig's own default is bias=True; pass bias=True for that layout).
    "tost-lm": {
        "base": dict(vocab=50304, context=1024, d=768, depth=12, heads=12, bias=False),
        "medium": dict(vocab=50304, context=1024, d=1024, depth=24, heads=16, bias=False),
        "large": dict(vocab=50304, context=1024, d=1280, depth=36, heads=20, bias=False),
    },
    # crate_overcomplete.py: CRATEConfig defaults.
    "crate-lm": {
        "base": dict(vocab=50304, context=1024, d=768, depth=12, heads=12),
    },
}

# Constants of the authors' code (plain attributes or literals, not state).
CRATE_ISTA = dict(eta=0.1, lambd=0.1)
CRATE_MAE_ISTA = dict(eta=0.1, lambd=0.5)
CRATE_ALPHA_ISTA = dict(eta=0.1, lambd=0.1)
CRATE_LM_ISTA = dict(eta=0.1, lambd=0.1)

_BUFFER_KINDS = {"bn_mean", "bn_var", "bn_count"}


# --------------------------------------------------------------------------------------------------------------
# State-dict layouts: ordered lists of (key, shape, kind), kind saying how to draw a value. ("tie", other_key)
# entries share the tensor of ``other_key`` (weight tying: the authors' state_dict() lists both keys).
# --------------------------------------------------------------------------------------------------------------


def _head_dim(sizes: dict) -> int:
    return int(sizes.get("head_dim", sizes["d"] // sizes["heads"]))


def _has_out_projection(sizes: dict) -> bool:
    # Attention(..): ``project_out = not (heads == 1 and dim_head == dim)``; otherwise to_out is an Identity.
    return not (sizes["heads"] == 1 and _head_dim(sizes) == sizes["d"])


def _ln(prefix: str, n: int, bias: bool = True) -> list:
    out = [(f"{prefix}.weight", (n,), "ln_w")]
    if bias:
        out.append((f"{prefix}.bias", (n,), "ln_b"))
    return out


def _linear(prefix: str, n_in: int, n_out: int, bias: bool = True) -> list:
    out = [(f"{prefix}.weight", (n_out, n_in), "w")]
    if bias:
        out.append((f"{prefix}.bias", (n_out,), "b"))
    return out


def _mssa_entries(prefix: str, sizes: dict, out_bias: bool) -> list:
    d, inner = sizes["d"], sizes["heads"] * _head_dim(sizes)
    out = [(f"{prefix}.qkv.weight", (inner, d), "w")]
    if _has_out_projection(sizes):
        out += _linear(f"{prefix}.to_out.0", inner, d, bias=out_bias)
    return out


def _patches(sizes: dict) -> int:
    return (sizes["image_size"] // sizes["patch_size"]) ** 2


def _spec_crate(z: dict) -> list:
    d, p, c = z["d"], z["patch_size"], z["channels"]
    patch_dim = c * p * p
    spec = [("pos_embedding", (1, _patches(z) + 1, d), "pos"), ("cls_token", (1, 1, d), "tok")]
    spec += _ln("to_patch_embedding.1", patch_dim) + _linear("to_patch_embedding.2", patch_dim, d)
    spec += _ln("to_patch_embedding.3", d)
    for i in range(z["depth"]):
        pre = f"transformer.layers.{i}"
        spec += _ln(f"{pre}.0.norm", d) + _mssa_entries(f"{pre}.0.fn", z, out_bias=True)
        spec += _ln(f"{pre}.1.norm", d) + [(f"{pre}.1.fn.weight", (d, d), "w")]
    spec += _ln("mlp_head.0", d) + _linear("mlp_head.1", d, z["classes"])
    return spec


def _spec_crate_mae(z: dict) -> list:
    d, p, c = z["d"], z["patch_size"], z["channels"]
    n = _patches(z)
    spec = [("cls_token", (1, 1, d), "tok"), ("pos_embed", (1, n + 1, d), "sincos")]
    spec += [("patch_embed.proj.weight", (d, c, p, p), "w"), ("patch_embed.proj.bias", (d,), "b")]
    for i in range(z["depth"]):
        pre = f"blocks.{i}.layers.0"
        spec += _ln(f"{pre}.0.norm", d) + _mssa_entries(f"{pre}.0.fn", z, out_bias=True)
        spec += _ln(f"{pre}.1.norm", d) + [(f"{pre}.1.fn.weight", (d, d), "w")]
    spec += _ln("norm", d) + _linear("decoder_embed", d, d)
    spec += [("mask_token", (1, 1, d), "tok"), ("decoder_pos_embed", (1, n + 1, d), "sincos")]
    for i in range(z["depth"]):
        pre = f"decoder_blocks.{i}.layers.0"
        spec += _ln(f"{pre}.0.norm", d) + [(f"{pre}.0.fn.weight", (d, d), "w")]
        spec += _ln(f"{pre}.1.norm", d) + _mssa_entries(f"{pre}.1.fn", z, out_bias=True)
    spec += _ln("decoder_norm", d) + _linear("decoder_pred", d, p * p * c)
    return spec


def _spec_crate_alpha(z: dict) -> list:
    d, p, c, r = z["d"], z["patch_size"], z["channels"], z.get("ratio", 4)
    spec = [("pos_embedding", (1, _patches(z) + 1, d), "pos"), ("cls_token", (1, 1, d), "tok")]
    spec += [("conv1.weight", (d, c, p, p), "w"), ("conv1.bias", (d,), "b")]
    for i in range(z["depth"]):
        pre = f"transformer.layers.{i}"
        spec += _ln(f"{pre}.0.norm", d) + _mssa_entries(f"{pre}.0.fn", z, out_bias=False)
        spec += _ln(f"{pre}.1.norm", d)
        # D is contracted over its first axis (x D), D1 over its second (z D1^T): scale each by that fan-in.
        spec += [(f"{pre}.1.fn.D", (d, r * d), ("w", d)), (f"{pre}.1.fn.D1", (d, r * d), ("w", r * d))]
    spec += _ln("mlp_head.0", d) + _linear("mlp_head.1", d, z["classes"])
    return spec


def _tost_conv_channels(z: dict) -> list[tuple[int, int]]:
    d = z["d"]
    if z["patch_size"] == 16:
        widths = [3, d // 8, d // 4, d // 2, d]
    elif z["patch_size"] == 8:
        widths = [3, d // 4, d // 2, d]
    else:
        raise ValueError("ToST's ConvPatchEmbed takes patch_size 8 or 16")
    return list(pairwise(widths))


def _spec_tost(z: dict) -> list:
    d, h, hidden = z["d"], z["heads"], 4 * z["d"]
    spec = [("cls_token", (1, 1, d), "tok")]
    for j, (c_in, c_out) in enumerate(_tost_conv_channels(z)):
        pre = f"patch_embed.proj.{2 * j}"  # Sequential(conv3x3, GELU, conv3x3, GELU, ...)
        spec += [
            (f"{pre}.0.weight", (c_out, c_in, 3, 3), "w"),
            (f"{pre}.1.weight", (c_out,), "bn_w"),
            (f"{pre}.1.bias", (c_out,), "bn_b"),
            (f"{pre}.1.running_mean", (c_out,), "bn_mean"),
            (f"{pre}.1.running_var", (c_out,), "bn_var"),
            (f"{pre}.1.num_batches_tracked", (), "bn_count"),
        ]
    for i in range(z["depth"]):
        pre = f"blocks.{i}"
        spec += [(f"{pre}.gamma1", (d,), "gamma"), (f"{pre}.gamma2", (d,), "gamma")]
        spec += _ln(f"{pre}.norm1", d) + _linear(f"{pre}.attn.qkv", d, d)
        spec += [(f"{pre}.attn.temp", (h, 1), "temp")] + _linear(f"{pre}.attn.to_out.0", d, d)
        spec += _ln(f"{pre}.norm2", d) + _linear(f"{pre}.mlp.fc1", d, hidden) + _linear(f"{pre}.mlp.fc2", hidden, d)
    for i in range(z.get("class_depth", 2)):
        pre = f"cls_attn_blocks.{i}"
        spec += [(f"{pre}.gamma1", (d,), "gamma"), (f"{pre}.gamma2", (d,), "gamma")]
        spec += _ln(f"{pre}.norm1", d) + _linear(f"{pre}.attn.qkv", d, 3 * d) + _linear(f"{pre}.attn.proj", d, d)
        spec += _ln(f"{pre}.norm2", d) + _linear(f"{pre}.mlp.fc1", d, hidden) + _linear(f"{pre}.mlp.fc2", hidden, d)
    spec += _ln("norm", d) + _linear("head", d, z["classes"])
    spec += [
        ("pos_embeder.token_projection.weight", (d, 64, 1, 1), "w"),
        ("pos_embeder.token_projection.bias", (d,), "b"),
    ]
    return spec


def _spec_tost_lm(z: dict) -> list:
    d, h, bias = z["d"], z["heads"], bool(z.get("bias", True))
    spec = [("transformer.wte.weight", (z["vocab"], d), "w"), ("transformer.wpe.weight", (z["context"], d), "pos")]
    for i in range(z["depth"]):
        pre = f"transformer.h.{i}"
        spec += [(f"{pre}.gamma1", (d,), "gamma"), (f"{pre}.gamma2", (d,), "gamma")]
        spec += _ln(f"{pre}.ln_1", d, bias)
        spec += [(f"{pre}.attn.temp", (h, 1), "temp"), (f"{pre}.attn.denom_bias", (h, z["context"], 1), "small")]
        spec += _linear(f"{pre}.attn.c_attn", d, d, bias) + _linear(f"{pre}.attn.c_proj", d, d, bias)
        spec += _ln(f"{pre}.ln_2", d, bias)
        spec += _linear(f"{pre}.mlp.c_fc", d, 4 * d, bias) + _linear(f"{pre}.mlp.c_proj", 4 * d, d, bias)
    spec += _ln("transformer.ln_f", d, bias)
    spec += [("lm_head.weight", (z["vocab"], d), ("tie", "transformer.wte.weight"))]
    return spec


def _spec_crate_lm(z: dict) -> list:
    d = z["d"]
    spec = [("transformer.wte.weight", (z["vocab"], d), "w"), ("transformer.wpe.weight", (z["context"], d), "pos")]
    for i in range(z["depth"]):
        pre = f"transformer.h.{i}"
        spec += _ln(f"{pre}.prenorm_1", d)
        spec += _linear(f"{pre}.attn.c_attn", d, d, bias=False) + _linear(f"{pre}.attn.c_proj", d, d, bias=True)
        spec += _ln(f"{pre}.prenorm_2", d) + [(f"{pre}.ista.weight", (4 * d, d), "w")]
    spec += _ln("transformer.ln_f", d)
    spec += [("lm_head.weight", (z["vocab"], d), ("tie", "transformer.wte.weight"))]
    return spec


_SPECS = {
    "crate": _spec_crate,
    "crate-mae": _spec_crate_mae,
    "crate-alpha": _spec_crate_alpha,
    "tost": _spec_tost,
    "tost-lm": _spec_tost_lm,
    "crate-lm": _spec_crate_lm,
}


def layout(family: str, sizes: dict) -> list[tuple[str, tuple[int, ...], object]]:
    """The authors' state-dict layout: ``(key, shape, kind)`` in their registration order."""
    if family not in _SPECS:
        raise KeyError(f"unknown family {family!r}; known: {FAMILIES}")
    return _SPECS[family](sizes)


def buffer_keys(family: str, sizes: dict) -> set[str]:
    """Keys of non-parameter buffers (BatchNorm running statistics and counters)."""
    return {key for key, _, kind in layout(family, sizes) if kind in _BUFFER_KINDS}


def tied_keys(family: str, sizes: dict) -> dict[str, str]:
    """``{key: key it shares its tensor with}``."""
    return {key: kind[1] for key, _, kind in layout(family, sizes) if isinstance(kind, tuple) and kind[0] == "tie"}


def mae_sincos_table(d: int, grid: int, dtype=torch.float64) -> torch.Tensor:
    """MAE's fixed 2-D sin-cos table, ``(1 + grid*grid, d)`` with a zero row for the class token.

    Token ``1 + i*grid + j`` (row i, column j). As in ``pos_embed.py`` (``np.meshgrid(grid_w, grid_h)`` puts the
    column coordinate first): channels ``[0, d/2)`` encode the COLUMN j, ``[d/2, d)`` the ROW i; each half is
    ``[sin(pos * omega), cos(pos * omega)]`` with ``omega_k = 10000 ** (-k / (d/4))``, k < d/4.
    """
    if d % 4:
        raise ValueError("the 2-D sin-cos table needs d divisible by 4")
    quarter = d // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, cols = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64), indexing="ij"
    )

    def one_axis(pos):
        angles = pos.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    table = torch.cat([one_axis(cols), one_axis(rows)], dim=1)
    return torch.cat([torch.zeros(1, d, dtype=torch.float64), table]).to(dtype)


def state_dict(
    family: str, sizes: dict, *, seed: int = 0, dtype=torch.float64, device="cpu"
) -> dict[str, torch.Tensor]:
    """A random state dict with exactly the authors' keys, shapes and buffers (tied keys share one tensor).

    Values are drawn on the CPU in float64 from ``torch.Generator().manual_seed(seed)`` and then moved to
    ``dtype``/``device``; with ``device="meta"`` nothing is drawn (shapes only).
    """
    meta = torch.device(device).type == "meta"
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}

    def randn(shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    for key, shape, kind in layout(family, sizes):
        if isinstance(kind, tuple) and kind[0] == "tie":
            out[key] = out[kind[1]]
            continue
        if kind == "bn_count":
            out[key] = (
                torch.empty((), dtype=torch.int64, device=device)
                if meta
                else torch.tensor(1000, dtype=torch.int64, device=device)
            )
            continue
        if meta:
            out[key] = torch.empty(shape, dtype=dtype, device=device)
            continue
        if isinstance(kind, tuple):  # ("w", fan_in)
            value = randn(shape) * kind[1] ** -0.5
        elif kind == "w":
            value = randn(shape) * math.prod(shape[1:]) ** -0.5
        elif kind in ("b", "ln_b", "bn_b"):
            value = 0.05 * randn(shape)
        elif kind in ("ln_w", "bn_w", "gamma"):
            value = 1.0 + 0.1 * randn(shape)
        elif kind in ("bn_mean", "small"):
            value = 0.1 * randn(shape)
        elif kind in ("bn_var", "temp"):  # must stay positive
            value = 0.5 + torch.rand(shape, generator=gen, dtype=torch.float64)
        elif kind in ("tok", "pos"):
            value = 0.2 * randn(shape)
        elif kind == "sincos":
            value = mae_sincos_table(shape[-1], math.isqrt(shape[1] - 1)).unsqueeze(0)
        else:  # pragma: no cover - a layout typo
            raise AssertionError(f"unknown kind {kind!r} for {key}")
        out[key] = value.to(dtype=dtype, device=device)
    return out


def parameter_count(family: str, sizes: dict) -> int:
    """Unique parameters (tied tensors once), excluding non-parameter buffers, counted on the meta device."""
    state = state_dict(family, sizes, device="meta")
    buffers = buffer_keys(family, sizes)
    seen: set[int] = set()
    total = 0
    for key, tensor in state.items():
        if key in buffers or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += tensor.numel()
    return total


# --------------------------------------------------------------------------------------------------------------
# Functional pieces.
# --------------------------------------------------------------------------------------------------------------


def _layer_norm(x, state, prefix, eps):
    weight = state[f"{prefix}.weight"]
    return F.layer_norm(x, weight.shape, weight, state.get(f"{prefix}.bias"), eps)


def _lin(x, state, prefix):
    return F.linear(x, state[f"{prefix}.weight"], state.get(f"{prefix}.bias"))


def _split_heads(u, heads):
    b, n, inner = u.shape
    return u.reshape(b, n, heads, inner // heads).transpose(1, 2)  # (b, h, n, hd)


def _merge_heads(u):
    b, h, n, hd = u.shape
    return u.transpose(1, 2).reshape(b, n, h * hd)


def _mssa(x, state, prefix, heads, *, causal=False):
    """Shared-projection attention: U = x W^T split in heads; softmax(U U^T / sqrt(hd)) U; then to_out if any."""
    u = _split_heads(F.linear(x, state[f"{prefix}.qkv.weight"]), heads)
    scores = u @ u.transpose(-1, -2) * u.shape[-1] ** -0.5
    if causal:
        n = u.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=u.device).triu(1), float("-inf"))
    out = _merge_heads(torch.softmax(scores, dim=-1) @ u)
    if f"{prefix}.to_out.0.weight" in state:
        out = _lin(out, state, f"{prefix}.to_out.0")
    return out


def _crate_ista(x, weight, eta, lambd):
    """CRATE's one-step ISTA (square dictionary): relu(x + eta (x W - x W^T W) - eta lambda)."""
    return F.relu(x + eta * (x @ weight - (x @ weight.T) @ weight) - eta * lambd)


def _patchify(images, p):
    """'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'."""
    b, c, hh, ww = images.shape
    x = images.reshape(b, c, hh // p, p, ww // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (hh // p) * (ww // p), p * p * c)


def _conv_patches(images, state, prefix, p):
    x = F.conv2d(images, state[f"{prefix}.weight"], state[f"{prefix}.bias"], stride=p)
    return x.flatten(2).transpose(1, 2)  # (b, h*w, d), row-major


def _with_class_token(x, token):
    return torch.cat([token.expand(x.shape[0], -1, -1), x], dim=1)


# --------------------------------------------------------------------------------------------------------------
# Families.
# --------------------------------------------------------------------------------------------------------------


def _forward_crate(state, images, z):
    x = _patchify(images, z["patch_size"])
    x = _layer_norm(x, state, "to_patch_embedding.1", 1e-5)
    x = _lin(x, state, "to_patch_embedding.2")
    x = _layer_norm(x, state, "to_patch_embedding.3", 1e-5)
    n = x.shape[1]
    x = _with_class_token(x, state["cls_token"]) + state["pos_embedding"][:, : n + 1]
    for i in range(z["depth"]):
        pre = f"transformer.layers.{i}"
        x = x + _mssa(_layer_norm(x, state, f"{pre}.0.norm", 1e-5), state, f"{pre}.0.fn", z["heads"])
        x = _crate_ista(_layer_norm(x, state, f"{pre}.1.norm", 1e-5), state[f"{pre}.1.fn.weight"], **CRATE_ISTA)
    cls = _layer_norm(x[:, 0], state, "mlp_head.0", 1e-5)
    return {"logits": _lin(cls, state, "mlp_head.1")}


def _forward_crate_mae(state, images, z, mask):
    x = _conv_patches(images, state, "patch_embed.proj", z["patch_size"])
    if mask is not None:
        if mask.shape != x.shape[:2]:
            raise ValueError(f"mask must be (B, N) = {tuple(x.shape[:2])}, got {tuple(mask.shape)}")
        x = torch.where(mask.to(torch.bool).unsqueeze(-1), state["mask_token"].to(x.dtype), x)
    # The authors add decoder_pos_embed here (after class and mask tokens are in place); pos_embed is unused.
    x = _with_class_token(x, state["cls_token"]) + state["decoder_pos_embed"]
    for i in range(z["depth"]):
        pre = f"blocks.{i}.layers.0"
        x = x + _mssa(_layer_norm(x, state, f"{pre}.0.norm", 1e-5), state, f"{pre}.0.fn", z["heads"])
        x = _crate_ista(_layer_norm(x, state, f"{pre}.1.norm", 1e-5), state[f"{pre}.1.fn.weight"], **CRATE_MAE_ISTA)
    latent = _layer_norm(x, state, "norm", 1e-6)
    # forward_decoder starts straight from the latent (decoder_embed is never applied, nothing is added).
    x = latent
    for i in range(z["depth"]):
        pre = f"decoder_blocks.{i}.layers.0"
        y = F.linear(_layer_norm(x, state, f"{pre}.0.norm", 1e-5), state[f"{pre}.0.fn.weight"])
        x = y - _mssa(_layer_norm(y, state, f"{pre}.1.norm", 1e-5), state, f"{pre}.1.fn", z["heads"])
    x = _lin(_layer_norm(x, state, "decoder_norm", 1e-6), state, "decoder_pred")
    return {"latent": latent, "pred": x[:, 1:]}


def _alpha_ista(x, big_d, big_d1, eta, lambd):
    """CRATE-alpha's overcomplete ISTA: two proximal steps on z (in R^{ratio*d}), decoded by D1."""
    z1 = F.relu(eta * (x @ big_d) - eta * lambd)
    z2 = F.relu(z1 - eta * ((z1 @ big_d.T - x) @ big_d) - eta * lambd)
    return z2 @ big_d1.T


def _forward_crate_alpha(state, images, z):
    x = _conv_patches(images, state, "conv1", z["patch_size"])
    n = x.shape[1]
    x = _with_class_token(x, state["cls_token"]) + state["pos_embedding"][:, : n + 1]
    for i in range(z["depth"]):
        pre = f"transformer.layers.{i}"
        x = x + _mssa(_layer_norm(x, state, f"{pre}.0.norm", 1e-6), state, f"{pre}.0.fn", z["heads"])
        x = x + _alpha_ista(
            _layer_norm(x, state, f"{pre}.1.norm", 1e-6),
            state[f"{pre}.1.fn.D"],
            state[f"{pre}.1.fn.D1"],
            **CRATE_ALPHA_ISTA,
        )
    cls = _layer_norm(x[:, 0], state, "mlp_head.0", 1e-5)  # nn.LayerNorm(dim): default eps
    return {"logits": _lin(cls, state, "mlp_head.1")}


def _fourier_positions(state, height, width, dtype):
    """PositionalEncodingFourier(hidden_dim=32, temperature=10000), 1x1-conv projected: (h*w, d), row-major.
    The authors build the features in float32 (``cumsum(..., dtype=torch.float32)``, a float32 ``dim_t``),
    whatever the model's dtype; the projection then runs in the weights' dtype."""
    hidden, eps, scale = 32, 1e-6, 2 * math.pi
    weight = state["pos_embeder.token_projection.weight"]
    f32 = dict(dtype=torch.float32, device=weight.device)
    ys = torch.arange(1, height + 1, **f32) / (height + eps) * scale
    xs = torch.arange(1, width + 1, **f32) / (width + eps) * scale
    k = torch.arange(hidden, **f32)
    dim_t = 10000 ** (2 * torch.div(k, 2, rounding_mode="floor") / hidden)
    even = torch.arange(hidden, device=weight.device) % 2 == 0

    def encode(pos):  # channel k: sin(pos / dim_t[k]) for even k, cos for odd k
        angles = pos[:, None] / dim_t
        return torch.where(even, angles.sin(), angles.cos())

    pos_y = encode(ys)[:, None, :].expand(height, width, hidden)
    pos_x = encode(xs)[None, :, :].expand(height, width, hidden)
    feats = torch.cat([pos_y, pos_x], dim=-1).reshape(height * width, 2 * hidden).to(weight.dtype)
    return F.linear(feats, weight.reshape(weight.shape[0], -1), state["pos_embeder.token_projection.bias"])


def _tssa(x, state, prefix, heads):
    """ToST's token-statistics self-attention (vision, non-causal)."""
    w = _split_heads(_lin(x, state, f"{prefix}.qkv"), heads)  # (b, h, n, hd)
    w_normed = F.normalize(w, dim=-2)  # over tokens
    pi = torch.softmax((w_normed**2).sum(-1) * state[f"{prefix}.temp"], dim=1)  # (b, h, n), over heads
    weights = pi / (pi.sum(dim=-1, keepdim=True) + 1e-8)
    dots = weights.unsqueeze(-2) @ (w**2)  # (b, h, 1, hd)
    out = -(w * pi.unsqueeze(-1)) * (1.0 / (1.0 + dots))
    return _lin(_merge_heads(out), state, f"{prefix}.to_out.0")


def _mlp(x, state, prefix, first="fc1", second="fc2"):
    return _lin(F.gelu(_lin(x, state, f"{prefix}.{first}")), state, f"{prefix}.{second}")


def _class_attention(x, state, prefix, heads):
    """CaiT class attention: the class token queries all tokens; the other tokens are returned unchanged."""
    b, n, d = x.shape
    qkv = _lin(x, state, f"{prefix}.qkv").reshape(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = torch.softmax((q[:, :, :1] * k).sum(-1) * (d // heads) ** -0.5, dim=-1)  # (b, h, n)
    cls = (attn.unsqueeze(2) @ v).transpose(1, 2).reshape(b, 1, d)
    return torch.cat([_lin(cls, state, f"{prefix}.proj"), x[:, 1:]], dim=1)


def _forward_tost(state, images, z):
    x = images
    convs = _tost_conv_channels(z)
    for j in range(len(convs)):
        pre = f"patch_embed.proj.{2 * j}"
        x = F.conv2d(x, state[f"{pre}.0.weight"], stride=2, padding=1)
        x = F.batch_norm(
            x,
            state[f"{pre}.1.running_mean"],
            state[f"{pre}.1.running_var"],
            state[f"{pre}.1.weight"],
            state[f"{pre}.1.bias"],
            training=False,
            eps=1e-5,
        )
        if j < len(convs) - 1:
            x = F.gelu(x)
    height, width = x.shape[-2:]
    x = x.flatten(2).transpose(1, 2)
    x = x + _fourier_positions(state, height, width, x.dtype)
    for i in range(z["depth"]):
        pre = f"blocks.{i}"
        x = x + state[f"{pre}.gamma1"] * _tssa(
            _layer_norm(x, state, f"{pre}.norm1", 1e-6), state, f"{pre}.attn", z["heads"]
        )
        x = x + state[f"{pre}.gamma2"] * _mlp(_layer_norm(x, state, f"{pre}.norm2", 1e-6), state, f"{pre}.mlp")
    x = _with_class_token(x, state["cls_token"])
    for i in range(z.get("class_depth", 2)):
        pre = f"cls_attn_blocks.{i}"
        x = x + state[f"{pre}.gamma1"] * _class_attention(
            _layer_norm(x, state, f"{pre}.norm1", 1e-6), state, f"{pre}.attn", z["heads"]
        )
        if z.get("tokens_norm", True):
            x = _layer_norm(x, state, f"{pre}.norm2", 1e-6)
        else:
            x = torch.cat([_layer_norm(x[:, :1], state, f"{pre}.norm2", 1e-6), x[:, 1:]], dim=1)
        cls = state[f"{pre}.gamma2"] * _mlp(x[:, :1], state, f"{pre}.mlp")
        x = x + torch.cat([cls, x[:, 1:]], dim=1)  # the authors' residual doubles the patch tokens
    cls = _layer_norm(x, state, "norm", 1e-6)[:, 0]
    return {"logits": _lin(cls, state, "head")}


def _embed_tokens(state, tokens):
    t = tokens.shape[1]
    return state["transformer.wte.weight"][tokens] + state["transformer.wpe.weight"][:t]


def _causal_tssa(x, state, prefix, heads):
    """ToST-LM's causal TSSA: every statistic is a running (cumulative) one over positions <= t."""
    t = x.shape[1]
    w = _split_heads(_lin(x, state, f"{prefix}.c_attn"), heads)  # (b, h, t, hd)
    w_sq = w**2
    ratio = w_sq / torch.cumsum(w_sq, dim=-2).clamp_min(1e-12) + state[f"{prefix}.denom_bias"][:, :t, :]
    pi = torch.softmax(ratio.sum(-1) * state[f"{prefix}.temp"], dim=1)  # (b, h, t), over heads
    dots = torch.cumsum(w_sq * pi.unsqueeze(-1), dim=-2) / (torch.cumsum(pi, dim=-1) + 1e-8).unsqueeze(-1)
    out = -(w * pi.unsqueeze(-1)) * (1.0 / (1.0 + dots))
    return _lin(_merge_heads(out), state, f"{prefix}.c_proj")


def _forward_tost_lm(state, tokens, z):
    x = _embed_tokens(state, tokens)
    for i in range(z["depth"]):
        pre = f"transformer.h.{i}"
        x = x + state[f"{pre}.gamma1"] * _causal_tssa(
            _layer_norm(x, state, f"{pre}.ln_1", 1e-5), state, f"{pre}.attn", z["heads"]
        )
        x = x + state[f"{pre}.gamma2"] * _mlp(
            _layer_norm(x, state, f"{pre}.ln_2", 1e-5), state, f"{pre}.mlp", "c_fc", "c_proj"
        )
    x = _layer_norm(x, state, "transformer.ln_f", 1e-5)
    return {"logits": F.linear(x, state["lm_head.weight"])}


def _crate_lm_ista(x, weight, eta, lambd):
    """crate-lm's overcomplete ISTA, W of shape (4d, d): two steps on z in R^{4d} from 0, decoded z W."""
    xw = x @ weight.T
    z0 = F.relu(eta * xw - eta * lambd)
    z = F.relu(z0 + eta * (xw - (z0 @ weight) @ weight.T) - eta * lambd)
    return z @ weight


def _forward_crate_lm(state, tokens, z):
    x = _embed_tokens(state, tokens)
    for i in range(z["depth"]):
        pre = f"transformer.h.{i}"
        u = _split_heads(
            F.linear(_layer_norm(x, state, f"{pre}.prenorm_1", 1e-5), state[f"{pre}.attn.c_attn.weight"]), z["heads"]
        )
        t = u.shape[-2]
        scores = (u @ u.transpose(-1, -2)) * u.shape[-1] ** -0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=u.device).triu(1), float("-inf"))
        x = x + _lin(_merge_heads(torch.softmax(scores, dim=-1) @ u), state, f"{pre}.attn.c_proj")
        x = _crate_lm_ista(
            _layer_norm(x, state, f"{pre}.prenorm_2", 1e-5), state[f"{pre}.ista.weight"], **CRATE_LM_ISTA
        )
    x = _layer_norm(x, state, "transformer.ln_f", 1e-5)
    return {"logits": F.linear(x, state["lm_head.weight"])}


def forward(
    family: str, state: dict[str, torch.Tensor], inputs: torch.Tensor, sizes: dict, *, mask: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """The authors' model output, computed from ``state`` (eval mode, dropout 0).

    classifiers -> {"logits": (B, classes)}; language models (``inputs`` int64 (B, T)) -> {"logits": (B, T, vocab)}
    for every position; crate-mae -> {"latent": (B, 1+N, d) after ``norm``, "pred": (B, N, p*p*c)} with ``mask``
    a bool (B, N), True = that patch is replaced by ``mask_token`` in place (None = nothing masked).
    """
    if mask is not None and family != "crate-mae":
        raise ValueError(f"mask only applies to crate-mae, not {family}")
    if family == "crate":
        return _forward_crate(state, inputs, sizes)
    if family == "crate-mae":
        return _forward_crate_mae(state, inputs, sizes, mask)
    if family == "crate-alpha":
        return _forward_crate_alpha(state, inputs, sizes)
    if family == "tost":
        return _forward_tost(state, inputs, sizes)
    if family == "tost-lm":
        return _forward_tost_lm(state, inputs, sizes)
    if family == "crate-lm":
        return _forward_crate_lm(state, inputs, sizes)
    raise KeyError(f"unknown family {family!r}; known: {FAMILIES}")

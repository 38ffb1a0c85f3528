"""Where each family of the authors' code keeps the tensors of each kind of step.

A :class:`Family` is a table, one :class:`Place` per kind of step: the step's role in the network
(``encoder``, ``decoder``, a stack's name...), its primitive, and for each of its tensors the
authors' name (``{layer}`` is the layer's index) and the :class:`Layout` change between the two. The
tables are written from the authors' public code, named in ``Family.code``; the tests build state
dicts with those names from an independent reading of the same code and compare outputs.

Steps are matched by role and primitive, never by the step's name in the spec, so a spec may call
its steps anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the tables are read by the command line before torch is imported
    import torch


@dataclass(frozen=True)
class Layout:
    """How a tensor's layout differs between the authors' code and ours."""

    name: str
    to_ours: Callable[[torch.Tensor], torch.Tensor]
    to_theirs: Callable[[torch.Tensor], torch.Tensor]


SAME = Layout("same", lambda t: t, lambda t: t)
TRANSPOSED = Layout("transposed", lambda t: t.t(), lambda t: t.t())
BATCHED = Layout("a leading axis of 1", lambda t: t.unsqueeze(0), lambda t: t.squeeze(0))  # (n, d) <-> (1, n, d)


@dataclass(frozen=True)
class Place:
    """The authors' names of one kind of step's tensors: ``tensors`` maps our name inside the step
    (``subspaces.weight``) to theirs (``transformer.layers.{layer}.0.fn.qkv.weight``), or to
    ``(theirs, layout)``. ``part`` narrows a stack role to its ``pre``, ``layer`` or ``post`` steps;
    ``args`` are values the authors' code fixes (a spec that differs gets a note)."""

    role: str
    primitive: str
    tensors: dict[str, str | tuple[str, Layout]]
    part: str | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def matches(self, role: str, part: str | None, primitive: str) -> bool:
        return self.role == role and self.primitive == primitive and (self.part is None or self.part == part)

    def theirs(self, ours: str, layer: int | None) -> tuple[str, Layout] | None:
        entry = self.tensors.get(ours)
        if entry is None:
            return None
        name, layout = (entry, SAME) if isinstance(entry, str) else entry
        return name.format(layer=layer), layout


@dataclass(frozen=True)
class Family:
    """One code base's checkpoints: where each step's tensors are (``places``), the tensors its forward
    never reads (``unused``: a pattern and why; skipped on import, written on export by ``fill``),
    the key its training script nests the weights under (``nest``), the spec that builds its models
    (``spec``) and how to read the sizes from a checkpoint (``sizes``)."""

    name: str
    code: str
    spec: str
    marker: str  # a tensor name only this family's checkpoints hold (how a file's family is told)
    places: tuple[Place, ...]
    sizes: Callable[[dict[str, torch.Tensor]], dict[str, int]]
    unused: dict[str, str] = field(default_factory=dict)
    fill: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    nest: str | None = None

    def place(self, role: str, part: str | None, primitive: str) -> Place | None:
        return next((p for p in self.places if p.matches(role, part, primitive)), None)

    def is_unused(self, name: str) -> str | None:
        return next((why for pattern, why in self.unused.items() if re.fullmatch(pattern, name)), None)


def pair(ours: str, theirs: str, *suffixes: str) -> dict[str, str]:
    """``{ours.weight: theirs.weight, ours.bias: theirs.bias}`` (or the given suffixes)."""
    return {f"{ours}.{s}" if ours else s: f"{theirs}.{s}" for s in (suffixes or ("weight", "bias"))}


def _count(tensors: dict[str, torch.Tensor], pattern: str) -> int:
    """How many distinct layer indices ``pattern`` (with one group) finds among the keys."""
    return len({m.group(1) for k in tensors if (m := re.match(pattern, k))})


def _image_side(positions: torch.Tensor, patch: int) -> int:
    """The image side a position table (1, 1 + side^2, d) with a class token's row implies."""
    return math.isqrt(positions.shape[1] - 1) * patch


def _conv_patches(weight: torch.Tensor, positions: torch.Tensor) -> dict[str, int]:
    """Width, patch size, channels and image side from a strided patch convolution and the position table."""
    d, patch = weight.shape[0], weight.shape[-1]
    return {"d": d, "patch_size": patch, "channels": weight.shape[1], "image_size": _image_side(positions, patch)}


# The published widths and their heads, where the checkpoint's shapes cannot tell the heads apart
# (one shared projection of K*p x d): CRATE-T/S/B/L (003 Table 1), CRATE-MAE, CRATE-alpha B and L
# (64 per head), crate-lm's GPT-2 sizes. Another width keeps the spec's heads (see exchange.infer_sizes).
HEADS_BY_WIDTH = {384: 6, 512: 8, 576: 12, 768: 12, 1024: 16, 1280: 20, 1600: 25}


def _heads(d: int, inner: int) -> dict[str, int]:
    """``inner`` (heads x head dimension, the projection's rows) and, for a published width, its heads."""
    heads = HEADS_BY_WIDTH.get(d)
    return {"inner": inner} if heads is None or inner % heads else {"heads": heads, "head_dim": inner // heads}


# --- CRATE (Ma-Lab-Berkeley/CRATE, model/crate.py) ---------------------------------------------

def _crate_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    d = t["cls_token"].shape[-1]
    patch_dim = t["to_patch_embedding.1.weight"].shape[0]
    patch = math.isqrt(patch_dim // 3)
    return {"d": d, "patch_size": patch, "image_size": _image_side(t["pos_embedding"], patch), "depth": _count(t, r"transformer\.layers\.(\d+)\."),
            "classes": t["mlp_head.1.weight"].shape[0], **_heads(d, t["transformer.layers.0.0.fn.qkv.weight"].shape[0])}


def _crate_layer(prefix: str, lambd: float = 0.1) -> tuple[Place, ...]:
    return (
        Place("encoder", "mssa", {**pair("norm", f"{prefix}.0.norm"), "subspaces.weight": f"{prefix}.0.fn.qkv.weight",
                                  **pair("out", f"{prefix}.0.fn.to_out.0")}),
        Place("encoder", "ista", {**pair("norm", f"{prefix}.1.norm"), "dictionary": f"{prefix}.1.fn.weight"},
              args={"step_size": 0.1, "lambd": lambd}),
    )


CRATE = Family(
    name="crate",
    code="Ma-Lab-Berkeley/CRATE, model/crate.py",
    spec="crate-base",
    marker="to_patch_embedding.1.weight",
    places=(
        Place("preprocess", "patch_embed", {**pair("norm_in", "to_patch_embedding.1"),
                                            **pair("project", "to_patch_embedding.2"),
                                            **pair("norm_out", "to_patch_embedding.3")}),
        Place("preprocess", "class_token", {"token": "cls_token"}),
        Place("preprocess", "positions", {"embedding": "pos_embedding"}),
        *_crate_layer("transformer.layers.{layer}"),
        Place("head", "classify", {**pair("norm", "mlp_head.0"), **pair("classifier", "mlp_head.1")}),
    ),
    sizes=_crate_sizes,
    nest="state_dict",
)


# --- CRATE-MAE (Ma-Lab-Berkeley/CRATE, model/crate_ae/) ------------------------------------------

def _mae_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    sizes = _conv_patches(t["patch_embed.proj.weight"], t["decoder_pos_embed"])
    return {**sizes, "depth": _count(t, r"blocks\.(\d+)\."),
            **_heads(sizes["d"], t["blocks.0.layers.0.0.fn.qkv.weight"].shape[0])}


def _mae_fill(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors the authors' module holds but its forward never reads: the encoder's copy of the
    position table (the forward adds ``decoder_pos_embed``) and the decoder embedding (identity here)."""
    import torch

    table = theirs["decoder_pos_embed"]
    d = table.shape[-1]
    eye = torch.eye(d, dtype=table.dtype)
    return {"pos_embed": table.clone(), "decoder_embed.weight": eye, "decoder_embed.bias": torch.zeros(d, dtype=table.dtype)}


def _mae_decoder_layer(prefix: str) -> tuple[Place, ...]:
    """The decoder block: ``y = LN(x) E^T``, then ``y - MSSA(LN y)`` (residual on the un-normalized ``y``)."""
    return (
        Place("decoder", "dictionary", {**pair("norm", f"{prefix}.0.norm"), "dictionary": f"{prefix}.0.fn.weight"}),
        Place("decoder", "mssa_ascent", {**pair("norm", f"{prefix}.1.norm"), "subspaces.weight": f"{prefix}.1.fn.qkv.weight",
                                         **pair("out", f"{prefix}.1.fn.to_out.0")}, args={"residual": "input"}),
    )


CRATE_MAE = Family(
    name="crate-mae",
    code="Ma-Lab-Berkeley/CRATE, model/crate_ae/crate_ae.py (+ crate_encoder.py, crate_decoder.py)",
    spec="crate-mae-base",
    marker="decoder_pos_embed",
    places=(
        Place("preprocess", "patch_embed", pair("project", "patch_embed.proj")),
        Place("preprocess", "mask", {"mask_token": "mask_token"}),
        Place("preprocess", "class_token", {"token": "cls_token"}),
        Place("preprocess", "positions", {"embedding": "decoder_pos_embed"}),  # the table their forward adds
        *_crate_layer("blocks.{layer}.layers.0", lambd=0.5),
        Place("encoder", "layernorm", pair("", "norm"), part="post"),
        *_mae_decoder_layer("decoder_blocks.{layer}.layers.0"),
        Place("decoder", "pixel_head", {**pair("norm", "decoder_norm"), **pair("predict", "decoder_pred")},
              args={"eps": 1e-6}),
    ),
    sizes=_mae_sizes,
    unused={r"pos_embed": "a copy of the position table; their forward adds decoder_pos_embed",
            r"decoder_embed\.(weight|bias)": "defined by their module, never used by its forward"},
    fill=_mae_fill,
    nest="model",
)


# --- CRATE-alpha (UCSC-VLAA/CRATE-alpha, torch_inference/model/crate_alpha.py) -------------------

def _alpha_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    sizes = _conv_patches(t["conv1.weight"], t["pos_embedding"])
    d = sizes["d"]
    return {**sizes, "ratio": t["transformer.layers.0.1.fn.D"].shape[1] // d,
            "depth": _count(t, r"transformer\.layers\.(\d+)\."), "classes": t["mlp_head.1.weight"].shape[0],
            **_heads(d, t["transformer.layers.0.0.fn.qkv.weight"].shape[0])}


CRATE_ALPHA = Family(
    name="crate-alpha",
    code="UCSC-VLAA/CRATE-alpha, torch_inference/model/crate_alpha.py",
    spec="crate-alpha-base16",
    marker="conv1.weight",
    places=(
        Place("preprocess", "patch_embed", pair("project", "conv1")),
        Place("preprocess", "class_token", {"token": "cls_token"}),
        Place("preprocess", "positions", {"embedding": "pos_embedding"}),
        Place("encoder", "mssa", {**pair("norm", "transformer.layers.{layer}.0.norm"),
                                  "subspaces.weight": "transformer.layers.{layer}.0.fn.qkv.weight",
                                  "out.weight": "transformer.layers.{layer}.0.fn.to_out.0.weight"},
              args={"eps": 1e-6}),
        Place("encoder", "ista_odl", {**pair("norm", "transformer.layers.{layer}.1.norm"),
                                      "dictionary": "transformer.layers.{layer}.1.fn.D",
                                      "synthesis": "transformer.layers.{layer}.1.fn.D1"},
              args={"eps": 1e-6, "step_size": 0.1, "lambd": 0.1, "synthesis": "learned", "residual": True}),
        Place("encoder", "layernorm", pair("", "mlp_head.0"), part="post", args={"eps": 1e-5}),
        Place("head", "classify", pair("classifier", "mlp_head.1"), args={"norm": False}),
    ),
    sizes=_alpha_sizes,
)


# --- ToST, vision (RobinWu218/ToST, tost_vision/tost.py; timm / XCiT names) -----------------------

def _tost_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    d = t["cls_token"].shape[-1]
    convs = _count(t, r"patch_embed\.proj\.(\d+)\.0\.weight")
    return {"d": d, "patch_size": 2 ** convs, "channels": t["patch_embed.proj.0.0.weight"].shape[1],
            "heads": t["blocks.0.attn.temp"].shape[0], "depth": _count(t, r"blocks\.(\d+)\."),
            "class_depth": _count(t, r"cls_attn_blocks\.(\d+)\."), "classes": t["head.weight"].shape[0]}


def _conv_stem(t_prefix: str, convs: int = 4) -> dict[str, str]:
    names = {}
    for i in range(convs):
        names.update(pair(f"proj.{2 * i}.0", f"{t_prefix}.{2 * i}.0", "weight"))
        names.update(pair(f"proj.{2 * i}.1", f"{t_prefix}.{2 * i}.1", "weight", "bias", "running_mean", "running_var",
                          "num_batches_tracked"))
    return names


TOST = Family(
    name="tost",
    code="RobinWu218/ToST, tost_vision/tost.py",
    spec="tost-small",
    marker="pos_embeder.token_projection.weight",
    places=(
        Place("preprocess", "conv_patch_embed", _conv_stem("patch_embed.proj")),
        Place("preprocess", "fourier_positions", pair("token_projection", "pos_embeder.token_projection")),
        Place("encoder", "tssa", {**pair("norm", "blocks.{layer}.norm1"), **pair("qkv", "blocks.{layer}.attn.qkv"),
                                  "temp": "blocks.{layer}.attn.temp", **pair("to_out", "blocks.{layer}.attn.to_out.0"),
                                  "layer_scale": "blocks.{layer}.gamma1"}, args={"eps": 1e-6}),
        Place("encoder", "mlp", {**pair("norm", "blocks.{layer}.norm2"), **pair("expand", "blocks.{layer}.mlp.fc1"),
                                 **pair("contract", "blocks.{layer}.mlp.fc2"), "layer_scale": "blocks.{layer}.gamma2"},
              args={"eps": 1e-6}),
        Place("class_attention", "class_token", {"token": "cls_token"}),
        Place("class_attention", "class_attention", {
            **pair("norm", "cls_attn_blocks.{layer}.norm1"), **pair("qkv", "cls_attn_blocks.{layer}.attn.qkv"),
            **pair("proj", "cls_attn_blocks.{layer}.attn.proj"), "layer_scale": "cls_attn_blocks.{layer}.gamma1"},
              args={"eps": 1e-6}),
        Place("class_attention", "class_mlp", {
            **pair("norm", "cls_attn_blocks.{layer}.norm2"), **pair("expand", "cls_attn_blocks.{layer}.mlp.fc1"),
            **pair("contract", "cls_attn_blocks.{layer}.mlp.fc2"), "layer_scale": "cls_attn_blocks.{layer}.gamma2"},
              args={"eps": 1e-6}),
        Place("class_attention", "layernorm", pair("", "norm"), part="post", args={"eps": 1e-6}),
        Place("head", "classify", pair("classifier", "head"), args={"norm": False}),
    ),
    sizes=_tost_sizes,
    nest="model",
)


# --- the language models (nanoGPT's names): ToST (tost_lang/model_TSSA.py) and crate-lm ---------

def _lm_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    vocab, d = t["transformer.wte.weight"].shape
    return {"vocab": vocab, "d": d, "context": t["transformer.wpe.weight"].shape[0],
            "depth": _count(t, r"transformer\.h\.(\d+)\.")}


def _tost_lm_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    return {**_lm_sizes(t), "heads": t["transformer.h.0.attn.temp"].shape[0], "bias": "transformer.ln_f.bias" in t}


def _crate_lm_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    sizes = _lm_sizes(t)
    return {**sizes, "ratio": t["transformer.h.0.ista.weight"].shape[0] // sizes["d"],
            **_heads(sizes["d"], t["transformer.h.0.attn.c_attn.weight"].shape[0])}


LM_EMBEDDINGS = (
    Place("preprocess", "token_embed", {"weight": "transformer.wte.weight"}),
    Place("preprocess", "positions", {"embedding": ("transformer.wpe.weight", BATCHED)}),
    Place("head", "lm_head", {"weight": "lm_head.weight"}),
)

TOST_LM = Family(
    name="tost-lm",
    code="RobinWu218/ToST, tost_lang/model_TSSA.py (TSSA=True)",
    spec="tost-lm-base",
    marker="transformer.h.0.attn.denom_bias",
    places=(
        *LM_EMBEDDINGS,
        Place("encoder", "tssa", {**pair("norm", "transformer.h.{layer}.ln_1"), **pair("qkv", "transformer.h.{layer}.attn.c_attn"),
                                  "temp": "transformer.h.{layer}.attn.temp",
                                  "denom_bias": "transformer.h.{layer}.attn.denom_bias",
                                  **pair("to_out", "transformer.h.{layer}.attn.c_proj"),
                                  "layer_scale": "transformer.h.{layer}.gamma1"}, args={"causal": True}),
        Place("encoder", "mlp", {**pair("norm", "transformer.h.{layer}.ln_2"), **pair("expand", "transformer.h.{layer}.mlp.c_fc"),
                                 **pair("contract", "transformer.h.{layer}.mlp.c_proj"),
                                 "layer_scale": "transformer.h.{layer}.gamma2"}),
        Place("encoder", "layernorm", pair("", "transformer.ln_f"), part="post"),
    ),
    sizes=_tost_lm_sizes,
    nest="model",
)

CRATE_LM = Family(
    name="crate-lm",
    code="crate-lm/crate-lm, crate_overcomplete.py",
    spec="crate-lm-base",
    marker="transformer.h.0.ista.weight",
    places=(
        *LM_EMBEDDINGS,
        Place("encoder", "mssa", {**pair("norm", "transformer.h.{layer}.prenorm_1"),
                                  "subspaces.weight": "transformer.h.{layer}.attn.c_attn.weight",
                                  **pair("out", "transformer.h.{layer}.attn.c_proj")}, args={"causal": True}),
        Place("encoder", "ista_odl", {**pair("norm", "transformer.h.{layer}.prenorm_2"),
                                      "dictionary": ("transformer.h.{layer}.ista.weight", TRANSPOSED)},
              args={"synthesis": "tied", "residual": False, "step_size": 0.1, "lambd": 0.1}),
        Place("encoder", "layernorm", pair("", "transformer.ln_f"), part="post"),
    ),
    sizes=_crate_lm_sizes,
    unused={r"transformer\.h\.\d+\.attn\.bias": "the causal mask, a constant"},
    nest="model",
)

FAMILIES = {f.name: f for f in (CRATE, CRATE_MAE, CRATE_ALPHA, TOST, TOST_LM, CRATE_LM)}

"""The papers' authors' code bases as families (CRATE, CRATE-MAE, CRATE-alpha, ToST, ToST's and crate-lm's
language models): where each keeps each step's tensors (:mod:`.families` says how a table reads), each
registered where it is written (:func:`.catalog.family`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .catalog import family
from .families import (
    LM_EMBEDDINGS,
    TRANSPOSED,
    Family,
    Place,
    Published,
    conv_patch_sizes,
    gpt2_sizes,
    head_sizes,
    image_side,
    layer_count,
    pair,
    preset_sizes,
)

if TYPE_CHECKING:  # the tables are read by the command line before torch is imported
    import torch


def _args(recorded: dict[str, Any]) -> dict[str, Any]:
    """The command line a DeiT/MAE-style training script saved as ``args`` (an ``argparse.Namespace``)."""
    args = recorded.get("args")
    return args if isinstance(args, dict) else {}


def _model_args(recorded: dict[str, Any], bias: bool = False) -> dict[str, Any]:
    """nanoGPT's ``model_args`` (``n_layer``, ``n_head``, ``n_embd``, ``block_size``, ``vocab_size``, ``bias``)
    in the specs' size names."""
    given = recorded.get("model_args")
    if not isinstance(given, dict):
        return {}
    names = {"n_embd": "d", "n_head": "heads", "n_layer": "depth", "block_size": "context", "vocab_size": "vocab"}
    sizes = {ours: given[theirs] for theirs, ours in names.items() if theirs in given}
    if bias and "bias" in given:
        sizes["bias"] = bool(given["bias"])
    return sizes


_P16 = {"patch_size": 16}  # a model's name fixes its architecture; classes and image size are the training's
# --- CRATE (Ma-Lab-Berkeley/CRATE, model/crate.py) ---------------------------------------------


def _channels_and_patch(patch_dim: int) -> tuple[int, int]:
    """Channels and patch side of flattened ``p x p x C`` patches: RGB if ``patch_dim / 3`` is a square, else
    grey (``p^2 = 3 q^2`` has no solution in integers, so the two never both fit)."""
    for channels in (3, 1):
        side = math.isqrt(patch_dim // channels)
        if patch_dim % channels == 0 and side * side * channels == patch_dim:
            return channels, side
    raise ValueError(f"a patch of {patch_dim} values is p x p x C for no C in (3, 1)")


def _crate_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    d = t["cls_token"].shape[-1]
    channels, patch = _channels_and_patch(t["to_patch_embedding.1.weight"].shape[0])
    return {
        "d": d,
        "patch_size": patch,
        "channels": channels,
        "image_size": image_side(t["pos_embedding"], patch),
        "depth": layer_count(t, r"transformer\.layers\.(\d+)\."),
        "classes": t["mlp_head.1.weight"].shape[0],
        **head_sizes(t["transformer.layers.0.0.fn.qkv.weight"].shape[0]),
    }


def _crate_recorded(recorded: dict[str, Any]) -> dict[str, Any]:
    """main.py saves ``arch`` (``CRATE_tiny`` ...), the name of the model it built."""
    arch = recorded.get("arch")
    return CRATE.model(arch, "the checkpoint's 'arch'") if isinstance(arch, str) else {}


_CRATE_KEYS = ("patch_size", "d", "depth", "heads", "head_dim")  # what a CRATE's name fixes
_CRATE_PRESETS = {
    "CRATE_tiny": "crate-tiny",
    "CRATE_small": "crate-small",
    "CRATE_base": "crate-base",
    "CRATE_large": "crate-large",
}


def _crate_models() -> dict[str, dict[str, Any]]:
    """model/crate.py's CRATE_tiny/small/base/large (dim_head = dim // heads): the zoo presets crate-tiny,
    crate-small, crate-base and crate-large."""
    return {name: preset_sizes(preset, _CRATE_KEYS) for name, preset in _CRATE_PRESETS.items()}


def _crate_layer(prefix: str, lambd: float = 0.1) -> tuple[Place, ...]:
    return (
        Place(
            "encoder",
            "mssa",
            {
                **pair("norm", f"{prefix}.0.norm"),
                "subspaces.weight": f"{prefix}.0.fn.qkv.weight",
                **pair("out", f"{prefix}.0.fn.to_out.0"),
            },
        ),
        Place(
            "encoder",
            "ista",
            {**pair("norm", f"{prefix}.1.norm"), "dictionary": f"{prefix}.1.fn.weight"},
            args={"step_size": 0.1, "lambd": lambd},
        ),
    )


CRATE = family(
    Family(
        name="crate",
        code="Ma-Lab-Berkeley/CRATE, model/crate.py",
        spec="crate-base",
        marker="to_patch_embedding.1.weight",
        places=(
            Place(
                "preprocess",
                "patch_embed",
                {
                    **pair("norm_in", "to_patch_embedding.1"),
                    **pair("project", "to_patch_embedding.2"),
                    **pair("norm_out", "to_patch_embedding.3"),
                },
            ),
            Place("preprocess", "class_token", {"token": "cls_token"}),
            Place("preprocess", "positions", {"embedding": "pos_embedding"}),
            *_crate_layer("transformer.layers.{layer}"),
            Place("head", "classify", {**pair("norm", "mlp_head.0"), **pair("classifier", "mlp_head.1")}),
        ),
        sizes=_crate_sizes,
        nest="state_dict",
        recorded=_crate_recorded,
        published=Published(_crate_models, _CRATE_PRESETS),
    )
)


# --- CRATE-MAE (Ma-Lab-Berkeley/CRATE, model/crate_ae/) ------------------------------------------


def _mae_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    sizes = conv_patch_sizes(t["patch_embed.proj.weight"], t["decoder_pos_embed"])
    return {
        **sizes,
        "depth": layer_count(t, r"blocks\.(\d+)\."),
        **head_sizes(t["blocks.0.layers.0.0.fn.qkv.weight"].shape[0]),
    }


def _mae_recorded(recorded: dict[str, Any]) -> dict[str, Any]:
    """MAE's main_pretrain.py saves its command line as ``args``: ``model`` (``mae_crate_base`` ...), ``input_size``."""
    args = _args(recorded)
    sizes = CRATE_MAE.model(args["model"], "the checkpoint's args.model") if isinstance(args.get("model"), str) else {}
    return {**sizes, **({"image_size": args["input_size"]} if isinstance(args.get("input_size"), int) else {})}


def _mae_fill(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors the authors' module holds but its forward never reads: the encoder's copy of the
    position table (the forward adds ``decoder_pos_embed``) and the decoder embedding (identity here)."""
    import torch

    table = theirs["decoder_pos_embed"]
    d = table.shape[-1]
    eye = torch.eye(d, dtype=table.dtype)
    return {
        "pos_embed": table.clone(),
        "decoder_embed.weight": eye,
        "decoder_embed.bias": torch.zeros(d, dtype=table.dtype),
    }


_MAE_PRESETS = {"mae_crate_small": "crate-mae-small", "mae_crate_base": "crate-mae-base"}


def _mae_models() -> dict[str, dict[str, Any]]:
    """model/crate_ae/crate_ae.py's mae_crate_*, the decoder as wide and deep as the encoder: small and base
    are the zoo presets crate-mae-small and crate-mae-base."""
    return {
        "mae_crate_tiny": {
            **_P16,
            "d": 384,
            "depth": 12,
            "heads": 6,
            "head_dim": 64,
        },  # no crate-mae preset of this size
        **{name: preset_sizes(preset, _CRATE_KEYS) for name, preset in _MAE_PRESETS.items()},
        "mae_crate_large": {**_P16, "d": 1024, "depth": 24, "heads": 16, "head_dim": 64},
    }  # no crate-mae preset of this size


def _mae_decoder_layer(prefix: str) -> tuple[Place, ...]:
    """The decoder block: ``y = LN(x) E^T``, then ``y - MSSA(LN y)`` (residual on the un-normalized ``y``)."""
    return (
        Place("decoder", "dictionary", {**pair("norm", f"{prefix}.0.norm"), "dictionary": f"{prefix}.0.fn.weight"}),
        Place(
            "decoder",
            "mssa_ascent",
            {
                **pair("norm", f"{prefix}.1.norm"),
                "subspaces.weight": f"{prefix}.1.fn.qkv.weight",
                **pair("out", f"{prefix}.1.fn.to_out.0"),
            },
            args={"residual": "input"},
        ),
    )


CRATE_MAE = family(
    Family(
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
            Place(
                "decoder",
                "pixel_head",
                {**pair("norm", "decoder_norm"), **pair("predict", "decoder_pred")},
                args={"eps": 1e-6},
            ),
        ),
        sizes=_mae_sizes,
        unused={
            r"pos_embed": "a copy of the position table; their forward adds decoder_pos_embed",
            r"decoder_embed\.(weight|bias)": "defined by their module, never used by its forward",
        },
        fill=_mae_fill,
        nest="model",
        recorded=_mae_recorded,
        published=Published(_mae_models, _MAE_PRESETS),
    )
)


# --- CRATE-alpha (UCSC-VLAA/CRATE-alpha, torch_inference/model/crate_alpha.py) -------------------


def _alpha_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    sizes = conv_patch_sizes(t["conv1.weight"], t["pos_embedding"])
    d = sizes["d"]
    return {
        **sizes,
        "ratio": t["transformer.layers.0.1.fn.D"].shape[1] // d,
        "depth": layer_count(t, r"transformer\.layers\.(\d+)\."),
        "classes": t["mlp_head.1.weight"].shape[0],
        **head_sizes(t["transformer.layers.0.0.fn.qkv.weight"].shape[0]),
    }


_ALPHA_PRESETS = {"CRATE_base": "crate-alpha-base16"}


def _alpha_models() -> dict[str, dict[str, Any]]:
    """CRATE_base (B/16: the zoo preset crate-alpha-base16) and CRATE_large (L/14); the released weights
    record no arguments."""
    return {
        "CRATE_base": preset_sizes(_ALPHA_PRESETS["CRATE_base"], (*_CRATE_KEYS, "ratio")),
        "CRATE_large": {"patch_size": 14, "d": 1024, "depth": 24, "heads": 16, "head_dim": 64, "ratio": 4},
    }  # no preset of CRATE-alpha-L/14


CRATE_ALPHA = family(
    Family(
        name="crate-alpha",
        code="UCSC-VLAA/CRATE-alpha, torch_inference/model/crate_alpha.py",
        spec="crate-alpha-base16",
        marker="conv1.weight",
        places=(
            Place("preprocess", "patch_embed", pair("project", "conv1")),
            Place("preprocess", "class_token", {"token": "cls_token"}),
            Place("preprocess", "positions", {"embedding": "pos_embedding"}),
            Place(
                "encoder",
                "mssa",
                {
                    **pair("norm", "transformer.layers.{layer}.0.norm"),
                    "subspaces.weight": "transformer.layers.{layer}.0.fn.qkv.weight",
                    "out.weight": "transformer.layers.{layer}.0.fn.to_out.0.weight",
                },
                args={"eps": 1e-6},
            ),
            Place(
                "encoder",
                "ista_odl",
                {
                    **pair("norm", "transformer.layers.{layer}.1.norm"),
                    "dictionary": "transformer.layers.{layer}.1.fn.D",
                    "synthesis": "transformer.layers.{layer}.1.fn.D1",
                },
                args={"eps": 1e-6, "step_size": 0.1, "lambd": 0.1, "synthesis": "learned", "residual": True},
            ),
            Place("encoder", "layernorm", pair("", "mlp_head.0"), part="post", args={"eps": 1e-5}),  # nn.LayerNorm(dim)
            Place("head", "classify", pair("classifier", "mlp_head.1"), args={"norm": False}),
        ),
        sizes=_alpha_sizes,
        published=Published(_alpha_models, _ALPHA_PRESETS),
    )
)


# --- ToST, vision (RobinWu218/ToST, tost_vision/tost.py; timm / XCiT names) -----------------------


def _tost_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    d = t["cls_token"].shape[-1]
    convs = layer_count(t, r"patch_embed\.proj\.(\d+)\.0\.weight")
    return {
        "d": d,
        "patch_size": 2**convs,
        "channels": t["patch_embed.proj.0.0.weight"].shape[1],
        "heads": t["blocks.0.attn.temp"].shape[0],
        "depth": layer_count(t, r"blocks\.(\d+)\."),
        "class_depth": layer_count(t, r"cls_attn_blocks\.(\d+)\."),
        "classes": t["head.weight"].shape[0],
    }


def _tost_recorded(recorded: dict[str, Any]) -> dict[str, Any]:
    """DeiT's main.py saves its command line as ``args``: ``model`` (``tost_cab_small_12_p16`` ...),
    ``input_size`` and ``nb_classes``."""
    args = _args(recorded)
    sizes = TOST.model(args["model"], "the checkpoint's args.model") if isinstance(args.get("model"), str) else {}
    for theirs, ours in (("input_size", "image_size"), ("nb_classes", "classes")):
        if isinstance(args.get(theirs), int):
            sizes[ours] = args[theirs]
    return sizes


_TOST_PRESETS = {"tost_cab_tiny_12_p16": "tost-tiny", "tost_cab_small_12_p16": "tost-small"}


def _tost_models() -> dict[str, dict[str, Any]]:
    """tost.py's registrations ``tost_cab_{size}_{depth}_p{patch}``: width, heads and the 2 class-attention
    layers by size (tiny and small as the zoo presets tost-tiny and tost-small state them), depth and patch
    by name."""
    widths = {
        "tiny": preset_sizes("tost-tiny", ("d", "heads", "class_depth")),
        "small": preset_sizes("tost-small", ("d", "heads", "class_depth")),
        "medium": {"d": 512, "heads": 8, "class_depth": 2},  # no preset of this size
        "large": {"d": 768, "heads": 16, "class_depth": 2},
    }  # no preset of this size
    models = {}
    for size, width in widths.items():
        for depth in (12, 24) if size in ("tiny", "small") else (24,):
            for patch in (16, 8):
                models[f"tost_cab_{size}_{depth}_p{patch}"] = {
                    "d": width["d"],
                    "heads": width["heads"],
                    "depth": depth,
                    "patch_size": patch,
                    "class_depth": width["class_depth"],
                }
    return models


def _conv_stem(t_prefix: str, convs: int = 4) -> dict[str, str]:
    names = {}
    for i in range(convs):
        names.update(pair(f"proj.{2 * i}.0", f"{t_prefix}.{2 * i}.0", "weight"))
        names.update(
            pair(
                f"proj.{2 * i}.1",
                f"{t_prefix}.{2 * i}.1",
                "weight",
                "bias",
                "running_mean",
                "running_var",
                "num_batches_tracked",
            )
        )
    return names


TOST = family(
    Family(
        name="tost",
        code="RobinWu218/ToST, tost_vision/tost.py",
        spec="tost-small",
        marker="pos_embeder.token_projection.weight",
        places=(
            Place("preprocess", "conv_patch_embed", _conv_stem("patch_embed.proj")),
            Place("preprocess", "fourier_positions", pair("token_projection", "pos_embeder.token_projection")),
            Place(
                "encoder",
                "tssa",
                {
                    **pair("norm", "blocks.{layer}.norm1"),
                    **pair("qkv", "blocks.{layer}.attn.qkv"),
                    "temp": "blocks.{layer}.attn.temp",
                    **pair("to_out", "blocks.{layer}.attn.to_out.0"),
                    "layer_scale": "blocks.{layer}.gamma1",
                },
                args={"eps": 1e-6},
            ),
            Place(
                "encoder",
                "mlp",
                {
                    **pair("norm", "blocks.{layer}.norm2"),
                    **pair("expand", "blocks.{layer}.mlp.fc1"),
                    **pair("contract", "blocks.{layer}.mlp.fc2"),
                    "layer_scale": "blocks.{layer}.gamma2",
                },
                args={"eps": 1e-6},
            ),
            Place("class_attention", "class_token", {"token": "cls_token"}),
            Place(
                "class_attention",
                "class_attention",
                {
                    **pair("norm", "cls_attn_blocks.{layer}.norm1"),
                    **pair("qkv", "cls_attn_blocks.{layer}.attn.qkv"),
                    **pair("proj", "cls_attn_blocks.{layer}.attn.proj"),
                    "layer_scale": "cls_attn_blocks.{layer}.gamma1",
                },
                args={"eps": 1e-6},
            ),
            Place(
                "class_attention",
                "class_mlp",
                {
                    **pair("norm", "cls_attn_blocks.{layer}.norm2"),
                    **pair("expand", "cls_attn_blocks.{layer}.mlp.fc1"),
                    **pair("contract", "cls_attn_blocks.{layer}.mlp.fc2"),
                    "layer_scale": "cls_attn_blocks.{layer}.gamma2",
                },
                args={"eps": 1e-6},
            ),
            Place("class_attention", "layernorm", pair("", "norm"), part="post", args={"eps": 1e-6}),
            Place("head", "classify", pair("classifier", "head"), args={"norm": False}),
        ),
        sizes=_tost_sizes,
        nest="model",
        recorded=_tost_recorded,
        published=Published(_tost_models, _TOST_PRESETS),
    )
)


# --- the language models (nanoGPT's names): ToST (tost_lang/model_TSSA.py) and crate-lm ---------


def _tost_lm_sizes(t: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {**gpt2_sizes(t), "heads": t["transformer.h.0.attn.temp"].shape[0], "bias": "transformer.ln_f.bias" in t}


def _crate_lm_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    sizes = gpt2_sizes(t)
    return {
        **sizes,
        "ratio": t["transformer.h.0.ista.weight"].shape[0] // sizes["d"],
        **head_sizes(t["transformer.h.0.attn.c_attn.weight"].shape[0]),
    }


_CRATE_LM_PRESETS = {"crate": "crate-lm-base"}


def _crate_lm_models() -> dict[str, dict[str, Any]]:
    """CRATE.from_pretrained's table (train.py records model_args, which come first): ``crate`` is the zoo
    preset crate-lm-base; the others are in no preset."""
    return {
        "crate-1l": {"d": 768, "depth": 1, "heads": 1},  # no preset of this size
        "crate": preset_sizes(_CRATE_LM_PRESETS["crate"], ("d", "depth", "heads")),
        "crate-medium": {"d": 1024, "depth": 24, "heads": 16},  # no preset of this size
        "crate-large": {"d": 1280, "depth": 36, "heads": 20},  # no preset of this size
        "crate-xl": {"d": 1600, "depth": 48, "heads": 25},
    }  # no preset of this size


TOST_LM = family(
    Family(
        name="tost-lm",
        code="RobinWu218/ToST, tost_lang/model_TSSA.py (TSSA=True)",
        spec="tost-lm-base",
        marker="transformer.h.0.attn.denom_bias",
        places=(
            *LM_EMBEDDINGS,
            Place(
                "encoder",
                "tssa",
                {
                    **pair("norm", "transformer.h.{layer}.ln_1"),
                    **pair("qkv", "transformer.h.{layer}.attn.c_attn"),
                    "temp": "transformer.h.{layer}.attn.temp",
                    "denom_bias": "transformer.h.{layer}.attn.denom_bias",
                    **pair("to_out", "transformer.h.{layer}.attn.c_proj"),
                    "layer_scale": "transformer.h.{layer}.gamma1",
                },
                args={"causal": True},
            ),
            Place(
                "encoder",
                "mlp",
                {
                    **pair("norm", "transformer.h.{layer}.ln_2"),
                    **pair("expand", "transformer.h.{layer}.mlp.c_fc"),
                    **pair("contract", "transformer.h.{layer}.mlp.c_proj"),
                    "layer_scale": "transformer.h.{layer}.gamma2",
                },
            ),
            Place("encoder", "layernorm", pair("", "transformer.ln_f"), part="post"),
        ),
        sizes=_tost_lm_sizes,
        nest="model",
        recorded=lambda recorded: _model_args(recorded, bias=True),
    )
)

CRATE_LM = family(
    Family(
        name="crate-lm",
        code="crate-lm/crate-lm, crate_overcomplete.py",
        spec="crate-lm-base",
        marker="transformer.h.0.ista.weight",
        places=(
            *LM_EMBEDDINGS,
            Place(
                "encoder",
                "mssa",
                {
                    **pair("norm", "transformer.h.{layer}.prenorm_1"),
                    "subspaces.weight": "transformer.h.{layer}.attn.c_attn.weight",
                    **pair("out", "transformer.h.{layer}.attn.c_proj"),
                },
                args={"causal": True},
            ),
            Place(
                "encoder",
                "ista_odl",
                {
                    **pair("norm", "transformer.h.{layer}.prenorm_2"),
                    "dictionary": ("transformer.h.{layer}.ista.weight", TRANSPOSED),
                },
                args={"synthesis": "tied", "residual": False, "step_size": 0.1, "lambd": 0.1},
            ),
            Place("encoder", "layernorm", pair("", "transformer.ln_f"), part="post"),
        ),
        sizes=_crate_lm_sizes,
        unused={r"transformer\.h\.\d+\.attn\.bias": "the causal mask, a constant"},
        nest="model",
        recorded=lambda recorded: _model_args(recorded),
        published=Published(_crate_lm_models, _CRATE_LM_PRESETS),
    )
)

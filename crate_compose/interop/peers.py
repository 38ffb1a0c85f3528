"""The baselines' own releases as families: timm's ViT and transformers' GPT-2 (names as their hubs hold them).

The specs compute what these peers compute (``specs/vit.yaml`` is timm's ``VisionTransformer`` with class
pooling, ``specs/gpt2.yaml`` transformers' ``GPT2LMHeadModel``), so their released weights import into the
zoo presets ``vit-tiny``/``vit-small`` and ``gpt2-small`` (at the sizes the file gives), and a comparison of
a CRATE with a pretrained peer runs both through the same commands. Neither package is imported here: the
tables are written from their public code, named in ``Family.code``, and tests/test_peers.py compares the
imported networks with timm's and transformers' own forward passes.

A hub folder keeps ``config.json`` beside ``model.safetensors`` (:attr:`.reading.Checkpoint.recorded`
``["config"]``): timm's names the architecture (``vit_small_patch16_224``, sizes by :attr:`Family.published`)
and may record ``model_args`` and ``pretrained_cfg.input_size``; transformers' gives ``n_embd``, ``n_head``,
``n_layer``, ``n_positions`` and ``vocab_size``.
"""

from __future__ import annotations

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
    layer_count,
    pair,
    preset_sizes,
)

if TYPE_CHECKING:  # read by the command line before torch is imported
    import torch


def _config(recorded: dict[str, Any]) -> dict[str, Any]:
    """The hub's ``config.json`` beside the weights, if any (:func:`.reading._hub_config`)."""
    config = recorded.get("config")
    return config if isinstance(config, dict) else {}


def _side(value: Any) -> int | None:
    """An image side given as ``N`` or ``[N, N]`` (timm's ``img_size``); None for anything else."""
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _count_of(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# --- timm's VisionTransformer (huggingface/pytorch-image-models, timm/models/vision_transformer.py) ----

_NOT_TIMM_VIT = ("cls_attn_blocks.", "pos_embeder.", "decoder_")  # CaiT and ToST; CRATE-MAE and MAE's decoder


def _holds_timm_vit(t: dict[str, torch.Tensor]) -> bool:
    """timm's ViT names (``blocks.N.attn.qkv`` of shape (3d, d), ``patch_embed.proj``, ``pos_embed``,
    ``cls_token``), and none of the names of the families that share some of them: ToST (``pos_embeder``,
    ``cls_attn_blocks``, a convolutional stem ``patch_embed.proj.0.0``), CaiT (``cls_attn_blocks``) and
    CRATE-MAE (``blocks.N.layers``, no ``blocks.N.attn``; ``decoder_pos_embed``)."""
    qkv = t.get("blocks.0.attn.qkv.weight")
    return (
        qkv is not None
        and qkv.dim() == 2
        and qkv.shape[0] == 3 * qkv.shape[1]
        and all(k in t for k in ("patch_embed.proj.weight", "pos_embed", "cls_token"))
        and not any(k.startswith(_NOT_TIMM_VIT) for k in t)
    )


def _timm_vit_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    """Width, patch, channels and image side (the conv and ``pos_embed`` (1, 1 + N, d)), depth and classes
    (``head``; a headless file, ``num_classes=0``, gives none); the heads are not in the shapes."""
    sizes = {
        **conv_patch_sizes(t["patch_embed.proj.weight"], t["pos_embed"]),
        "depth": layer_count(t, r"blocks\.(\d+)\."),
        **head_sizes(t["blocks.0.attn.qkv.weight"].shape[0] // 3),
    }
    if "head.weight" in t:
        sizes["classes"] = t["head.weight"].shape[0]
    return sizes


def _timm_vit_recorded(recorded: dict[str, Any]) -> dict[str, Any]:
    """timm's hub ``config.json``: ``architecture`` (a name of :data:`TIMM_VIT`'s ``published``: its sizes;
    another name gives none, the sizes then come from the shapes), ``num_classes``,
    ``pretrained_cfg.input_size`` ([C, H, W]) and, in files timm's ``save_for_hf`` wrote, ``model_args`` (the
    arguments the model was built with: ``embed_dim``, ``depth``, ``num_heads``, ``patch_size``, ``img_size``,
    ``in_chans``, ``num_classes``), each later one winning. A pooling other than the class token's is refused."""
    config = _config(recorded)
    if not config:
        return {}
    args = config.get("model_args") if isinstance(config.get("model_args"), dict) else {}
    pools = (("global_pool", config.get("global_pool")), ("model_args.global_pool", args.get("global_pool")))
    for where, pool in pools:
        if pool not in (None, "token"):
            raise ValueError(
                f"config.json's {where} is {pool!r}: the vit spec classifies the class token "
                "(timm's global_pool='token')"
            )
    architecture = config.get("architecture")
    architecture = architecture.partition(".")[0] if isinstance(architecture, str) else None  # a hub tag aside
    known = architecture in TIMM_VIT.published
    sizes = dict(TIMM_VIT.published[architecture]) if known else {}
    if _count_of(config.get("num_classes")):
        sizes["classes"] = config["num_classes"]
    pretrained = config.get("pretrained_cfg") if isinstance(config.get("pretrained_cfg"), dict) else {}
    shape = pretrained.get("input_size")
    if isinstance(shape, list) and len(shape) == 3 and _count_of(shape[0]) and _side(shape[1:]):
        sizes.update(channels=shape[0], image_size=shape[1])
    for theirs, ours in (
        ("embed_dim", "d"),
        ("depth", "depth"),
        ("num_heads", "heads"),
        ("patch_size", "patch_size"),
        ("in_chans", "channels"),
        ("num_classes", "classes"),
    ):
        if _count_of(args.get(theirs)):
            sizes[ours] = args[theirs]
    if _side(args.get("img_size")):
        sizes["image_size"] = _side(args["img_size"])
    return sizes


_TIMM_VIT_PRESETS = {"vit_tiny_patch16_224": "vit-tiny", "vit_small_patch16_224": "vit-small"}


def _timm_vit_models() -> dict[str, dict[str, Any]]:
    """timm's registrations of the plain ViT (``vit_{size}_patch{P}_{image}``, and DeiT's without distillation,
    the same module in deit.py): one pre-norm block of MHSA and a 4x GELU MLP, LayerNorm eps 1e-6, class
    pooling. Widths, heads and depth by size (tiny and small as the zoo presets vit-tiny and vit-small state
    them), patch and image side by name."""
    width = ("d", "heads", "depth")
    widths = {
        "tiny": preset_sizes("vit-tiny", width),
        "small": preset_sizes("vit-small", width),
        "base": {"d": 768, "heads": 12, "depth": 12},  # no preset of this size
        "large": {"d": 1024, "heads": 16, "depth": 24},
    }  # no preset of this size
    registered = {
        "tiny": ("16_224", "16_384"),
        "small": ("8_224", "16_224", "16_384", "32_224", "32_384"),
        "base": ("8_224", "16_224", "16_384", "32_224", "32_384"),
        "large": ("14_224", "16_224", "16_384", "32_224", "32_384"),
    }
    deit = {"tiny": ("16_224",), "small": ("16_224",), "base": ("16_224", "16_384")}
    models = {}
    for prefix, table in (("vit", registered), ("deit", deit)):
        for size, names in table.items():
            for name in names:
                patch, image = (int(v) for v in name.split("_"))
                models[f"{prefix}_{size}_patch{name}"] = {**widths[size], "patch_size": patch, "image_size": image}
    return models


TIMM_VIT = family(
    Family(
        name="timm-vit",
        code="huggingface/pytorch-image-models (timm), timm/models/vision_transformer.py (VisionTransformer)",
        spec="vit-small",
        marker=_holds_timm_vit,
        places=(
            Place(
                "preprocess",
                "patch_embed",
                pair("project", "patch_embed.proj"),
                args={"projection": "conv", "norm": False},
            ),
            Place("preprocess", "class_token", {"token": "cls_token"}),
            Place("preprocess", "positions", {"embedding": "pos_embed"}),
            Place(
                "encoder",
                "mhsa",
                {
                    **pair("norm", "blocks.{layer}.norm1"),
                    **pair("qkv", "blocks.{layer}.attn.qkv"),
                    **pair("out", "blocks.{layer}.attn.proj"),
                },
                args={"eps": 1e-6, "causal": False},
            ),
            Place(
                "encoder",
                "mlp",
                {
                    **pair("norm", "blocks.{layer}.norm2"),
                    **pair("expand", "blocks.{layer}.mlp.fc1"),
                    **pair("contract", "blocks.{layer}.mlp.fc2"),
                },
                args={"eps": 1e-6, "gelu": "exact"},
            ),
            # timm normalizes every token with `norm`, then takes the class token; ours takes it, then normalizes
            Place(
                "head",
                "classify",
                {**pair("norm", "norm"), **pair("classifier", "head")},
                args={"eps": 1e-6, "pool": "cls"},
            ),
        ),
        sizes=_timm_vit_sizes,
        recorded=_timm_vit_recorded,
        published=Published(_timm_vit_models, _TIMM_VIT_PRESETS),
    )
)


# --- transformers' GPT-2 (huggingface/transformers, models/gpt2/modeling_gpt2.py) --------------------

_GPT2_BARE = ("wte.", "wpe.", "h.", "ln_f.")  # GPT2Model's names: the hub's original gpt2/model.safetensors
_NOT_GPT2 = ("attn.denom_bias", ".ista.weight")  # the nanoGPT-named language models: tost-lm, crate-lm


def _gpt2_names(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's names for either layout of the hub's files: the original ``gpt2/model.safetensors``
    names GPT2Model's tensors (``wte.weight``, ``h.0.attn.c_attn.weight``: ``transformer.`` added here), and
    neither it nor ``save_pretrained`` writes the head tied to ``wte`` (``lm_head.weight``: ``wte``'s tensor)."""
    if "transformer.wte.weight" not in t and "wte.weight" in t:
        t = {f"transformer.{k}" if k.startswith(_GPT2_BARE) else k: v for k, v in t.items()}
    if "lm_head.weight" not in t and "transformer.wte.weight" in t:
        t = {**t, "lm_head.weight": t["transformer.wte.weight"]}
    return t


def _holds_gpt2(t: dict[str, torch.Tensor]) -> bool:
    """transformers' GPT-2 names in either layout, with ``c_attn`` a Conv1D (d, 3d); nanoGPT's files share the
    names but hold Linear layers ((3d, d): not this family), and ToST-LM's and crate-lm's hold ``denom_bias``
    or ``ista`` besides."""
    prefix = "transformer." if "transformer.wte.weight" in t else "" if "wte.weight" in t else None
    if prefix is None:
        return False
    c_attn = t.get(f"{prefix}h.0.attn.c_attn.weight")
    return (
        c_attn is not None
        and c_attn.dim() == 2
        and c_attn.shape[1] == 3 * c_attn.shape[0]
        and not any(k.endswith(_NOT_GPT2) for k in t)
    )


def _gpt2_sizes(t: dict[str, torch.Tensor]) -> dict[str, int]:
    """Vocabulary and width (``wte``), context (``wpe``), depth; the heads are not in the shapes."""
    return {**gpt2_sizes(t), **head_sizes(t["transformer.h.0.attn.c_attn.weight"].shape[1] // 3)}


_GPT2_COMPUTES = {  # config.json entries that change what the model computes, and the value the spec computes with
    "activation_function": ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"),  # GELU's tanh approximation
    "layer_norm_epsilon": (1e-5,),
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
}


def _gpt2_recorded(recorded: dict[str, Any]) -> dict[str, Any]:
    """transformers' ``config.json``: ``n_embd``, ``n_head``, ``n_layer``, ``n_positions`` (older files: ``n_ctx``)
    and ``vocab_size`` in the spec's size names. An entry that makes the model compute otherwise than the
    spec (another activation or LayerNorm eps, attention scaled by the layer) is refused, naming it."""
    config = _config(recorded)
    if config.get("model_type") not in (None, "gpt2"):
        raise ValueError(f"config.json's model_type is {config['model_type']!r}, not 'gpt2'")
    for key, computed in _GPT2_COMPUTES.items():
        if key in config and config[key] not in computed:
            raise ValueError(
                f"config.json's {key} is {config[key]!r}; the gpt2 spec computes with {' / '.join(map(repr, computed))}"
            )
    names = {
        "n_embd": "d",
        "n_head": "heads",
        "n_layer": "depth",
        "n_ctx": "context",
        "n_positions": "context",
        "vocab_size": "vocab",
    }  # n_positions after n_ctx: it wins where both are given
    return {ours: config[theirs] for theirs, ours in names.items() if _count_of(config.get(theirs))}


_GPT2_LAYER = "transformer.h.{layer}"
_GPT2_PRESETS = {"gpt2": "gpt2-small"}


def _gpt2_models() -> dict[str, dict[str, Any]]:
    """The hub's GPT-2 releases (openai-community/gpt2*, distilbert/distilgpt2): ``gpt2`` is the zoo preset
    gpt2-small, whose context (1024) and vocabulary (50257) every release shares; the others' width, heads
    and depth are in no preset."""
    small = preset_sizes(_GPT2_PRESETS["gpt2"], ("d", "heads", "depth", "context", "vocab"))
    shared = {"context": small["context"], "vocab": small["vocab"]}
    others = {
        "gpt2-medium": (1024, 16, 24),
        "gpt2-large": (1280, 20, 36),
        "gpt2-xl": (1600, 25, 48),
        "distilgpt2": (768, 12, 6),
    }  # no preset of these sizes
    return {
        "gpt2": small,
        **{name: {"d": d, "heads": heads, "depth": depth, **shared} for name, (d, heads, depth) in others.items()},
    }


GPT2 = family(
    Family(
        name="gpt2",
        code="huggingface/transformers, models/gpt2/modeling_gpt2.py (GPT2LMHeadModel)",
        spec="gpt2-small",
        marker=_holds_gpt2,
        places=(
            *LM_EMBEDDINGS,  # wte, wpe (context, d), and lm_head tied to wte
            Place(
                "encoder",
                "mhsa",
                {
                    **pair("norm", f"{_GPT2_LAYER}.ln_1"),
                    "qkv.weight": (f"{_GPT2_LAYER}.attn.c_attn.weight", TRANSPOSED),  # Conv1D: (d, 3d)
                    "qkv.bias": f"{_GPT2_LAYER}.attn.c_attn.bias",
                    "out.weight": (f"{_GPT2_LAYER}.attn.c_proj.weight", TRANSPOSED),
                    "out.bias": f"{_GPT2_LAYER}.attn.c_proj.bias",
                },
                args={"causal": True, "eps": 1e-5},
            ),
            Place(
                "encoder",
                "mlp",
                {
                    **pair("norm", f"{_GPT2_LAYER}.ln_2"),
                    "expand.weight": (f"{_GPT2_LAYER}.mlp.c_fc.weight", TRANSPOSED),
                    "expand.bias": f"{_GPT2_LAYER}.mlp.c_fc.bias",
                    "contract.weight": (f"{_GPT2_LAYER}.mlp.c_proj.weight", TRANSPOSED),
                    "contract.bias": f"{_GPT2_LAYER}.mlp.c_proj.bias",
                },
                args={"gelu": "tanh", "eps": 1e-5},
            ),
            Place("encoder", "layernorm", pair("", "transformer.ln_f"), part="post", args={"eps": 1e-5}),
        ),
        sizes=_gpt2_sizes,
        unused={r"transformer\.h\.\d+\.attn\.(bias|masked_bias)": "the causal mask (older files hold it), a constant"},
        recorded=_gpt2_recorded,
        published=Published(_gpt2_models, _GPT2_PRESETS),
        canonical=_gpt2_names,
    )
)

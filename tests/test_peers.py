"""The baselines' own releases: timm's ViT and transformers' GPT-2 import into the zoo's specs.

timm and transformers are test extras (never imported by crate_compose): each builds its model at a small,
unpublished size with random weights in float64, saves it as its hub holds it (``model.safetensors`` beside
``config.json``), and the imported network's logits are compared with the peer's own forward. At the published
sizes the names, shapes and sizes are checked on the meta device only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from authors_files import SMALL, saved
from reference.authors import state_dict
from safetensors.torch import save_file

import crate_compose as cc
from crate_compose.interop.catalog import FAMILIES
from crate_compose.interop.exchange import (
    detect,
    export_checkpoint,
    import_checkpoint,
    in_family_names,
    infer_sizes,
    load_checkpoint,
    write_checkpoint,
)
from crate_compose.interop.peers import GPT2, TIMM_VIT
from crate_compose.interop.reading import Checkpoint, InteropError, read_checkpoint


def _peers():
    """timm and transformers, imported after torchvision: the CUDA build of torchvision PyPI serves beside this
    project's CPU torch fails on import unless its missing operators are declared first (what the training
    pipeline does, :func:`crate_compose.data.batches.transforms_v2`), and both import it when present."""
    from crate_compose.data.batches import transforms_v2

    transforms_v2()
    return pytest.importorskip("timm"), pytest.importorskip("transformers")


timm, transformers = _peers()
pytestmark = pytest.mark.usefixtures("one_thread")

TOLERANCE = 1e-12
VIT = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, num_classes=10)  # an unpublished size
GPT = dict(n_embd=48, n_layer=2, n_head=3, n_positions=32, vocab_size=100)


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` in float64 with every parameter random (biases and LayerNorms too), in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    model = model.double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=torch.float64) * 0.3)
    return model


def timm_vit(seed: int = 0) -> torch.nn.Module:
    return randomized(timm.create_model("vit_small_patch16_224", **VIT), seed)


def gpt2(seed: int = 0) -> torch.nn.Module:
    config = transformers.GPT2Config(**GPT, bos_token_id=0, eos_token_id=0)
    return randomized(transformers.GPT2LMHeadModel(config), seed)


def hub_vit(folder: Path, model: torch.nn.Module) -> Path:
    """The folder timm's ``save_for_hf`` writes (``push_to_hub``): config.json names the architecture and records
    the ``model_args`` it was built with (given outright, so that whichever timm writes the file records them)."""
    from timm.models._hub import save_for_hf

    save_for_hf(model, folder, model_args=dict(VIT), safe_serialization=True)
    return folder / "model.safetensors"


def hub_gpt2(folder: Path, model: torch.nn.Module) -> Path:
    model.save_pretrained(folder, safe_serialization=True)  # transformer.-prefixed names, the tied lm_head dropped
    return folder / "model.safetensors"


def images(seed: int = 1) -> torch.Tensor:
    return torch.randn(
        3, 3, VIT["img_size"], VIT["img_size"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def tokens(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, GPT["vocab_size"], (2, GPT["n_positions"] - 5), generator=generator)


def difference(ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        mine = ours.eval()(x)["output"]
        peer = theirs(x)
        peer = peer.logits if hasattr(peer, "logits") else peer
    assert mine.shape == peer.shape
    return (mine - peer).abs().max().item()


def test_the_peers_are_families():
    peers = [f for f in FAMILIES.values() if f.declared_in == "crate_compose.interop.peers"]
    assert (
        {f.name for f in peers} == {"timm-vit", "gpt2"}
        and FAMILIES["gpt2"] is GPT2
        and FAMILIES["timm-vit"] is TIMM_VIT
    )


# ---------------------------------------------------------------- timm's ViT


def test_a_timm_hub_folder_imports_into_vit_small_and_computes_what_timm_computes(tmp_path):
    model = timm_vit()
    imported = import_checkpoint("vit-small", hub_vit(tmp_path, model))  # sizes and heads from config.json
    assert imported.family is TIMM_VIT
    assert next(imported.module.parameters()).dtype == torch.float64
    assert imported.sizes == {"d": 48, "patch_size": 8, "image_size": 32, "depth": 2, "classes": 10, "heads": 4}
    assert not any("computes with" in note for note in imported.notes), imported.notes
    assert difference(imported.module, model, images()) < TOLERANCE


def hub_config_without_model_args(folder: Path, architecture: str | None = None, **more) -> None:
    """config.json as the hub holds the published ViTs (uploaded before timm recorded ``model_args``)."""
    config = {
        "num_classes": VIT["num_classes"],
        "num_features": VIT["embed_dim"],
        "global_pool": "token",
        "pretrained_cfg": {
            "input_size": [3, 32, 32],
            "fixed_input_size": True,
            "mean": [0.5] * 3,
            "std": [0.5] * 3,
            "num_classes": VIT["num_classes"],
            "first_conv": "patch_embed.proj",
            "classifier": "head",
        },
        **more,
    }
    if architecture:
        config["architecture"] = architecture
    (folder / "config.json").write_text(json.dumps(config))


def test_the_heads_of_an_unpublished_size_come_from_the_user_or_the_import_is_refused_naming_the_set(tmp_path):
    model = timm.models.vision_transformer.VisionTransformer(**VIT)  # built without a registered name
    model = randomized(model, 2)
    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), path)
    hub_config_without_model_args(tmp_path, architecture="vit_custom_patch8_32")  # a name of no published model
    refusal = r"number of heads is neither recorded.*--set sizes\.heads=K \(K divides 48\)"
    with pytest.raises(InteropError, match=refusal):
        import_checkpoint("vit-small", path)
    imported = import_checkpoint("vit-small", path, overrides=["sizes.heads=4"])
    assert cc.spec_of(imported.module).sizes["heads"] == 4
    assert difference(imported.module, model, images(2)) < TOLERANCE


def test_a_published_name_that_contradicts_the_shapes_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(timm_vit().state_dict(), path)
    hub_config_without_model_args(tmp_path, architecture="vit_small_patch16_224")
    with pytest.raises(InteropError, match=r"contradict its tensors \(d=384 recorded, 48 in the shapes"):
        import_checkpoint("vit-small", path)


def test_a_pooling_other_than_the_class_token_is_refused(tmp_path):
    path = hub_vit(tmp_path, timm_vit())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "global_pool": "avg"}))
    with pytest.raises(InteropError, match="global_pool is 'avg'"):
        import_checkpoint("vit-small", path)


def meta_checkpoint(tensors: dict, config: dict | None) -> Checkpoint:
    return Checkpoint(Path("model.safetensors"), tensors, "0" * 64, recorded={"config": config} if config else {})


def fits(spec, tensors: dict, family) -> list[str]:
    """Every misfit of the published model's ``tensors`` with ``spec`` (on the meta device)."""
    from crate_compose.building.derivation import explicit
    from crate_compose.building.plan import plan, tied
    from crate_compose.interop.mapping import check, correspond

    ours = cc.compile_spec(spec, meta=True).state_dict()
    pairs, problems = correspond(plan(explicit(spec)), ours, family)
    return (
        problems
        or check(pairs, ours, family.canonical(tensors) if family.canonical else tensors, family, tied(spec))[0]
    )


TIMM_PUBLISHED = {
    "vit_tiny_patch16_224": dict(d=192, heads=3),
    "vit_small_patch16_224": {},  # vit-small's own
    "vit_base_patch16_224": dict(d=768, heads=12),
    "vit_large_patch16_224": dict(d=1024, heads=16, depth=24),
}


@pytest.mark.parametrize("name", sorted(TIMM_PUBLISHED))
@pytest.mark.parametrize("config", [True, False], ids=["config.json", "weights-only"])
def test_timms_published_vits_fit_vit_small_at_their_sizes(name, config):
    """On the meta device: the sizes from config.json (as the hub holds it) or, without one, from the shapes and
    the published model they match; then every tensor has its place and shape."""
    with torch.device("meta"):
        tensors = timm.create_model(name).state_dict()
    recorded = (
        {
            "architecture": name,
            "num_classes": 1000,
            "global_pool": "token",
            "pretrained_cfg": {"input_size": [3, 224, 224], "num_classes": 1000},
        }
        if config
        else None
    )
    checkpoint = meta_checkpoint(tensors, recorded)
    assert detect(checkpoint) is TIMM_VIT
    spec = cc.load_spec("vit-small")
    changed, notes = infer_sizes(TIMM_VIT, checkpoint, spec.sizes)
    assert changed == TIMM_PUBLISHED[name]
    assert config or any("timm-vit's published" in note and name in note for note in notes), notes
    spec = cc.load_spec("vit-small", overrides=[f"sizes.{k}={v}" for k, v in changed.items()])
    assert not fits(spec, tensors, TIMM_VIT)


def test_every_published_vit_name_is_a_vit_timm_registers():
    registered = set(timm.list_models(["vit_*", "deit_*"]))
    assert set(TIMM_VIT.published) <= registered
    for name, sizes in TIMM_VIT.published.items():
        with torch.device("meta"):
            model = timm.create_model(name)
        assert (
            model.embed_dim,
            model.blocks[0].attn.num_heads,
            len(model.blocks),
            model.patch_embed.patch_size[0],
            model.patch_embed.img_size[0],
        ) == tuple(sizes[k] for k in ("d", "heads", "depth", "patch_size", "image_size")), name


# ---------------------------------------------------------------- transformers' GPT-2


def test_a_save_pretrained_folder_imports_into_gpt2_small_with_no_overrides(tmp_path):
    model = gpt2()
    imported = import_checkpoint("gpt2-small", hub_gpt2(tmp_path, model))
    assert imported.family is GPT2
    assert next(imported.module.parameters()).dtype == torch.float64
    assert imported.sizes == {"vocab": 100, "d": 48, "context": 32, "depth": 2, "heads": 3}
    assert not any("computes with" in note for note in imported.notes), imported.notes
    assert difference(imported.module, model, tokens()) < TOLERANCE


def bare(tensors: dict, masks: bool = True) -> dict:
    """The hub's original ``gpt2/model.safetensors``: GPT2Model's names (no ``transformer.``), no ``lm_head``, and
    the causal mask buffers older files hold (``h.N.attn.bias``, ``h.N.attn.masked_bias``)."""
    out = {k.removeprefix("transformer."): v for k, v in tensors.items() if k != "lm_head.weight"}
    if masks:
        n = GPT["n_positions"]
        for layer in range(GPT["n_layer"]):
            out[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
            out[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4, dtype=torch.float64)
    return out


def test_the_hubs_bare_names_import_too_and_the_causal_masks_are_skipped(tmp_path):
    model = gpt2(seed=3)
    path = tmp_path / "model.safetensors"
    save_file(bare(model.state_dict()), path)
    model.config.to_json_file(tmp_path / "config.json")
    imported = import_checkpoint("gpt2-small", path)
    assert imported.family is GPT2
    assert sorted(s.split(":")[0] for s in imported.skipped) == sorted(
        f"transformer.h.{i}.attn.{b}" for i in range(2) for b in ("bias", "masked_bias")
    )
    assert difference(imported.module, model, tokens(3)) < TOLERANCE
    built = cc.compile_spec(cc.spec_of(imported.module), dtype=torch.float64)  # --weights FILE: the spec as it is
    notes = load_checkpoint(built, path)
    assert any("not used: transformer.h.0.attn.bias" in note for note in notes), notes
    assert difference(built, model, tokens(3)) < TOLERANCE


def test_without_config_json_the_heads_of_an_unpublished_gpt2_are_asked_for(tmp_path):
    model = gpt2(seed=4)
    path = tmp_path / "weights.safetensors"
    save_file(bare(model.state_dict(), masks=False), path)
    with pytest.raises(InteropError, match=r"--set sizes\.heads=K \(K divides 48\)"):
        import_checkpoint("gpt2-small", path)
    imported = import_checkpoint("gpt2-small", path, overrides=["sizes.heads=3"])
    assert difference(imported.module, model, tokens(4)) < TOLERANCE


def test_a_head_untied_from_the_embedding_is_refused(tmp_path):
    tensors = dict(gpt2().state_dict())
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, path)
    with pytest.raises(InteropError, match="checkpoint's lm_head.weight and transformer.wte.weight differ"):
        import_checkpoint("gpt2-small", path, overrides=["sizes.heads=3"])


@pytest.mark.parametrize(
    "key, value",
    [("activation_function", "gelu"), ("layer_norm_epsilon", 1e-6), ("scale_attn_by_inverse_layer_idx", True)],
)
def test_a_config_that_computes_otherwise_is_refused_naming_the_entry(tmp_path, key, value):
    path = hub_gpt2(tmp_path, gpt2())
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(InteropError, match=f"config.json's {key} is {value!r}"):
        import_checkpoint("gpt2-small", path)


GPT2_PUBLISHED = {
    "gpt2": ({}, {}),  # GPT2Config's arguments, and the sizes that differ from gpt2-small's
    "gpt2-medium": (dict(n_embd=1024, n_layer=24, n_head=16), dict(d=1024, depth=24, heads=16)),
}


@pytest.mark.parametrize("name", sorted(GPT2_PUBLISHED))
@pytest.mark.parametrize("config", [True, False], ids=["config.json", "weights-only"])
def test_the_published_gpt2s_fit_gpt2_small_at_their_sizes(name, config):
    arguments, expected = GPT2_PUBLISHED[name]
    gpt_config = transformers.GPT2Config(**arguments)
    with torch.device("meta"):
        tensors = bare(transformers.GPT2LMHeadModel(gpt_config).state_dict(), masks=False)  # as the hub holds them
    checkpoint = meta_checkpoint(tensors, gpt_config.to_dict() if config else None)
    assert detect(checkpoint) is GPT2
    changed, notes = infer_sizes(GPT2, in_family_names(checkpoint, GPT2), cc.load_spec("gpt2-small").sizes)
    assert changed == expected
    assert config or any("gpt2's published" in note and name in note for note in notes), notes
    assert not fits(cc.load_spec("gpt2-small", overrides=[f"sizes.{k}={v}" for k, v in changed.items()]), tensors, GPT2)


# ---------------------------------------------------------------- export, detection, the command line


def test_export_then_import_is_the_identity_and_the_peers_load_the_export_strictly(tmp_path):
    for family, model, write, preset in (
        ("timm-vit", timm_vit(5), hub_vit, "vit-small"),
        ("gpt2", gpt2(5), hub_gpt2, "gpt2-small"),
    ):
        first = import_checkpoint(preset, write(tmp_path / family, model)).module
        exported = export_checkpoint(first, family)
        assert set(exported) == set(model.state_dict())
        assert all(torch.equal(exported[k], v) for k, v in model.state_dict().items())
        fresh = timm_vit(6) if family == "timm-vit" else gpt2(6)
        fresh.load_state_dict(exported, strict=True)
        back = write_checkpoint(exported, tmp_path / f"{family}.safetensors")
        again = import_checkpoint(cc.spec_of(first), back, family).module
        assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))


def test_transformers_from_pretrained_reads_an_exported_folder(tmp_path):
    model = gpt2(7)
    first = import_checkpoint("gpt2-small", hub_gpt2(tmp_path / "hub", model)).module
    folder = tmp_path / "exported"
    folder.mkdir()
    write_checkpoint(export_checkpoint(first, "gpt2"), folder / "model.safetensors")
    model.config.to_json_file(folder / "config.json")
    dtype = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"  # its name before 5
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(
        folder, output_loading_info=True, **{dtype: torch.float64}
    )
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert difference(first, loaded.eval(), tokens(7)) < TOLERANCE


def test_each_file_is_told_its_family(tmp_path):
    vit = hub_vit(tmp_path / "vit", timm_vit())
    gpt = hub_gpt2(tmp_path / "gpt2", gpt2())
    hub = tmp_path / "bare" / "model.safetensors"
    hub.parent.mkdir()
    save_file(bare(gpt2().state_dict()), hub)
    assert [detect(read_checkpoint(p)).name for p in (vit, gpt, hub)] == ["timm-vit", "gpt2", "gpt2"]
    for family, (_preset, sizes, _) in SMALL.items():  # the authors' families are still told apart from the peers
        assert detect(read_checkpoint(saved(tmp_path, family, state_dict(family, sizes)))).name == family


def test_nanogpts_linear_layout_is_not_taken_for_transformers_gpt2(tmp_path):
    tensors = {
        k: (v.t() if k.endswith(("c_attn.weight", "c_fc.weight", "c_proj.weight")) else v)
        for k, v in gpt2().state_dict().items()
    }  # nanoGPT's GPT: the same names, nn.Linear (out, in)
    with pytest.raises(InteropError, match="cannot tell whose code saved it"):
        detect(meta_checkpoint(tensors, None))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crate_compose.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_import_of_a_gpt2_folder_on_the_command_line(tmp_path):
    model = gpt2(8)
    path = hub_gpt2(tmp_path / "gpt2", model)
    done = run("import", "gpt2-small", str(path), "--out", "imported", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "(gpt2)" in done.stdout and "config.json" in done.stderr
    build = cc.load_build(tmp_path / "imported")
    assert difference(build, model, tokens(8)) < TOLERANCE
    gpt2(9).load_state_dict(export_checkpoint(build, "gpt2"), strict=True)  # what `export --to gpt2` writes

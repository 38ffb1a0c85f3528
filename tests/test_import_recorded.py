"""Importing reads what a checkpoint says about the model it holds, not what the spec guesses.

The files are written as each family's training script writes them (tests/authors_files.py), with the
arguments that script records beside the weights (nanoGPT's ``model_args``, CRATE's ``arch``, DeiT's and
MAE's ``args``), at sizes that are in no published table, and imported with no ``--set``; the outputs
are compared with the independent reading of the authors' forward (tests/reference/authors.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch
from authors_files import SMALL, TOLERANCE, inputs, ours_and_theirs, saved
from reference.authors import SIZES, forward, state_dict

import crate_compose as cc
from crate_compose.interop.catalog import FAMILIES
from crate_compose.interop.exchange import import_checkpoint, infer_sizes
from crate_compose.interop.reading import Checkpoint, InteropError, read_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def model_args(sizes: dict, **extra) -> dict:
    """nanoGPT's ``model_args``, as its train.py records them."""
    return dict(
        n_layer=sizes["depth"],
        n_head=sizes["heads"],
        n_embd=sizes["d"],
        block_size=sizes["context"],
        vocab_size=sizes["vocab"],
        dropout=0.0,
        **extra,
    )


# ---------------------------------------------------------------- the language models: nanoGPT's model_args


@pytest.mark.parametrize("family, heads", [("crate-lm", 3), ("crate-lm", 1), ("tost-lm", 3)])
def test_a_language_model_takes_every_size_from_its_model_args(tmp_path, family, heads):
    """A width-48 crate-lm with 3 heads (or 1, as crate-lm's own table lists a one-head model) is built with
    them: the shapes of its shared projection cannot tell the heads, and the spec's 12 would be wrong."""
    sizes = dict(SMALL[family][1], d=48, heads=heads, depth=3, context=24, vocab=80)
    state = state_dict(family, sizes, seed=4)
    bias = {"bias": sizes["bias"]} if "bias" in sizes else {}
    path = saved(
        tmp_path,
        family,
        state,
        model_args=model_args(sizes, **bias),
        iter_num=5000,
        config={"learning_rate": 6e-4, "n_layer": sizes["depth"]},
    )
    imported = import_checkpoint(SMALL[family][0], path)
    spec_sizes = cc.spec_of(imported.module).sizes
    assert (spec_sizes["heads"], spec_sizes["d"], spec_sizes["depth"], spec_sizes["context"], spec_sizes["vocab"]) == (
        heads,
        48,
        3,
        24,
        80,
    )
    assert any("recorded in the checkpoint" in note and f"heads={heads}" in note for note in imported.notes)
    ours, theirs = ours_and_theirs(imported.module.eval(), family, state, inputs(family, sizes), sizes)
    assert (ours - theirs).abs().max().item() < TOLERANCE


# ---------------------------------------------------------------- the vision families: a model's registered name


NAMED = [  # family, what its script records, the published sizes that name stands for (tests/reference/authors.py)
    ("crate", {"arch": "CRATE_small"}, SIZES["crate"]["small"]),
    (
        "crate-mae",
        {"args": argparse.Namespace(model="mae_crate_small", input_size=224, mask_ratio=0.75)},
        SIZES["crate-mae"]["small"],
    ),
    (
        "tost",
        {"args": argparse.Namespace(model="tost_cab_small_24_p16", input_size=224, nb_classes=1000)},
        SIZES["tost"]["small-24"],
    ),
]


@pytest.mark.parametrize("family, recorded, published", NAMED, ids=[n[0] for n in NAMED])
def test_a_recorded_model_name_gives_its_sizes(tmp_path, family, recorded, published):
    """CRATE-S has 12 heads of 48, not the 576 / 64 = 9 a head dimension of 64 would give: its script records
    ``arch``, and that is what is read (checked on the meta device: the sizes alone)."""
    checkpoint = Checkpoint(
        tmp_path / "x.pth",
        state_dict(family, published, device="meta"),
        "0" * 64,
        recorded={k: vars(v) if isinstance(v, argparse.Namespace) else v for k, v in recorded.items()},
    )
    spec_sizes = cc.load_spec(SMALL[family][0]).sizes
    sizes, notes = infer_sizes(FAMILIES[family], checkpoint, dict(spec_sizes, heads=1))
    assert sizes["heads"] == published["heads"] and sizes.get("head_dim", published.get("head_dim")) == published.get(
        "head_dim", sizes.get("head_dim")
    )
    assert any("recorded in the checkpoint" in note for note in notes)


def test_recorded_arguments_are_read_from_the_file_as_plain_values(tmp_path):
    """``args`` is an ``argparse.Namespace`` in a DeiT checkpoint: it is read as its dictionary; tensors and
    optimizer states beside the weights are not kept."""
    sizes = SMALL["tost"][1]
    path = saved(
        tmp_path,
        "tost",
        state_dict("tost", sizes),
        optimizer={"state": {0: {"m": torch.ones(2)}}},
        args=argparse.Namespace(model="tost_cab_tiny_12_p16", input_size=48, nb_classes=10, lr=5e-4),
    )
    recorded = read_checkpoint(path).recorded
    assert recorded == {"args": {"model": "tost_cab_tiny_12_p16", "input_size": 48, "nb_classes": 10, "lr": 5e-4}}


def test_a_tost_takes_its_image_size_and_classes_from_its_args(tmp_path):
    sizes = dict(SMALL["tost"][1], d=64, heads=4, depth=2)
    state = state_dict("tost", sizes, seed=1)
    path = saved(tmp_path, "tost", state, args=argparse.Namespace(model=None, input_size=48, nb_classes=10))
    imported = import_checkpoint("tost-tiny", path)
    assert cc.spec_of(imported.module).sizes["image_size"] == 48
    x = torch.randn(2, 3, 48, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ours, theirs = ours_and_theirs(imported.module.eval(), "tost", state, x, sizes)
    assert (ours - theirs).abs().max().item() < TOLERANCE


def test_a_published_model_is_told_by_all_its_shapes_when_nothing_is_recorded(tmp_path):
    """CRATE-alpha's released weights record no arguments: the shapes of its B/16, every one of them, give
    its 12 heads; a width of 768 alone would not (crate-lm's one-head model has it too)."""
    published = SIZES["crate-alpha"]["base"]
    checkpoint = Checkpoint(tmp_path / "x.pth", state_dict("crate-alpha", published, device="meta"), "0" * 64)
    sizes, notes = infer_sizes(
        FAMILIES["crate-alpha"], checkpoint, dict(cc.load_spec("crate-alpha-base16").sizes, heads=1)
    )
    assert sizes["heads"] == 12 and any("published CRATE_base" in note for note in notes)
    one_layer = dict(SIZES["crate-lm"]["base"], depth=1, heads=1)
    checkpoint = Checkpoint(tmp_path / "y.pth", state_dict("crate-lm", one_layer, device="meta"), "0" * 64)
    sizes, notes = infer_sizes(FAMILIES["crate-lm"], checkpoint, cc.load_spec("crate-lm-base").sizes)
    assert sizes["heads"] == 1 and any("crate-1l" in note for note in notes)


# ---------------------------------------------------------------- what cannot be known is asked for


def test_heads_that_nothing_tells_are_refused_naming_the_override(tmp_path):
    preset, sizes, _ = SMALL["crate"]
    path = saved(tmp_path, "crate", state_dict("crate", sizes))
    with pytest.raises(
        InteropError,
        match=r"(?s)number of heads is neither recorded.*--set sizes\.heads=K "
        r"\(K divides 48\)",
    ):
        import_checkpoint(preset, path)
    done = subprocess.run(
        [sys.executable, "-m", "crate_compose.cli", "import", preset, str(path), "--out", "built"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--set sizes.heads=K" in done.stderr
    assert not (tmp_path / "built").exists()
    imported = import_checkpoint(preset, path, overrides=["sizes.heads=4"])
    assert cc.spec_of(imported.module).sizes["heads"] == 4


def test_recorded_arguments_that_contradict_the_tensors_are_refused(tmp_path):
    preset, sizes, _ = SMALL["crate"]
    path = saved(tmp_path, "crate", state_dict("crate", sizes), arch="CRATE_base")
    with pytest.raises(
        InteropError,
        match=r"contradict its tensors \(patch_size=16 recorded, 8 in the shapes; d=768 recorded, 48 in the shapes",
    ):
        import_checkpoint(preset, path)
    path = saved(tmp_path, "crate", state_dict("crate", sizes), arch="CRATE_huge")
    with pytest.raises(InteropError, match=r"'arch' is 'CRATE_huge', which .* does not define .*CRATE_base"):
        import_checkpoint(preset, path)


# ---------------------------------------------------------------- arguments the family's code fixes


def test_crate_alpha_takes_its_final_layernorm_eps_from_the_family(tmp_path):
    """The released port ends with ``nn.LayerNorm(dim)`` (eps 1e-5) where the spec's LayerNorms use 1e-6."""
    preset, sizes, overrides = SMALL["crate-alpha"]
    assert cc.load_spec(preset).encoder.post[0].args["eps"] == 1e-6
    state = state_dict("crate-alpha", sizes, seed=3)
    imported = import_checkpoint(preset, saved(tmp_path, "crate-alpha", state), overrides=overrides)
    assert cc.spec_of(imported.module).encoder.post[0].args["eps"] == 1e-5
    assert any("as crate-alpha's code computes" in note and "eps=1.0e-05" in note for note in imported.notes)
    ours, theirs = ours_and_theirs(imported.module.eval(), "crate-alpha", state, inputs("crate-alpha", sizes), sizes)
    assert (ours - theirs).abs().max().item() < TOLERANCE
    mine = import_checkpoint(
        preset, saved(tmp_path, "crate-alpha", state), overrides=[*overrides, "encoder.post.norm.args.eps=1e-6"]
    )  # a --set still wins
    assert cc.spec_of(mine.module).encoder.post[0].args["eps"] == 1e-6
    assert any("has eps=1e-06; crate-alpha's code computes with 1e-05" in note for note in mine.notes)


# ---------------------------------------------------------------- model_ema


def test_the_average_of_the_weights_is_read_when_asked_for(tmp_path):
    preset, sizes, overrides = SMALL["tost"]
    model, ema = state_dict("tost", sizes, seed=1), state_dict("tost", sizes, seed=2)
    path = saved(tmp_path, "tost", model, model_ema=ema)
    default = import_checkpoint(preset, path, overrides=overrides)
    chosen = import_checkpoint(preset, path, overrides=overrides, key="model_ema")
    temp = "encoder.layer_1.compress.temp"
    assert torch.equal(default.module.state_dict()[temp], model["blocks.1.attn.temp"])
    assert torch.equal(chosen.module.state_dict()[temp], ema["blocks.1.attn.temp"])
    assert any("--key model_ema" in note for note in default.notes)
    with pytest.raises(InteropError, match=r"no entry 'model_emma' .*'model', 'model_ema'"):
        import_checkpoint(preset, path, overrides=overrides, key="model_emma")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crate_compose.cli",
            "import",
            preset,
            str(path),
            "--key",
            "model_ema",
            *(f"--set={o}" for o in overrides),
            "--out",
            "ema",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert torch.equal(cc.load_build(tmp_path / "ema").state_dict()[temp].double(), ema["blocks.1.attn.temp"])


# ---------------------------------------------------------------- ToST at any resolution


@pytest.mark.parametrize("side", [32, 48, 80])
def test_a_tost_computes_its_positions_from_the_input_grid(tmp_path, side):
    """Built for 32x32 images (a 2x2 grid), it takes any square image its patch size divides, with the Fourier
    features of that grid computed in float32 as the authors compute them (float64 features would leave the
    float64 logits about 1e-8 off the authors')."""
    preset, sizes, overrides = SMALL["tost"]
    state = state_dict("tost", sizes, seed=6)
    module = import_checkpoint(preset, saved(tmp_path, "tost", state), overrides=overrides).module.eval()
    x = torch.randn(2, 3, side, side, dtype=torch.float64, generator=torch.Generator().manual_seed(side))
    with torch.no_grad():
        ours = module(x)["output"]
    theirs = forward("tost", state, x, sizes)["logits"]
    assert (ours - theirs).abs().max().item() < TOLERANCE


def test_a_tost_refuses_a_grid_of_other_proportions_than_its_build(tmp_path):
    preset, sizes, overrides = SMALL["tost"]
    module = import_checkpoint(preset, saved(tmp_path, "tost", state_dict("tost", sizes)), overrides=overrides).module
    with pytest.raises(ValueError, match=r"8 tokens do not form a patch grid of the build's proportions 1:1"):
        module(torch.randn(1, 3, 32, 64, dtype=torch.float64))

"""``crate-compose show``: the pictures are what the network computes.

The attention a picture shows is the one each step applies (its rows sum to 1, and the step's output
recomputed from it equals the forward's in float64 to 1e-10); TSSA's memberships sum to 1 over the
heads and reproduce the step; the PCA colours are a function of the features; the PNG files are
valid images of the sizes the layout gives; bad input is refused with its message, a non-zero exit
and nothing written; nothing is ever written into the weights folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

import crate_compose as cc
from crate_compose.cli import main
from crate_compose.errors import SpecError, WorkbenchError
from crate_compose.modules.aot import AoT
from crate_compose.modules.compress import MSSA
from crate_compose.modules.embed import patchify
from crate_compose.modules.standard import MHSA
from crate_compose.modules.tssa import TSSA, CausalTSSA
from crate_compose.pictures import drawings
from crate_compose.pictures.show import picture_folder
from crate_compose.pictures.views import look, pca_rgb, unpatchify

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
SMALL = ["--set", "sizes.depth=2"]  # crate-digits: 16 patches of 2x2, a class token, 4 heads


def _images(count: int = 3, channels: int = 1, side: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(count, channels, side, side, generator=torch.Generator().manual_seed(seed))


def _model(ref: str, overrides: list[str], dtype=torch.float64, seed: int = 0):
    return cc.compile_spec(cc.load_spec(ref, overrides), seed=seed, dtype=dtype)


def _inputs_and_outputs(model, images: torch.Tensor, names: list[str]) -> dict[str, tuple]:
    """Each named step's input and output, from hooks of the test's own."""
    seen = {}
    handles = [
        model.get_submodule(name).register_forward_hook(
            lambda module, args, output, name=name: seen.__setitem__(name, (args[0], output))
        )
        for name in names
    ]
    model.eval()
    with torch.no_grad():
        model(images)
    for handle in handles:
        handle.remove()
    return seen


def _png_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.verify()  # a whole, valid PNG
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


# --------------------------------------------------------------------------------------- the modules' own maps


def _attention_branch(module, x: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The step's output recomputed from ``attention`` (B, K, n, n) and the module's weights alone."""
    if isinstance(module, MSSA):
        w = module.heads_of(module.norm(x))
        return module.combine(x, module.project((attention @ w).transpose(1, 2).flatten(2)))
    if isinstance(module, MHSA):
        _, _, v = module.project(x)
        return module.combine(x, module.out((attention @ v).transpose(1, 2).flatten(2)))
    _, _, v, back = module._project(x)  # AoT
    return module.combine(x, module.step_size * ((attention @ v).transpose(1, 2).flatten(2) @ back))


@pytest.mark.parametrize(
    "make",
    [
        lambda: MSSA(24, 3, 8),
        lambda: MSSA(24, 3, 8, output="tied", step_size=0.5),
        lambda: MSSA(24, 3, 8, causal=True),
        lambda: MHSA(24, 3, 8),
        lambda: MHSA(24, 2, 12, causal=True),
        lambda: AoT(24, 3, 8, norm=True),
        lambda: AoT(24, 3, 8, variant="mhsa", scale=0.3),
    ],
    ids=["mssa", "mssa-tied", "mssa-causal", "mhsa", "mhsa-causal", "aot", "aot-mhsa"],
)
def test_the_attention_a_module_gives_is_the_one_its_forward_applies(make):
    torch.manual_seed(0)
    module = make().double()
    if isinstance(module, MSSA) and module.out is not None:
        module.enable_layer_scale(24, 0.7)  # LayerScale scales the branch the attention makes
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    attention = module.attention(x)
    assert attention.shape == (2, module.heads, 7, 7)
    assert torch.allclose(attention.sum(-1), torch.ones(2, module.heads, 7, dtype=torch.float64), atol=1e-12)
    assert (attention >= 0).all()
    if getattr(module, "causal", False):
        assert (attention.triu(1) == 0).all()  # query i sees keys 0..i only
    assert (_attention_branch(module, x, attention) - module(x)).abs().max() < 1e-10


@pytest.mark.parametrize("make", [lambda: TSSA(24, 4), lambda: CausalTSSA(24, 3, 7)], ids=["tssa", "causal"])
def test_the_memberships_a_tssa_gives_sum_to_one_over_heads_and_make_its_output(make):
    torch.manual_seed(0)
    module = make().double()
    with torch.no_grad():
        module.temp.mul_(torch.tensor([[3.0]] + [[0.5]] * (module.heads - 1), dtype=torch.float64))
    x = torch.randn(2, 7, 24, dtype=torch.float64)
    pi = module.membership(x)
    assert pi.shape == (2, module.heads, 7)
    assert torch.allclose(pi.sum(1), torch.ones(2, 7, dtype=torch.float64), atol=1e-12)
    if isinstance(module, CausalTSSA):
        return  # its second moments are running sums: the step's output is checked in its own tests
    w = module.qkv(module.norm(x)).unflatten(-1, (module.heads, -1)).transpose(1, 2)
    m = (pi.unsqueeze(-2) @ w.pow(2)) / (pi.sum(-1)[..., None, None] + 1e-8)
    branch = module.to_out((-pi.unsqueeze(-1) * w / (1 + m)).transpose(1, 2).flatten(2))
    assert (module.combine(x, branch) - module(x)).abs().max() < 1e-10


# --------------------------------------------------------------------------------------- what look gathers


def test_the_pictured_attention_reproduces_each_step_of_a_built_crate():
    model = _model(DIGITS, ["sizes.depth=2"])
    images = _images()
    views = look(model, images, patch=5)
    assert [s.module for s in views.steps] == ["encoder.layer_1.compress"]  # the last layer by default
    step = views.steps[0]
    assert (step.kind, step.prefix, step.values.shape) == ("attention", 1, (3, 4, 17, 17))  # class token + 16
    assert torch.allclose(step.values.sum(-1), torch.ones(3, 4, 17, dtype=torch.float64), atol=1e-12)
    x, y = _inputs_and_outputs(model, images, [step.module])[step.module]
    module = model.get_submodule(step.module)
    assert (_attention_branch(module, x, step.values) - y).abs().max() < 1e-10
    # the maps drawn: the class token's and patch 5's attention to the 16 patches, on the 4x4 grid
    assert torch.equal(step.maps(views.grid, 0), step.values[:, :, 0, 1:].reshape(3, 4, 4, 4))
    assert torch.equal(step.maps(views.grid, 1 + 5), step.values[:, :, 6, 1:].reshape(3, 4, 4, 4))
    earlier = look(model, images, layer=0)
    assert [s.module for s in earlier.steps] == ["encoder.layer_0.compress"]
    assert earlier.patch == 2 * 4 + 2  # the centre patch by default
    assert earlier.pca_site == "encoder.layer_0.sparsify"  # the layer's last step


def test_mhsa_and_aot_steps_are_pictured_and_reproduced():
    for ref, overrides in [
        (
            "vit-tiny",
            [
                "sizes.depth=1",
                "sizes.image_size=8",
                "sizes.patch_size=2",
                "sizes.d=24",
                "sizes.heads=3",
                "sizes.channels=1",
            ],
        ),
        (
            "aot",
            [
                "sizes.depth=1",
                "sizes.image_size=8",
                "sizes.patch_size=2",
                "sizes.d=24",
                "sizes.heads=3",
                "sizes.channels=1",
            ],
        ),
    ]:
        model = _model(ref, overrides)
        images = _images(2)
        views = look(model, images)
        assert views.steps, ref
        for step in views.steps:
            x, y = _inputs_and_outputs(model, images, [step.module])[step.module]
            assert (_attention_branch(model.get_submodule(step.module), x, step.values) - y).abs().max() < 1e-10


def test_the_pictured_memberships_of_a_tost_sum_to_one_over_heads():
    model = _model(
        "tost-tiny",
        [
            "sizes.depth=2",
            "sizes.image_size=32",
            "sizes.patch_size=8",
            "sizes.d=32",
            "sizes.heads=4",
            "sizes.class_depth=1",
            "sizes.channels=1",
        ],
    )
    images = _images(2, side=32)
    views = look(model, images)
    step, summary = views.steps
    assert (step.kind, step.module, step.prefix) == ("membership", "encoder.layer_1.compress", 0)  # no class token yet
    # and the class token's attention in the last class-attention layer: a softmax over every token
    assert (summary.module, summary.kind, summary.prefix) == ("class_attention.layer_0.attend", "attention", 1)
    assert summary.values.shape == (2, 4, 1, 17)
    assert torch.allclose(summary.values.sum(-1), torch.ones(2, 4, 1, dtype=torch.float64), atol=1e-6)
    assert summary.maps(views.grid, 0).shape == (2, 4, 4, 4)
    assert torch.allclose(step.values.sum(1), torch.ones(2, 16, dtype=torch.float64), atol=1e-12)
    x, _ = _inputs_and_outputs(model, images, [step.module])[step.module]
    assert torch.equal(step.values, model.get_submodule(step.module).statistics(x)[1].double())
    assert step.maps(views.grid).shape == (2, 4, 4, 4)


def test_the_pca_colours_are_a_function_of_the_features():
    images = _images(3)
    model = _model(DIGITS, ["sizes.depth=2"])
    views = look(model, images)
    features = _inputs_and_outputs(model, images, ["encoder.layer_1.sparsify"])["encoder.layer_1.sparsify"][1]
    assert torch.equal(views.features, features[:, 1:].double())  # the patch tokens, the class token left out
    colours = pca_rgb(features[:, 1:].flatten(0, 1))
    assert torch.equal(views.pca, colours.reshape(3, 4, 4, 3))
    assert colours.min() == 0 and colours.max() == 1 and colours.shape == (48, 3)
    # a function of the features up to what PCA cannot see: a shift and a scale
    assert torch.allclose(pca_rgb(3 * features[:, 1:].flatten(0, 1) + 5), colours, atol=1e-9)
    # the colours are the centred features' top three principal coordinates, each scaled to [0, 1]
    centred = features[:, 1:].flatten(0, 1) - features[:, 1:].flatten(0, 1).mean(0)
    _, _, vh = torch.linalg.svd(centred)
    coordinates = centred @ vh[:3].T
    for c in range(3):
        scaled = (coordinates[:, c] - coordinates[:, c].min()) / (coordinates[:, c].max() - coordinates[:, c].min())
        assert torch.allclose(colours[:, c], scaled, atol=1e-9) or torch.allclose(colours[:, c], 1 - scaled, atol=1e-9)
    other = look(_model(DIGITS, ["sizes.depth=2"], seed=1), images)
    assert (other.pca - views.pca).abs().max() > 0.1  # other weights, other colours
    assert pca_rgb(torch.randn(2, 5)).shape == (2, 3)  # fewer than three components: the rest black


def test_a_masked_autoencoder_is_pictured_unmasked_and_reconstructed():
    model = _model("crate-mae-photos", ["sizes.channels=1", "sizes.image_size=8", "sizes.patch_size=2"])
    images = _images(2)
    views = look(model, images, seed=3)
    step = views.steps[-1]
    assert step.values.shape[-1] == 17  # the encoder saw every patch and the class token: nothing hidden
    pictures = views.reconstruction
    assert set(pictures) == {"masked", "output", "filled", "original", "mask"}
    hidden = pictures["mask"].reshape(2, 1, 4, 4).repeat_interleave(2, -2).repeat_interleave(2, -1)
    assert pictures["mask"].sum(1).tolist() == [12, 12]  # 75% of 16 patches hidden
    original, output = pictures["original"], pictures["output"]
    assert torch.equal(pictures["filled"] * (1 - hidden), original * (1 - hidden))  # visible patches kept
    assert torch.allclose(pictures["filled"] * hidden, output * hidden)
    assert torch.all(pictures["masked"][hidden.expand_as(original) > 0] == 0.5)  # hidden patches grey
    again = look(model, images, seed=3).reconstruction["mask"]
    assert torch.equal(again, pictures["mask"])  # the masks come from the seed
    patches = torch.randn(2, 16, 12)
    assert torch.equal(patchify(unpatchify(patches, 2, 3, (4, 4)), 2), patches)


def test_drop_masking_is_pictured_with_every_patch():
    model = _model(
        "specs/mae-drop.yaml",
        [
            "sizes.channels=1",
            "sizes.image_size=8",
            "sizes.patch_size=2",
            "sizes.depth=1",
            "sizes.d=32",
            "sizes.heads=2",
            "sizes.head_dim=16",
        ],
    )
    views = look(model, _images(2))
    assert views.steps[0].values.shape[-1] == 17 and views.reconstruction is not None


# --------------------------------------------------------------------------------------- the command


def test_show_writes_every_picture_as_a_png_of_its_size(tmp_path, capsys):
    out = tmp_path / "pictures"
    assert main(["show", DIGITS, *SMALL, "--data", "digits", "--out", str(out), "--patch", "5"]) == 0
    printed = capsys.readouterr().out
    sizes = {  # 4 images; the image and 4 heads, under one colour bar
        "attention-cls-encoder.layer_1.compress.png": drawings.pixels(4, 5, bar=True),
        "attention-patch5-encoder.layer_1.compress.png": drawings.pixels(4, 5, bar=True),
        "pca-encoder.layer_1.sparsify.png": drawings.pixels(4, 3),
    }
    assert drawings.pixels(4, 5) == (750, 665) and drawings.pixels(4, 5, bar=True) == (750, 720)
    assert _files(out) == {*sizes, ".lock"}
    for name, size in sizes.items():
        assert _png_size(out / name) == size
        assert f"wrote {out / name}: " in printed
    assert (
        main(["show", DIGITS, *SMALL, "--data", "digits", "--out", str(out / "two"), "--images", "2", "--layer", "0"])
        == 0
    )
    assert _png_size(out / "two" / "attention-cls-encoder.layer_0.compress.png") == drawings.pixels(2, 5, bar=True)


def test_show_draws_memberships_and_reconstructions(tmp_path, capsys):
    tost = [
        "--set",
        "sizes.depth=1",
        "--set",
        "sizes.patch_size=8",
        "--set",
        "sizes.d=32",
        "--set",
        "sizes.heads=2",
        "--set",
        "sizes.class_depth=1",
    ]
    assert (
        main(
            [
                "show",
                "tost-tiny",
                *tost,
                "--data",
                "digits",
                "--image-size",
                "16",
                "--out",
                str(tmp_path / "t"),
                "--images",
                "1",
            ]
        )
        == 0
    )
    assert _png_size(tmp_path / "t" / "membership-encoder.layer_0.compress.png") == drawings.pixels(1, 3, bar=True)
    assert _png_size(tmp_path / "t" / "attention-cls-class_attention.layer_0.attend.png") == drawings.pixels(
        1, 3, bar=True
    )  # ToST's class token, summarizing the patches
    mae = ["--set", "sizes.patch_size=2", "--set", "sizes.depth=1"]
    assert main(["show", "crate-mae-photos", *mae, "--data", "digits", "--out", str(tmp_path / "m")]) == 0
    assert _png_size(tmp_path / "m" / "reconstruction.png") == drawings.pixels(4, 4)
    assert "reconstruction.png" in capsys.readouterr().out


def test_the_pictures_of_other_weights_differ_and_go_beside_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = cc.load_spec(DIGITS, ["sizes.depth=2"])
    run = tmp_path / "run"
    cc.save(cc.compile_spec(spec, seed=5), run / "final")
    before = sorted(p.name for p in (run / "final").iterdir())
    assert main(["show", DIGITS, *SMALL, "--data", "digits", "--weights", str(run / "final")]) == 0
    assert sorted(p.name for p in (run / "final").iterdir()) == before  # nothing written into the weights
    trained = (run / "pictures" / "final" / "pca-encoder.layer_1.sparsify.png").read_bytes()
    assert main(["show", DIGITS, *SMALL, "--data", "digits"]) == 0  # untrained: pictures/<spec name>
    untrained = (tmp_path / "pictures" / spec.name / "pca-encoder.layer_1.sparsify.png").read_bytes()
    assert trained != untrained
    assert picture_folder(run / "checkpoints" / "step-000100", "x") == run / "pictures" / "step-000100"
    assert picture_folder(tmp_path / "out" / "net", "x") == tmp_path / "out" / "pictures" / "net"
    for inside in (run / "final", run / "final" / "pictures"):  # never into a build
        assert (
            main(["show", DIGITS, *SMALL, "--data", "digits", "--weights", str(run / "final"), "--out", str(inside)])
            == 2
        )
        assert "pictures are never written into a build" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "final").iterdir()) == before


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--layer", "7"], "--layer 7: the encoder has layers 0..1"),
        (["--patch", "16"], "--patch 16: the patch grid is 4x4, patches 0..15"),
        (["--set", "encoder.layer.compress.primitive=coding_rate_step"], "crate-digits.yaml:"),  # located
        (["--data", "text"], "data set 'text' is not images"),
        (["--data", "nothing"], "unknown data set 'nothing'"),
        (["--weights", "missing"], "no model.safetensors there"),
    ],
    ids=["layer", "patch", "no-picture-steps", "token-data", "unknown-data", "no-weights"],
)
def test_bad_input_is_refused_with_its_message_and_writes_nothing(tmp_path, capsys, arguments, message):
    out = tmp_path / "pictures"
    data = [] if "--data" in arguments else ["--data", "digits"]
    assert main(["show", DIGITS, *SMALL, *data, *arguments, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not out.exists()


@pytest.mark.parametrize(
    "arguments",
    [["--images", "0"], ["--images", "17"], ["--patch", "-1"], ["--layer", "x"]],
    ids=["no-images", "many-images", "patch", "layer"],
)
def test_bad_arguments_exit_2_before_anything_loads(tmp_path, capsys, arguments):
    with pytest.raises(SystemExit) as exit_:
        main(["show", DIGITS, "--data", "digits", *arguments, "--out", str(tmp_path / "p")])
    assert exit_.value.code == 2
    assert "show: error:" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_a_spec_without_pictures_names_its_steps_and_a_token_spec_is_refused(tmp_path, capsys):
    out = tmp_path / "p"
    assert (
        main(
            [
                "show",
                DIGITS,
                *SMALL,
                "--set",
                "encoder.layer.compress.primitive=coding_rate_step",
                "--data",
                "digits",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    error = capsys.readouterr().err
    assert "encoder.layer.compress (coding_rate_step), encoder.layer.sparsify (ista)" in error
    assert "publishes a picture" in error
    assert main(["show", "gpt2-bytes", "--data", "digits", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "gpt2.yaml:" in error and "not images cut into patches" in error
    assert not out.exists()
    with pytest.raises(SpecError):
        look(_model("gpt2-bytes", ["sizes.depth=1"], dtype=torch.float32), torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(WorkbenchError, match="--layer 3"):
        look(_model(DIGITS, ["sizes.depth=2"]), _images(1), layer=3)


def test_every_attention_map_of_a_figure_is_on_one_scale(monkeypatch):
    """A nearly uniform map must look as faint as it is: one scale (0 to the figure's largest weight) for every
    head and image, shown by a colour bar, not each map stretched to its own maximum."""
    tops = []
    monkeypatch.setattr(drawings, "show_map", lambda axes, values, patch, *, top: tops.append(top))
    maps = torch.full((2, 3, 4, 4), 1 / 16, dtype=torch.float64)
    maps[1, 2, 0, 0] = 0.7  # one peaked head
    drawings.maps_png(torch.rand(2, 1, 8, 8), maps, 2, title="t")
    assert tops == [0.7] * 6
    tops.clear()
    drawings.maps_png(torch.rand(2, 1, 8, 8), maps / 10, 2, title="t", fixed=True)
    assert tops == [1.0] * 6  # memberships: always 0 to 1

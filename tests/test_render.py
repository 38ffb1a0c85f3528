"""Architecture diagrams: golden DOT files, SVG rendering, mirrored decoders, readable sizes.

Golden files are regenerated only on purpose:  CRATE_COMPOSE_UPDATE_GOLDEN=1 pytest tests/test_render.py
"""

import os
import re
import shutil
from pathlib import Path

import pytest

import crate_compose as cc
import crate_compose.cli
import crate_compose.rendering.diagrams as figures

GOLDEN = Path(__file__).parent / "golden"
HAVE_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT and not os.environ.get("CI"), reason="Graphviz dot is not installed")


@pytest.mark.parametrize("preset", ["crate-tiny", "crate-mae-base"])
def test_diagram_matches_golden_dot(preset):
    source = cc.diagram(cc.build(preset, meta=True)).source
    golden = GOLDEN / f"{preset}.dot"
    if os.environ.get("CRATE_COMPOSE_UPDATE_GOLDEN"):
        golden.write_text(source)
    assert golden.exists(), f"no golden file {golden}; create it with CRATE_COMPOSE_UPDATE_GOLDEN=1"
    assert source == golden.read_text(), f"{preset} diagram changed; if on purpose, regenerate the golden file"


def _step_nodes(source: str) -> list[str]:
    return re.findall(r"^\s*(\w+) \[label=<<b>", source, flags=re.M)


def test_collapsed_layers_are_drawn_once_with_their_count():
    source = cc.diagram(cc.build("crate-large", meta=True)).source
    assert "layer × 24" in source
    assert source.count("mssa</font>") == 1 and source.count("ista</font>") == 1
    assert "2.10M × 24 params" in source  # one MSSA step of CRATE-L, repeated


def test_expanded_diagram_draws_every_layer():
    source = cc.diagram(cc.build("crate-large", meta=True), expand=True).source
    assert source.count("mssa</font>") == 24 and source.count("ista</font>") == 24
    assert "layer 23" in source


def test_mirrored_decoder_has_a_dashed_edge_from_each_step_to_its_inverse():
    source = cc.diagram(cc.build("crate-mae-base", meta=True)).source
    dashed = re.findall(r"(\w+) -> (\w+) \[[^\]]*style=dashed", source)
    assert set(dashed) == {
        ("encoder_0_compress", "decoder_0_inverse_compress"),
        ("encoder_0_sparsify", "decoder_0_inverse_sparsify"),
        ("preprocess_class_token", "decoder_inverse_class_token"),
        ("preprocess_patch_embed", "decoder_inverse_patch_embed"),
    }
    # the decoder flows upward: its edges are drawn reversed
    assert re.search(r"decoder_0_inverse_compress -> decoder_0_inverse_sparsify \[[^\]]*dir=back", source)


def test_listing3_decoder_re_adds_positions_with_a_dashed_edge():
    source = cc.diagram(cc.build("crate-mae-base", overrides=["decoder.form=listing3"], meta=True)).source
    assert re.search(r"preprocess_positions -> decoder_inverse_positions \[[^\]]*style=dashed", source)
    assert "LN Z − MSSA(LN Z | V)" in source  # Listing 3's residual on the normalized input


@pytest.mark.parametrize(
    "setting, label",
    [
        ([], "Z + MSSA(LN Z | U)"),
        (["encoder.layer.compress.args.norm=false"], "Z + MSSA(Z | U)"),
        (["encoder.layer.compress.args.output=tied"], "Z + MSSA(LN Z | U)·Uᵀ"),
        (["encoder.layer.compress.args.causal=true"], "Z + MSSA_causal(LN Z | U)"),
        (["encoder.layer.compress.args.kappa=0.1"], "(1 − c)Z + c·MSSA(LN Z | U), c = κp/(Nε²)"),
        (["encoder.layer.compress.layer_scale=0.1"], "(γ₀ = 0.1)"),
    ],
)
def test_labels_show_the_settings_that_change_a_steps_math(setting, label):
    source = cc.diagram(cc.build("crate-tiny", overrides=setting, meta=True)).source
    assert label in source
    if setting:
        assert "Z + MSSA(LN Z | U)<" not in source  # the default label is gone


def test_labels_carry_update_shape_and_parameters():
    source = cc.diagram(cc.build("crate-tiny", meta=True)).source
    assert "Z + MSSA(LN Z | U)" in source
    assert "(B, 197, 384)" in source
    assert "296.1K × 12 params" in source
    no_edge_shapes = cc.diagram(cc.build("crate-tiny", meta=True), edge_shapes=False).source
    assert 'label="(B, 197, 384)"' in source and 'label="(B, 197, 384)"' not in no_edge_shapes
    assert "rankdir=LR" in cc.diagram(cc.build("crate-tiny", meta=True), direction="LR").source


@needs_dot
@pytest.mark.parametrize("fmt", ["svg", "png", "pdf"])
def test_renders_with_dot(tmp_path, fmt):
    written, note = cc.render(cc.build("crate-mae-base", meta=True), tmp_path / "mae", format=fmt)
    assert note is None and written == tmp_path / f"mae.{fmt}"
    data = written.read_bytes()
    assert {"svg": b"<svg", "png": b"\x89PNG", "pdf": b"%PDF"}[fmt] in data[:1000]
    assert not list(tmp_path.glob(".*partial"))


@needs_dot
@pytest.mark.parametrize("preset", ["crate-large", "crate-mae-base"])
def test_collapsed_diagrams_fit_on_one_page(tmp_path, preset):
    source = cc.diagram(cc.build(preset, meta=True)).source
    assert len(_step_nodes(source)) <= 16
    written, _ = cc.render(cc.build(preset, meta=True), tmp_path / preset, format="svg")
    width, height = map(float, re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', written.read_text()).groups())
    assert width <= 1000 and height <= 1100, f"{preset} diagram is {width:.0f} x {height:.0f} pt"


def test_without_dot_writes_dot_source_and_says_how(tmp_path, monkeypatch):
    monkeypatch.setattr(figures.shutil, "which", lambda name: None)
    written, note = cc.render(cc.build("crate-tiny", meta=True), tmp_path / "tiny", format="svg")
    assert written == tmp_path / "tiny.dot" and written.read_text().startswith("digraph")
    assert "\n" not in note and "dot -Tsvg" in note and "apt-get install graphviz" in note


def test_cli_render_and_build_render(tmp_path, capsys):
    assert cc.cli.main(["render", "crate-tiny", "--format", "dot", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t.dot").read_text().startswith("digraph")
    small = ["--set", "sizes.depth=1", "--set", "sizes.d=32", "--set", "sizes.heads=2", "--set", "sizes.head_dim=16"]
    out = tmp_path / "build"
    assert cc.cli.main(["build", "crate-tiny", *small, "--out", str(out), "--render", "--format", "dot"]) == 0
    assert (out / "diagram.dot").exists() and (out / "model.safetensors").exists()


def test_cli_render_into_a_directory_names_the_file_after_the_spec(tmp_path, capsys):
    existing = tmp_path / "figures"
    existing.mkdir()
    assert cc.cli.main(["render", "crate-tiny", "--format", "dot", "--out", str(existing)]) == 0
    assert cc.cli.main(["render", "crate-large", "--format", "dot", "--out", f"{tmp_path / 'new'}/"]) == 0
    assert (existing / "crate-tiny.dot").exists() and (tmp_path / "new" / "crate-large.dot").exists()

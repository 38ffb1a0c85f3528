"""Importing the authors' checkpoints, shown without downloading anything.

For every family, a state dict with the authors' names, nesting and shapes is written by an
independent reading of their public code (tests/reference/authors.py), saved as their training script
saves it, imported with ``--infer-sizes``, and the built network's outputs are compared with the
reference's eager forward on the same state dict (float64, 1e-10). Export then import is the identity.
At the published sizes, the names and shapes are checked on the meta device for every zoo preset.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from authors_files import NESTING, SMALL, TOLERANCE, inputs, ours_and_theirs, saved
from reference.authors import SIZES, state_dict

import crate_compose as cc
from crate_compose.errors import WorkbenchError
from crate_compose.interop.catalog import FAMILIES
from crate_compose.interop.exchange import export_checkpoint, import_checkpoint, write_checkpoint
from crate_compose.interop.reading import InteropError

AUTHORS = [f for f in FAMILIES.values() if f.declared_in == "crate_compose.interop.authors"]


def test_every_family_is_tested():
    assert set(SMALL) == {f.name for f in AUTHORS} == set(NESTING)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_an_imported_checkpoint_computes_what_the_authors_code_computes(tmp_path, family):
    preset, sizes, overrides = SMALL[family]
    state = state_dict(family, sizes, seed=0)
    imported = import_checkpoint(preset, saved(tmp_path, family, state), family, infer=True, overrides=overrides)
    module = imported.module.eval()
    assert next(module.parameters()).dtype == torch.float64
    ours, theirs = ours_and_theirs(module, family, state, inputs(family, sizes), sizes)
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < TOLERANCE
    assert not any("computes with" in note for note in imported.notes), imported.notes  # the spec is theirs


@pytest.mark.parametrize("family", sorted(SMALL))
def test_export_then_import_is_the_identity(tmp_path, family):
    preset, sizes, overrides = SMALL[family]
    state = state_dict(family, sizes, seed=5)
    first = import_checkpoint(preset, saved(tmp_path, family, state), family, infer=True, overrides=overrides).module
    exported = export_checkpoint(first, family)
    assert set(exported) == set(state)  # every tensor of theirs, the unused ones filled in
    used = {k for k in state if FAMILIES[family].is_unused(k) is None}
    assert all(torch.equal(exported[k], state[k]) for k in used)
    path = write_checkpoint(exported, tmp_path / "back.pth", nest=FAMILIES[family].nest)
    again = import_checkpoint(cc.spec_of(first), path, family).module
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))


@pytest.mark.parametrize("family", sorted(SMALL))
def test_the_sizes_are_read_from_the_checkpoint(tmp_path, family):
    preset, sizes, overrides = SMALL[family]
    imported = import_checkpoint(
        preset, saved(tmp_path, family, state_dict(family, sizes)), family, infer=True, overrides=overrides
    )
    spec_sizes = cc.spec_of(imported.module).sizes
    assert {k: spec_sizes[k] for k in sizes if k in spec_sizes} == {k: v for k, v in sizes.items() if k in spec_sizes}


PUBLISHED = [(family, name) for family in sorted(SIZES) for name in sorted(SIZES[family])]


@pytest.mark.parametrize("family, size", PUBLISHED)
def test_the_published_sizes_fit_their_presets_name_for_name(family, size):
    """At full size, on the meta device: every tensor of the authors' model has its place and shape."""
    from crate_compose.building.derivation import explicit
    from crate_compose.building.plan import plan, tied
    from crate_compose.interop.mapping import check, correspond

    sizes = SIZES[family][size]
    theirs = state_dict(family, sizes, device="meta")
    found = FAMILIES[family]
    spec = cc.load_spec(
        found.spec, overrides=[f"sizes.{k}={v}" for k, v in sizes.items() if k in cc.load_spec(found.spec).sizes]
    )
    ours = cc.compile_spec(spec, meta=True).state_dict()
    pairs, problems = correspond(plan(explicit(spec)), ours, found)
    assert not problems
    problems, _ = check(pairs, ours, theirs, found, tied(spec))
    assert not problems, problems[:5]


# ---------------------------------------------------------------- misfits, named on both sides


def test_a_checkpoint_of_another_width_is_refused_naming_both_sides(tmp_path):
    preset, sizes, _ = SMALL["crate"]
    path = saved(tmp_path, "crate", state_dict("crate", sizes))
    with pytest.raises(InteropError) as error:
        import_checkpoint(preset, path, "crate", infer=False)  # --keep-spec: crate-tiny's own sizes, d 384
    text = str(error.value)
    assert "cls_token is (1, 1, 48) in the checkpoint; preprocess.class_token.token is (1, 1, 384) in the spec" in text
    assert "without --keep-spec" in text and str(path) in text


def test_missing_and_extra_tensors_are_each_named(tmp_path):
    preset, sizes, overrides = SMALL["crate"]
    state = state_dict("crate", sizes)
    del state["transformer.layers.1.1.fn.weight"]
    state["transformer.layers.0.0.fn.extra"] = torch.zeros(3)
    with pytest.raises(InteropError) as error:
        import_checkpoint(preset, saved(tmp_path, "crate", state), "crate", infer=True, overrides=overrides)
    text = str(error.value)
    assert (
        "transformer.layers.1.1.fn.weight is missing from the checkpoint (it would fill "
        "encoder.layer_1.sparsify.dictionary, (48, 48))" in text
    )
    assert "transformer.layers.0.0.fn.extra (3,) is in the checkpoint but has no place in the spec" in text


def test_a_spec_step_the_family_does_not_have_is_named(tmp_path):
    preset, sizes, overrides = SMALL["crate"]
    path = saved(tmp_path, "crate", state_dict("crate", sizes))
    with pytest.raises(
        InteropError,
        match=r"encoder.layer_0.sparsify \(ista_mm, encoder layer 0\) has no "
        r"counterpart in crate checkpoints",
    ):
        import_checkpoint(
            preset, path, "crate", infer=True, overrides=[*overrides, "encoder.layer.sparsify.primitive=ista_mm"]
        )


def test_the_wrong_family_is_refused_with_what_it_lacks(tmp_path):
    path = saved(tmp_path, "tost", state_dict("tost", SMALL["tost"][1]))
    with pytest.raises(InteropError, match="cannot read the sizes of a crate checkpoint"):
        import_checkpoint("crate-tiny", path, "crate", infer=True)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_the_family_is_told_by_the_names_of_the_tensors(tmp_path, family):
    preset, sizes, overrides = SMALL[family]
    imported = import_checkpoint(
        preset, saved(tmp_path, family, state_dict(family, sizes)), infer=True, overrides=overrides
    )
    assert imported.family.name == family


def test_a_checkpoint_of_no_family_asks_for_one(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"encoder.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(InteropError, match="cannot tell whose code saved it .*encoder.weight.*give --from crate"):
        import_checkpoint("crate-tiny", path)


def test_every_command_that_takes_weights_reads_an_authors_checkpoint_as_its_import(tmp_path):
    """evaluate (and probe, linear-probe, show: the same loader) on the .pth equals it on the imported build."""
    from crate_compose.assessment.scoring import evaluate_weights

    sizes = dict(image_size=8, channels=1, patch_size=4, d=32, depth=2, heads=2, head_dim=16, classes=10)
    path = saved(tmp_path, "crate", state_dict("crate", sizes, dtype=torch.float32))
    spec = "specs/crate-digits.yaml"
    overrides = [
        "sizes.patch_size=4",
        "sizes.d=32",
        "sizes.heads=2",
        "sizes.depth=2",
        "preprocess.patch_embed.args.norm=true",
    ]
    cc.save(import_checkpoint(spec, path, overrides=overrides).module, tmp_path / "imported")
    direct = evaluate_weights(spec, "digits", path, overrides=overrides)
    built = evaluate_weights(spec, "digits", tmp_path / "imported", overrides=overrides)
    assert direct["test_loss"] == built["test_loss"] and direct["test_accuracy"] == built["test_accuracy"]
    with pytest.raises(
        WorkbenchError, match="(?s)--weights .*does not fit.*import SPEC FILE builds the spec at the checkpoint's sizes"
    ):
        evaluate_weights(spec, "digits", path)


def test_an_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(InteropError, match="unknown family 'crates'.*did you mean 'crate'"):
        import_checkpoint("crate-tiny", "x.pth", "crates")


def test_a_spec_argument_that_differs_from_the_authors_code_gets_a_note(tmp_path):
    preset, sizes, overrides = SMALL["crate-mae"]
    path = saved(tmp_path, "crate-mae", state_dict("crate-mae", sizes))
    imported = import_checkpoint(
        preset, path, "crate-mae", infer=True, overrides=[*overrides, "encoder.layer.sparsify.args.lambd=0.1"]
    )
    assert any("lambd=0.1; crate-mae's code computes with 0.5" in note for note in imported.notes)
    assert any("decoder_embed.weight" in skipped for skipped in imported.skipped)


# ---------------------------------------------------------------- the command line


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crate_compose.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_import_and_export_on_the_command_line(tmp_path):
    preset, sizes, overrides = SMALL["tost"]
    state = state_dict("tost", sizes, seed=2)
    path = saved(tmp_path, "tost", state)
    done = run(
        "import",
        preset,
        str(path),
        "--from",
        "tost",
        "--infer-sizes",
        *(f"--set={o}" for o in overrides),
        "--out",
        "imported",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "the prefix 'module.' was removed" in done.stderr and "imported" in done.stdout
    build = cc.load_build(tmp_path / "imported")
    assert torch.equal(build.state_dict()["encoder.layer_1.compress.temp"], state["blocks.1.attn.temp"])
    done = run("export", "imported", "--to", "tost", "--out", "back.pth", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    back = torch.load(tmp_path / "back.pth", weights_only=True)["model"]
    assert set(back) == set(state)


def test_a_refused_import_exits_2_and_writes_nothing(tmp_path):
    path = saved(tmp_path, "crate", state_dict("crate", SMALL["crate"][1]))
    done = run("import", "crate-tiny", str(path), "--from", "crate", "--keep-spec", "--out", "imported", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "does not fit crate-tiny as a crate checkpoint" in done.stderr
    assert not (tmp_path / "imported").exists()

"""Reading other code's checkpoints safely: tensors only, never code (crate_compose.interop.reading)."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from crate_compose.interop.reading import InteropError, read_checkpoint

TENSORS = {"cls_token": torch.randn(1, 1, 4), "mlp_head.1.weight": torch.randn(3, 4)}


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_safetensors_are_read_directly(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file(TENSORS, path)
    read = read_checkpoint(path)
    assert same(read.tensors, TENSORS) and read.notes == [] and len(read.sha256) == 64


def test_safetensors_are_recognised_without_their_suffix(tmp_path):
    path = tmp_path / "weights.bin"
    save_file(TENSORS, path)
    assert same(read_checkpoint(path).tensors, TENSORS)


@pytest.mark.parametrize(
    "nest, prefix", [(None, ""), ("model", "module."), ("state_dict", "module."), ("model", "_orig_mod."), ("net", "")]
)
def test_nesting_and_wrapper_prefixes_are_undone_and_said(tmp_path, nest, prefix):
    state = {prefix + k: v for k, v in TENSORS.items()}
    path = tmp_path / "ckpt.pth"
    torch.save({nest: state, "epoch": 3, "optimizer": {"state": {}}} if nest else state, path)
    read = read_checkpoint(path)
    assert same(read.tensors, TENSORS)
    assert any(repr(nest) in n for n in read.notes) == bool(nest)
    assert any(repr(prefix) in n for n in read.notes) == bool(prefix)


def test_training_scripts_command_lines_are_allowed(tmp_path):
    """DeiT and MAE save their argparse.Namespace beside the weights: a plain attribute holder."""
    path = tmp_path / "deit.pth"
    torch.save({"model": TENSORS, "args": argparse.Namespace(lr=5e-4, model="tost_small"), "epoch": 299}, path)
    assert same(read_checkpoint(path).tensors, TENSORS)


class Payload:
    """Unpickling this runs a shell command: the file must be refused before that can happen."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pth"
    torch.save({"model": TENSORS, "extra": Payload(marker)}, path)
    with pytest.raises(InteropError, match="refused.*weights_only=True") as error:
        read_checkpoint(path)
    assert "system" in str(error.value) and str(path) in str(error.value)
    assert not marker.exists()


def test_a_raw_pickle_is_refused_too(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"w": Payload(marker)}))
    with pytest.raises(InteropError):
        read_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04broken zip"])
def test_garbage_and_truncated_files_are_refused_with_their_name(tmp_path, content):
    path = tmp_path / "broken.pth"
    path.write_bytes(content)
    with pytest.raises(InteropError, match="broken.pth"):
        read_checkpoint(path)


def test_a_truncated_torch_file_is_refused(tmp_path):
    path = tmp_path / "cut.pth"
    torch.save({"model": TENSORS}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(InteropError, match="cut.pth"):
        read_checkpoint(path)


def test_a_file_without_a_dictionary_of_tensors_says_what_it_found(tmp_path):
    path = tmp_path / "list.pth"
    torch.save({"model": [1, 2, 3], "epoch": 1}, path)
    with pytest.raises(InteropError, match="no dictionary of tensors.*'model'"):
        read_checkpoint(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(InteropError, match="no such checkpoint file"):
        read_checkpoint(tmp_path / "nowhere.pth")


# ---------------------------------------------------------------- an authors' checkpoint holding NaN or Inf


DIGITS_SETS = [
    "sizes.patch_size=4",
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.depth=2",
    "preprocess.patch_embed.args.norm=true",
]  # crate-digits as the authors' CRATE computes it


def _diverged(tmp_path):
    """A CRATE checkpoint of the authors' layout fitting crate-digits, two of its tensors NaN and Inf."""
    from authors_files import saved
    from reference.authors import state_dict

    sizes = dict(image_size=8, channels=1, patch_size=4, d=32, depth=2, heads=2, head_dim=16, classes=10)
    state = state_dict("crate", sizes, dtype=torch.float32)
    names = sorted(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)[:2]
    state[names[0]] = state[names[0]].clone().fill_(float("nan"))
    state[names[1]] = state[names[1]].clone()
    state[names[1]][0, 0] = float("-inf")
    return saved(tmp_path, "crate", state), names


def test_an_authors_checkpoint_holding_nan_or_inf_is_refused_by_every_command(tmp_path, capsys, monkeypatch):
    """As a build folder's NaN is: import, evaluate, linear-probe, probe and show each exit 2 naming the file and
    the tensors, and write nothing (interop.exchange.fitted, which import and --weights FILE both go through)."""
    from crate_compose.cli import main

    path, names = _diverged(tmp_path)
    monkeypatch.chdir(tmp_path)
    sets = [arg for override in DIGITS_SETS for arg in ("--set", override)]
    spec = str(Path(__file__).resolve().parent.parent / "specs" / "crate-digits.yaml")
    commands = {
        "import": ["import", spec, str(path), *sets, "--out", "imported"],
        "evaluate": ["evaluate", spec, "--weights", str(path), *sets, "--out", "evaluated.json"],
        "linear-probe": ["linear-probe", spec, "--weights", str(path), *sets, "--out", "probed.json"],
        "probe": ["probe", spec, "--weights", str(path), *sets, "--samples", "16", "--out", "probes"],
        "show": ["show", spec, "--weights", str(path), *sets, "--out", "pictures"],
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for command, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, command
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"{path}: 2 tensors hold NaN or infinite values" in err, (command, err)
        assert all(name in err for name in names), (command, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, command  # nothing written

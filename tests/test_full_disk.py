"""Outputs that cannot be written (issue "Trustworthy runs"): a full disk (ENOSPC) and a read-only
folder (EROFS) give exit status 1 and a message naming the path, remove every temporary file, and
leave earlier outputs intact (crate_compose/files.py).

The disk is real where this machine allows it: a small tmpfs (``mount -t tmpfs -o size=...``),
remounted read-only for EROFS. Where mounting is not permitted (no root), the same tests run with
the failure injected where the operating system would report it (writes of more than the room
left, safetensors' own error type, temporary files that cannot be created), so every assertion
runs either way; ``injected`` runs them that way here too.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from disks import Disk  # tests/disks.py

import crate_compose as cc
from crate_compose import files
from crate_compose.cli import main

DIGITS = str(Path(__file__).resolve().parent.parent / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
SETS = [arg for override in TINY for arg in ("--set", override)]


@pytest.fixture(params=["tmpfs", "injected"])
def disk(request, tmp_path, monkeypatch):
    """A 4 MB disk: a real tmpfs where mounting is permitted, else (and for ``injected``) injected failures."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = (
        request.param == "tmpfs"
        and shutil.which("mount") is not None
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield Disk(folder, monkeypatch, real=mounted)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return cc.load_build(folder).state_dict()


def test_a_build_onto_a_full_disk_names_the_file_and_keeps_the_earlier_build(disk, capsys):
    out = disk.folder / "b"
    assert main(["build", DIGITS, *SETS, "--out", str(out)]) == 0
    before = _weights(out)
    disk.leave(32_000)  # the full crate-digits weights are 210 kB
    assert main(["build", DIGITS, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"No space left on device: '{out / 'model.safetensors'}'" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert disk.temporary_files() == []
    after = _weights(out)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_a_build_into_a_read_only_folder_names_it_and_keeps_the_earlier_build(disk, capsys):
    out = disk.folder / "b"
    assert main(["build", DIGITS, *SETS, "--out", str(out)]) == 0
    before = _weights(out)
    disk.read_only()
    assert main(["build", DIGITS, *SETS, "--seed", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "Read-only file system" in err and str(out) in err, err
    assert disk.temporary_files() == []
    assert all(torch.equal(_weights(out)[k], v) for k, v in before.items())


def test_a_diagram_and_a_derived_spec_onto_a_full_disk_name_their_path(disk, capsys):
    disk.leave(100)
    derived, drawn = disk.folder / "derived.yaml", disk.folder / "net.dot"
    assert main(["derive", "crate-tiny", "--out", str(derived)]) == 1
    assert main(["render", "crate-tiny", "--format", "dot", "--out", str(drawn)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: cannot write output: [Errno 28] No space left on device: '{derived}'", err
    assert err[1] == f"error: cannot write output: [Errno 28] No space left on device: '{drawn}'", err
    assert not derived.exists() and not drawn.exists() and disk.temporary_files() == []


def test_probe_onto_a_full_disk_names_the_file_and_keeps_the_earlier_pair(disk, capsys):
    out = disk.folder / "probes"
    probe = ["probe", DIGITS, *SETS, "--samples", "16", "--out", str(out)]
    assert main(probe) == 0
    capsys.readouterr()
    earlier = {name: (out / name).read_bytes() for name in ("probes.json", "probes.png")}
    disk.leave(1_000)
    assert main([*probe, "--seed", "1"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and f"{out}/probes." in err, err
    assert {name: (out / name).read_bytes() for name in earlier} == earlier  # both old, neither new
    assert disk.temporary_files() == []


def test_save_tensors_raises_the_oserror_safetensors_reports(disk):
    disk.leave(4_000)
    path = disk.folder / "x.safetensors"
    with pytest.raises(OSError) as raised:
        files.save_tensors({"w": torch.zeros(100_000)}, path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert not path.exists() and disk.temporary_files() == []


def test_the_errno_of_a_library_message():
    assert files._errno_of("Error while serializing: I/O error: No space left on device (os error 28)") == 28
    assert files._errno_of("I/O error: Os { code: 30, kind: ReadOnlyFilesystem }") == 30
    assert files._errno_of("Read-only file system") == errno.EROFS
    assert files._errno_of("tensor is not contiguous") is None  # not a failed write: left as it is


def _left(disk: Disk) -> list[str]:
    """Everything on the disk but the filler that fills it up."""
    return sorted(str(p.relative_to(disk.folder)) for p in disk.folder.rglob("*") if p.name != "filler")


def test_a_refused_probe_removes_the_folder_it_made_and_only_that(disk, capsys):
    """The lock makes the folder (and its new parents); a probe that cannot write its pair removes them again.
    A folder that was there before stays, with nothing of the probe's in it."""
    disk.leave(1_000)
    made = disk.folder / "new" / "probes"
    probe = ["probe", DIGITS, *SETS, "--samples", "16"]
    assert main([*probe, "--out", str(made)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert _left(disk) == []  # no .lock, no probes/, no new/
    (disk.folder / "mine").mkdir()
    assert main([*probe, "--out", str(disk.folder / "mine")]) == 1
    assert _left(disk) == ["mine"]  # the user's folder kept, empty as it was


def test_a_refused_ablation_removes_what_it_made_and_keeps_what_it_trained(disk, capsys):
    """An ablation that cannot train its first run (a full disk) wrote nothing of value: its folder, record,
    lock and variant folders go. One whose first run trained keeps it, to resume."""
    ablate = [
        "ablate",
        DIGITS,
        *SETS,
        "--swap",
        "encoder.layer.sparsify.primitive=ista,ista_soft",
        "--data",
        "digits",
        "--batch-size",
        "16",
        "--steps",
        "2",
        "--no-progress",
    ]
    disk.leave(20_000)
    assert main([*ablate, "--out", str(disk.folder / "abl")]) == 1
    assert str(disk.folder / "abl") in capsys.readouterr().err
    assert _left(disk) == []


def test_an_ablation_stopped_after_a_trained_run_keeps_it(tmp_path, capsys, monkeypatch):
    from crate_compose.ablation import study as ablation

    real, calls = ablation.train_described, []

    def second_fails(*args, **kwargs):
        calls.append(kwargs["out"])
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(kwargs["out"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(ablation, "train_described", second_fails)
    out = tmp_path / "abl"
    assert (
        main(
            [
                "ablate",
                DIGITS,
                *SETS,
                "--swap",
                "encoder.layer.sparsify.primitive=ista,ista_soft",
                "--data",
                "digits",
                "--batch-size",
                "16",
                "--steps",
                "2",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    assert (out / "ablation.json").is_file() and (out / "sparsify-ista" / "seed-0" / "final").is_dir()

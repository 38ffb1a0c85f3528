"""Nothing half-written (issue 11): every output is written under a temporary name and renamed.

Each writer is run in a child process that kills itself with SIGKILL at a chosen moment: halfway
through writing its largest file, or just before the rename that publishes it. Afterwards the
destination holds the old output, complete, or nothing: never a mix. Outputs that are not
regular files (a FIFO, a device) are refused, not replaced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import crate_compose as cc
from crate_compose.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = ["sizes.d=32", "sizes.heads=2", "sizes.depth=1"]

# The child: build (seed 0) into OUT once when asked, then arm the kill and write again (seed 1).
CHILD = """
import os, signal, sys
from pathlib import Path
import crate_compose as cc
from crate_compose import files

out, moment, writer, first = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
model = cc.build("crate-digits", overrides={tiny!r}, seed=0)

def write(seed):
    if writer == "build":
        cc.save(cc.build("crate-digits", overrides={tiny!r}, seed=seed), out)
    elif writer == "file":
        files.write_atomic(out, f"seed {{seed}}\\n" * 100_000)
    elif writer == "diagram":
        cc.render(model, out, format="dot", expand=bool(seed))

if first:
    write(0)

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if moment == "midway" and writer == "build":  # the weights, the largest file, are half written
    import safetensors.torch
    def half(tensors, path, *args, **kwargs):
        Path(path).write_bytes(b"\\0" * 1000)
        die()
    safetensors.torch.save_file = half  # what files.save_tensors calls
elif moment == "midway":  # the file is half written when the process dies
    real_write_bytes = Path.write_bytes
    def half_bytes(self, data):
        real_write_bytes(self, data[: len(data) // 2])
        die()
    Path.write_bytes = half_bytes
else:  # everything is written; the publishing rename never happens
    real_replace = Path.replace
    def replace(self, target):  # files staged inside a build's temporary folder are renamed there
        return die() if Path(target).resolve() == out.resolve() else real_replace(self, target)
    Path.replace = replace
    Path.rename = die
    files._exchange = die
write(1)
print("not killed")
"""


def _killed(out: Path, moment: str, writer: str, first: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(tiny=TINY), str(out), moment, writer, str(int(first))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


@pytest.mark.parametrize("moment", ["midway", "before-rename"])
@pytest.mark.parametrize("first", [False, True], ids=["new", "replacing"])
def test_a_build_killed_while_writing_leaves_the_old_build_or_none(tmp_path, moment, first):
    out = tmp_path / "build"
    _killed(out, moment, "build", first)
    if not first:
        assert not out.exists()
        return
    old = cc.load_build(out)  # the complete first build, loadable
    expected = cc.build("crate-digits", overrides=TINY, seed=0).state_dict()
    assert all(torch.equal(old.state_dict()[k], v) for k, v in expected.items())


@pytest.mark.parametrize("moment", ["midway", "before-rename"])
@pytest.mark.parametrize("writer", ["file", "diagram"])
def test_a_file_writer_killed_midway_leaves_the_old_file(tmp_path, moment, writer):
    out = tmp_path / ("table.md" if writer == "file" else "net.dot")
    _killed(out, moment, writer, True)
    text = out.read_text()
    if writer == "file":
        assert text == "seed 0\n" * 100_000
    else:
        assert text.startswith("digraph") and text.rstrip().endswith("}")


def test_a_checkpoint_killed_midway_is_never_taken_for_a_complete_one(tmp_path):
    from crate_compose.training.run_folder import checkpoint

    model = cc.build("crate-digits", overrides=TINY)
    optimizer = torch.optim.AdamW(model.parameters())
    run = tmp_path / "run"
    checkpoint.save_checkpoint(run, 10, model, optimizer, {})
    # a later checkpoint cut short: its staging folder is left behind, and ignored
    partial = run / "checkpoints" / ".step-000020.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\0" * 10)
    assert checkpoint.latest_checkpoint(run).name == "step-000010"


def test_outputs_never_replace_a_fifo_or_a_device(tmp_path, capsys):
    fifo = tmp_path / "derived.yaml"
    os.mkfifo(fifo)
    assert main(["derive", "crate-tiny", "--out", str(fifo)]) == 1
    assert "is a FIFO" in capsys.readouterr().err
    dot = tmp_path / "net.dot"
    os.mkfifo(dot)
    assert main(["render", "crate-tiny", "--format", "dot", "--out", str(dot)]) == 1
    assert "is a FIFO" in capsys.readouterr().err
    assert fifo.is_fifo() and dot.is_fifo()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary file was left behind"


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_character_device_like_dev_full_survives_an_output_aimed_at_it(tmp_path, capsys):
    import stat

    device = tmp_path / "full"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers
    assert main(["derive", "crate-tiny", "--out", str(device)]) == 1
    assert "is a character device" in capsys.readouterr().err
    assert device.is_char_device()


def test_metrics_survive_a_line_cut_short_by_a_kill(tmp_path):
    from crate_compose.training.metrics import rows_of as _rows

    text = '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo'
    assert [row["step"] for row in _rows(text)] == [1, 2]


KILLED_CHECKPOINT = """
import os, signal, sys
from pathlib import Path
import safetensors.torch, torch
import crate_compose as cc
from crate_compose.training.run_folder import checkpoint

run = Path(sys.argv[1])
model = cc.build("crate-digits", overrides={tiny!r})
optimizer = torch.optim.AdamW(model.parameters())
checkpoint.save_checkpoint(run, 10, model, optimizer, {{}})

def half(tensors, path, *args, **kwargs):  # the weights of the build inside the checkpoint, half written
    Path(path).write_bytes(b"\\0" * 1000)
    os.kill(os.getpid(), signal.SIGKILL)

safetensors.torch.save_file = half
checkpoint.save_checkpoint(run, 20, model, optimizer, {{}})
print("not killed")
"""


def test_a_checkpoint_killed_while_its_build_is_written_leaves_nothing_a_resume_keeps(tmp_path):
    """SIGKILL while the build inside a checkpoint is written leaves the checkpoint's staging folder and, beside it,
    the build's own (``..step-000020.X.partial.Y.partial``): the cleanup of a resume removes both, and nothing
    else (a complete checkpoint, a user's files and folders whose names only look alike)."""
    from crate_compose.training.run_folder import checkpoint

    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CHECKPOINT.format(tiny=TINY), str(run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    folder = run / "checkpoints"
    left = sorted(p.name for p in folder.iterdir() if p.name != "step-000010")
    assert len(left) == 2 and left[0].startswith("..step-000020.") and left[1].startswith(".step-000020."), left
    assert left[0].count(".partial") == 2 and all((folder / name).is_dir() for name in left)
    # a deeper one, as a further staging level would name it, and what is not the writer's
    (folder / "...step-000030.abcd1234.partial.efgh5678.partial.ijkl9012.partial").mkdir()
    users = {
        "notes.partial": "file",
        ".step-000040.mine.partial": "file",
        ".step-draft.partial": "folder",
        "step-000050.partial": "folder",
        ".step-000010.abcd1234.old": "folder",
    }
    for name, kind in users.items():
        (folder / name).mkdir() if kind == "folder" else (folder / name).write_text("mine\n")
    checkpoint.prune_partial(run)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["step-000010", *users])
    assert checkpoint.latest_checkpoint(run).name == "step-000010"
    assert cc.load_build(folder / "step-000010").state_dict().keys()  # complete and loadable

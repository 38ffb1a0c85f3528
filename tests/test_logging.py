"""Logging: TensorBoard event files beside metrics.jsonl (``--logger tensorboard|none``), exact on resume.

Every run here is a tiny CRATE on the 8x8 digits driven through the command line. The event files
are read back with TensorBoard's own reader (``EventAccumulator``, which applies purges as
TensorBoard's Python loader does), and raw (every record of every file, no purge applied: what a
loader that ignores purges, such as TensorBoard's Rust data server, would show).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader  # noqa: E402

from crate_compose import cli  # noqa: E402
from crate_compose.errors import TrainError  # noqa: E402
from crate_compose.settings import Settings  # noqa: E402
from crate_compose.tasks import settings_problems  # noqa: E402
from crate_compose.training.run import train  # noqa: E402
from crate_compose.training.run_folder import (
    eventlog,  # noqa: E402
    identity,
)

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
CLI = [sys.executable, "-m", "crate_compose.cli"]
BATCH = 16


def _args(out: Path, steps: int, *extra: str) -> list[str]:
    sets = [arg for o in TINY for arg in ("--set", o)]
    return [
        "train",
        DIGITS,
        *sets,
        "--data",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        str(BATCH),
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _f32(value: float) -> float:
    """A value as TensorBoard stores a scalar (float32)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _expected(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """The scalars metrics.jsonl says the event files hold: every number of a row as KIND/NAME."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for name, value in row.items():
            if name not in ("step", "kind", "seconds") and isinstance(value, (int, float)):
                scalars.setdefault(f"{row['kind']}/{name}", []).append((row["step"], _f32(value)))
    return scalars


def _accumulated(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars as TensorBoard's accumulator shows them (every point kept, purges applied)."""
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def _raw(folder: Path) -> Counter:
    """How often each (tag, step) is written in the folder's files, no purge applied."""
    seen: Counter = Counter()
    for path in sorted(folder.iterdir()):
        for event in LegacyEventFileLoader(str(path)).Load():
            if event.HasField("summary"):
                seen.update((value.tag, event.step) for value in event.summary.value)
    return seen


def _board_equals_metrics(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The run's event files hold exactly metrics.jsonl's numbers at its steps, each once, in one file,
    and the throughput at every train row; returns what the accumulator shows."""
    folder = run / eventlog.FOLDER
    assert len(list(folder.iterdir())) == 1, sorted(p.name for p in folder.iterdir())
    shown, rows = _accumulated(folder), _rows(run)
    expected = _expected(rows)
    train_steps = [row["step"] for row in rows if row["kind"] == "train"]
    assert set(shown) == {*expected, *eventlog.THROUGHPUT}
    for tag, points in expected.items():
        assert shown[tag] == points, tag
    for tag in eventlog.THROUGHPUT:
        assert [step for step, _ in shown[tag]] == train_steps
        assert all(value > 0 for _, value in shown[tag])
    raw = _raw(folder)
    assert set(raw.values()) == {1}, [key for key, count in raw.items() if count > 1]  # no loader sees a step twice
    return shown


def test_a_run_writes_its_metrics_as_tensorboard_scalars(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(_args(run, 12, "--log-every", "2", "--eval-every", "6", "--checkpoint-every", "6")) == 0
    assert "tensorboard/" in capsys.readouterr().out
    shown = _board_equals_metrics(run)
    rows = _rows(run)
    assert [s for s, _ in shown["train/loss"]] == [2, 4, 6, 8, 10, 12]
    assert [s for s, _ in shown["eval/test_accuracy"]] == [s for s, _ in shown["eval/test_loss"]] == [6, 12]
    assert shown["train/lr"] == [(r["step"], _f32(r["lr"])) for r in rows if r["kind"] == "train"]
    # the throughput over each interval between train rows, from the rows' own clock (seconds since the start)
    train_rows = [r for r in rows if r["kind"] == "train"]
    previous = [(0, 0.0)] + [(r["step"], r["seconds"]) for r in train_rows[:-1]]
    for (step, per_second), (before, began), row in zip(shown["throughput/steps_per_second"], previous, train_rows):
        assert per_second == pytest.approx((step - before) / (row["seconds"] - began), rel=1e-6)
    for (_, steps), (_, examples) in zip(shown["throughput/steps_per_second"], shown["throughput/examples_per_second"]):
        assert examples == pytest.approx(steps * BATCH, rel=1e-6)


def test_logger_none_writes_no_event_files(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(_args(run, 4, "--log-every", "1", "--logger", "none")) == 0
    assert "tensorboard" not in capsys.readouterr().out
    assert not (run / eventlog.FOLDER).exists() and len(_rows(run)) == 5  # metrics.jsonl as ever
    assert cli.main(["probe", str(run), "--samples", "8", "--logger", "none"]) == 0
    assert [p.name for p in (run / "probes" / "final").iterdir() if "tfevents" in p.name] == []
    assert (run / "probes" / "final" / "probes.json").is_file()


def test_the_logger_is_no_part_of_the_run(tmp_path, capsys):
    """A run started without event files resumes with them (and the other way round): same identity."""
    run = tmp_path / "run"
    assert cli.main(_args(run, 4, "--log-every", "1", "--checkpoint-every", "2", "--logger", "none")) == 0
    record = json.loads((run / identity.RUN_FILE).read_text())
    assert "logger" not in record["identity"]["settings"]
    assert (
        cli.main(_args(run, 6, "--log-every", "1", "--checkpoint-every", "2", "--resume", "--logger", "tensorboard"))
        == 0
    )
    assert json.loads((run / identity.RUN_FILE).read_text())["hash"] == record["hash"]
    shown = _accumulated(run / eventlog.FOLDER)
    assert [s for s, _ in shown["train/loss"]] == [5, 6]  # what this resume trained; the steps before had none
    assert cli.main(_args(run, 8, "--log-every", "1", "--checkpoint-every", "2", "--resume", "--logger", "none")) == 0
    note = capsys.readouterr().err
    assert "is left as it was" in note
    assert [s for s, _ in _accumulated(run / eventlog.FOLDER)["train/loss"]] == [5, 6]  # untouched by --logger none


def test_resume_from_an_earlier_checkpoint_drops_the_later_points(tmp_path):
    run = tmp_path / "run"
    args = _args(run, 12, "--log-every", "1", "--eval-every", "4", "--checkpoint-every", "4")
    assert cli.main(args) == 0
    before = _accumulated(run / eventlog.FOLDER)
    assert cli.main([*args, "--resume-from", "4"]) == 0  # steps 5..12 trained again: their old points go
    shown = _board_equals_metrics(run)
    assert [s for s, _ in shown["train/loss"]] == list(range(1, 13))
    assert shown["train/loss"] == before["train/loss"]  # exact resume: the same losses, each once
    assert [p[0] for p in shown["throughput/steps_per_second"][:4]] == [1, 2, 3, 4]
    aside = list((run / "superseded").glob(f"*/{eventlog.FOLDER}"))
    assert len(aside) == 1 and _accumulated(aside[0])["train/loss"] == before["train/loss"]  # never deleted


def _past_a_checkpoint(run: Path, least: int) -> bool:
    """Whether the run has a checkpoint at step ``least`` or later, and event points on disk past it."""
    found = [int(p.name[5:]) for p in (run / "checkpoints").glob("step-*")] if (run / "checkpoints").is_dir() else []
    if not found or max(found) < least:
        return False
    written = [step for tag, step in _raw(run / eventlog.FOLDER) if tag == "train/loss"]
    return bool(written) and max(written) > max(found)


def test_a_run_killed_and_resumed_shows_each_step_once(tmp_path):
    steps, run = 80, tmp_path / "run"
    args = [*CLI, *_args(run, steps, "--log-every", "1", "--checkpoint-every", "10", "--eval-every", "10")]
    process = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not _past_a_checkpoint(run, 20) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)  # after points past the checkpoint: the resumed run writes them again
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (run / "final").exists(), "the run ended before it was killed: the test proved nothing"
    killed_at = max(int(p.name[5:]) for p in (run / "checkpoints").glob("step-*"))
    written = max(step for tag, step in _raw(run / eventlog.FOLDER) if tag == "train/loss")
    assert written > killed_at  # on disk: every point up to the checkpoint, and later ones the resume writes again
    subprocess.run([*args, "--resume"], env=ENV, check=True, capture_output=True)
    shown = _board_equals_metrics(run)
    assert [s for s, _ in shown["train/loss"]] == list(range(1, steps + 1))
    assert [s for s, _ in shown["eval/test_accuracy"]] == list(range(10, steps + 1, 10))


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_only_rank_zero_writes_event_files_under_torchrun(tmp_path):
    run = tmp_path / "run"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node=2", "-m", "crate_compose.cli", *_args(run, 4, "--log-every", "1")],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    _board_equals_metrics(run)  # one file, each step once


def test_probe_curves_appear_beside_probes_json(tmp_path):
    run = tmp_path / "run"
    assert cli.main(_args(run, 2, "--logger", "none")) == 0
    assert cli.main(["probe", str(run), "--samples", "8"]) == 0
    folder = run / "probes" / "final"
    table = json.loads((folder / "probes.json").read_text())
    shown = _accumulated(folder)
    measures = {row["measure"] for row in table["trained"]}
    assert set(shown) == {f"probes/{m}/{r}" for m in measures for r in ("trained", "untrained")}
    for name, rows in table.items():
        for measure in measures:
            mine = [r for r in rows if r["measure"] == measure]
            assert shown[f"probes/{measure}/{name}"] == [(r["layer"] + 1, _f32(r["value"])) for r in mine]
    assert [s for s, _ in shown["probes/coding_rate/trained"]] == [1, 2]  # the layer is the step
    assert cli.main(["probe", str(run), "--samples", "8", "--seed", "1"]) == 0  # probed again: replaced, not added
    assert len([p for p in folder.iterdir() if "tfevents" in p.name]) == 1
    assert set(_raw(folder).values()) == {1}
    assert _accumulated(folder)["probes/coding_rate/trained"] != shown["probes/coding_rate/untrained"]


def test_probe_curves_of_two_roles_and_of_unnumbered_steps():
    rows = [
        {"measure": "coding_rate", "role": role, "layer": layer, "value": value}
        for role, layer, value in (("encoder", 0, 3.0), ("encoder", 1, 2.0), ("decoder", 0, 1.0))
    ]
    rows.append({"measure": "snr", "role": "input", "layer": None, "value": None})
    curves = eventlog.probe_curves({"trained": rows})
    assert curves["probes/coding_rate/trained/encoder"] == [(1, 3.0), (2, 2.0)]
    assert curves["probes/coding_rate/trained/decoder"] == [(1, 1.0)]
    assert len(curves["probes/snr/trained"]) == 1 and curves["probes/snr/trained"][0][0] == 1


def test_the_logger_setting_and_a_missing_package(tmp_path, monkeypatch):
    assert settings_problems(Settings(logger="tensorboard")) == settings_problems(Settings(logger=None)) == []
    assert [name for name, _ in settings_problems(Settings(logger="wandb"))] == ["logger"]
    assert eventlog.choose(None) == "tensorboard" and eventlog.choose("none") == "none"
    monkeypatch.setattr(eventlog, "available", lambda: False)
    notes: list[str] = []
    assert eventlog.choose(None, notes.append) == "none" and "pip install tensorboard" in notes[0]
    out = tmp_path / "run"
    with pytest.raises(TrainError, match="--logger tensorboard: the tensorboard package is not installed"):
        train(DIGITS, Settings(steps=1, logger="tensorboard"), overrides=TINY, out=out, progress=False)
    assert not out.exists()  # refused before anything was written
    train(DIGITS, Settings(steps=1, batch_size=BATCH), overrides=TINY, out=out, progress=False, notes=notes.append)
    assert not (out / eventlog.FOLDER).exists() and any("not installed" in n for n in notes[1:])


def test_an_ablation_resumes_with_another_logger():
    from crate_compose.ablation.grids import Grid
    from crate_compose.ablation.study import _identity
    from crate_compose.training.description import describe

    swaps = {"encoder.layer.sparsify.primitive": ["ista", "ista_soft"]}
    grids = [Grid(swaps, Settings(steps=2, logger=logger), overrides=TINY) for logger in ("tensorboard", "none", None)]
    identities = {
        json.dumps(_identity(describe(DIGITS, grid.settings, overrides=grid.overrides), grid), sort_keys=True)
        for grid in grids
    }
    assert len(identities) == 1


def test_a_tensorboard_folder_that_stops_taking_writes_stops_the_logging_not_the_run(tmp_path, capsys, monkeypatch):
    """The event file is open when the folder stops taking writes (a full disk, a folder remounted read-only:
    a chmod of the folder would not stop writes into a file already open, and root ignores modes anyway), so
    the failure is injected where the writer's thread meets it: its record writer raises ENOSPC from the 8th
    record on. The run finishes (exit 0) with every row in metrics.jsonl; stderr has one note naming the folder
    and the reason, and no traceback (none from the writer's thread either)."""
    import errno
    import threading

    from tensorboard.summary.writer import record_writer

    real, written, raised = record_writer.RecordWriter.write, [], []

    def full(self, data):
        written.append(len(data))
        if len(written) > 7:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", full)
    monkeypatch.setattr(threading, "excepthook", lambda info: raised.append(info.exc_value))
    run = tmp_path / "run"
    assert cli.main(_args(run, 8, "--log-every", "1")) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err and raised == [], (err, raised)
    notes = [line for line in err.splitlines() if "TensorBoard" in line]
    assert notes == [
        f"note: TensorBoard logging stopped: {run / eventlog.FOLDER} cannot be written ([Errno 28] No "
        "space left on device); the run goes on, its metrics in metrics.jsonl and metrics.csv"
    ], err
    assert [row["step"] for row in _rows(run) if row["kind"] == "train"] == list(range(1, 9))
    assert (run / "final").is_dir() and (run / "result.json").is_file()


def test_a_tensorboard_folder_that_takes_no_write_from_the_start_stops_the_logging_not_the_run(
    tmp_path, capsys, monkeypatch
):
    """The event file cannot be written at all (a read-only folder: the writer opens the file for each write, so
    the first one fails; injected where the writer's thread meets it, as root ignores modes). That first write
    happens in the writer's own thread while it is made, before the writer's records can be guarded: it is one
    note all the same, never a traceback from that thread, and the run finishes (exit 0) with its metrics."""
    import errno
    import threading

    from tensorboard.summary.writer import record_writer

    def denied(self, data):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    raised = []
    monkeypatch.setattr(record_writer.RecordWriter, "write", denied)
    monkeypatch.setattr(threading, "excepthook", lambda info: raised.append(info.exc_value))
    run = tmp_path / "run"
    assert cli.main(_args(run, 4, "--log-every", "1", "--logger", "tensorboard")) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err and raised == [], (err, raised)
    notes = [line for line in err.splitlines() if "TensorBoard" in line]
    assert notes == [
        f"note: TensorBoard logging stopped: {run / eventlog.FOLDER} cannot be written ([Errno 13] "
        "Permission denied); the run goes on, its metrics in metrics.jsonl and metrics.csv"
    ], err
    assert [row["step"] for row in _rows(run) if row["kind"] == "train"] == [1, 2, 3, 4]
    assert (run / "final").is_dir() and (run / "result.json").is_file()
    assert not [t for t in threading.enumerate() if type(t).__module__.startswith("tensorboard.")]  # none left


def test_probe_curves_that_cannot_be_written_are_one_error_and_no_half_file(tmp_path, capsys, monkeypatch):
    from tensorboard.summary.writer import record_writer

    run = tmp_path / "run"
    assert cli.main(_args(run, 2, "--logger", "none")) == 0
    real = record_writer.RecordWriter.write
    monkeypatch.setattr(
        record_writer.RecordWriter,
        "write",
        lambda self, data: (
            (_ for _ in ()).throw(OSError(28, "No space left on device")) if b"probes/" in data else real(self, data)
        ),
    )
    capsys.readouterr()
    assert cli.main(["probe", str(run), "--samples", "8"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: cannot write output: [Errno 28] No space left on device" in err, err
    assert not [p for p in (run / "probes" / "final").iterdir() if eventlog.INFIX in p.name]

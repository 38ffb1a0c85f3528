"""What a run tells its user (issue 27): a resumed run says so and its clock goes on, --compile says why the
first step is slow and the time left leaves it out, the time left follows the machine's recent speed, and a
recipe's warm-up does not swallow a run shortened with --steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from crate_compose.settings import Settings
from crate_compose.training import progress
from crate_compose.training import run as train_module
from crate_compose.training.run import train

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]

pytestmark = pytest.mark.usefixtures("one_thread")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_time_left_follows_the_recent_steps_not_the_first_or_the_whole_run(monkeypatch, capsys):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    lines = progress.Lines(1000, every_s=1e9)
    clock.now += 600.0  # the first step compiled for ten minutes
    lines.update()
    for _ in range(99):  # then 10 steps a second
        clock.now += 0.1
        lines.update()
    assert lines.rate() == pytest.approx(10.0)
    for _ in range(300):  # the machine slows to 1 step a second: after two minutes, the rate is that alone
        clock.now += 1.0
        lines.update()
    assert lines.rate() == pytest.approx(1.0)
    lines._line(clock.now)
    assert "about 600 s left" in capsys.readouterr().err


def test_a_resumed_run_says_so_and_its_clock_goes_on(tmp_path):
    run, said = tmp_path / "run", []
    settings = Settings(steps=4, batch_size=8, checkpoint_every=2, log_every=1)
    train(DIGITS, settings, overrides=TINY, out=run, progress=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["step"] <= 2]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))  # as a run killed after step 2
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "checkpoints" / "step-000004")
    (run / "result.json").unlink()
    result = train(DIGITS, settings, overrides=TINY, out=run, progress=False, resume=True, notes=said.append)
    assert any(note.startswith("resumed at step 2 of 4 from ") for note in said), said
    seconds = [
        json.loads(line)["seconds"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("kind") == "train"
    ]
    assert seconds == sorted(seconds) and result.seconds >= seconds[1]  # never back to zero


def test_a_recipe_warm_up_longer_than_half_the_run_is_shortened_and_said(tmp_path):
    said = []
    settings = Settings(steps=20, batch_size=64, warmup_epochs=5)  # 5 epochs of digits: 110 steps
    train(DIGITS, settings, overrides=TINY, out=tmp_path / "run", progress=False, notes=said.append)
    assert any("warmup_epochs 5 would be 110 of this run's 20 steps: warming up for 1 (5%)" in note for note in said), (
        said
    )
    identity = json.loads((tmp_path / "run" / "run.json").read_text())["identity"]
    assert identity["settings"]["warmup"] == 1


def test_compiling_says_why_the_first_step_is_slow(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(train_module.torch, "compile", lambda net, mode=None: net)  # the messages, not the compiler
    train(
        DIGITS,
        Settings(steps=2, batch_size=8, compile=True),
        overrides=TINY,
        out=tmp_path / "run",
        progress=False,
        notes=said.append,
    )
    assert any(note.startswith("--compile: the first step compiles the network") for note in said)
    assert any(note.startswith("compiled, and took the first step, in ") for note in said)

"""benchmarks/device_check.py, the one check run first whenever a GPU is lent: its dry run on the CPU writes
the section with every step reported and within the limits on what comes back from the GPU machine; the
collapse detector tells a collapsed run (the loss back at ln 10 and staying) from a healthy one, and a
collapse keeps the weights from before and after the jump; without CUDA and without --dry-run it refuses
with exit status 2 and says to use --dry-run.

The dry run takes about a minute on 2 cores (its steps at toy sizes, one thread each)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import device_check as check  # noqa: E402  (benchmarks/device_check.py)

HEADINGS = [heading for _, heading, _ in check.STEPS]


def run_script(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "OUT"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_dry_run_reports_every_step_with_its_figures(tmp_path, device):
    """One test, not one per property: the dry run takes a minute, and pytest-xdist would run a module's
    fixture once per worker that takes one of its tests."""
    if device.type != "cpu":  # the check's own step b runs this suite on the GPU: no minute of it spent on the CPU
        pytest.skip("the dry run checks the script on the CPU; on a GPU, run the check itself")
    out = tmp_path / "out"
    done = run_script("--dry-run", "--out-dir", str(out), timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    section = (out / "section.md").read_text()
    assert section.startswith("## device_check.py: ") and "(CPU, dry run)" in section.splitlines()[0]
    assert check.DRY_NOTE in section
    positions = [section.index(f"\n### {heading}\n") for heading in HEADINGS]  # every step, in order
    assert positions == sorted(positions)
    assert "**Error**" not in section and "**Skipped**" not in section and "**failed**" not in section
    assert "**met**" not in section and "**not met**" not in section  # CPU toy sizes judge no GPU goal
    assert "(a GPU's goal: not judged in a dry run)" in section
    assert done.stdout.strip() == section.strip()  # the section is what it prints
    for heading in HEADINGS:  # each step's progress line on stderr
        assert f"] {heading}: ok, " in done.stderr

    data = json.loads((out / "device-check.json").read_text())
    assert {key: step["status"] for key, step in data["steps"].items()} == {key: "ok" for key, _, _ in check.STEPS}
    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["crate_compose"].startswith(str(ROOT))
    assert data["tests"]["complete"] and data["tests"]["counts"]["passed"] >= 10 and not data["tests"]["failures"]
    ratios = {(r["batch"], r["dtype"]): r for r in data["train_ratios"]}
    assert set(ratios) == {(2, "float32"), (2, "bfloat16"), (4, "bfloat16")}
    assert all(r["crate_images_per_s"] > 0 and r["vit_images_per_s"] > 0 for r in ratios.values())
    assert ratios[(2, "bfloat16")]["goal"] == check.RATIO_GOALS[False]  # bf16 eager at the goal's batch
    for model in ("CRATE-B", "ViT-B/16 (timm)"):
        profile = data["profile"][model]
        assert profile["kernels_per_step"] > 100 and 0 < profile["busy_ms_per_step"] and len(profile["top"]) == 15
        assert any("mm" in kernel["name"] for kernel in profile["top"][:3])  # the matrix products lead
    adamw = data["adamw"]
    assert adamw["parameters"] == 22_796_008 and all(t > 0 for t in adamw["median_s"].values())
    assert adamw["max_abs_difference"] < 1e-5  # fused and foreach take the same steps
    assert "lion_pytorch" in data["optimizer_step"]
    assert data["folder_run"]["last_step"] == 10 and data["folder_run"]["collapse"] is None

    files = list(out.iterdir())  # within what comes back from the GPU machine
    assert len(files) <= check.MAX_FILES and all(f.is_file() for f in files)
    assert all(check.SAFE_NAME.match(f.name) and f.stat().st_size <= check.MAX_BYTES for f in files)
    assert {"section.md", "device-check.json", "folder-run.png", "metrics.jsonl"} <= {f.name for f in files}
    assert (out / "folder-run.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_2_and_says_to_use_the_dry_run(tmp_path):
    done = run_script("--out-dir", str(tmp_path), timeout=60)
    assert done.returncode == 2
    assert "CUDA" in done.stderr and "--dry-run" in done.stderr
    assert not list(tmp_path.iterdir())


def rows(losses: list[float], every: int = 10) -> list[dict]:
    return [{"step": every * (i + 1), "kind": "train", "loss": loss, "lr": 1e-4} for i, loss in enumerate(losses)]


LEARNING = [2.3 - 1.4 * i / 80 for i in range(80)]  # 2.30 at step 10 down to 0.92 at step 800


def test_the_collapse_detector_flags_a_collapsed_run(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    collapsed = rows(LEARNING + [2.3021, 2.3040, 2.3026, 2.3019, 2.3030])  # as the H200 run: ln 10 from step 810
    evals = [{"step": 400, "kind": "eval", "test_accuracy": 0.9, "test_loss": 0.3}]
    metrics.write_text(
        "".join(json.dumps(r) + "\n" for r in collapsed + evals) + '{"step": 860, "kind": "tr'
    )  # cut short
    found = check.collapse(check.read_rows(metrics))
    assert found is not None and (found["step"], found["before_step"], found["last_step"]) == (810, 800, 850)
    assert abs(found["before_loss"] - LEARNING[-1]) < 1e-12


@pytest.mark.parametrize(
    "losses",
    [
        LEARNING,  # healthy
        LEARNING + [2.29, 1.2, 0.9],  # back at ln 10 for one logged step, then learning again
        [math.log(10)] * 20,  # never learned: never below 1.5
        LEARNING + [2.303],  # one logged step at the end says nothing yet
        LEARNING + [2.2, 2.21],  # high, but not a constant output
    ],
    ids=["healthy", "recovered", "never-learned", "last-step-only", "near-but-not-ln10"],
)
def test_the_collapse_detector_leaves_other_runs_alone(losses):
    assert check.collapse(rows(losses)) is None


def test_a_collapse_keeps_the_weights_before_and_after_the_jump(tmp_path, monkeypatch):
    """folder_step on a run that collapsed (train stopped it, exit 2): the checkpoints at 800 and 825 kept."""
    from safetensors.torch import load_file, save_file

    plan = check.dry_plan(300)
    work = tmp_path / "work"
    run = work / "folder-run"
    weights = {
        f"step-{step:06d}": {"w": torch.full((4, 4), float(step)), "b": torch.arange(3.0) + step}
        for step in (775, 800, 825, 850)
    }
    for name, tensors in weights.items():
        (run / "checkpoints" / name).mkdir(parents=True)
        save_file(tensors, str(run / "checkpoints" / name / "model.safetensors"))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(LEARNING + [2.3026] * 6)))
    state = check.Check(plan, check.Clock(300), work)
    said = "error: every example has had exactly the same output since step 815 (50 steps in a row; loss 2.3026)"
    monkeypatch.setattr(state, "run", lambda *args, **kwargs: check.Done(2, "", said, 5.0, False, 60.0))
    text = "\n".join(check.folder_step(state))
    assert "**Collapsed**" in text and said in text and "at step 810" in text
    assert set(state.files) == {
        "metrics.jsonl",
        "folder-run.png",
        "weights-step000800-1of1.safetensors",
        "weights-step000825-1of1.safetensors",
    }
    for step in (800, 825):
        (tmp_path / "kept").write_bytes(state.files[f"weights-step{step:06d}-1of1.safetensors"][1])
        kept = load_file(str(tmp_path / "kept"))
        assert kept.keys() == weights[f"step-{step:06d}"].keys()
        assert all(torch.equal(kept[k], weights[f"step-{step:06d}"][k]) for k in kept)


def test_weights_over_16_mib_are_split_into_files_that_merge_back(tmp_path):
    from safetensors.torch import load, save_file

    tensors = {f"layer{i}": torch.randn(1024, 1024) for i in range(6)}  # 6 x 4 MiB
    save_file(tensors, str(tmp_path / "model.safetensors"))
    parts = check.split_weights(tmp_path / "model.safetensors", "weights-step000800")
    assert list(parts) == ["weights-step000800-1of2.safetensors", "weights-step000800-2of2.safetensors"]
    assert all(len(content) <= check.MAX_BYTES for content in parts.values())
    merged = {k: v for content in parts.values() for k, v in load(content).items()}
    assert merged.keys() == tensors.keys() and all(torch.equal(merged[k], tensors[k]) for k in tensors)


def test_the_files_kept_are_the_first_8_by_priority_each_under_16_mib():
    files = {
        "device-check.json": (0, b"{}"),
        "profile.txt": (3, b"p"),
        "pytest.log": (3, b"l"),
        "metrics.jsonl": (1, b"m"),
        "folder-run.png": (1, b"f"),
        "huge.safetensors": (2, b"0" * (check.MAX_BYTES + 1)),
        **{f"weights-{i}.safetensors": (2, b"w") for i in range(4)},
    }
    kept, notes = check.chosen_files(files)
    assert kept[0] == "section.md" and len(kept) == check.MAX_FILES
    assert "huge.safetensors" not in kept and {"profile.txt", "pytest.log"}.isdisjoint(kept)
    assert {f"weights-{i}.safetensors" for i in range(4)} <= set(kept)
    assert len(notes) == 3 and any("huge.safetensors" in note and "MiB" in note for note in notes)


def test_pytest_counts_read_the_summary_or_else_the_progress_line():
    complete = """bringing up nodes...
..s.F...s.                                                           [100%]
=========================== short test summary info ============================
SKIPPED [2] tests/test_peers.py:37: could not import 'transformers': No module named 'transformers'
FAILED tests/test_speed_paths.py::test_folded_ista[bfloat16-cuda] - AssertionError: 0.031 > 0.02
1 failed, 7 passed, 2 skipped, 120 deselected in 12.31s
"""
    found = check.pytest_counts(complete)
    assert found["complete"] and found["counts"] == {"failed": 1, "passed": 7, "skipped": 2, "deselected": 120}
    assert found["failures"] == [
        {"test": "test_speed_paths.py::test_folded_ista[bfloat16-cuda]", "message": "AssertionError: 0.031 > 0.02"}
    ]
    assert found["skip_reasons"] == [("could not import 'transformers': No module named 'transformers'", 2)]
    stopped = check.pytest_counts("bringing up nodes...\n....s.....ss........ [ 12%]\n......F.\n")
    assert not stopped["complete"] and stopped["counts"] == {"passed": 24, "failed": 1, "skipped": 3, "errors": 0}


def test_gpu_busy_time_counts_overlapping_kernels_once():
    work = [("a", 0.0, 10.0), ("b", 5.0, 10.0), ("c", 30.0, 5.0)]  # (name, start us, us): a and b overlap
    assert check.busy_us(work, union=True) == 20.0
    assert check.busy_us(work, union=False) == 25.0
    summary = check.kernel_summary(work, steps=1, step_s=40e-6, union=True)
    assert summary["busy_ms_per_step"] == pytest.approx(0.020) and summary["kernels_per_step"] == 3
    assert [k["name"] for k in summary["top"]] == ["a", "b", "c"] and summary["top"][0]["share"] == pytest.approx(0.4)

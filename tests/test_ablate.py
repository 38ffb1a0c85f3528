"""Ablation grids you can believe (issue 17): grid files read and checked like specs, values deduplicated,
size bounded, every variant checked before anything trains, and a folder that knows its grid
(``ablation.json``), continued only with ``--resume`` and only when nothing differs.

Every refusal is checked for its exit status, its located words, no traceback and nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_workbench import one_thread  # noqa: F401  (autouse: one thread for small matrices)

from crate_compose import cli
from crate_compose.ablation.grids import Grid, GridError, parse_swap
from crate_compose.ablation.study import _folder, ablate, variant_label
from crate_compose.settings import MAX_RUNS, Settings
from crate_compose.spec_language import loader
from crate_compose.spec_language.naming import safe_name
from crate_compose.training import run as train_module

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
SPARSIFY = "encoder.layer.sparsify.primitive"
PNG = b"\x89PNG\r\n\x1a\n"


def _args(out, *extra):
    sets = [arg for o in TINY for arg in ("--set", o)]
    return [
        "ablate",
        DIGITS,
        *sets,
        "--data",
        "digits",
        "--batch-size",
        "16",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def _refused(capsys, argv, *words, status=2) -> str:
    """Run ``argv``: it exits with ``status``, printing ``words`` and no traceback."""
    capsys.readouterr()
    assert cli.main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def _runs(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.glob("*/seed-*") if (p / "result.json").is_file())


# ---------------------------------------------------------------- the Python API


def test_an_ablation_grid_runs_resumes_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "grid"
    grid = Grid({SPARSIFY: ["ista", "ista_soft"]}, Settings(steps=10), seeds=2, overrides=TINY)
    rows = ablate(DIGITS, grid, out=out)
    assert [r.variant for r in rows] == ["sparsify=ista", "sparsify=ista_soft"]
    assert all(len(r.values) == 2 and 0 <= r.mean <= 1 and r.params > 0 for r in rows)
    table = (out / "results.md").read_text()
    assert "| sparsify=ista_soft |" in table and "spread (std over seeds)" in table and "10 steps" in table
    assert (out / "results.csv").read_text().count("\n") == 3
    assert (out / "probes.png").read_bytes().startswith(PNG)
    probes = json.loads((out / "probes.json").read_text())  # every seed probed: the mean, its spread and range
    assert list(probes) == ["sparsify=ista", "sparsify=ista_soft", "sparsify=ista, untrained"]
    rate = next(r for r in probes["sparsify=ista"] if r["measure"] == "coding_rate")
    assert rate["seeds"] == 2 and len(rate["values"]) == 2 and rate["low"] <= rate["value"] <= rate["high"]
    assert rate["value"] == pytest.approx(sum(rate["values"]) / 2) and rate["spread"] > 0
    untrained = next(r for r in probes["sparsify=ista, untrained"] if r["measure"] == "coding_rate")
    assert untrained["values"] != rate["values"]
    soft = loader.load(out / "sparsify-ista_soft" / "seed-0" / "spec.yaml")
    plain = loader.load(out / "sparsify-ista" / "seed-0" / "spec.yaml")
    assert [s.primitive for s in soft.encoder.layer] == ["mssa", "ista_soft"]
    assert soft.encoder.layer[0] == plain.encoder.layer[0] and soft.preprocess == plain.preprocess
    recorded = json.loads((out / "ablation.json").read_text())["identity"]
    assert recorded["settings"]["steps"] == 10 and recorded["seeds"] == 2 and recorded["swaps"] == grid.swaps
    assert recorded["spec"]["name"] == "crate-digits.d-16.heads-2.head_dim-8.depth-1"
    assert len(recorded["spec"]["sha256"]) == 64
    stamp = (out / "sparsify-ista" / "seed-1" / "result.json").stat().st_mtime_ns
    capsys.readouterr()
    again = ablate(DIGITS, grid, out=out, resume=True)  # finished runs are read back, not trained again
    assert (out / "sparsify-ista" / "seed-1" / "result.json").stat().st_mtime_ns == stamp
    assert [r.mean for r in again] == [r.mean for r in rows]
    assert capsys.readouterr().out.count("finished before, kept") == 4


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: Grid({SPARSIFY: ["ista"]}, Settings(grad_clip=-1)), "grad_clip: -1 is not a finite number > 0"),
        (lambda: Grid({SPARSIFY: ["ista"]}, Settings(lr=float("nan"))), "lr: nan is not"),
        (lambda: Grid({SPARSIFY: ["ista"]}, seeds=0), "seeds: 0 is not a whole number of seeds"),
        (lambda: Grid({SPARSIFY: ["ista"]}, Settings(seed=3)), "seed: a grid trains seeds 0..seeds-1"),
        (lambda: Grid({}), "swaps: give the steps to swap"),
        (lambda: Grid({SPARSIFY: []}), "give a non-empty list of values"),
        (lambda: Grid({SPARSIFY: ["ista", None]}), "give a non-empty list of values"),
        (lambda: Grid({f"p{i}": list("abcd") for i in range(10)}), "1,048,576 runs (4 x 4 x 4 x 4 x 4 x 4"),
    ],
)
def test_a_grid_made_in_python_is_checked_by_the_same_rules(make, words):
    with pytest.raises(GridError) as caught:
        make()
    assert words in str(caught.value)


def test_a_huge_grid_is_refused_from_its_lengths():
    """10^12 variants: counted from the lengths of the lists, never made."""
    began = time.perf_counter()
    with pytest.raises(GridError, match=f"at most {MAX_RUNS}"):
        Grid({f"p{i}": [str(v) for v in range(1000)] for i in range(4)})
    assert time.perf_counter() - began < 1


def test_values_listed_twice_are_kept_once():
    grid = Grid({SPARSIFY: ["ista", "ista", "ista_soft", "ista"], "sizes.depth": [1, 1, "2"]})
    assert grid.swaps == {SPARSIFY: ["ista", "ista_soft"], "sizes.depth": ["1", "2"]}
    assert len(grid.variants()) == 4
    assert grid.notes == [
        f"swaps.{SPARSIFY}: ista listed more than once; trained once",
        "swaps.sizes.depth: 1 listed more than once; trained once",
    ]


def test_every_variant_gets_a_folder_of_its_own():
    labels = ["sparsify=ista_soft", "depth=2, sparsify=ista", "x=a/b", "x=a?b", "x=" + "v" * 200]
    names = [_folder(label) for label in labels]
    assert names[:2] == ["sparsify-ista_soft", "depth-2_sparsify-ista"]
    assert len(set(names)) == len(names) and all(len(n) <= 80 and safe_name(n) == n for n in names)


def test_swap_parsing_and_labels():
    assert parse_swap(f"{SPARSIFY}=ista, ista_mm") == (SPARSIFY, ["ista", "ista_mm"])
    assert variant_label({"encoder.layer.compress.primitive": "tssa", "sizes.depth": "2"}) == "compress=tssa, depth=2"
    with pytest.raises(GridError, match="--swap 'sparsify': write PATH=a,b,c"):
        parse_swap("sparsify")


# ---------------------------------------------------------------- grid files


def test_ablate_from_a_grid_file(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "swaps:\n  encoder.layer.compress.primitive: [mssa, tssa]\nsteps: 3\nbatch_size: 16\nseeds: 1\n"
        "set:\n" + "".join(f"  - {o}\n" for o in TINY)
    )
    out = tmp_path / "out"
    assert cli.main(["ablate", DIGITS, "--grid", str(grid), "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "compress=tssa" in printed and "3 steps, batch 16" in printed
    assert "no variant is ahead: " in printed and "from one seed a gap cannot be told" in printed  # one seed
    _refused(capsys, ["ablate", DIGITS, "--out", str(tmp_path / "none")], "needs something to swap")
    assert not (tmp_path / "none").exists()


GOOD = f"swaps:\n  {SPARSIFY}: [ista, ista_soft]\n"  # line 2: the values
BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))
    + GOOD
)


@pytest.mark.parametrize(
    "text, words",
    [
        (GOOD + "seeds: 0\n", ["grid.yaml:3:1: seeds: 0 is not a whole number of seeds in [1, 100]"]),
        (GOOD + "seeds: 1.5\n", ["grid.yaml:3:1: seeds: 1.5 is not"]),
        (GOOD + "lr: .nan\n", ["grid.yaml:3:1: lr: nan is not a finite number > 0"]),
        (GOOD + "batch_size: 0\n", ["grid.yaml:3:1: batch_size: 0 is not a whole number >= 1"]),
        (GOOD + "grad_clip: -1\n", ["grid.yaml:3:1: grad_clip: -1 is not a finite number > 0"]),
        (GOOD + "label_smoothing: 1\n", ["grid.yaml:3:1: label_smoothing: 1 is not"]),
        (GOOD + "task: classfy\n", ["grid.yaml:3:1: task: 'classfy' is not one of: classify, mae, lm"]),
        (GOOD + "steps: many\n", ["grid.yaml:3:1: steps: 'many' is not"]),
        ("swaps: null\n", ["grid.yaml:1:1: swaps: give the steps to swap"]),
        (
            "swaps:\n  encoder.layer.sparsify.primitive: []\n",
            ["grid.yaml:2:3: swaps.encoder.layer.sparsify.primitive: give a non-empty list"],
        ),
        ("swaps:\n  encoder.layer.sparsify.primitive: [ista, [a]]\n", ["grid.yaml:2:3:", "give a non-empty list"]),
        (GOOD + "stepz: 3\n", ["grid.yaml:3:1: stepz: unknown key 'stepz' (did you mean 'steps'?)"]),
        (GOOD + "seed: 3\n", ["grid.yaml:3:1: seed: unknown key 'seed' (a grid's seeds are 0..seeds-1"]),
        (GOOD + "set: sizes.d=16\n", ["grid.yaml:3:1: set: give a list of PATH=VALUE overrides"]),
        (
            "seeds: 0\nswaps: 3\nlr: -1\n",
            ["3 problems in the ablation grid", "grid.yaml:1:1: seeds", "grid.yaml:2:1: swaps", "grid.yaml:3:1: lr"],
        ),  # every problem, in the file's order
        (GOOD + "steps: !!python/object/apply:os.system ['echo PWNED']\n", ["grid.yaml:3:", "tag"]),
        (BOMB, ["grid.yaml", "more than 10,000 values"]),
        (GOOD + "lr: " + "[" * 200 + "]" * 200 + "\n", ["grid.yaml", "nested more than 64 levels"]),
        ("swaps:\n" + "".join(f"  p{i}.primitive: [a, b, c, d]\n" for i in range(10)), ["1,048,576 runs"]),
    ],
)
def test_a_bad_grid_file_is_located_and_nothing_is_written(tmp_path, capsys, text, words):
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    began = time.perf_counter()
    _refused(capsys, _args(tmp_path / "out", "--grid", str(grid)), *words)
    assert time.perf_counter() - began < 5
    assert not (tmp_path / "out").exists()


def test_grid_files_that_are_not_files_are_refused_at_once(tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    for path in ("/dev/zero", str(tmp_path / "folder")):
        _refused(capsys, _args(tmp_path / "out", "--grid", path), path, "cannot read", "in the ablation grid")
    fifo = tmp_path / "fifo.yaml"  # opening a FIFO nobody writes into would wait forever: in a process of its own
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-m", "crate_compose.cli", *_args(tmp_path / "out", "--grid", str(fifo))],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "fifo.yaml: cannot read spec file: not a regular file" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_command_line_wins_over_the_grid_file(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"swaps:\n  {SPARSIFY}: [ista, ista_mm]\n  sizes.depth: [1]\nsteps: 5\nseeds: 3\n")
    out = tmp_path / "out"
    assert (
        cli.main(_args(out, "--grid", str(grid), "--swap", f"{SPARSIFY}=ista_soft", "--steps", "2", "--seeds", "1"))
        == 0
    )
    assert f"note: --swap {SPARSIFY}: replaces the grid file's values of that path" in capsys.readouterr().err
    identity = json.loads((out / "ablation.json").read_text())["identity"]
    assert identity["swaps"] == {SPARSIFY: ["ista_soft"], "sizes.depth": ["1"]}
    assert identity["settings"]["steps"] == 2 and identity["seeds"] == 1
    assert _runs(out) == ["sparsify-ista_soft_depth-1/seed-0"]


def test_a_value_listed_twice_is_trained_once(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"swaps:\n  {SPARSIFY}: [ista, ista_soft, ista]\n")
    out = tmp_path / "out"
    assert cli.main(_args(out, "--grid", str(grid), "--steps", "2")) == 0
    captured = capsys.readouterr()
    assert f"note: swaps.{SPARSIFY}: ista listed more than once; trained once" in captured.err
    assert captured.out.count("| sparsify=ista |") == 1 and "[2/2]" in captured.out and "[3/" not in captured.out
    assert _runs(out) == ["sparsify-ista/seed-0", "sparsify-ista_soft/seed-0"]
    assert (out / "results.csv").read_text().count("\n") == 3


# ---------------------------------------------------------------- every variant, before anything trains


def test_values_that_cannot_fit_are_all_found_before_anything_trains(tmp_path, capsys):
    """The first values are fine; the bad ones come last and are reported together, at their lines."""
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"swaps:\n  {SPARSIFY}:\n    - ista\n    - classify\n  sizes.patch_size: [2, 3]\n")
    err = _refused(
        capsys,
        _args(tmp_path / "out", "--grid", str(grid), "--steps", "2"),
        "problems in the ablation grid",
        "variants sparsify=classify, patch_size=2; sparsify=classify, patch_size=3: required key is missing",
        "variant sparsify=ista, patch_size=3: step 'patch_embed'",
        "image size 8x8 is not divisible by patch_size=3",
        f"given at {grid}:5:",
    )
    assert "sparsify=ista, patch_size=2" not in err and "--set #" not in err
    assert not (tmp_path / "out").exists()


def test_a_swap_path_that_does_not_exist_is_located_at_its_argument(tmp_path, capsys):
    err = _refused(
        capsys,
        _args(tmp_path / "out", "--swap", "encoder.layer.nosuch.primitive=ista,ista_soft", "--steps", "2"),
        "--swap 'encoder.layer.nosuch.primitive=ista,ista_soft': encoder.layer: every variant: no step named 'nosuch'",
    )
    assert err.count("no step named") == 1 and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the folder knows its grid


def test_a_stale_ablation_is_refused(tmp_path, capsys):
    """Re-running an ablation with other steps into its folder used to reuse the 3-step runs and label the
    table '2 steps'. Refused without --resume, and with it, naming both values; the table is untouched."""
    out = tmp_path / "grid"
    swap = ["--swap", f"{SPARSIFY}=ista,ista_soft"]
    assert cli.main(_args(out, *swap, "--steps", "3")) == 0
    table, files = (out / "results.md").read_text(), sorted(out.rglob("*"))
    stamps = {p: p.stat().st_mtime_ns for p in files}
    capsys.readouterr()
    _refused(capsys, _args(out, *swap, "--steps", "2"), f"{out} holds an ablation: pass --resume to continue it")
    _refused(
        capsys,
        _args(out, *swap, "--steps", "2", "--lr", "0.01", "--resume"),
        f"--resume: {out} holds another ablation: lr: 0.001 in {out}/ablation.json, 0.01 now; steps: 3 in "
        f"{out}/ablation.json, 2 now",
    )
    assert {p: p.stat().st_mtime_ns for p in files} == stamps and "3 steps" in table
    assert cli.main(_args(out, *swap, "--steps", "3", "--resume")) == 0  # the same grid: every run kept
    assert (out / "results.md").read_text() == table
    for run in _runs(out):
        assert json.loads((out / run / "result.json").read_text())["steps"] == 3


def test_other_files_and_a_resume_of_nothing_are_refused(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    swap = ["--swap", f"{SPARSIFY}=ista", "--steps", "2"]
    _refused(capsys, _args(mine, *swap), f"{mine} holds files that are not an ablation (notes.txt)", status=1)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    _refused(capsys, _args(tmp_path / "empty", *swap, "--resume"), "holds no ablation to continue")
    assert not (tmp_path / "empty").exists()
    edited = tmp_path / "edited"
    assert cli.main(_args(edited, *swap)) == 0
    record = json.loads((edited / "ablation.json").read_text())
    record["identity"]["settings"]["steps"] = 9
    (edited / "ablation.json").write_text(json.dumps(record))
    _refused(capsys, _args(edited, *swap, "--resume"), "ablation.json cannot be trusted (not an ablation record")


def test_an_ablation_that_never_started_a_run_is_started_again(tmp_path, capsys, monkeypatch):
    out = tmp_path / "grid"
    monkeypatch.setattr(
        "crate_compose.ablation.study.train_described", _raise(KeyboardInterrupt)
    )  # stopped before its first run
    assert cli.main(_args(out, "--swap", f"{SPARSIFY}=ista", "--steps", "3")) == 130
    monkeypatch.undo()
    assert cli.main(_args(out, "--swap", f"{SPARSIFY}=ista", "--steps", "2")) == 0  # another grid: nothing is lost
    assert json.loads((out / "ablation.json").read_text())["identity"]["settings"]["steps"] == 2


def _raise(error):
    def stop(*args, **kwargs):
        raise error

    return stop


def test_ablate_resume_continues_an_interrupted_grid_exactly(tmp_path, capsys, monkeypatch):
    """Stopped during the second variant's run (after its step-2 checkpoint): --resume keeps the first run,
    continues the second from its checkpoint, and the table equals that of a grid never stopped."""
    swap = ["--swap", f"{SPARSIFY}=ista,ista_soft", "--steps", "4", "--checkpoint-every", "2"]
    whole = tmp_path / "whole"
    assert cli.main(_args(whole, *swap)) == 0
    out = tmp_path / "grid"
    real, calls = train_module.train_described, []

    def interrupted(*args, **kwargs):
        calls.append(kwargs["out"])
        if len(calls) == 2:  # the second run stops when it evaluates, at step 4, before its last checkpoint
            monkeypatch.setattr(train_module, "_evaluate", _raise(KeyboardInterrupt))
        return real(*args, **kwargs)

    monkeypatch.setattr("crate_compose.ablation.study.train_described", interrupted)
    assert cli.main(_args(out, *swap)) == 130
    monkeypatch.undo()
    assert _runs(out) == ["sparsify-ista/seed-0"] and not (out / "results.md").exists()
    assert (out / "sparsify-ista_soft" / "seed-0" / "checkpoints").is_dir()
    stamp = (out / "sparsify-ista" / "seed-0" / "result.json").stat().st_mtime_ns
    capsys.readouterr()
    _refused(capsys, _args(out, *swap), "pass --resume")
    assert cli.main(_args(out, *swap, "--resume")) == 0
    printed = capsys.readouterr().out
    assert "[1/2] sparsify=ista, seed 0" in printed and "finished before, kept" in printed
    assert (out / "sparsify-ista" / "seed-0" / "result.json").stat().st_mtime_ns == stamp
    history = json.loads((out / "sparsify-ista_soft" / "seed-0" / "run.json").read_text())["history"]
    assert [h["from_step"] for h in history] == [0, 2]
    assert _same_but_seconds(out / "results.csv", whole / "results.csv")


def _same_but_seconds(a: Path, b: Path) -> bool:
    """Two results.csv equal in every column but the wall time."""

    def rows(path):
        return [line.split(",")[:6] + line.split(",")[7:] for line in path.read_text().splitlines()]

    return rows(a) == rows(b)


# ---------------------------------------------------------------- recipes and fine-tuning (issue 20)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny digits network trained a few steps: the build every variant is fine-tuned from."""
    run = tmp_path_factory.mktemp("pretrained") / "run"
    train_module.train(DIGITS, Settings(steps=4, batch_size=16), overrides=TINY, out=run)
    return run / "final"


def test_every_variant_is_fine_tuned_from_one_build_with_a_recipe(tmp_path, capsys, pretrained):
    """``--config`` gives every run the recipe's settings (the command line winning) and its text;
    ``--init --freeze encoder`` starts every variant from the same build and trains the head alone, so
    the encoder of every variant ends exactly as it began."""
    from safetensors.torch import load_file

    out = tmp_path / "grid"
    args = _args(
        out,
        "--swap",
        f"{SPARSIFY}=ista,ista_soft",
        "--config",
        "crate-finetune",
        "--image-size",
        "8",
        "--steps",
        "3",
        "--init",
        str(pretrained),
        "--freeze",
        "encoder",
    )
    assert cli.main(args) == 0
    assert "fine-tuned from the weights of" in (out / "results.md").read_text()
    start = load_file(pretrained / "model.safetensors")
    for variant in ("sparsify-ista", "sparsify-ista_soft"):
        run = out / variant / "seed-0"
        identity = json.loads((run / "run.json").read_text())["identity"]
        assert (identity["settings"]["lr"], identity["settings"]["weight_decay"]) == (5e-5, 0.01)  # the recipe's
        assert identity["settings"]["augment"] == "randaugment" and identity["settings"]["batch_size"] == 16  # ours
        assert identity["init"]["path"] == str(pretrained.resolve()) and identity["freeze"] == "encoder"
        assert (run / "recipe.yaml").read_text() == (ROOT / "recipes" / "crate-finetune.yaml").read_text()
        final = load_file(run / "final" / "model.safetensors")
        body = [name for name in start if not name.startswith("head.")]
        assert body and all(torch.equal(final[name], start[name]) for name in body), variant
        assert any(not torch.equal(final[name], start[name]) for name in start if name.startswith("head."))
    recorded = json.loads((out / "ablation.json").read_text())["identity"]
    assert recorded["init"]["path"] == str(pretrained.resolve()) and recorded["freeze"] == "encoder"
    _refused(
        capsys,
        _args(
            out,
            "--swap",
            f"{SPARSIFY}=ista,ista_soft",
            "--config",
            "crate-finetune",
            "--image-size",
            "8",
            "--steps",
            "3",
            "--resume",
        ),
        "holds another ablation",
        "init",
    )


def test_a_variant_the_build_cannot_start_is_refused_before_anything_trains(tmp_path, capsys, pretrained):
    out = tmp_path / "grid"
    err = _refused(
        capsys,
        _args(out, "--swap", f"{SPARSIFY}=ista,ista_odl", "--steps", "2", "--init", str(pretrained)),
        "variant sparsify=ista_odl",
        "synthesis",
        "is not in",
    )
    assert "variant sparsify=ista:" not in err and not out.exists()


def test_the_grid_file_wins_over_the_recipe_and_the_command_line_over_both(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        f"swaps:\n  {SPARSIFY}: [ista]\nlr: 0.003\nweight_decay: 0.2\nsteps: 2\n"
        "set:\n" + "".join(f"  - {o}\n" for o in TINY)
    )
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                "ablate",
                DIGITS,
                "--grid",
                str(grid),
                "--config",
                "crate-pretrain",
                "--image-size",
                "8",
                "--weight-decay",
                "0.3",
                "--batch-size",
                "16",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    settings = json.loads((out / "ablation.json").read_text())["identity"]["settings"]
    assert (settings["optimizer"], settings["lr"], settings["weight_decay"], settings["steps"]) == (
        "lion",
        0.003,
        0.3,
        2,
    )  # recipe, grid file, command line, and the grid's steps over the recipe's epochs
    assert "epochs" not in settings or settings["epochs"] is None


def test_a_variant_is_called_ahead_only_when_its_lead_exceeds_the_seeds_spread():
    from crate_compose.ablation.study import Row, verdict

    def row(name, values):
        import statistics

        return Row(
            name,
            10,
            "test_accuracy",
            statistics.fmean(values),
            statistics.stdev(values) if len(values) > 1 else 0.0,
            1.0,
            values,
        )

    one = [row("sparsify=ista", [0.90]), row("sparsify=ista_soft", [0.91])]
    assert verdict(one).startswith(
        "no variant is ahead: sparsify=ista_soft (test_accuracy 0.9100) leads sparsify=ista "
        "by 0.0100, but from one seed"
    )
    close = [row("a", [0.90, 0.92, 0.88]), row("b", [0.91, 0.95, 0.89])]
    assert verdict(close).startswith(
        "no variant is ahead: b (test_accuracy 0.9167) leads a by 0.0167, within the seeds' spread"
    )
    clear = [row("a", [0.80, 0.81, 0.79]), row("b", [0.90, 0.91, 0.89])]
    assert verdict(clear) == (
        "best: b (test_accuracy 0.9000 ± 0.0100), ahead of a by 0.1000, more than the seeds' spread"
    )
    lower = [
        Row("a", 1, "test_loss", 1.0, 0.01, 1, [0.99, 1.0, 1.01], maximize=False),
        Row("b", 1, "test_loss", 2.0, 0.01, 1, [1.99, 2.0, 2.01], maximize=False),
    ]
    assert verdict(lower).startswith("best: a (test_loss 1.0000")
    assert verdict([Row("a", 1, "m", float("nan"), 0, 0, [], missing={0: "failed"})]) == "no variant finished a run"

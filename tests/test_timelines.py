"""Probes over training time and over seeds (issue 27): ``probe RUN --checkpoints all`` measures every
checkpoint of a run and its untrained network on the same inputs, and ablations summarize their seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crate_compose import cli
from crate_compose.assessment.layer_probes import probes_png
from crate_compose.assessment.timelines import spread_rows, timeline_png

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "specs" / "crate-digits.yaml")
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=2"]
PNG = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.usefixtures("one_thread")


def _row(module: str, measure: str, value, layer: int | None = 0) -> dict:
    return {
        "module": module,
        "role": "encoder",
        "layer": layer,
        "step": module.rsplit(".", 1)[-1],
        "primitive": "mssa",
        "measure": measure,
        "value": value,
        "before": None,
        "direction": "down",
    }


def test_the_seeds_of_a_probe_are_summarized_by_their_mean_spread_and_range():
    seeds = [
        [_row("a", "coding_rate", 1.0), _row("b", "coding_rate", None, 1)],
        [_row("a", "coding_rate", 3.0), _row("b", "coding_rate", 5.0, 1)],
    ]
    a, b = spread_rows(seeds)
    assert (a["value"], a["spread"], a["low"], a["high"], a["values"], a["seeds"]) == (
        2.0,
        pytest.approx(2**0.5),
        1.0,
        3.0,
        [1.0, 3.0],
        2,
    )
    assert (b["value"], b["spread"], b["seeds"]) == (5.0, 0.0, 1)  # a value that could not be measured is left out
    one = spread_rows([[_row("a", "coding_rate", 4.0)]])[0]
    assert (one["value"], one["spread"], one["low"], one["high"]) == (4.0, 0.0, 4.0, 4.0)


def test_figures_draw_bands_for_seeds_and_say_which_runs_lack_a_measure():
    trained = spread_rows([[_row("a", "coding_rate", v), _row("c", "l0_density", v / 10, 0)] for v in (1.0, 2.0)])
    other = [_row("a", "variational_rate", 2.0)]
    assert probes_png({"mssa": trained, "tssa": other}).startswith(PNG)
    assert timeline_png({0: trained, 100: trained}).startswith(PNG)
    with pytest.raises(ValueError, match="no checkpoints"):
        timeline_png({})


def test_probe_over_every_checkpoint_of_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    sets = [arg for o in TINY for arg in ("--set", o)]
    assert (
        cli.main(
            [
                "train",
                DIGITS,
                *sets,
                "--data",
                "digits",
                "--steps",
                "6",
                "--checkpoint-every",
                "2",
                "--batch-size",
                "16",
                "--no-progress",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert cli.main(["probe", str(run), "--checkpoints", "all", "--samples", "32"]) == 0
    out = capsys.readouterr()
    assert "probing every checkpoint and the untrained network of seed 0" in out.err
    folder = run / "probes" / "over-training"
    steps = json.loads((folder / "probes.json").read_text())
    assert list(steps) == ["step 0", "step 2", "step 4", "step 6"]
    assert (folder / "probes.png").read_bytes().startswith(PNG)
    rates = [next(r["value"] for r in rows if r["module"] == "encoder.layer_1.compress") for rows in steps.values()]
    assert len(set(rates)) == 4  # each checkpoint's own weights


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--data", "photos"], "leave out --data"),
        (["--set", "sizes.d=8"], "leave out --data, --image-size, --seed and --set"),
    ],
)
def test_probe_over_checkpoints_takes_a_run_as_it_is(tmp_path, capsys, extra, words):
    run = tmp_path / "run"
    sets = [arg for o in TINY for arg in ("--set", o)]
    assert (
        cli.main(
            [
                "train",
                DIGITS,
                *sets,
                "--data",
                "digits",
                "--steps",
                "2",
                "--batch-size",
                "8",
                "--no-progress",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert cli.main(["probe", str(run), "--checkpoints", "all", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert cli.main(["probe", DIGITS, "--checkpoints", "all"]) == 2
    assert "takes a run folder" in capsys.readouterr().err

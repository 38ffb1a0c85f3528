"""A command reads its spec once: ``train``, ``ablate`` and ``probe`` open the spec file one time and hand the
reading down, an ablation loads its data set once for every variant and seed, and a spec edited while a grid
trains changes none of its variants."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from crate_compose import cli
from crate_compose.ablation import study as ablation
from crate_compose.spec_language import extends
from crate_compose.spec_language.loader import load
from crate_compose.training import preparation

ROOT = Path(__file__).resolve().parents[1]
TINY = ["sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1"]
SETS = [arg for o in TINY for arg in ("--set", o)]
RUN = ["--steps", "2", "--batch-size", "8", "--eval-every", "0", "--no-progress", "--logger", "none"]


@pytest.fixture
def reads(monkeypatch) -> collections.Counter:
    """How many times each spec file is opened (every file a spec reads goes through extends.read_file)."""
    seen: collections.Counter = collections.Counter()
    real = extends.read_file

    def counting(path, *args, **kwargs):
        seen[Path(path).resolve()] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(extends, "read_file", counting)
    return seen


@pytest.fixture
def spec_file(tmp_path) -> Path:
    path = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "specs" / "crate-digits.yaml", path)
    return path


def test_train_opens_its_spec_file_once(reads, spec_file, tmp_path):
    assert cli.main(["train", str(spec_file), *SETS, *RUN, "--out", str(tmp_path / "run")]) == 0
    assert reads[spec_file.resolve()] == 1, reads


def test_ablate_opens_its_spec_file_once_and_loads_its_data_once(reads, spec_file, tmp_path, monkeypatch):
    loads = []
    real = preparation.load_data
    monkeypatch.setattr(preparation, "load_data", lambda *a, **k: loads.append(a) or real(*a, **k))
    assert (
        cli.main(
            [
                "ablate",
                str(spec_file),
                "--swap",
                "encoder.layer.sparsify.primitive=ista,ista_soft",
                "--seeds",
                "2",
                *SETS,
                *RUN,
                "--out",
                str(tmp_path / "grid"),
            ]
        )
        == 0
    )
    assert reads[spec_file.resolve()] == 1, reads  # two variants, two seeds, their checks and probes: one reading
    assert len(loads) == 1  # digits, for every variant and seed


def test_probe_of_a_run_opens_its_spec_once(reads, spec_file, tmp_path):
    assert cli.main(["train", str(spec_file), *SETS, *RUN, "--out", str(tmp_path / "run")]) == 0
    reads.clear()
    assert cli.main(["probe", str(tmp_path / "run"), "--out", str(tmp_path / "probes"), "--logger", "none"]) == 0
    assert list(reads.values()) == [1], reads  # the run's own spec.yaml


def test_a_spec_edited_while_a_grid_trains_changes_none_of_its_variants(spec_file, tmp_path, monkeypatch):
    real = ablation.train_described

    def then_edit(*args, **kwargs):
        result = real(*args, **kwargs)
        spec_file.write_text(spec_file.read_text().replace("depth: 4", "depth: 3"))  # a user edits the file
        return result

    monkeypatch.setattr(ablation, "train_described", then_edit)
    assert "depth: 4" in spec_file.read_text()
    assert (
        cli.main(
            [
                "ablate",
                str(spec_file),
                "--swap",
                "encoder.layer.sparsify.primitive=ista,ista_soft",
                "--set",
                "sizes.d=16",
                "--set",
                "sizes.heads=2",
                "--set",
                "sizes.head_dim=8",
                *RUN,
                "--out",
                str(tmp_path / "grid"),
            ]
        )
        == 0
    )
    depths = {
        path.parent.parent.name: load(path).encoder.depth for path in (tmp_path / "grid").glob("*/seed-0/spec.yaml")
    }
    assert len(depths) == 2 and set(depths.values()) == {4}, depths


def _count_lookups(monkeypatch) -> collections.Counter:
    """Counters of the task lookups and data-set name parses a command makes from here on, as in a fresh process
    (no data set's name read before)."""
    from crate_compose import tasks
    from crate_compose.data import set_registry
    from crate_compose.tasks import task_registry

    counts: collections.Counter = collections.Counter()

    def counted(owner, name, key):
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, **k: counts.update([key]) or original(*a, **k))

    counted(tasks, "get", "task")
    counted(task_registry, "get", "task")
    counted(set_registry, "_claim", "data")  # a data set's name parsed
    monkeypatch.setattr(set_registry, "_RESOLVED", {})
    return counts


def test_train_looks_each_name_up_once(spec_file, tmp_path, monkeypatch):
    """``train`` turns its task's and data set's names into objects once and hands the objects on: the checks
    before torch loads, the run and the closing lines take the same task (it looked it up four times before)."""
    counts = _count_lookups(monkeypatch)
    assert cli.main(["train", str(spec_file), *SETS, *RUN, "--out", str(tmp_path / "run")]) == 0
    assert counts == {"task": 1, "data": 1}, counts


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("read-once") / "run"
    assert cli.main(["train", "crate-digits", *SETS, *RUN, "--out", str(run)]) == 0
    return run


@pytest.mark.parametrize("command", ["evaluate", "linear-probe", "probe", "show"])
def test_a_command_on_a_run_looks_its_task_and_data_up_once(command, trained, tmp_path, monkeypatch):
    """A command reading a run turns the run's task and data set into objects once (the run's weights, the data's
    form, the scores and the probes' inputs all take them: evaluate looked its task up three times before)."""
    counts = _count_lookups(monkeypatch)
    out = {"probe": ["--out", str(tmp_path / "p"), "--logger", "none"], "show": ["--out", str(tmp_path / "s")]}
    extra = {"linear-probe": ["--no-untrained"], **out}.get(command, [])
    assert cli.main([command, str(trained), *extra]) == 0
    assert counts == {"task": 1, "data": 1}, counts


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory) -> Path:
    """A masked language model (fill), a causal one (generate) and a classifier on pasted-digits (segment), tiny."""
    home = tmp_path_factory.mktemp("read-once-text")
    texts = home / "texts"
    texts.mkdir()
    for i in range(6):
        (texts / f"t{i}.txt").write_text(f"the quick brown fox jumps over the lazy dog {i}\n" * 40)
    tiny = {
        "mlm": [
            "crate-bert-mini",
            "--set",
            "sizes.context=16",
            "--task",
            "mlm",
            "--data",
            f"wordpiece-64:folder:{texts}",
        ],
        "lm": ["causal-crate-bytes", "--set", "sizes.context=32", "--task", "lm", "--data", "text"],
        "seg": ["crate-mini", "--set", "sizes.head_dim=8", "--data", "pasted-digits:64"],
    }
    for name, argv in tiny.items():
        small = ["--set", "sizes.d=16", "--set", "sizes.heads=2", "--set", "sizes.depth=1"]
        assert cli.main(["train", *argv, *small, *RUN, "--out", str(home / name)]) == 0
    return home


@pytest.mark.parametrize(
    "command, expected",
    [("fill", {"task": 1}), ("generate", {"data": 1}), ("segment", {"task": 1, "data": 1})],
)
def test_the_text_and_segment_commands_look_each_name_up_once(command, expected, text_runs, monkeypatch):
    """fill (the run's task, to refuse another than mlm), generate (the data set's name, for its tokenizer's kind)
    and segment (the run's task and data set) each look a name up once."""
    counts = _count_lookups(monkeypatch)
    argv = {
        "fill": ["fill", str(text_runs / "mlm"), "the [MASK] fox"],
        "generate": [
            "generate",
            str(text_runs / "lm" / "final" / "spec.yaml"),
            "--weights",
            str(text_runs / "lm" / "final"),
            "--prompt",
            "ab",
            "--tokens",
            "2",
        ],
        "segment": ["segment", str(text_runs / "seg"), "--samples", "8"],
    }[command]
    assert cli.main(argv) == 0
    assert counts == expected, counts

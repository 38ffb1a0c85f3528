"""``--data subspaces`` follows the spec it is for (crate_compose.data.subspaces.load_subspaces), and training a
token-set spec says in one line that no task trains on token sets."""

from __future__ import annotations

import pytest

import crate_compose as cc
from crate_compose import cli
from crate_compose.data import sets as D
from crate_compose.errors import DataError
from crate_compose.training.preparation import prepare


def test_subspaces_are_generated_at_the_sizes_the_spec_declares():
    spec = cc.load_spec("specs/aot-subspaces.yaml")  # K = 3 subspaces of dimension 32 in R^96, 48 tokens
    data = D.load_data("subspaces", spec=spec, train_count=4, test_count=2)
    assert data.input_shape == (48, 96) and data.subspaces.shape == (96, 96)
    assert data.sizes == {"tokens": 48, "d": 96, "subspaces": 3, "subspace_dim": 32}
    assert data.spec_overrides(spec) == []  # nothing shrinks: the spec trains and probes as written
    given = D.load_data("subspaces", spec=spec, K=2, p=8, train_count=4, test_count=2)  # options still win
    assert given.sizes == {"tokens": 48, "d": 96, "subspaces": 2, "subspace_dim": 8}
    assert D.load_data("subspaces", train_count=4, test_count=2).input_shape == (48, 48)  # no spec: the defaults
    fitted, _ = prepare("specs/aot-subspaces.yaml", "subspaces")
    assert fitted.name == "aot-subspaces" and fitted.input.shape == [48, 96]


def test_subspaces_that_cannot_exist_name_the_spec_sizes():
    with pytest.raises(DataError, match=r"d >= K\*p; got K=3, p=32, n=48, d=50.*from the spec's sizes"):
        D.load_data("subspaces", spec={"sizes": {"d": 50, "subspaces": 3, "subspace_dim": 32}})


@pytest.mark.parametrize("task", ["classify", "mae", "lm"])
def test_training_on_token_sets_is_one_clear_refusal(tmp_path, capsys, task):
    code = cli.main(
        [
            "train",
            "specs/aot-subspaces.yaml",
            "--data",
            "subspaces",
            "--task",
            task,
            "--steps",
            "2",
            "--no-progress",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("error: data set 'subspaces' holds token sets labeled per token, which no task trains on")
    assert "crate-compose probe" in err and "use --task" not in err and "aot-subspaces." not in err  # not shrunk
    assert not (tmp_path / "run").exists()

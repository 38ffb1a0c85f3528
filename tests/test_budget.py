"""The resource guard (issue 11): memory estimated from shapes before anything is allocated."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import crate_compose as cc
from crate_compose import memory
from crate_compose.building import budget
from crate_compose.building.budget import ResourceError, estimate
from crate_compose.cli import main
from crate_compose.memory import parse_size

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
HUGE_D = ["sizes.d=10000000"]  # crate-digits with d = 10^7: about 10^14 parameters


@pytest.mark.parametrize(
    "text, size",
    [
        ("8GB", 8e9),
        ("512MiB", 512 * 2**20),
        ("2e9", 2e9),
        ("1.5 gb", 1.5e9),
        (4_000_000, 4e6),
        ("none", None),
        (None, None),
    ],
)
def test_sizes_are_read_in_decimal_and_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["8XB", "-1GB", "0", "GB", "inf", "1e400"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_the_estimate_counts_what_a_build_holds(spec):
    """Parameters as the meta build counts them (a tied weight once), for every shipped spec."""
    found = estimate(cc.load_spec(spec))
    model = cc.build(spec, meta=True)
    assert found.parameters == sum(p.numel() for p in model.parameters())
    assert found.activation_bytes_per_sample > 0
    steps = [n.target for n in model.graph.nodes if n.op == "call_module" and n.target != "cast"]
    counts, seen = {}, set()  # a tied weight counted at the step that holds it (the first), as inspect's rows
    for t in steps:
        own = [p for p in model.get_submodule(t).parameters() if id(p) not in seen]
        seen.update(id(p) for p in own)
        counts[t] = sum(p.numel() for p in own)
    assert found.largest[:2] == max(counts.items(), key=lambda item: item[1])  # the first of the largest


def test_activations_grow_with_the_tokens():
    small = estimate(cc.load_spec("crate-digits")).activation_bytes_per_sample
    large = estimate(cc.load_spec("crate-digits", ["input.shape=[1, 16, 16]"])).activation_bytes_per_sample
    assert 3.5 * small < large  # 4x the tokens; attention maps grow faster


def test_a_build_over_the_limit_fails_before_allocating_with_the_estimate_and_the_limit():
    spec = cc.load_spec("crate-digits", HUGE_D)
    with pytest.raises(ResourceError) as caught:
        cc.compile_spec(spec)  # the default limit: what this machine has; 10^14 parameters never fit
    message = str(caught.value)
    assert "building crate-digits.d-10000000 needs about" in message
    assert "over the memory limit of" in message and "available on this machine" in message
    assert "--memory-limit" in message and "crate-digits.yaml:" in message  # located at the largest step


def test_the_limit_is_configurable(monkeypatch):
    spec = cc.load_spec("crate-digits")
    needed = estimate(spec).build_bytes(4)
    with pytest.raises(ResourceError, match=r"limit of .* \(--memory-limit\)"):
        cc.compile_spec(spec, memory_limit=needed / 2)
    cc.compile_spec(spec, memory_limit=needed * 2)
    monkeypatch.setenv(memory.ENVIRONMENT, str(int(needed / 2)))
    with pytest.raises(ResourceError, match=memory.ENVIRONMENT):
        cc.compile_spec(spec)
    cc.compile_spec(spec, memory_limit="none")  # the argument wins over the environment


def test_a_bad_limit_in_the_environment_is_a_located_error(monkeypatch):
    monkeypatch.setenv(memory.ENVIRONMENT, "lots")
    with pytest.raises(cc.SpecError, match="CRATE_COMPOSE_MEMORY_LIMIT: 'lots' is not a size"):
        cc.compile_spec(cc.load_spec("crate-digits"))


def test_meta_builds_and_inspect_are_never_refused():
    summary = cc.inspect("crate-digits", HUGE_D)  # the sizes are what a user wants to see
    assert summary.params_total > 10**13


def test_the_cli_refuses_an_oversized_build_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", "crate-digits", "--set", "sizes.d=10000000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "over the memory limit" in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit) as stop:  # argparse checks it before anything loads
        main(["build", "crate-digits", "--memory-limit", "lots", "--out", str(out)])
    assert stop.value.code == 2 and "--memory-limit: 'lots' is not a size" in capsys.readouterr().err


def test_training_counts_optimizer_state_and_a_batch_of_activations(tmp_path, capsys):
    spec = cc.load_spec("crate-digits")
    found = estimate(spec)
    batch = 64
    needed = found.parameters * 16 + found.buffers_bytes + batch * found.activation_bytes_per_sample
    limit = math.floor(needed * 0.99)
    with pytest.raises(ResourceError) as caught:
        budget.check_training(spec, batch, memory_limit=limit)
    assert "training crate-digits with a batch of 64 per process" in str(caught.value)
    assert "of activations" in str(caught.value)
    budget.check_training(spec, batch, memory_limit=math.ceil(needed * 1.01))
    run = tmp_path / "run"
    assert (
        main(
            ["train", "crate-digits", "--steps", "1", "--no-progress", "--out", str(run), "--memory-limit", str(limit)]
        )
        == 2
    )
    assert "over the memory limit" in capsys.readouterr().err and not run.exists()


def test_a_batch_larger_than_the_training_set_is_refused(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "crate-digits",
                "--steps",
                "1",
                "--batch-size",
                "100000000",
                "--no-progress",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    assert "is larger than the training set of 'digits'" in capsys.readouterr().err


def test_depth_is_bounded_where_it_is_written(tmp_path, capsys):
    spec = tmp_path / "deep.yaml"
    spec.write_text("extends: " + str(ROOT / "specs/crate-digits.yaml") + "\nsizes:\n  depth: 100000\n")
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "less than or equal to 1024" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "options, copies, batches",
    [
        ({}, 4, 1),  # AdamW: weights, gradients, two moments; the batch in use
        ({"optimizer": "lion"}, 3, 1),
        ({"optimizer": "sgd", "momentum": 0.0}, 2, 1),
        ({"optimizer": "sgd"}, 3, 1),
        ({"ema": 0.999}, 5, 1),
        ({"workers": 4}, 4, 9),  # two batches prepared ahead by each worker
    ],
)
def test_a_run_is_estimated_with_its_optimizer_its_ema_and_its_prefetched_batches(options, copies, batches):
    from crate_compose.settings import Settings
    from crate_compose.training.preparation import check_run_memory

    spec = cc.load_spec("crate-digits")
    found = estimate(spec)
    inputs = 64 * 4 * math.prod(spec.input.shape)
    needed = (
        found.parameters * 4 * copies + found.buffers_bytes + 64 * found.activation_bytes_per_sample + batches * inputs
    )
    settings = Settings(**options)
    with pytest.raises(ResourceError) as caught:
        check_run_memory(spec, settings, 64, "cpu", math.floor(needed * 0.9995))
    assert f"{batches} input batch{'es' * (batches != 1)} held" in str(caught.value)
    check_run_memory(spec, settings, 64, "cpu", math.ceil(needed * 1.0005))
    # on a GPU the batches wait in the host's memory, not the device's: not counted against its limit
    check_run_memory(spec, settings, 64, "cuda", math.ceil((needed - batches * inputs) * 1.0005))

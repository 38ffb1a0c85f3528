"""Masked language modelling (task mlm): BERT's masking rule exactly from a seed and in its proportions, the loss
at the chosen positions only, a run that learns, evaluates beside the unigram baseline and fills masks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from dataclasses import replace as replaced
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from crate_compose import tasks
from crate_compose.cli import main
from crate_compose.errors import TrainError
from crate_compose.settings import Settings
from crate_compose.tasks.masked_language_modelling import _scored, mask_tokens
from crate_compose.training.run import train

MLM = tasks.get("mlm")
EXAMPLE = MLM.example


@dataclass(frozen=True)
class _Vocabulary:
    """What mask_tokens reads of a tokenizer: its size, its special ids and [MASK]."""

    size: int = 40
    specials: frozenset = frozenset({0, 1, 2, 3, 4})
    mask: int = 4


def _reference(x: torch.Tensor, vocabulary: _Vocabulary, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's rule written position by position from the module's documented draws (u, v, r, in that order)."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.rand(x.shape, generator=generator)
    v = torch.rand(x.shape, generator=generator)
    r = torch.randint(vocabulary.size - len(vocabulary.specials), x.shape, generator=generator)
    ordinary = [i for i in range(vocabulary.size) if i not in vocabulary.specials]
    inputs, chosen = x.clone(), torch.zeros(x.shape, dtype=torch.bool)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            if int(x[b, i]) in vocabulary.specials or u[b, i] >= 0.15:
                continue
            chosen[b, i] = True
            if v[b, i] < 0.8:
                inputs[b, i] = vocabulary.mask
            elif v[b, i] < 0.9:
                inputs[b, i] = ordinary[int(r[b, i])]
    return inputs, chosen


def _windows(batch: int, length: int, vocabulary: _Vocabulary, seed: int = 0) -> torch.Tensor:
    x = torch.randint(5, vocabulary.size, (batch, length), generator=torch.Generator().manual_seed(seed))
    x[:, 0], x[:, -1] = 2, 3  # [CLS] ... [SEP]
    return x


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_masking_is_berts_rule_exactly_from_a_seed(seed):
    vocabulary = _Vocabulary()
    x = _windows(6, 20, vocabulary, seed)
    inputs, chosen = mask_tokens(x, vocabulary, torch.Generator().manual_seed(seed))
    expected_inputs, expected_chosen = _reference(x, vocabulary, seed)
    assert torch.equal(chosen, expected_chosen) and torch.equal(inputs, expected_inputs)
    assert not chosen[:, 0].any() and not chosen[:, -1].any()  # [CLS] and [SEP] are never chosen
    assert torch.equal(inputs[~chosen], x[~chosen])  # nothing else changes


def test_the_masking_proportions_are_15_and_80_10_10():
    """On 400,000 ordinary tokens: 15% chosen; of those 80% [MASK], 10% another token, 10% kept (a random token
    may draw the same token: 1/35 of the 10%); the random tokens are uniform over the ordinary ones. Bounds at
    five standard deviations."""
    vocabulary = _Vocabulary()
    x = _windows(2000, 200, vocabulary)
    inputs, chosen = mask_tokens(x, vocabulary, torch.Generator().manual_seed(3))
    ordinary = int((~torch.isin(x, torch.tensor(sorted(vocabulary.specials)))).sum())
    n = int(chosen.sum())
    assert abs(n / ordinary - 0.15) < 5 * (0.15 * 0.85 / ordinary) ** 0.5
    masked = int((inputs[chosen] == vocabulary.mask).sum())
    kept = int((inputs[chosen] == x[chosen]).sum())
    swapped = n - masked - kept
    bound = 5 * (0.1 * 0.9 / n) ** 0.5
    assert abs(masked / n - 0.8) < 5 * (0.8 * 0.2 / n) ** 0.5
    assert abs(kept / n - (0.1 + 0.1 / 35)) < bound and abs(swapped / n - 0.1 * 34 / 35) < bound
    random_tokens = inputs[chosen & (inputs != vocabulary.mask) & (inputs != x)]
    assert not torch.isin(random_tokens, torch.tensor(sorted(vocabulary.specials))).any()
    counts = torch.bincount(random_tokens, minlength=vocabulary.size)[5:].double()
    expected = counts.sum() / 35
    assert ((counts - expected) ** 2 / expected).sum() < 35 + 5 * (2 * 34) ** 0.5  # chi-square, 34 d.o.f.


def test_the_loss_is_the_cross_entropy_at_the_chosen_positions_only():
    logits = torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.randint(11, (3, 7), generator=torch.Generator().manual_seed(1))
    chosen = torch.zeros(3, 7, dtype=torch.bool)
    chosen[0, 2] = chosen[1, 5] = chosen[2, 0] = True
    loss, hits, n = _scored(logits, y, chosen)
    by_hand = sum(-F.log_softmax(logits[b, i], -1)[y[b, i]] for b, i in ((0, 2), (1, 5), (2, 0))) / 3
    assert n == 3 and torch.allclose(loss.double(), by_hand)
    assert hits == sum(int(logits[b, i].argmax() == y[b, i]) for b, i in ((0, 2), (1, 5), (2, 0)))
    logits.requires_grad_(True)
    _scored(logits, y, chosen)[0].backward()
    assert logits.grad[~chosen].abs().max() == 0  # the other positions get no gradient
    none, _, zero = _scored(logits, y, torch.zeros_like(chosen))
    assert zero == 0 and float(none.detach()) == 0.0 and none.requires_grad


def _settings(**changes) -> Settings:
    base = Settings(
        task="mlm",
        data=EXAMPLE.data,
        steps=4,
        batch_size=8,
        checkpoint_every=2,
        log_every=1,
        logger="none",
        warmup=1,
        lr=3e-3,
    )
    return replaced(base, **changes)


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlm") / "run"
    result = train(EXAMPLE.spec, _settings(), overrides=EXAMPLE.overrides, out=out, progress=False)
    return out, result


def test_a_run_keeps_its_tokenizer_logs_its_accuracy_and_evaluates_beside_the_unigram(mlm_run):
    out, result = mlm_run
    assert (out / "tokenizer.json").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= row["mlm_accuracy"] <= 1.0 for row in rows if row["kind"] == "train")
    metrics = result.metrics
    assert metrics["test_mlm_loss"] > 0 and 0.0 <= metrics["test_mlm_accuracy"] <= 1.0
    assert metrics["test_unigram_loss"] > 0 and 0.0 <= metrics["test_unigram_accuracy"] <= 1.0


def test_fill_prints_the_top_k_tokens_at_every_mask(mlm_run, capsys):
    out, _ = mlm_run
    assert main(["fill", str(out), "a[MASK]c [MASK]", "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[MASK] 1 (token 2 of the text's 5): ")
    assert lines[1].startswith("[MASK] 2 (token 5 of the text's 5): ")
    assert lines[0].count(",") == 2 and "[MASK]" not in lines[2]
    assert lines[2].startswith("a") and "c " in lines[2]  # the text as written, each mask replaced
    assert main(["fill", str(out), "no mask here"]) == 2
    assert "has no [MASK]" in capsys.readouterr().err


def test_what_mlm_cannot_train_is_refused(tmp_path):
    with pytest.raises(TrainError, match="no tokenizer with a \\[MASK\\]|does not fit data set"):
        train(EXAMPLE.spec, _settings(data="text"), overrides=EXAMPLE.overrides, out=tmp_path / "a", progress=False)
    with pytest.raises(TrainError, match="causal"):
        train(
            EXAMPLE.spec,
            _settings(),
            overrides=[*EXAMPLE.overrides, "encoder.layer.compress.args.causal=true"],
            out=tmp_path / "b",
            progress=False,
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_under_torchrun_a_masked_lm_run_trains_and_resumes_to_the_same_losses(tmp_path):
    """Two processes, each masking its share of the batch from its own seed; killed after its step-2 checkpoint
    and resumed, the same losses."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    sets = [a for s in EXAMPLE.overrides for a in ("--set", s)]

    def run(out, *extra):
        command = [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "crate_compose.cli",
            "train",
            EXAMPLE.spec,
            "--task",
            "mlm",
            "--data",
            EXAMPLE.data,
            *sets,
            "--steps",
            "4",
            "--batch-size",
            "8",
            "--checkpoint-every",
            "2",
            "--log-every",
            "1",
            "--no-progress",
            "--out",
            str(out),
            *extra,
        ]
        result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]

    run(tmp_path / "whole")
    run(tmp_path / "broken")
    shutil.rmtree(tmp_path / "broken/checkpoints/step-000004"), shutil.rmtree(tmp_path / "broken/final")
    (tmp_path / "broken/result.json").unlink()
    run(tmp_path / "broken", "--resume")
    losses = [
        [
            row["loss"]
            for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if row["kind"] == "train"
        ]
        for out in (tmp_path / "whole", tmp_path / "broken")
    ]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


def test_probing_a_black_box_language_model_is_refused_with_a_reason(capsys):
    sets = [a for s in ("sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1") for a in ("--set", s)]
    assert main(["probe", "bert-mini", *sets, "--data", "bytes:text", "--samples", "8"]) == 2
    err = capsys.readouterr().err
    assert "has no step with an objective of its own" in err and "mhsa" in err and "Traceback" not in err

"""Task lm on tokenized text: ``generate`` reads the prompt in the run's vocabulary (``RUN/tokenizer.json``) and
decodes what it writes; the refusals (a prompt of no token, a token the embedding never read, a tokenizer file
missing, damaged or not the run's); and the metrics, per token everywhere, per byte and per character where the
ids say how much text they stand for.

Every run here is tiny (a few steps of a 1-layer model of width 16) on a small generated text folder; GPT-2's
vocabulary is a generated stand-in in GPT-2's two formats (the 256 byte characters and a few merges), so no test
needs ``make data``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import crate_compose as cc
from crate_compose import cli, tasks
from crate_compose.assessment.run_probes import load_weights
from crate_compose.building.builder import compile_spec
from crate_compose.data.text_sets import gpt2_vocabulary as G
from crate_compose.data.text_sets.tokens import Tokenizer, train_tokenizer
from crate_compose.errors import WorkbenchError
from crate_compose.generation.text import generate_text
from crate_compose.training.metrics import Metrics
from crate_compose.training.run_folder.checkpoint import latest_checkpoint

WORDS = (
    "the king and queen of denmark speak to their loyal friends about love war honour and death in the "
    "castle while a ghost walks upon the platform at night"
).split()
TINY = ["sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"]
PROMPT = "the queen and the ghost"


def _run(capsys, *argv):
    capsys.readouterr()  # what a fixture's run printed
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """Six text files of sentences from a small word list (the last, about a tenth of the bytes, held out)."""
    import random

    folder = tmp_path_factory.mktemp("texts")
    draw = random.Random(0)
    for part in range(6):
        lines = (" ".join(draw.choice(WORDS) for _ in range(10)) + "." for _ in range(120))
        (folder / f"part{part}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _train(out: Path, data: str, steps: int = 3) -> Path:
    code = cli.main(
        [
            "train",
            "causal-crate-bytes",
            "--task",
            "lm",
            "--data",
            data,
            "--steps",
            str(steps),
            "--batch-size",
            "4",
            "--out",
            str(out),
            "--no-progress",
            "--logger",
            "none",
            *[arg for size in TINY for arg in ("--set", size)],
        ]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def wordpiece_run(tmp_path_factory, texts) -> Path:
    return _train(tmp_path_factory.mktemp("wordpiece") / "run", f"wordpiece-200:folder:{texts}")


@pytest.fixture(scope="module")
def gpt2_home(tmp_path_factory) -> Path:
    """A data home holding a GPT-2 vocabulary in GPT-2's formats: the 256 byte characters (GPT-2's table, in byte
    order), 16 merges (the prompt's words) and <|endoftext|>: 273 ids of text, as ``make data`` would leave the
    real one."""
    from crate_compose.data.text_sets.tokens import byte_level_bytes

    home = tmp_path_factory.mktemp("data-home")
    characters = sorted(byte_level_bytes(), key=byte_level_bytes().__getitem__)
    merges = [
        ("t", "h"),
        ("th", "e"),
        ("q", "u"),
        ("qu", "e"),
        ("que", "e"),
        ("quee", "n"),
        ("a", "n"),
        ("an", "d"),
        ("g", "h"),
        ("gh", "o"),
        ("gho", "s"),
        ("ghos", "t"),
    ]
    merges += [("\u0120", word) for word in ("the", "queen", "and", "ghost")]  # Ġ: GPT-2's space
    encoder = {token: i for i, token in enumerate(characters + [a + b for a, b in merges] + [G.END_OF_TEXT])}
    folder = G.cache_folder(home)
    folder.mkdir(parents=True)
    (folder / G.ENCODER).write_text(json.dumps(encoder, ensure_ascii=False), encoding="utf-8")
    (folder / G.MERGES).write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return home


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory, texts, gpt2_home) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CRATE_COMPOSE_DATA", str(gpt2_home))
        return _train(tmp_path_factory.mktemp("gpt2") / "run", f"gpt2:folder:{texts}")


def _greedy(run: Path, prompt: str, tokens: int) -> tuple[Tokenizer, list[int], list[int]]:
    """The run's weights continued greedily from ``prompt`` encoded by the run's own tokenizer, by hand."""
    tokenizer = Tokenizer.read(run / "tokenizer.json")
    model = compile_spec(cc.load_spec(run / "final" / "spec.yaml"))
    load_weights(model, run / "final")
    ids = tokenizer.encode(prompt)
    out = cc.generate(model, torch.tensor([ids]), tokens, temperature=0.0)
    return tokenizer, ids, out[0, len(ids) :].tolist()


# ----------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize("which", ["wordpiece_run", "gpt2_run"])
def test_generate_reads_and_writes_text_in_the_runs_vocabulary(which, request, capsys):
    run = request.getfixturevalue(which)
    tokenizer, ids, new = _greedy(run, PROMPT, 6)
    assert len(ids) < len(PROMPT.encode())  # words, not bytes: the ids are the run's vocabulary's
    whole, head = tokenizer.decode(ids + new), tokenizer.decode(ids)
    assert whole.startswith(head)
    expected = whole[len(head) :]
    result = generate_text(run / "final" / "spec.yaml", PROMPT, weights=run / "final", tokens=6, temperature=0)
    assert result.prompt == PROMPT.encode() and result.continuation.decode() == expected
    assert result.text == PROMPT + expected and result.tokens == 6
    as_bytes = generate_text(
        run / "final" / "spec.yaml", PROMPT.encode(), weights=run / "final", tokens=6, temperature=0
    )
    assert as_bytes == result._replace(seconds=as_bytes.seconds)
    code, out, err = _run(
        capsys,
        "generate",
        run / "final" / "spec.yaml",
        "--weights",
        run / "final",
        "--prompt",
        PROMPT,
        "--tokens",
        6,
        "--temperature",
        0,
    )
    assert code == 0 and out == PROMPT + expected + "\n", err
    _, again, _ = _run(
        capsys,
        "generate",
        run / "final" / "spec.yaml",
        "--weights",
        run / "final",
        "--prompt",
        PROMPT,
        "--tokens",
        6,
        "--temperature",
        0,
        "--no-cache",
    )
    assert again == out
    checkpoint = latest_checkpoint(run)  # a checkpoint of the run reads the same vocabulary
    assert (
        generate_text(
            checkpoint / "spec.yaml", PROMPT, weights=checkpoint, tokens=6, temperature=0
        ).continuation.decode()
        == expected
    )  # the last one: the final weights


def test_a_wordpiece_piece_joins_the_prompts_last_word(wordpiece_run):
    tokenizer = Tokenizer.read(wordpiece_run / "tokenizer.json")
    piece = next(i for i in range(tokenizer.size) if tokenizer.token(i).startswith("##"))
    from crate_compose.generation.text import _continuation

    word = tokenizer.encode("the")
    assert _continuation(tokenizer, word, [piece]) == tokenizer.token(piece)[2:]  # "the" + "##y" reads "they"


def _refused(capsys, run: Path, prompt: str, weights: Path | None = None) -> str:
    weights = weights or run / "final"
    code, out, err = _run(
        capsys, "generate", run / "final" / "spec.yaml", "--weights", weights, "--prompt", prompt, "--tokens", 2
    )
    assert code == 2 and out == "" and "Traceback" not in err, err
    return err


def test_a_prompt_of_no_token_is_refused(wordpiece_run, capsys):
    err = _refused(capsys, wordpiece_run, "  \n ")
    assert "error: the prompt '  \\n ' encodes to no token in the vocabulary of" in err and "(wordpiece)" in err
    with pytest.raises(WorkbenchError, match="the prompt is not valid UTF-8: byte 0xff at character 2"):
        generate_text(wordpiece_run / "final" / "spec.yaml", "a\udcff", weights=wordpiece_run / "final")


def test_a_token_past_the_embedding_is_refused(gpt2_run, capsys):
    """GPT-2's specials follow its ids of text: a language model trained on text never read them."""
    tokenizer = Tokenizer.read(gpt2_run / "tokenizer.json")
    assert tokenizer.kind == "gpt2" and tokenizer.text_size == 273 and tokenizer.size == 278
    err = _refused(capsys, gpt2_run, "the [MASK] king")
    assert "error: prompt token 2 is '[MASK]' (id 277); spec 'causal-crate-bytes." in err
    assert "has a vocabulary of 273 tokens (0-272), which its weights were trained on" in err


def test_a_missing_damaged_or_foreign_tokenizer_is_named(wordpiece_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(wordpiece_run, run)
    (run / "tokenizer.json").unlink()
    err = _refused(capsys, run, PROMPT)
    assert f"error: {run} has no tokenizer.json: the vocabulary of wordpiece-200:folder:" in err and "restore it" in err
    (run / "tokenizer.json").write_text('{"format": ', encoding="utf-8")
    err = _refused(capsys, run, PROMPT, latest_checkpoint(run))
    assert f"error: the tokenizer {run / 'tokenizer.json'}: " in err
    (run / "tokenizer.json").write_text(
        train_tokenizer("bpe", 400, [" ".join(WORDS) * 20 + "xyz" * 50]).to_json(), encoding="utf-8"
    )
    err = _refused(capsys, run, PROMPT)
    assert f"error: {run / 'tokenizer.json'} holds " in err and "it is not the vocabulary the run was trained" in err


def test_byte_level_runs_keep_reading_bytes(tmp_path, texts, capsys):
    run = _train(tmp_path / "run", f"bytes:folder:{texts}", steps=1)
    assert Tokenizer.read(run / "tokenizer.json").kind == "bytes"
    result = generate_text(run / "final" / "spec.yaml", "\udcff[MASK]", weights=run / "final", tokens=2)
    assert result.prompt == b"\xff[MASK]"  # the bytes as typed; "[MASK]" is six bytes, not a special


@pytest.mark.parametrize("which", ["wordpiece_run", "gpt2_run", "bytes"])
def test_a_runs_tokenizer_json_is_hugging_faces_own(which, request, tmp_path, texts):
    """tokenizers and transformers read a run's tokenizer.json as is and give the run's ids; its record lies
    beside it."""
    from tokenizers import Tokenizer as HuggingFace
    from transformers import PreTrainedTokenizerFast

    run = (
        _train(tmp_path / "run", f"bytes:folder:{texts}", steps=1)
        if which == "bytes"
        else request.getfixturevalue(which)
    )
    ours = Tokenizer.read(run / "tokenizer.json")
    assert json.loads((run / "tokenizer.record.json").read_text())["kind"] == ours.kind == which.split("_")[0]
    text = PROMPT + " [MASK] déjà vu\n\tx[SEP]"
    theirs = HuggingFace.from_file(str(run / "tokenizer.json"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(run / "tokenizer.json"))
    assert (
        theirs.encode(text, add_special_tokens=False).ids
        == fast.encode(text, add_special_tokens=False)
        == ours.encode(text)
    )
    assert theirs.get_vocab_size() == ours.size and theirs.token_to_id("[MASK]") == ours.mask


# ----------------------------------------------------------------------------------------- metrics


def _metrics(run: Path) -> dict[str, float]:
    return json.loads((run / "result.json").read_text())["metrics"]


def test_lm_reports_per_token_and_where_the_ids_say_it_per_byte_and_per_character(
    wordpiece_run, gpt2_run, gpt2_home, texts
):
    from crate_compose.data.sets import load_data
    from crate_compose.tasks.language_modelling import EVAL_WINDOWS
    from crate_compose.training.preparation import in_task_form

    lm = tasks.get("lm")
    assert "--data text or a tokenized text set" in lm.trains_on and "per token" in lm.summary
    assert lm.columns == (
        "test_loss",
        "test_bits_per_byte",
        "test_unigram_loss",
        "test_loss_per_char",
        "test_bigram_loss",
    )
    assert set(_metrics(wordpiece_run)) == {"test_loss", "test_unigram_loss", "test_bigram_loss"}  # WordPiece's ids
    # drop the spaces: no per-byte or per-character figure
    metrics = _metrics(gpt2_run)
    assert set(metrics) == set(lm.columns)
    with pytest.MonkeyPatch.context() as patch:  # the held-out targets the run was scored on, decoded by hand
        patch.setenv("CRATE_COMPOSE_DATA", str(gpt2_home))
        data = in_task_form(
            load_data(f"gpt2:folder:{texts}", spec=cc.load_spec(gpt2_run / "final" / "spec.yaml")), "lm"
        )
    targets = data.test.tokens[1 : min(len(data.test), EVAL_WINDOWS) * 16 + 1]
    text = Tokenizer.read(gpt2_run / "tokenizer.json").decode(targets)
    nats = metrics["test_loss"] * len(targets)
    assert metrics["test_loss_per_char"] == pytest.approx(nats / len(text), rel=1e-6)
    assert metrics["test_bits_per_byte"] == pytest.approx(nats / len(text.encode()) / math.log(2), rel=1e-6)
    assert len(targets) < len(text) < len(targets) * 3  # a generated vocabulary of 16 merges


def test_on_bytes_every_figure_is_per_byte(tmp_path, texts):
    run = _train(tmp_path / "run", f"bytes:folder:{texts}", steps=1)
    metrics = _metrics(run)
    assert metrics["test_loss_per_char"] == pytest.approx(metrics["test_loss"], rel=1e-9)  # ASCII
    assert metrics["test_bits_per_byte"] == pytest.approx(metrics["test_loss"] / math.log(2), rel=1e-9)


def test_a_runs_metrics_without_the_per_character_column_still_read(tmp_path):
    """A run written before test_loss_per_char (its metrics.jsonl rows lack it) is read and resumed as before."""
    old = [
        {"step": 1, "kind": "train", "loss": 5.5, "lr": 0.001, "seconds": 0.1},
        {
            "step": 2,
            "kind": "eval",
            "test_loss": 5.0,
            "test_bits_per_byte": 5.0 / math.log(2),
            "test_unigram_loss": 3.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in old))
    Metrics(tmp_path, keep=2, enabled=True)
    import csv

    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    assert [row["test_loss"] for row in rows] == ["", "5.0"] and rows[1]["test_loss_per_char"] == ""


@pytest.mark.parametrize("kind, vocab", [("bytes", None), ("bpe", 300), ("gpt2", None)])
def test_the_lengths_of_ids_are_the_bytes_and_characters_they_decode_to(kind, vocab, gpt2_home, monkeypatch):
    monkeypatch.setenv("CRATE_COMPOSE_DATA", str(gpt2_home))
    text = "Tö be, or not to be: [MASK] æther 日本\n\t<|endoftext|> 𝟚 the king"
    tokenizer = train_tokenizer(kind, vocab, [text * 3])
    ids = tokenizer.encode_tensor(text)
    size, characters = tokenizer.lengths()
    assert tokenizer.decode(ids) == text
    assert int(size[ids].sum()) == len(text.encode()) and int(characters[ids].sum()) == len(text)
    assert train_tokenizer("wordpiece", 100, [text * 3]).lengths() is None

"""One guarded way to read an input file (crate_compose.files.read_input and read_json), and what is built on it:
the tokenizer file, the data cache's checks, the capped tokenizer training and fill's text."""

from __future__ import annotations

import json
import os
import random
import re
import time

import pytest
import torch

from crate_compose.data import archives
from crate_compose.data.text_sets import tokens
from crate_compose.data.text_sets.tokens import MAX_WORD, Tokenizer, train_tokenizer
from crate_compose.errors import DataError, WorkbenchError
from crate_compose.files import json_depth, read_input, read_json
from crate_compose.generation.fill import check_text


class Refused(WorkbenchError):
    """The error class a caller asks for."""


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"a": [1, {"b": 2}]}')
    assert read_input(path, limit=100, what="the file") == path.read_bytes()
    assert read_json(path, limit=100, what="the file") == {"a": [1, {"b": 2}]}


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: os.mkfifo(p), "a FIFO, not a file"),
        (lambda p: p.mkdir(), "a directory, not a file"),
        (lambda p: p.symlink_to(p.parent / "gone"), "a link to nothing"),
        (lambda p: None, "no such file"),
        (lambda p: p.write_bytes(b"x" * 101), "101 bytes, more than the 100 it may hold"),
    ],
)
def test_what_is_not_a_small_regular_file_is_refused_naming_it(tmp_path, make, said):
    path = tmp_path / "in.json"
    make(path)
    with pytest.raises(Refused, match=f"^the input {path}: {said}"):
        read_input(path, limit=100, what="the input", error=Refused)


def test_devices_and_files_that_lie_about_their_size():
    with pytest.raises(DataError, match="/dev/zero: a character device"):
        read_input("/dev/zero", limit=100, what="x")
    with pytest.raises(DataError, match="/proc/self/status: more than the 10 bytes it may hold"):
        read_input("/proc/self/status", limit=10, what="x")  # a regular file that says it holds 0 bytes


@pytest.mark.parametrize(
    "content, said",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to read"),
        (b'{"a": ' * 70 + b"1" + b"}" * 70, "nested 70 levels deep, more than 64"),
        (b'{"a": "\xff"}', r"not UTF-8 \(byte 0xff at offset 7\)"),
        (b'{"a": ', "not JSON"),
    ],
)
def test_json_that_cannot_be_read_is_refused_naming_the_file(tmp_path, content, said):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match=f"the config {path}: {said}"):
        read_json(path, limit=1 << 20, what="the config")


def test_json_depth_counts_without_recursion():
    assert json_depth(3) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert json_depth(deep) == 10_001


def test_a_damaged_tokenizer_file_is_named(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(Tokenizer("bytes").to_json()[:40])
    with pytest.raises(DataError, match=f"^the tokenizer {path}: not JSON"):
        Tokenizer.read(path)
    path.write_text(json.dumps({"format": "crate-compose-tokenizer", "kind": "unigram"}))
    with pytest.raises(DataError, match=f"^the tokenizer {path}: unknown kind 'unigram'"):
        Tokenizer.read(path)
    path.write_text(Tokenizer("bytes").to_json())
    assert Tokenizer.read(path).size == 261


def test_a_tokens_text_is_what_it_writes_in_place_of_a_mask():
    texts = ["def items(self):\n    return self.values\n" * 50, "for key, value in self.items():\n" * 50]
    wordpiece = train_tokenizer("wordpiece", 100, texts)
    continuing = next(i for i in range(wordpiece.size) if wordpiece.token(i).startswith("##"))
    assert wordpiece.text_of(continuing) == wordpiece.token(continuing)[2:]
    assert wordpiece.text_of(wordpiece.mask) == "[MASK]"
    bpe = train_tokenizer("bpe", 300, texts)
    spaced = bpe.encode(" items")
    assert "".join(bpe.text_of(i) for i in spaced) == " items"
    assert Tokenizer("bytes").text_of(ord("x")) == "x"


def _letters(count: int, seed: int = 1) -> str:
    draw = random.Random(seed)
    return "".join(draw.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(count))


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_a_pathological_word_trains_in_seconds(kind):
    """A word of 200,000 letters took minutes to train on; words over MAX_WORD characters are capped."""
    text = "the quick brown fox jumps over the lazy dog\n" * 200 + _letters(200_000) + "\n"
    began = time.monotonic()
    tokenizer = train_tokenizer(kind, 300, [text])
    assert time.monotonic() - began < 20
    assert all(len(tokenizer.token(i).removeprefix("##")) <= MAX_WORD for i in range(tokenizer.size))


def test_pre_tokens_up_to_the_cap_are_given_unchanged():
    """A text whose byte-level pre-tokens (a word with the space before it) are at most MAX_WORD characters
    long is given to the BPE trainer as it is."""
    text = _letters(MAX_WORD) + "".join(" " + _letters(MAX_WORD - 1, seed) for seed in range(30)) + "\n"
    assert list(tokens._capped([text], _byte_level())) == [text]


def _byte_level():
    import tokenizers

    return tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)


def test_a_long_pre_token_is_cut_for_bpe_and_the_rest_kept():
    long = "x" * (MAX_WORD * 2 + 5)
    parts = list(tokens._capped([f"a b {long} c"], _byte_level()))
    assert "".join(parts) == f"a b {long} c" and max(map(len, parts)) <= MAX_WORD
    assert parts[0] == "a b"


@pytest.mark.parametrize(
    "text, said",
    [
        ("ab\udcff", r"byte 0xff at character 3 of 3"),
        ("a\ud800", r"U\+D800 \(a lone surrogate\) at character 2"),
    ],
)
def test_a_text_to_fill_must_be_utf8(text, said):
    with pytest.raises(WorkbenchError, match=f"the text is not valid UTF-8: {said}"):
        check_text(text)
    check_text("ordinary text, é and 𝟚 [MASK]")


def _tensors(count: int = 14) -> dict[str, torch.Tensor]:
    return {
        "images": torch.zeros(count, 28, 28, dtype=torch.uint8),
        "labels": torch.arange(count) % 10,
        "test": (torch.arange(count) % 7 == 0).to(torch.uint8),
    }


@pytest.mark.parametrize(
    "change, said",
    [
        (
            lambda t: t.update(labels=t["labels"][:-1]),
            r"labels are int64 of shape \(13,\); expected int64 of shape \(14,\)",
        ),
        (lambda t: t.update(images=t["images"].reshape(14, 784)), r"images are uint8 of shape \(14, 784\)"),
        (lambda t: t.update(images=t["images"].float()), "images are float32"),
        (lambda t: t["labels"].__setitem__(0, 10), r"a label is 10; the set has 10 classes \(0\.\.9\)"),
        (lambda t: t["test"].zero_(), "0 of its 14 images are test images"),
        (lambda t: t["test"].fill_(1), "14 of its 14 images are test images"),
        (lambda t: t["test"].__setitem__(0, 3), "a test mark is 3"),
    ],
)
def test_the_cache_checks(change, said):
    tensors = _tensors()
    assert archives.check_cache(tensors, 10) == ""
    change(tensors)
    assert re.search(said, archives.check_cache(tensors, 10))

"""Tokenizers made without a download (crate_compose.data.text_sets.tokens, .texts) and the text sets for masked language
modelling: round trips, determinism, safe storage, BERT's windows, folders of text, the modules set."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from crate_compose.data import sets as D
from crate_compose.data.text_sets import texts as T
from crate_compose.data.text_sets.corpus import stdlib_source
from crate_compose.data.text_sets.tokens import SPECIALS, Tokenizer, train_tokenizer
from crate_compose.errors import DataError
from crate_compose.training.preparation import fingerprint

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "value",
    "index",
    "result",
    "counter",
    "parser",
    "token",
    "return",
    "self",
    "items",
    "append",
    "lambda",
    "yield",
    "print",
    "encode",
    "decode",
    "window",
]


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """A few hundred lines of code-like text, fixed by ``seed``, as four documents."""
    rng = random.Random(seed)
    made = []
    for i in range(lines):
        a, b, c = rng.sample(WORDS, 3)
        made.append(
            rng.choice(
                [
                    f"def {a}_{b}(self, {c}):\n",
                    f"    {a} = {b}.{c}({i % 17})\n",
                    f"    return {a} + {b} * {c}  # {c} times\n",
                    f"    if {a} > {i}: {b}.append({c})\n",
                ]
            )
        )
    return ["".join(made[k::4]) for k in range(4)]


@pytest.fixture(scope="module", params=["wordpiece", "bpe"])
def trained(request):
    return request.param, train_tokenizer(request.param, 300, corpus())


# ---------------------------------------------------------------- bytes


def test_bytes_round_trip_with_specials():
    tok = Tokenizer("bytes")
    assert (tok.size, tok.pad, tok.unk, tok.cls, tok.sep, tok.mask) == (261, 256, 257, 258, 259, 260)
    assert tok.specials == frozenset(range(256, 261))
    text = "héllo [MASK] wörld[SEP]\n\tend"
    ids = tok.encode(text)
    assert ids[:3] == [ord("h"), 0xC3, 0xA9] and tok.mask in ids and tok.sep in ids and tok.cls not in ids
    assert ids.count(tok.mask) == 1 and len(ids) == len(text.encode()) - len("[MASK][SEP]") + 2
    assert tok.decode(ids) == text and tok.decode(torch.tensor(ids)) == text
    assert torch.equal(tok.encode_tensor(text), torch.tensor(ids)) and tok.encode("") == []
    assert [tok.token(i) for i in (ord("a"), ord(" "), 10, 0xC3, tok.mask)] == ["a", " ", "\\n", "\\xc3", "[MASK]"]
    again = Tokenizer.from_json(tok.to_json())
    assert again.kind == "bytes" and again.encode(text) == ids and again.sha256 == tok.sha256
    with pytest.raises(DataError, match="outside the vocabulary"):
        tok.decode([261])


# ---------------------------------------------------------------- trained: wordpiece, bpe


def test_training_is_deterministic_with_specials_first(trained):
    kind, tok = trained
    again = train_tokenizer(kind, 300, corpus())
    assert again.to_json() == tok.to_json() and again.sha256 == tok.sha256
    assert [tok.pad, tok.unk, tok.cls, tok.sep, tok.mask] == [0, 1, 2, 3, 4]
    assert [tok.token(i) for i in range(5)] == list(SPECIALS) and tok.specials == frozenset(range(5))
    assert 5 < tok.size <= 300 and tok.kind == kind
    other = train_tokenizer(kind, 300, corpus(seed=1))
    assert other.sha256 != tok.sha256  # the vocabulary is learned from the texts


def test_determinism_does_not_follow_the_thread_count():
    """One thread (TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1) in a fresh process learns the same
    vocabularies as this process's thread pool: the trainer's merges are ordered by count, then by pair."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from test_tokens import corpus; "
        "from crate_compose.data.text_sets.tokens import train_tokenizer; "
        "print(*(train_tokenizer(kind, 300, corpus()).sha256 for kind in ('wordpiece', 'bpe')))"
    )
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == [train_tokenizer(kind, 300, corpus()).sha256 for kind in ("wordpiece", "bpe")]


def test_encode_decode_and_storage(trained):
    kind, tok = trained
    ids = tok.encode("x [MASK] y")
    assert tok.mask in ids and tok.cls not in ids and tok.sep not in ids
    text = "def alpha_beta(self, gamma):\n    return alpha + beta * gamma  # [MASK] times\n"
    ids = tok.encode(text)
    assert tok.mask in ids and tok.unk not in ids
    if kind == "bpe":  # byte-level: whitespace and the specials round-trip exactly
        assert tok.decode(ids) == text
    else:  # BERT's WordPiece keeps the words, not the spaces between them
        assert "".join(tok.decode(ids).split()) == "".join(text.split())
        assert tok.decode(tok.encode("alpha_beta(gamma)")) == "alpha _ beta ( gamma )"
        assert any(tok.token(i).startswith("##") for i in range(tok.size))
        assert tok.encode("Alpha") != tok.encode("alpha")  # not lowercased: the corpus is code
    assert all(isinstance(tok.token(i), str) and tok.token(i).isprintable() for i in range(tok.size))
    stored = tok.to_json()
    back = Tokenizer.from_json(stored)
    assert back.kind == kind and back.size == tok.size and back.encode(text) == ids and back.to_json() == stored
    assert json.loads(stored)["tokenizer"]["model"]["type"] == {"wordpiece": "WordPiece", "bpe": "BPE"}[kind]


@pytest.mark.parametrize("kind", ["bytes", "wordpiece", "bpe"])
def test_saved_as_hugging_faces_file_with_the_record_beside_it(kind, tmp_path):
    from tokenizers import Tokenizer as HuggingFace

    tok = Tokenizer("bytes") if kind == "bytes" else train_tokenizer(kind, 300, corpus())
    path = tmp_path / "tokenizer.json"
    files = tok.save(path)
    assert sorted(p.name for p in files) == ["tokenizer.json", "tokenizer.record.json"]
    for where, text in files.items():
        where.write_text(text)
    text = "def alpha_beta(self, gamma):\n    return [MASK] é 日本\n"
    back = Tokenizer.read(path)
    assert (
        back.kind == kind
        and back.encode(text)
        == tok.encode(text)
        == HuggingFace.from_file(str(path)).encode(text, add_special_tokens=False).ids
    )
    assert back.sha256 == tok.sha256  # the data's fingerprint: a run recorded before the record resumes
    path.write_text(tok.to_json())  # the single file runs wrote before (its record beside it is not read)
    assert Tokenizer.read(path).encode(text) == tok.encode(text)


def test_a_tokenizer_file_that_is_not_its_records_is_refused(tmp_path):
    path = tmp_path / "tokenizer.json"
    for where, text in Tokenizer("bytes").save(path).items():
        where.write_text(text)
    record = tmp_path / "tokenizer.record.json"
    other = train_tokenizer("bpe", 300, corpus()).to_huggingface()
    path.write_text(other)  # another vocabulary in its place
    with pytest.raises(DataError, match=f"^the tokenizer {path} is not the file its record tokenizer.record.json"):
        Tokenizer.read(path)
    stored = json.loads(record.read_text())
    record.write_text(json.dumps({**stored, "sha256": hashlib.sha256(other.encode()).hexdigest()}))
    with pytest.raises(DataError, match="its record says bytes, and it is not the bytes tokenizer"):
        Tokenizer.read(path)  # the record edited to match: the kind still tells
    record.write_text("[1]")
    with pytest.raises(DataError, match=f"^the tokenizer's record {record}: not a tokenizer record"):
        Tokenizer.read(path)
    record.unlink()
    with pytest.raises(DataError, match="its record tokenizer.record.json is missing beside it"):
        Tokenizer.read(path)


def _tampered(stored: str, change) -> str:
    body = json.loads(stored)
    change(body)
    return json.dumps(body)


def test_a_malformed_tokenizer_file_is_a_data_error(trained):
    kind, tok = trained
    stored = tok.to_json()

    def swap_mask(body):  # [MASK] moved to id 7, the token there to 4
        vocab = body["tokenizer"]["model"]["vocab"]
        other = next(piece for piece, id in vocab.items() if id == 7)
        vocab["[MASK]"], vocab[other] = 7, 4

    def unmark_mask(body):  # [MASK] no longer an added token: the text "[MASK]" would be split into pieces
        body["tokenizer"]["added_tokens"] = [t for t in body["tokenizer"]["added_tokens"] if t["content"] != "[MASK]"]

    bad = {
        "truncated": (stored[: len(stored) // 2], "not JSON"),
        "a list": ("[1, 2]", "not a tokenizer file"),
        "another format": (_tampered(stored, lambda b: b.update(format="pickle")), "not a tokenizer file"),
        "a kind": (_tampered(stored, lambda b: b.update(kind="unigram")), "unknown kind"),
        "the specials": (_tampered(stored, lambda b: b.update(specials=["[MASK]"])), "specials must be"),
        "the size": (_tampered(stored, lambda b: b.update(size=tok.size + 1)), "size"),
        "the model": (_tampered(stored, lambda b: b["tokenizer"]["model"].update(type="Unigram")), "model"),
        "the vocabulary": (_tampered(stored, lambda b: b["tokenizer"]["model"].update(vocab="x")), "cannot be read"),
        "a special's id": (_tampered(stored, swap_mask), "must be the ids 0..4"),
        "a special's mark": (_tampered(stored, unmark_mask), "must be the ids 0..4, each found in text"),
        "no body": (_tampered(stored, lambda b: b.update(tokenizer=None)), "model"),
        "a body for bytes": (_tampered(stored, lambda b: b.update(kind="bytes")), "no trained vocabulary"),
    }
    for what, (text, message) in bad.items():
        with pytest.raises(DataError, match=message):
            Tokenizer.from_json(text)
            pytest.fail(f"{what}: read")


def test_vocabulary_bounds():
    with pytest.raises(DataError, match="at least 261|from 261"):
        train_tokenizer("bpe", 100, corpus())
    with pytest.raises(DataError, match="no text"):
        train_tokenizer("wordpiece", 300, ["", ""])
    assert train_tokenizer("bytes", None, []).size == 261


# ---------------------------------------------------------------- the text sets


@pytest.fixture(scope="module")
def wordpiece_text():
    return D.load_data("wordpiece-512:text", context=16)


def _check_windows(data, context):
    tok = data.tokenizer
    assert data.provides == "tokenized-text" and data.classes is None and data.input_shape == (context,)
    assert data.sizes == {"vocab": tok.size, "context": context, "sep": tok.sep}
    for split in (data.train, data.test):
        assert len(split) == len(split.tokens) // (context - 2) > 0
        assert isinstance(split.tokens, torch.Tensor) and split.tokens.dtype == torch.int64
        for i in (0, 1, len(split) - 1):
            x, y = split[i]
            assert x.dtype == torch.int64 and x.shape == (context,) and torch.equal(x, y)
            assert x[0] == tok.cls and x[-1] == tok.sep
            assert torch.equal(x[1:-1], split.tokens[i * (context - 2) : (i + 1) * (context - 2)])
    assert 0 < data.unigram_loss < math.log(tok.size)


def test_bytes_text_windows():
    data = D.load_data("bytes:text", context=12)
    _check_windows(data, 12)
    assert data.name == "bytes:text" and data.tokenizer.kind == "bytes" and data.sizes["vocab"] == 261
    source, split = stdlib_source()
    assert data.train.tokens.tolist()[:500] == list(source[:500])  # UTF-8 bytes, the text set's split
    assert len(data.train.tokens) == split and len(data.test.tokens) == len(source) - split


def test_wordpiece_text_windows_and_fingerprints(wordpiece_text):
    data = wordpiece_text
    _check_windows(data, 16)
    assert data.name == "wordpiece-512:text" and data.tokenizer.kind == "wordpiece" and data.sizes["vocab"] == 512
    assert D.takes("wordpiece-512:text") == frozenset({"spec"})
    fitted = D.load_data("wordpiece-512:text", spec=SimpleNamespace(input=SimpleNamespace(shape=[10])))
    assert fitted.input_shape == (10,) and fitted.tokenizer is data.tokenizer  # trained once per process
    smaller = D.load_data("wordpiece-256:text", context=16)
    assert smaller.sizes["vocab"] == 256 and smaller.tokenizer.sha256 != data.tokenizer.sha256
    assert len({fingerprint(data), fingerprint(smaller), fingerprint(D.load_data("bytes:text", context=16))}) == 3
    assert fingerprint(data) == fingerprint(D.load_data("wordpiece-512:text", context=16))
    assert T.set_name("wordpiece", 8192, "text") == "wordpiece:text"  # the default vocabulary's name is the short one


def test_names_and_refusals():
    forms = {"bytes:text", "wordpiece:text", "bpe:text", "KIND-V:text", "KIND:modules", "KIND:folder:PATH"}
    assert forms <= set(D.names())
    for name, message in [
        ("bytes-300:text", "bytes takes no vocabulary"),
        ("wordpiece-10:text", "from 64"),
        ("bpe-200:text", "from 261"),
        ("wordpiece:texts", "wordpiece\\[-V\\]:text"),
        ("wordpiece:folder:", "wordpiece:folder:PATH"),
        ("wordpeice:text", "did you mean 'wordpiece:text'"),
    ]:
        with pytest.raises(DataError, match=message):
            D.load_data(name)
    with pytest.raises(DataError, match="at least 3 tokens"):
        D.load_data("bytes:text", context=2)
    with pytest.raises(DataError, match="does not take image_size"):
        D.load_data("bytes:text", image_size=8)


# ---------------------------------------------------------------- folders of text


def write_texts(root, count=12, size=2000):
    """``count`` text files of ``size`` bytes each (.txt, .md, .py; half in a subfolder), a hidden one and a CSV."""
    rng = random.Random(3)
    for i in range(count):
        folder = root / "notes" if i % 2 else root
        folder.mkdir(parents=True, exist_ok=True)
        words = " ".join(rng.choices(WORDS, k=size // 3))
        text = "\n".join(words[k : k + 59] for k in range(0, size, 60))[: size - 1] + "\n"
        (folder / f"doc{i:02d}{['.txt', '.md', '.py'][i % 3]}").write_text(text)
    (root / ".hidden").mkdir()
    (root / ".hidden" / "skip.txt").write_text("never read")
    (root / "data.csv").write_text("not,text,here")


def test_a_folder_of_text(tmp_path):
    write_texts(tmp_path)
    data = D.load_data(f"bpe-300:folder:{tmp_path}", context=8)
    _check_windows(data, 8)
    assert data.name == f"bpe-300:folder:{tmp_path}"
    files = T.text_files(tmp_path)
    assert len(files) == 12 and files == sorted(files) and all(".hidden" not in str(f) for f in files)
    source = b"".join(f.read_bytes() for f in files)
    assert {len(f.read_bytes()) for f in files} == {2000}
    held = files[-1].read_bytes()  # 12 files of one size: the last one is the closest to 10%
    tok = data.tokenizer
    assert data.test.tokens.tolist() == tok.encode(held.decode()) and tok.decode(data.test.tokens) == held.decode()
    assert tok.decode(data.train.tokens) == source[: len(source) - len(held)].decode()
    assert tok.sha256 == train_tokenizer("bpe", 300, [source[: len(source) - len(held)].decode()]).sha256

    plain = D.load_data(f"folder:{tmp_path}", context=8)  # text files, no class folders of images: bytes
    assert (
        plain.name == f"bytes:folder:{tmp_path}"
        and plain.tokenizer.kind == "bytes"
        and plain.provides == "tokenized-text"
    )
    assert plain.train.tokens.tolist() == list(source[: len(source) - len(held)])
    assert D.takes(f"folder:{tmp_path}") == frozenset({"spec"})


def test_a_folder_without_text_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=f"{tmp_path / 'empty'}: no text files.*\\*\\.txt, \\*\\.md, \\*\\.py"):
        D.load_data(f"wordpiece-512:folder:{tmp_path / 'empty'}")
    with pytest.raises(DataError, match="no such folder"):
        D.load_data(f"bytes:folder:{tmp_path / 'missing'}")
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_text("just one file\n")
    with pytest.raises(DataError, match="at least two"):
        D.load_data(f"bytes:folder:{tmp_path / 'one'}")
    with pytest.raises(DataError, match="no class folders"):  # an empty folder is still read as images
        D.load_data(f"folder:{tmp_path / 'empty'}")


def test_a_folder_of_images_with_notes_stays_images(tmp_path):
    from PIL import Image

    for split in ("train", "test"):  # the train/test layout: no class folder right under the folder
        for name in ("cats", "dogs"):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (4, 4), (i * 40, 0, 0)).save(tmp_path / split / name / f"{i}.png")
            (tmp_path / split / name / "notes.txt").write_text("not an image")
    (tmp_path / "README.md").write_text("two classes")
    data = D.load_data(f"folder:{tmp_path}")
    assert data.provides == "labeled-images" and data.class_names == ["cats", "dogs"] and data.tokenizer is None
    assert (len(data.train), len(data.test)) == (4, 4)
    assert D.takes(f"folder:{tmp_path}") == frozenset()


# ---------------------------------------------------------------- modules


def test_modules_balanced_held_out_and_the_text_tokenizer(wordpiece_text):
    data = D.load_data("wordpiece-512:modules", context=16)
    tok = data.tokenizer
    assert data.name == "wordpiece-512:modules" and data.provides == "labeled-tokens" and data.classes == 10
    assert data.class_names == sorted(data.class_names) and len(set(data.class_names)) == 10
    assert not any(name.startswith("_") for name in data.class_names)
    assert data.sizes == {"vocab": 512, "context": 16, "sep": tok.sep, "classes": 10}
    assert tok.to_json() == wordpiece_text.tokenizer.to_json()  # pre-train on wordpiece-512:text, fine-tune here
    for split in (data.train, data.test):
        counts = Counter(split.targets.tolist())
        assert sorted(counts) == list(range(10)) and len(set(counts.values())) == 1  # balanced
        assert (split.inputs[:, 0] == tok.cls).all() and (split.inputs[:, -1] == tok.sep).all()
        assert not torch.isin(split.inputs[:, 1:-1], torch.tensor(sorted(tok.specials - {tok.unk}))).any()  # no padding
    assert len(data.train) > 3 * len(data.test) > 0
    train = {tuple(row) for row in data.train.inputs.tolist()}
    assert not any(tuple(row) in train for row in data.test.inputs.tolist())
    x, y = data.train[0]
    assert x.shape == (16,) and int(y) == 0


def test_the_pieces_a_vocabulary_cannot_say_are_named(trained):
    """What fill notes: a character no training text held reads as [UNK] in WordPiece; byte-level BPE and bytes
    say every text."""
    kind, tok = trained
    text = "def items(self): return 漢字 + ünïcode"
    unknown = tok.unknown(text)
    ids = tok.encode(text)
    assert len(unknown) == ids.count(tok.unk)
    if kind == "wordpiece":
        assert unknown and all(piece in text for piece in unknown) and any("漢" in piece for piece in unknown)
    assert Tokenizer("bytes").unknown(text) == []

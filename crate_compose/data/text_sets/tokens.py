"""Tokenizers made without a download, and the text sets for masked language modelling built on them.

A :class:`Tokenizer` is one of four kinds, each with the five special tokens of :data:`SPECIALS`:

* ``bytes``: ids 0..255 are the bytes of the UTF-8 text, the specials 256..260 (261 ids); nothing to train;
* ``wordpiece``: BERT's WordPiece (a "##" continuing prefix, BERT's pre-tokenizer splitting on whitespace
  and punctuation, BERT's normalizer with NO lowercasing and no accent stripping: the corpus is code), its
  vocabulary learned by :func:`train_tokenizer` from the texts given;
* ``bpe``: byte-level BPE (GPT-2's: the ByteLevel pre-tokenizer and decoder, so whitespace round-trips and
  no text is ever unknown);
* ``gpt2``: GPT-2's own byte-level BPE, its 50,257 ids exactly (0..50,256), the specials after them
  (50,257..50,261); nothing to train: its files are fetched once by ``make data`` (:mod:`.gpt2_vocabulary`).

Trained vocabularies come from Hugging Face's ``tokenizers`` (Rust, offline). Training is deterministic:
the same texts give the same vocabulary and ids, whatever the thread count. Its byte-level BPE trainer
already is; its WordPiece trainer is not (it numbers the "##" pieces in the order it meets them in a hash
map, and breaks ties between merges of equal counts by those numbers), so :func:`train_tokenizer` runs the
same algorithm through the BPE trainer on words whose non-initial characters are marked (mapped to
private-use code points, every piece of the alphabet given up front, numbered in code point order), then
turns the marked pieces back into "##" pieces: the vocabulary HF's WordPiece trainer learns, numbered
reproducibly.

A tokenizer is saved (:meth:`Tokenizer.save`) as Hugging Face's own ``tokenizer.json``, which
``tokenizers.Tokenizer.from_file`` and ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)`` read as is
(the bytes kind as a byte-level BPE without merges: the same ids), with the project's record beside it
(``tokenizer.record.json``: the kind, the size, the specials and the SHA-256 of the Hugging Face file, so a file
that is not the record's is refused). :meth:`Tokenizer.read` reads that pair, and the single file runs wrote
before it (the record with Hugging Face's JSON inside, :meth:`Tokenizer.to_json`), through
:func:`crate_compose.files.read_json`: a regular file of at most :data:`MAX_TOKENIZER_BYTES`, nested at most
:data:`~crate_compose.files.MAX_JSON_DEPTH` deep; JSON is only parsed (``tokenizers.Tokenizer.from_str`` for
trained ones), and every refusal names the file. :meth:`Tokenizer.to_json` stays the canonical text a data
set's fingerprint hashes, so a run recorded before the change resumes.

What training sees is capped, so that no text makes it slow: a word longer than :data:`MAX_WORD` characters
(a base64 blob, a minified line, a run of one letter) is left out of WordPiece training (WordPiece encodes
such a word as ``[UNK]``, so no piece learned from it would be used) and is cut into pieces of
:data:`MAX_WORD` characters for byte-level BPE (a pre-token of the ByteLevel pre-tokenizer, whitespace runs
included). Text without such words (the standard library's longest is 80 characters) trains as before.

The text sets built on them are in :mod:`.texts`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from ...errors import DataError
from ...files import MAX_JSON_DEPTH, json_depth, read_json, sha256_of
from .byte_level import SPECIALS, byte_level_bytes

if TYPE_CHECKING:  # imported where ids become tensors: the constants and check_vocab name the data sets torch-free
    import torch

__all__ = [
    "DEFAULT_VOCAB",
    "KINDS",
    "SPECIALS",
    "Tokenizer",
    "byte_level_bytes",
    "check_vocab",
    "gpt2_tokenizer",
    "train_tokenizer",
]

KINDS = ("bytes", "wordpiece", "bpe", "gpt2")
FIXED = {
    "bytes": "its ids are the 256 bytes and 5 specials",  # the kinds that learn no vocabulary: no V
    "gpt2": "its ids are GPT-2's 50,257 and 5 specials",
}
SPECIALS_LAST = ("bytes", "gpt2")  # the kinds whose specials follow the ids of text (the others': ids 0..4)
DEFAULT_VOCAB = 8192
MIN_VOCAB = {"wordpiece": 64, "bpe": 256 + len(SPECIALS)}  # bpe: every byte and the specials
MAX_VOCAB = 1 << 18
FORMAT = "crate-compose-tokenizer"
RECORD_SUFFIX = ".record.json"  # tokenizer.json's record: tokenizer.record.json
CHUNK = 1 << 16  # characters per piece of text the Rust side encodes in parallel
MAX_WORD = 100  # characters of a word tokenizer training sees (WordPiece's max_input_chars_per_word)
MAX_TOKENIZER_BYTES = 64 << 20  # a stored tokenizer (one of MAX_VOCAB pieces and its merges is about 10 MB)

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
# a line break between two non-space characters: both pre-tokenizers end a pre-token there
_BREAK = re.compile(r"(?<=\S)\n(?=\S)")
# where a byte-level pre-token may be longer than MAX_WORD: a run of MAX_WORD non-space or whitespace characters
_LONG = re.compile(rf"\S{{{MAX_WORD},}}|\s{{{MAX_WORD},}}")
# supplementary private use area A: a word's non-initial characters while a WordPiece vocabulary is learned
_MARK = 0xF0000


# ---------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A tokenizer of one of :data:`KINDS`; ids 0..size-1, the specials among them (see the module docstring).

    ``encode`` turns the special strings in the text ("[MASK]") into their ids and adds nothing around it;
    ``decode`` writes the specials back as their strings; ``token`` is a readable piece for display.
    ``text_size``: the ids text may encode to lie below it (bytes: 256, gpt2: 50,257; the others: ``size``)."""

    def __init__(self, kind: str, backend: Any = None, *, where: str = "tokenizer") -> None:
        if kind not in KINDS:
            raise DataError(f"{where}: unknown kind '{kind}'; expected one of {', '.join(KINDS)}")
        if (kind == "bytes") != (backend is None):
            needs = "takes no" if kind == "bytes" else "needs a"
            raise DataError(f"{where}: a {kind} tokenizer {needs} trained vocabulary")
        self.kind, self._backend = kind, backend
        if backend is None:
            self.size = 256 + len(SPECIALS)
            ids = list(range(256, 256 + len(SPECIALS)))
        else:
            self.size = backend.get_vocab_size(with_added_tokens=True)
            first = self.size - len(SPECIALS) if kind in SPECIALS_LAST else 0
            ids = [backend.token_to_id(s) for s in SPECIALS]
            found = [backend.encode(s, add_special_tokens=False).ids for s in SPECIALS]
            pieces = [backend.id_to_token(i) for i in range(first, first + len(SPECIALS))]
            expected = list(range(first, first + len(SPECIALS)))
            if ids != expected or found != [[i] for i in ids] or pieces != list(SPECIALS):
                raise DataError(
                    f"{where}: the special tokens {', '.join(SPECIALS)} must be the ids {first}.."
                    f"{first + 4}, each found in text; got {ids}, encoded as {found}"
                )
        self.pad, self.unk, self.cls, self.sep, self.mask = ids
        self.text_size = self.size - len(SPECIALS) if kind in SPECIALS_LAST else self.size
        self.specials = frozenset(ids)
        self._json: str | None = None
        self._lengths: tuple[torch.Tensor, torch.Tensor] | None = None

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, size {self.size}, sha256 {self.sha256[:12]})"

    # -------------------------------------------------------- ids

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``; the special strings in it become their ids; no [CLS]/[SEP] is added."""
        return self.encode_tensor(text).tolist()

    def encode_tensor(self, text: str) -> torch.Tensor:
        """:meth:`encode` as an int64 tensor, fast on long texts (in pieces encoded in parallel, split
        where both pre-tokenizers split anyway, so the ids are those of the whole text)."""
        import torch

        if self._backend is None:
            if not _SPECIAL_RE.search(text):
                data = bytearray(text.encode("utf-8", errors="replace"))
                return torch.frombuffer(data, dtype=torch.uint8).long() if data else torch.zeros(0, dtype=torch.long)
            ids: list[int] = []
            for i, piece in enumerate(_SPECIAL_RE.split(text)):  # odd pieces are the specials
                ids.extend([256 + SPECIALS.index(piece)] if i % 2 else piece.encode("utf-8", errors="replace"))
            return torch.tensor(ids, dtype=torch.long)
        pieces = list(_pieces(text))
        if len(pieces) == 1:
            return torch.tensor(self._backend.encode(pieces[0], add_special_tokens=False).ids, dtype=torch.long)
        encoded = self._backend.encode_batch(pieces, add_special_tokens=False)
        return torch.tensor([i for one in encoded for i in one.ids], dtype=torch.long)

    def unknown(self, text: str) -> list[str]:
        """The pieces of ``text`` this vocabulary cannot say, which :meth:`encode` reads as ``[UNK]`` (a character
        no training text held, in WordPiece); none for bytes and byte-level BPE, which say every text."""
        if self._backend is None:
            return []
        found = self._backend.encode(text, add_special_tokens=False)
        return [text[start:end] for id, (start, end) in zip(found.ids, found.offsets) if id == self.unk]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of ``ids`` (the specials as their strings; bytes that are not UTF-8 as U+FFFD)."""
        ids = self._checked(ids)
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        out, run = [], bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out += [run.decode("utf-8", errors="replace"), SPECIALS[i - 256]]
            run = bytearray()
        return "".join(out) + run.decode("utf-8", errors="replace")

    def token(self, id: int) -> str:
        """A readable piece for display: "##ing", "[MASK]", a BPE piece as its text ("\\n" and other
        unprintable characters escaped), a byte as its character or ``\\xNN``."""
        (id,) = self._checked([id])
        if id in self.specials:
            return SPECIALS[id - self.pad]
        if self._backend is None:
            return _printable(bytes([id]).decode("utf-8", errors="backslashreplace"))
        piece = self._backend.id_to_token(id)
        table = byte_level_bytes()
        if self.kind in ("bpe", "gpt2") and all(c in table for c in piece):
            piece = bytes(table[c] for c in piece).decode("utf-8", errors="backslashreplace")
        return _printable(piece)

    def text_of(self, id: int) -> str:
        """The text ``id`` stands for, written into a text in place of a ``[MASK]``: a WordPiece piece without
        its "##", a byte-level BPE piece's characters (its leading space too), a byte as its character (U+FFFD
        when it is part of a longer one), a special as its string."""
        (id,) = self._checked([id])
        if id in self.specials:
            return SPECIALS[id - self.pad]
        if self.kind == "wordpiece":
            piece = self._backend.id_to_token(id)
            return piece[2:] if piece.startswith("##") else piece
        return self.decode([id])

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """How much text each id stands for, as two int64 tensors of ``size``: its UTF-8 bytes and its characters
        (the leading bytes among them: a character split over two ids counts in the one holding its first byte), a
        special as its string; so summed over a stream they are exactly the bytes and characters of the text it
        decodes to. For the byte-level kinds (bytes, bpe, gpt2); None for wordpiece, whose ids do not keep the
        whitespace between words."""
        import torch

        if self.kind == "wordpiece":
            return None
        if self._lengths is None:
            table = byte_level_bytes()
            pieces = [
                SPECIALS[i - self.pad].encode()
                if i in self.specials
                else bytes([i])
                if self._backend is None
                else bytes(table[c] for c in self._backend.id_to_token(i))
                for i in range(self.size)
            ]
            self._lengths = (
                torch.tensor([len(p) for p in pieces], dtype=torch.long),
                torch.tensor([sum((b & 0xC0) != 0x80 for b in p) for p in pieces], dtype=torch.long),
            )
        return self._lengths

    def _checked(self, ids: Iterable[int] | torch.Tensor) -> list[int]:
        import torch

        ids = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.size), None)
        if bad is not None:
            raise DataError(f"tokenizer: id {bad} is outside the vocabulary (0..{self.size - 1})")
        return ids

    # -------------------------------------------------------- storage

    def to_json(self) -> str:
        """The tokenizer as JSON: its kind, the specials and, trained, Hugging Face's own JSON of it."""
        if self._json is None:
            body = None if self._backend is None else json.loads(self._backend.to_str())
            self._json = json.dumps(
                {
                    "format": FORMAT,
                    "version": 1,
                    "kind": self.kind,
                    "size": self.size,
                    "specials": list(SPECIALS),
                    "tokenizer": body,
                },
                ensure_ascii=False,
            )
        return self._json

    @property
    def sha256(self) -> str:
        """SHA-256 of :meth:`to_json` (UTF-8)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def to_huggingface(self) -> str:
        """Hugging Face's own JSON of this tokenizer (``tokenizers.Tokenizer.from_str`` reads it, giving the same
        ids): a trained one's as is; the bytes kind as a byte-level BPE without merges (each byte its own id,
        the specials after them)."""
        return (self._backend or _bytes_backend()).to_str()

    def save(self, path: Any) -> dict[Path, str]:
        """The files that store this tokenizer at ``path`` (a ``tokenizer.json``): Hugging Face's JSON there and
        the project's record beside it (:func:`record_path`), as ``{path: text}`` for
        :func:`crate_compose.files.write_together` (both files or neither)."""
        text = self.to_huggingface()
        record = {
            "format": FORMAT,
            "version": 2,
            "kind": self.kind,
            "size": self.size,
            "specials": list(SPECIALS),
            "huggingface": Path(path).name,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
        return {Path(path): text, record_path(path): json.dumps(record, indent=1) + "\n"}

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "tokenizer") -> "Tokenizer":
        """The tokenizer :meth:`to_json` wrote. JSON is only parsed (a trained vocabulary by
        ``tokenizers.Tokenizer.from_str``): nothing in the file runs. A malformed file is a DataError whose
        message begins with ``where`` (the file)."""
        try:
            stored = json.loads(text)
        except (ValueError, TypeError, RecursionError) as error:
            raise DataError(f"{where}: not JSON ({error})") from None
        if json_depth(stored) > MAX_JSON_DEPTH:
            raise DataError(f"{where}: nested {json_depth(stored)} levels deep, more than {MAX_JSON_DEPTH}")
        return cls.from_stored(stored, where)

    @classmethod
    def read(cls, path: Any) -> "Tokenizer":
        """The tokenizer stored at ``path`` (a run's ``tokenizer.json``): Hugging Face's file and its record
        beside it (:meth:`save`), or the single file of :meth:`to_json` (runs before the record), read by
        :func:`crate_compose.files.read_json` (regular files, their size and nesting bounded); every refusal is
        a DataError naming the file."""
        what = "the tokenizer"
        stored = read_json(path, limit=MAX_TOKENIZER_BYTES, what=what)
        if isinstance(stored, dict) and stored.get("format") == FORMAT:
            return cls.from_stored(stored, f"{what} {path}")
        beside = record_path(path)
        where = f"{what}'s record {beside}"
        if not os.path.lexists(beside):
            raise DataError(
                f"{what} {path}: its record {beside.name} is missing beside it (the kind and specials "
                "crate-compose reads with Hugging Face's file); restore it from the run it came from"
            )
        record = read_json(beside, limit=1 << 16, what=f"{what}'s record")
        if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("version") != 2:
            raise DataError(
                f'{where}: not a tokenizer record (expected a JSON object with "format": "{FORMAT}", "version": 2)'
            )
        if record.get("sha256") != sha256_of(path):
            raise DataError(
                f"{what} {path} is not the file its record {beside.name} describes (its SHA-256 "
                "differs): restore the pair from the run it came from"
            )
        if record.get("kind") == "bytes" and stored != json.loads(_bytes_backend().to_str()):
            raise DataError(f"{what} {path}: its record says bytes, and it is not the bytes tokenizer")
        return cls.from_stored({**record, "tokenizer": None if record.get("kind") == "bytes" else stored}, where)

    @classmethod
    def from_stored(cls, stored: Any, where: str = "tokenizer") -> "Tokenizer":
        """The tokenizer of :meth:`to_json`'s JSON, parsed (``stored``); a DataError beginning with ``where``
        when it is not one."""
        if not isinstance(stored, dict) or stored.get("format") != FORMAT:
            raise DataError(f'{where}: not a tokenizer file (expected a JSON object with "format": "{FORMAT}")')
        kind, body = stored.get("kind"), stored.get("tokenizer")
        if kind not in KINDS:
            raise DataError(f"{where}: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        if stored.get("specials") != list(SPECIALS):
            raise DataError(f"{where}: the specials must be {list(SPECIALS)}; got {stored.get('specials')!r}")
        if kind == "bytes":
            if body is not None:
                raise DataError(f'{where}: a bytes tokenizer has no trained vocabulary ("tokenizer": null)')
            made = cls("bytes", where=where)
        else:
            made = cls(kind, _backend_from(kind, body, where), where=where)
        if stored.get("size") != made.size:
            raise DataError(f"{where}: the file says size {stored.get('size')!r}, its vocabulary holds {made.size}")
        if made.size > MAX_VOCAB:
            raise DataError(f"{where}: a vocabulary of {made.size:,} tokens, more than {MAX_VOCAB:,}")
        return made


def _backend_from(kind: str, body: Any, where: str = "tokenizer") -> Any:
    """Hugging Face's tokenizer from its JSON (``body``, parsed), checked to be the ``kind`` stored."""
    from tokenizers import Tokenizer as Backend

    model = body.get("model") if isinstance(body, dict) else None
    expected = {"wordpiece": "WordPiece", "bpe": "BPE", "gpt2": "BPE"}[kind]
    if not isinstance(model, dict) or model.get("type") != expected:
        raise DataError(f'{where}: a {kind} tokenizer needs a {expected} model under "tokenizer"')
    try:
        backend = Backend.from_str(json.dumps(body))
    except Exception as error:  # tokenizers raises its own Exception subclass for every malformed field
        raise DataError(f"{where}: the {kind} vocabulary cannot be read ({error})") from None
    ids = sorted(backend.get_vocab(with_added_tokens=True).values())
    if ids != list(range(len(ids))):
        raise DataError(f"{where}: the {kind} vocabulary's ids are not 0..{len(ids) - 1}")
    return backend


def record_path(path: Any) -> Path:
    """Where the record of the Hugging Face tokenizer file ``path`` lies: beside it, ``NAME.record.json``."""
    path = Path(path)
    return path.with_name(path.stem + RECORD_SUFFIX)


def _bytes_backend() -> Any:
    """The bytes kind as Hugging Face's tokenizer: every byte its own id (byte-level BPE, GPT-2's byte alphabet,
    no merges, no splitting), the specials 256..260 after them, the byte-level decoder."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    backend = Backend(models.BPE(vocab=dict(byte_level_bytes()), merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIALS))
    return backend


def _printable(piece: str) -> str:
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in piece)


def _pieces(text: str, size: int = CHUNK) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, cut after a line break between two non-space
    characters, where BERT's and the byte-level pre-tokenizers both end a pre-token (so encoding the
    pieces gives the ids of the whole text, and no special string is cut)."""
    start = 0
    while len(text) - start > size:
        found = _BREAK.search(text, start + size)
        if found is None:
            break
        yield text[start : found.end()]
        start = found.end()
    yield text[start:]


# ---------------------------------------------------------------- training


def _require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - a runtime dependency
        raise DataError(
            "tokenizer: trained vocabularies need Hugging Face's tokenizers (pip install 'tokenizers>=0.15')"
        ) from None
    return tokenizers


def check_vocab(kind: str, vocab: int | None) -> None:
    """Refuse a vocabulary ``kind`` cannot have (bytes and gpt2 take none; bpe at least 261, wordpiece 64)."""
    if kind in FIXED:
        if vocab is not None:
            raise DataError(f"{kind}: {FIXED[kind]}; give no size ({kind}:..., not {kind}-N:...)")
        return
    if kind not in KINDS:
        raise DataError(f"tokenizer: unknown kind '{kind}'; expected one of {', '.join(KINDS)}")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not MIN_VOCAB[kind] <= vocab <= MAX_VOCAB:
        raise DataError(
            f"{kind}: the vocabulary must be a whole number from {MIN_VOCAB[kind]} to {MAX_VOCAB:,}; got {vocab!r}"
        )


def train_tokenizer(kind: str, vocab: int | None, texts: Iterable[str]) -> Tokenizer:
    """A tokenizer of ``kind`` whose vocabulary (at most ``vocab`` ids, the 5 specials first, 0..4) is
    learned from ``texts`` (documents); deterministic. ``bytes`` and ``gpt2`` learn nothing (``vocab`` None):
    gpt2 is GPT-2's fetched vocabulary (:func:`gpt2_tokenizer`).
    The trainer stops below ``vocab`` when the texts hold no more merges; ``size`` is the real one."""
    check_vocab(kind, vocab)
    if kind == "bytes":
        return Tokenizer("bytes")
    if kind == "gpt2":
        return gpt2_tokenizer()
    pieces = [piece for text in texts for piece in _pieces(text)]
    if not any(pieces):
        raise DataError(f"{kind}: no text to learn a vocabulary from")
    return Tokenizer(kind, (_train_wordpiece if kind == "wordpiece" else _train_bpe)(vocab, pieces))


def gpt2_tokenizer(home: Any = None) -> Tokenizer:
    """The ``gpt2`` tokenizer: GPT-2's vocabulary and merges as ``make data`` cached them (under ``home``, else the
    data folder; :func:`.gpt2_vocabulary.gpt2_backend`)."""
    from .gpt2_vocabulary import gpt2_backend

    backend, where = gpt2_backend(home)
    return Tokenizer("gpt2", backend, where=where)


def _train_bpe(vocab: int, pieces: list[str]) -> Any:
    tk = _require_tokenizers()
    backend = tk.Tokenizer(tk.models.BPE())
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(_capped(pieces, backend.pre_tokenizer), trainer)
    return backend


def _capped(pieces: Iterable[str], pre_tokenizer: Any) -> Iterator[str]:
    """``pieces`` as the BPE trainer sees them: a piece holding a pre-token longer than :data:`MAX_WORD`
    characters is given in parts (the trainer pre-tokenizes each part alone): the text between such
    pre-tokens as it is, and each of them cut into parts of :data:`MAX_WORD` characters. Every other piece
    is given unchanged."""
    for piece in pieces:
        if not _LONG.search(piece):
            yield piece
            continue
        start = 0
        for _, (begin, end) in pre_tokenizer.pre_tokenize_str(piece):  # offsets in characters of the piece
            if end - begin <= MAX_WORD:
                continue
            if begin > start:
                yield piece[start:begin]
            yield from (piece[cut : min(cut + MAX_WORD, end)] for cut in range(begin, end, MAX_WORD))
            start = end
        if start < len(piece):
            yield piece[start:]


def _bert_parts(tk: Any) -> tuple[Any, Any]:
    """BERT's normalizer (control characters dropped, whitespace made spaces, CJK characters split;
    NOT lowercased, accents kept) and pre-tokenizer (whitespace, then every punctuation character apart)."""
    normalizer = tk.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )
    return normalizer, tk.pre_tokenizers.BertPreTokenizer()


def _train_wordpiece(vocab: int, pieces: list[str]) -> Any:
    """HF's WordPiece training (BPE merges over words, "##" on non-initial pieces), made deterministic:
    see the module docstring. The alphabet is the ``(vocab - 5) // 4`` most frequent characters (ties by
    code point), each as a word's first piece and as a "##" piece, so merges fill at least half of the
    vocabulary; words with another character, and words longer than :data:`MAX_WORD` characters, are left
    out of training (WordPiece encodes them [UNK])."""
    from collections import Counter

    tk = _require_tokenizers()
    normalizer, pre_tokenizer = _bert_parts(tk)
    chunks: Counter[str] = Counter()
    for piece in pieces:
        chunks.update(normalizer.normalize_str(piece).split())
    words: Counter[str] = Counter()
    for chunk, count in chunks.items():
        for word, _ in pre_tokenizer.pre_tokenize_str(chunk):
            if len(word) <= MAX_WORD:
                words[word] += count
    letters: Counter[str] = Counter()
    for word, count in words.items():
        for c in word:
            letters[c] += count
    usable = sorted((c for c in letters if ord(c) < _MARK), key=lambda c: (-letters[c], c))
    alphabet = set(usable[: max(1, (vocab - len(SPECIALS)) // 4)])
    marked = {c: chr(_MARK + i) for i, c in enumerate(sorted(alphabet))}
    unmarked = {m: c for c, m in marked.items()}

    def lines() -> Iterator[str]:
        batch: list[str] = []
        for word, count in sorted(words.items()):
            if set(word) <= alphabet:
                batch.append(" ".join([word[0] + "".join(marked[c] for c in word[1:])] * count))
                if len(batch) >= 256:
                    yield " ".join(batch)
                    batch = []
        if batch:
            yield " ".join(batch)

    learner = tk.Tokenizer(tk.models.BPE())
    learner.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        show_progress=False,
        initial_alphabet=sorted(alphabet | set(marked.values())),
    )
    learner.train_from_iterator(lines(), trainer)
    table: dict[str, int] = {}
    for piece, id in learner.get_vocab(with_added_tokens=True).items():
        if piece in SPECIALS:
            table[piece] = id
        elif piece[0] in unmarked:  # a continuing piece: every character of it is marked
            table["##" + "".join(unmarked[c] for c in piece)] = id
        else:  # a word's first piece: its first character is not marked, the rest are
            table[piece[0] + "".join(unmarked[c] for c in piece[1:])] = id
    if len(table) != learner.get_vocab_size(with_added_tokens=True):  # never: "##" pieces and first pieces differ
        raise DataError(f"wordpiece: two pieces of the learned vocabulary became one ({len(table)} pieces)")
    backend = tk.Tokenizer(
        tk.models.WordPiece(
            vocab=table, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=MAX_WORD
        )
    )
    backend.normalizer, backend.pre_tokenizer = normalizer, pre_tokenizer
    backend.decoder = tk.decoders.WordPiece(prefix="##")
    backend.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return backend

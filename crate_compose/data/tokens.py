"""Tokenizers made without a download, and the text sets for masked language modelling built on them.

A :class:`Tokenizer` is one of three kinds, each with the five special tokens of :data:`SPECIALS`:

* ``bytes``: ids 0..255 are the bytes of the UTF-8 text, the specials 256..260 (261 ids); nothing to train;
* ``wordpiece``: BERT's WordPiece (a "##" continuing prefix, BERT's pre-tokenizer splitting on whitespace
  and punctuation, BERT's normalizer with NO lowercasing and no accent stripping: the corpus is code), its
  vocabulary learned by :func:`train_tokenizer` from the texts given;
* ``bpe``: byte-level BPE (GPT-2's: the ByteLevel pre-tokenizer and decoder, so whitespace round-trips and
  no text is ever unknown).

Trained vocabularies come from Hugging Face's ``tokenizers`` (Rust, offline). Training is deterministic:
the same texts give the same vocabulary and ids, whatever the thread count. Its byte-level BPE trainer
already is; its WordPiece trainer is not (it numbers the "##" pieces in the order it meets them in a hash
map, and breaks ties between merges of equal counts by those numbers), so :func:`train_tokenizer` runs the
same algorithm through the BPE trainer on words whose non-initial characters are marked (mapped to
private-use code points, every piece of the alphabet given up front, numbered in code point order), then
turns the marked pieces back into "##" pieces: the vocabulary HF's WordPiece trainer learns, numbered
reproducibly. A tokenizer is stored as JSON (:meth:`Tokenizer.to_json`), read back by
:meth:`Tokenizer.from_json`, which parses JSON only (``tokenizers.Tokenizer.from_str`` for trained ones).

The data sets (:mod:`crate_compose.data.sets` dispatches to them; ``KIND`` is bytes, wordpiece or bpe,
``-V`` the vocabulary, default 8192, bytes takes none):

* ``KIND[-V]:text``: the standard library corpus of the ``text`` set (:func:`~.corpus.stdlib_source`, its
  train/test split), the tokenizer trained on the train split's text only; every example is
  ``[CLS] t_1 .. t_{N-2} [SEP]`` (consecutive non-overlapping chunks of the split's token stream), target
  the same tokens (the masking is the task's);
* ``KIND[-V]:folder:PATH``: the same for a folder of text files (``*.txt``, ``*.md``, ``*.py``);
* ``KIND[-V]:modules``: which of 10 standard-library modules a snippet of ``N - 2`` tokens comes from,
  tokenized by the tokenizer ``KIND[-V]:text`` trains, for fine-tuning a model pre-trained there.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import Dataset

from ..errors import DataError
from .corpus import HELD_OUT, stdlib_files, stdlib_source, unigram_loss
from .folders import IMAGE_SUFFIXES
from .record import Data, Tensors

__all__ = ["DEFAULT_VOCAB", "KINDS", "SPECIALS", "Framed", "Tokenizer", "corpus_tokenizer", "is_text_folder",
           "load_modules", "load_text_folder", "load_tokens", "module_files", "text_files", "train_tokenizer"]

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
KINDS = ("bytes", "wordpiece", "bpe")
DEFAULT_VOCAB = 8192
MIN_VOCAB = {"wordpiece": 64, "bpe": 256 + len(SPECIALS)}  # bpe: every byte and the specials
MAX_VOCAB = 1 << 18
TEXT_SUFFIXES = (".txt", ".md", ".py")
MODULES = 10  # classes of the modules set
MODULES_HELD_OUT = 0.2  # the last 20% of each module's snippets
FORMAT = "crate-compose-tokenizer"
CHUNK = 1 << 16  # characters per piece of text the Rust side encodes in parallel

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
# a line break between two non-space characters: both pre-tokenizers end a pre-token there
_BREAK = re.compile(r"(?<=\S)\n(?=\S)")
# supplementary private use area A: a word's non-initial characters while a WordPiece vocabulary is learned
_MARK = 0xF0000


# ---------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A tokenizer of one of :data:`KINDS`; ids 0..size-1, the specials among them (see the module docstring).

    ``encode`` turns the special strings in the text ("[MASK]") into their ids and adds nothing around it;
    ``decode`` writes the specials back as their strings; ``token`` is a readable piece for display."""

    def __init__(self, kind: str, backend: Any = None) -> None:
        if kind not in KINDS:
            raise DataError(f"tokenizer: unknown kind '{kind}'; expected one of {', '.join(KINDS)}")
        if (kind == "bytes") != (backend is None):
            needs = "takes no" if kind == "bytes" else "needs a"
            raise DataError(f"tokenizer: a {kind} tokenizer {needs} trained vocabulary")
        self.kind, self._backend = kind, backend
        if backend is None:
            self.size = 256 + len(SPECIALS)
            ids = list(range(256, 256 + len(SPECIALS)))
        else:
            self.size = backend.get_vocab_size(with_added_tokens=True)
            ids = [backend.token_to_id(s) for s in SPECIALS]
            found = [backend.encode(s, add_special_tokens=False).ids for s in SPECIALS]
            pieces = [backend.id_to_token(i) for i in range(len(SPECIALS))]
            if ids != list(range(len(SPECIALS))) or found != [[i] for i in ids] or pieces != list(SPECIALS):
                raise DataError(f"tokenizer: the special tokens {', '.join(SPECIALS)} must be the ids 0..4, each "
                                f"found in text; got {ids}, encoded as {found}")
        self.pad, self.unk, self.cls, self.sep, self.mask = ids
        self.specials = frozenset(ids)
        self._json: str | None = None

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, size {self.size}, sha256 {self.sha256[:12]})"

    # -------------------------------------------------------- ids

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``; the special strings in it become their ids; no [CLS]/[SEP] is added."""
        return self.encode_tensor(text).tolist()

    def encode_tensor(self, text: str) -> torch.Tensor:
        """:meth:`encode` as an int64 tensor, fast on long texts (in pieces encoded in parallel, split
        where both pre-tokenizers split anyway, so the ids are those of the whole text)."""
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
        table = _byte_level_bytes()
        if self.kind == "bpe" and all(c in table for c in piece):
            piece = bytes(table[c] for c in piece).decode("utf-8", errors="backslashreplace")
        return _printable(piece)

    def _checked(self, ids: Iterable[int] | torch.Tensor) -> list[int]:
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
            self._json = json.dumps({"format": FORMAT, "version": 1, "kind": self.kind, "size": self.size,
                                     "specials": list(SPECIALS), "tokenizer": body}, ensure_ascii=False)
        return self._json

    @property
    def sha256(self) -> str:
        """SHA-256 of :meth:`to_json` (UTF-8)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str | bytes) -> "Tokenizer":
        """The tokenizer :meth:`to_json` wrote. JSON is only parsed (a trained vocabulary by
        ``tokenizers.Tokenizer.from_str``): nothing in the file runs. A malformed file is a DataError."""
        try:
            stored = json.loads(text)
        except (ValueError, TypeError, RecursionError) as error:
            raise DataError(f"tokenizer: not JSON ({error})") from None
        if not isinstance(stored, dict) or stored.get("format") != FORMAT:
            raise DataError(f"tokenizer: not a tokenizer file (expected a JSON object with \"format\": \"{FORMAT}\")")
        kind, body = stored.get("kind"), stored.get("tokenizer")
        if kind not in KINDS:
            raise DataError(f"tokenizer: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        if stored.get("specials") != list(SPECIALS):
            raise DataError(f"tokenizer: the specials must be {list(SPECIALS)}; got {stored.get('specials')!r}")
        if kind == "bytes":
            if body is not None:
                raise DataError("tokenizer: a bytes tokenizer has no trained vocabulary (\"tokenizer\": null)")
            made = cls("bytes")
        else:
            made = cls(kind, _backend_from(kind, body))
        if stored.get("size") != made.size:
            raise DataError(f"tokenizer: the file says size {stored.get('size')!r}, its vocabulary holds {made.size}")
        return made


def _backend_from(kind: str, body: Any) -> Any:
    """Hugging Face's tokenizer from its JSON (``body``, parsed), checked to be the ``kind`` stored."""
    from tokenizers import Tokenizer as Backend

    model = body.get("model") if isinstance(body, dict) else None
    expected = {"wordpiece": "WordPiece", "bpe": "BPE"}[kind]
    if not isinstance(model, dict) or model.get("type") != expected:
        raise DataError(f"tokenizer: a {kind} tokenizer needs a {expected} model under \"tokenizer\"")
    try:
        backend = Backend.from_str(json.dumps(body))
    except Exception as error:  # tokenizers raises its own Exception subclass for every malformed field
        raise DataError(f"tokenizer: the {kind} vocabulary cannot be read ({error})") from None
    ids = sorted(backend.get_vocab(with_added_tokens=True).values())
    if ids != list(range(len(ids))):
        raise DataError(f"tokenizer: the {kind} vocabulary's ids are not 0..{len(ids) - 1}")
    return backend


def _printable(piece: str) -> str:
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in piece)


@functools.lru_cache(maxsize=1)
def _byte_level_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


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
        raise DataError("tokenizer: trained vocabularies need Hugging Face's tokenizers "
                        "(pip install 'tokenizers>=0.15')") from None
    return tokenizers


def check_vocab(kind: str, vocab: int | None) -> None:
    """Refuse a vocabulary ``kind`` cannot have (bytes takes none; bpe at least 261, wordpiece 64)."""
    if kind == "bytes":
        if vocab is not None:
            raise DataError("bytes: the vocabulary is the 256 bytes and the 5 specials; give no size "
                            "(bytes:..., not bytes-N:...)")
        return
    if kind not in KINDS:
        raise DataError(f"tokenizer: unknown kind '{kind}'; expected one of {', '.join(KINDS)}")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not MIN_VOCAB[kind] <= vocab <= MAX_VOCAB:
        raise DataError(f"{kind}: the vocabulary must be a whole number from {MIN_VOCAB[kind]} to {MAX_VOCAB:,}; "
                        f"got {vocab!r}")


def train_tokenizer(kind: str, vocab: int | None, texts: Iterable[str]) -> Tokenizer:
    """A tokenizer of ``kind`` whose vocabulary (at most ``vocab`` ids, the 5 specials first, 0..4) is
    learned from ``texts`` (documents); deterministic. ``bytes`` learns nothing (``vocab`` None).
    The trainer stops below ``vocab`` when the texts hold no more merges; ``size`` is the real one."""
    check_vocab(kind, vocab)
    if kind == "bytes":
        return Tokenizer("bytes")
    pieces = [piece for text in texts for piece in _pieces(text)]
    if not any(pieces):
        raise DataError(f"{kind}: no text to learn a vocabulary from")
    return Tokenizer(kind, (_train_wordpiece if kind == "wordpiece" else _train_bpe)(vocab, pieces))


def _train_bpe(vocab: int, pieces: list[str]) -> Any:
    tk = _require_tokenizers()
    backend = tk.Tokenizer(tk.models.BPE())
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(pieces, trainer)
    return backend


def _bert_parts(tk: Any) -> tuple[Any, Any]:
    """BERT's normalizer (control characters dropped, whitespace made spaces, CJK characters split;
    NOT lowercased, accents kept) and pre-tokenizer (whitespace, then every punctuation character apart)."""
    normalizer = tk.normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                               lowercase=False)
    return normalizer, tk.pre_tokenizers.BertPreTokenizer()


def _train_wordpiece(vocab: int, pieces: list[str]) -> Any:
    """HF's WordPiece training (BPE merges over words, "##" on non-initial pieces), made deterministic:
    see the module docstring. The alphabet is the ``(vocab - 5) // 4`` most frequent characters (ties by
    code point), each as a word's first piece and as a "##" piece, so merges fill at least half of the
    vocabulary; words with another character are left out of training (WordPiece encodes them [UNK])."""
    from collections import Counter

    tk = _require_tokenizers()
    normalizer, pre_tokenizer = _bert_parts(tk)
    chunks: Counter[str] = Counter()
    for piece in pieces:
        chunks.update(normalizer.normalize_str(piece).split())
    words: Counter[str] = Counter()
    for chunk, count in chunks.items():
        for word, _ in pre_tokenizer.pre_tokenize_str(chunk):
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
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), show_progress=False,
                                     initial_alphabet=sorted(alphabet | set(marked.values())))
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
    backend = tk.Tokenizer(tk.models.WordPiece(vocab=table, unk_token="[UNK]", continuing_subword_prefix="##",
                                               max_input_chars_per_word=100))
    backend.normalizer, backend.pre_tokenizer = normalizer, pre_tokenizer
    backend.decoder = tk.decoders.WordPiece(prefix="##")
    backend.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return backend


# ---------------------------------------------------------------- the data sets


class Framed(Dataset):
    """BERT's windows of a token stream: item ``i`` is ``(x, x)`` with ``x`` = [CLS], the ``context - 2``
    tokens from ``i * (context - 2)``, [SEP] (consecutive, non-overlapping; the masking is the task's).
    ``tokens`` is the whole stream (int64), so a run's fingerprint covers the ids."""

    def __init__(self, tokens: torch.Tensor, context: int, cls: int, sep: int) -> None:
        self.tokens, self.context, self.cls, self.sep = tokens, context, cls, sep

    def __len__(self) -> int:
        return len(self.tokens) // (self.context - 2)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        step = self.context - 2
        x = torch.empty(self.context, dtype=torch.long)
        x[0], x[-1] = self.cls, self.sep
        x[1:-1] = self.tokens[index * step : (index + 1) * step]
        return x, x.clone()


def _context(where: str, spec: Any, context: int | None) -> int:
    """The context as :func:`~.corpus.load_text` takes it (the spec's input length, else 128), at least 3."""
    if context is None:
        shape = getattr(getattr(spec, "input", None), "shape", None)
        context = shape[0] if shape and len(shape) == 1 else 128
    if not isinstance(context, int) or isinstance(context, bool) or context < 3:
        raise DataError(f"{where}: the context must be at least 3 tokens ([CLS], a token, [SEP]); got {context!r}")
    return context


def set_name(kind: str, vocab: int | None, source: str) -> str:
    """The canonical name of a set: ``KIND:source``, ``KIND-V:source`` when V is not the default."""
    return f"{kind}:{source}" if vocab in (None, DEFAULT_VOCAB) else f"{kind}-{vocab}:{source}"


def _text(source: bytes) -> str:
    return source.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def corpus_tokenizer(kind: str, vocab: int | None) -> Tokenizer:
    """The tokenizer ``KIND[-V]:text`` trains: on the standard-library corpus's train split only
    (:func:`~.corpus.stdlib_source`, decoded as UTF-8). ``KIND[-V]:modules`` uses the same. Cached per process."""
    source, split = stdlib_source()
    if not source:
        raise DataError("text: this Python installation has no standard library source files to read")
    return train_tokenizer(kind, vocab, [_text(source[:split])])


@functools.lru_cache(maxsize=4)
def _corpus_streams(kind: str, vocab: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    source, split = stdlib_source()
    tokenizer = corpus_tokenizer(kind, vocab)
    return tokenizer.encode_tensor(_text(source[:split])), tokenizer.encode_tensor(_text(source[split:]))


def _framed_data(name: str, tokenizer: Tokenizer, train: torch.Tensor, test: torch.Tensor, context: int) -> Data:
    for split, stream in (("train", train), ("held-out", test)):
        if len(stream) < context - 2:
            raise DataError(f"{name}: the {split} split ({len(stream):,} tokens) is shorter than a window's "
                            f"{context - 2} tokens (the context {context} less [CLS] and [SEP])")
    specials = torch.tensor(sorted(tokenizer.specials))
    return Data(
        name=name,
        train=Framed(train, context, tokenizer.cls, tokenizer.sep),
        test=Framed(test, context, tokenizer.cls, tokenizer.sep),
        input_shape=(context,),
        classes=None,
        task_hint="mlm",
        sizes={"vocab": tokenizer.size, "context": context, "sep": tokenizer.sep},
        unigram_loss=unigram_loss(train, test[~torch.isin(test, specials)], tokenizer.size),
        tokenizer=tokenizer,
    )


def load_tokens(kind: str, vocab: int | None, *, spec: Any = None, context: int | None = None) -> Data:
    """The ``KIND[-V]:text`` set: the ``text`` corpus and split, tokenized, in BERT's windows (module docstring)."""
    name = set_name(kind, vocab, "text")
    context = _context(name, spec, context)
    check_vocab(kind, vocab)
    tokenizer = corpus_tokenizer(kind, vocab)
    train, test = _corpus_streams(kind, vocab)
    return _framed_data(name, tokenizer, train, test, context)


def _hidden(name: str) -> bool:
    return name.startswith(".")


def text_files(root: Path) -> list[Path]:
    """Every ``*.txt``, ``*.md`` and ``*.py`` file under ``root`` (any case), recursively, sorted; hidden
    files and folders (``.git``, ``.venv``) are skipped, links to folders not followed. A name of a text
    file that is not a regular file (a FIFO, a dangling link) is refused, never skipped silently."""
    if not root.is_dir():
        raise DataError(f"{root}: no such folder")
    found = []
    for top, folders, files in os.walk(root):
        folders[:] = [f for f in folders if not _hidden(f)]
        for name in files:
            path = Path(top) / name
            if _hidden(name) or path.suffix.lower() not in TEXT_SUFFIXES:
                continue
            if not path.is_file():
                raise DataError(f"{path}: not a regular file (a text file is expected here)")
            found.append(path)
    return sorted(found)


def is_text_folder(root: str | Path) -> bool:
    """Whether ``folder:PATH`` is text: a folder holding text files (:func:`text_files`) and no class
    folders of images (no image file in a folder under it, nor in one under its train/test/val)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return False

    def images_in(folder: Path) -> bool:
        try:
            return any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir())
        except OSError:
            return False

    try:
        for sub in root.iterdir():
            if sub.is_dir() and not _hidden(sub.name):
                if images_in(sub):
                    return False
                if sub.name in ("train", "test", "val") and any(images_in(c) for c in sub.iterdir() if c.is_dir()):
                    return False
    except OSError:  # unreadable: the image loader names the problem
        return False
    return bool(text_files(root))


def _read_split(root: Path) -> tuple[bytes, int]:
    """The text files of ``root`` concatenated and the byte offset where the held-out files begin: the
    last whole files holding about 10% of the bytes (as :func:`~.corpus.stdlib_source` splits)."""
    files = text_files(root)
    if not files:
        raise DataError(f"{root}: no text files (looked for {', '.join('*' + s for s in TEXT_SUFFIXES)} "
                        "under it, recursively)")
    parts = []
    for path in files:
        try:
            parts.append(path.read_bytes())
        except OSError as error:
            raise DataError(f"{path}: cannot read it ({error})") from None
    boundaries = [0]
    for part in parts:
        boundaries.append(boundaries[-1] + len(part))
    total = boundaries[-1]
    target = total * (1 - HELD_OUT)
    split = min(boundaries[1:-1] or [total], key=lambda b: abs(b - target))
    if split >= total:
        raise DataError(f"{root}: one text file ({files[0].name}); the last whole files are held out for "
                        "testing, so a text folder needs at least two")
    return b"".join(parts), split


def load_text_folder(path: str | Path, kind: str = "bytes", vocab: int | None = None, *, spec: Any = None,
                     context: int | None = None) -> Data:
    """The ``KIND[-V]:folder:PATH`` set: a folder's text files (:func:`text_files`), the last ~10% of the
    bytes (whole files) held out, the tokenizer trained on the rest; BERT's windows as ``KIND:text``."""
    root = Path(path).expanduser()
    name = set_name(kind, vocab, f"folder:{root}")
    context = _context(name, spec, context)
    check_vocab(kind, vocab)
    source, split = _read_split(root)
    tokenizer = train_tokenizer(kind, vocab, [_text(source[:split])])
    train, test = tokenizer.encode_tensor(_text(source[:split])), tokenizer.encode_tensor(_text(source[split:]))
    return _framed_data(name, tokenizer, train, test, context)


def module_files() -> list[Path]:
    """The classes of ``KIND:modules``: the :data:`MODULES` largest top-level standard-library files whose
    names do not start with "_" (ties by name), sorted by name."""
    candidates = [p for p in stdlib_files() if not p.name.startswith("_")]
    largest = sorted(candidates, key=lambda p: (-p.stat().st_size, p.name))[:MODULES]
    return sorted(largest, key=lambda p: p.stem)


@functools.lru_cache(maxsize=4)
def _module_streams(kind: str, vocab: int | None) -> tuple[tuple[str, torch.Tensor], ...]:
    tokenizer = corpus_tokenizer(kind, vocab)
    return tuple((path.stem, tokenizer.encode_tensor(_text(path.read_bytes()))) for path in module_files())


def load_modules(kind: str, vocab: int | None, *, spec: Any = None, context: int | None = None) -> Data:
    """The ``KIND[-V]:modules`` set: which standard-library module a snippet of ``N - 2`` tokens comes from.

    Each module's token stream is cut in non-overlapping snippets; its first 80% are train, the last 20%
    test, less the test snippets whose tokens a train snippet (of any module) also holds (code repeats:
    ``# ======`` rulers, ``hasattr(namespace, action.dest)``), so no test example is seen in training;
    each class keeps as many as the smallest class has in each split (evenly spread over its own).
    An example is ``[CLS] snippet [SEP]``, its target the module's index (modules sorted by name)."""
    name = set_name(kind, vocab, "modules")
    context = _context(name, spec, context)
    check_vocab(kind, vocab)
    if len(module_files()) < MODULES:
        raise DataError(f"{name}: this Python installation has fewer than {MODULES} standard-library modules")
    tokenizer = corpus_tokenizer(kind, vocab)
    step = context - 2
    snippets = []
    for _, stream in _module_streams(kind, vocab):
        count = len(stream) // step
        chunks = stream[: count * step].reshape(count, step)
        cut = count - round(count * MODULES_HELD_OUT)
        snippets.append((chunks[:cut], chunks[cut:]))
    seen = {row.numpy().tobytes() for train, _ in snippets for row in train}
    snippets = [(train, test[[row.numpy().tobytes() not in seen for row in test]]) for train, test in snippets]
    splits = []
    for part in (0, 1):
        keep = min(len(s[part]) for s in snippets)
        if keep == 0:
            raise DataError(f"{name}: the context {context} is too long: a module has no "
                            f"{'test' if part else 'train'} snippet of {step} tokens")
        rows, labels = [], []
        for label, pair in enumerate(snippets):
            chunks = pair[part]
            rows.append(chunks[[i * len(chunks) // keep for i in range(keep)]])
            labels += [label] * keep
        body = torch.cat(rows)
        frame = torch.empty(len(body), context, dtype=torch.long)
        frame[:, 0], frame[:, -1], frame[:, 1:-1] = tokenizer.cls, tokenizer.sep, body
        splits.append(Tensors(frame, torch.tensor(labels, dtype=torch.long)))
    return Data(
        name=name,
        train=splits[0],
        test=splits[1],
        input_shape=(context,),
        classes=MODULES,
        task_hint="classify",
        class_names=[stem for stem, _ in _module_streams(kind, vocab)],
        sizes={"vocab": tokenizer.size, "context": context, "sep": tokenizer.sep, "classes": MODULES},
        tokenizer=tokenizer,
    )

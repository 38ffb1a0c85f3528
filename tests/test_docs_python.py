"""docs/python.md runs: its ```python blocks, in order, as one script.

Each block is executed in one shared namespace (a module of its own, so that torch.compile can
resolve the globals of functions the examples define), from a temporary working directory, so the
files the examples write land there. A line ``print(EXPR)  # EXPECTED`` whose comment is exactly a
Python literal, a ``torch.Size([...])`` or a ``torch`` dtype is also checked: the printed value
must equal it. Comments with anything else (``# 0.5...``, ``# torch.float64: because ...``) are
prose and are not checked.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import traceback
import types
from pathlib import Path

import pytest
import torch

import crate_compose as cc
from crate_compose import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SIZE = re.compile(r"torch\.Size\(\[[0-9, ]*\]\)")
DTYPE = re.compile(r"torch\.([a-z0-9_]+)")
UNCHECKED = object()


def python_blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def expected_value(comment: str) -> object:
    """The value a trailing comment states, or UNCHECKED when it is prose."""
    text = comment.lstrip("#").strip()
    if SIZE.fullmatch(text):
        return torch.Size(ast.literal_eval(text[len("torch.Size(") : -1]))
    dtype = DTYPE.fullmatch(text)
    if dtype and isinstance(getattr(torch, dtype.group(1), None), torch.dtype):
        return getattr(torch, dtype.group(1))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return UNCHECKED


def comments_by_line(source: str) -> dict[int, str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0]: tok.string for tok in tokens if tok.type == tokenize.COMMENT}


class CheckPrints(ast.NodeTransformer):
    """``print(x)  # 3`` -> ``__check_print__(x, 0)``, with ``expected[0] == 3``."""

    def __init__(self, comments: dict[int, str]) -> None:
        self.comments = comments
        self.expected: list[tuple[object, int, str]] = []

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        call = node.value
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "print"
            and len(call.args) == 1
            and not call.keywords
            and not isinstance(call.args[0], ast.Starred)
        ):
            return node
        comment = self.comments.get(node.end_lineno)
        value = UNCHECKED if comment is None else expected_value(comment)
        if value is UNCHECKED:
            return node
        self.expected.append((value, node.lineno, comment))
        check = ast.Call(
            ast.Name("__check_print__", ast.Load()), [call.args[0], ast.Constant(len(self.expected) - 1)], []
        )
        return ast.copy_location(ast.Expr(check), node)


def compile_block(source: str, number: int) -> tuple[types.CodeType, list[tuple[object, int, str]]]:
    checker = CheckPrints(comments_by_line(source))
    tree = ast.fix_missing_locations(checker.visit(ast.parse(source)))
    return compile(tree, f"<docs/python.md block {number}>", "exec"), checker.expected


def check(value: object, want: object, line: int, comment: str) -> None:
    """Print ``value`` (as the example does) and compare it with what its comment says."""
    print(value)
    numbers = isinstance(want, (int, float)) and not isinstance(want, bool)
    if not (value == want and (type(value) is type(want) or numbers)):
        raise AssertionError(f"line {line} prints {value!r}; its comment says {comment.lstrip('# ')}")


def where(error: Exception) -> str:
    """The error, with the lines of the block it came from (not this file's frames)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith("<docs/python.md")]
    lines = [f"line {frame.lineno} of the block" for frame in frames[-1:]]
    return f"{type(error).__name__}: {error}" + "".join(f" (at {line})" for line in lines)


def test_blocks_are_found():
    blocks = python_blocks()
    assert len(blocks) > 20
    assert blocks[0].startswith("import torch")


def test_python_md_runs_as_one_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write out/, *.yaml, my_steps.py here
    cc.all_primitives()  # load the built-ins and plug-ins, then register the examples' on a copy
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = types.ModuleType("crate_compose_docs_python")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    modules_before = set(sys.modules)
    namespace = module.__dict__

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is several times faster on a busy 2-core runner
    try:
        with torch.random.fork_rng(devices=[]):
            for number, source in enumerate(python_blocks(), start=1):
                first = source.strip().splitlines()[0]
                code, expected = compile_block(source, number)

                namespace["__check_print__"] = lambda value, index, expected=expected: check(value, *expected[index])
                failure = None
                try:
                    exec(code, namespace)
                except Exception as error:
                    failure = f"docs/python.md block {number} ({first!r}) raised {where(error)}"
                if failure:  # failed outside the except block: no chained traceback
                    pytest.fail(failure, pytrace=False)
    finally:
        torch.set_num_threads(threads)
        for name in set(sys.modules) - modules_before:
            if name.startswith("crate_compose_plugin_"):  # load_plugins' modules
                del sys.modules[name]


def test_the_readme_shows_the_code_a_build_writes(tmp_path):
    """The README's excerpt of generated code is crate-tiny's code.py, line for line (``...`` elides layers)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    excerpt = next(block for block in BLOCK.findall(readme) if block.startswith("def forward("))
    code = (
        (cc.save(cc.build("crate-tiny", overrides=["sizes.image_size=32"]), tmp_path / "tiny") / "code.py")
        .read_text()
        .splitlines()
    )
    lines = [line for line in excerpt.splitlines() if line.strip() != "..."]
    assert [line for line in code if line in lines] == lines
    assert not any(line.endswith("= None") for line in code)  # torch.fx's frees are not part of the reading

"""The error contract: a bad spec is never a Python traceback.

Every problem is reported at once, each with file:line:column, the key path, what was expected and
what was found, and a did-you-mean for misspelled keys, primitives, sizes, steps and presets. The
CLI prints them one per line and exits with status 2.

Line numbers below are counted in the YAML written by each test (first line is 1).
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

import crate_compose as cc
from crate_compose import cli
from crate_compose.errors import Location, Problem, SpecError

ROOT = Path(__file__).resolve().parents[1]
CRATE_YAML = str(ROOT / "specs" / "crate.yaml")
SMALL = [
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=2",
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.classes=10",
]

# A complete, valid, small spec (no extends) so every problem is located in the test's own file.
FULL = """\
name: tiny-test
sizes:
  d: 32
  heads: 2
  depth: 2
input:
  shape: [3, 32, 32]
preprocess:
  - name: patch_embed
    primitive: patch_embed
    args: {patch_size: 8, dim: "${d}"}
  - name: class_token
    primitive: class_token
encoder:
  depth: ${depth}
  layer:
    - name: compress
      primitive: mssa
      args: {heads: "${heads}"}
    - name: sparsify
      primitive: ista
head:
  - name: classify
    primitive: classify
    args: {classes: 10, pool: cls}
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(ref, overrides=(), *, build: bool = False) -> list[Problem]:
    """The problems a spec raises (at load, or at build time with ``build=True``)."""
    with pytest.raises(SpecError) as caught:
        cc.validate(ref, overrides) if build else cc.load_spec(ref, overrides)
    problems = caught.value.problems
    assert problems, "a SpecError must list at least one problem"
    assert all(isinstance(p, Problem) for p in problems)
    return problems


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, "\n".join(map(str, problems))
    return problems[0]


def at(problem: Problem, source, line: int, column: int) -> None:
    """Assert the problem is located at source:line:column."""
    assert problem.location == Location(str(source), line, column), str(problem)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_valid_base_spec_loads(tmp_path):
    spec = cc.load_spec(write(tmp_path, FULL))
    assert spec.encoder.depth == 2 and spec.encoder.layer[0].args["heads"] == 2
    assert cc.inspect(spec).output_shape == ["B", 10]


# ---------------------------------------------------------------- unknown and misspelled keys


def test_unknown_top_level_key_suggests_the_closest(tmp_path, capsys):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encodr:
          depth: 2
        """,
    )
    problem = only(problems_of(path))
    assert problem.path == ("encodr",)
    at(problem, path, 2, 1)
    assert "unknown key 'encodr'" in problem.message
    assert "expected one of: decoder, description, encoder, extends, head, input" in problem.message
    assert problem.hint == "did you mean 'encoder'?"
    assert str(problem) == f"{path}:2:1: encodr: {problem.message} (did you mean 'encoder'?)"

    code, out, err = run_cli(capsys, "validate", str(path))
    assert code == 2 and out == ""
    assert err.splitlines() == ["error: 1 problem in the spec:", f"  {problem}"]


def test_unknown_nested_key(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encoder:
          depht: 2
        """,
    )
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "depht")
    at(problem, path, 3, 3)
    assert "unknown key 'depht'; expected one of: depth, layer" in problem.message
    assert problem.hint == "did you mean 'depth'?"


def test_unknown_argument_of_a_step(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encoder:
          layer:
            - name: compress
              primitive: mssa
              args:
                haeds: 2
            - name: sparsify
              primitive: ista
        """,
    )
    problems = problems_of(path)
    assert [(p.path, p.location.line, p.location.column) for p in problems] == [
        (("encoder", "layer", 0, "args", "heads"), 6, 7),  # missing: located at its parent 'args'
        (("encoder", "layer", 0, "args", "haeds"), 7, 9),
    ]
    missing, unknown = problems
    assert missing.message == "required key is missing"
    assert "unknown key 'haeds'" in unknown.message and "head_dim, heads" in unknown.message
    assert unknown.hint == "did you mean 'heads'?"


def test_misspelled_primitives_are_all_reported_with_suggestions(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encoder:
          layer:
            - name: compress
              primitive: msa
              args: {heads: 2}
            - name: sparsify
              primitive: istaa
        """,
    )
    first, second = problems_of(path)
    assert first.path == ("encoder", "layer", 0, "primitive")
    at(first, path, 5, 7)
    assert first.message.startswith("unknown primitive 'msa'; expected one of: ")
    assert first.hint == "did you mean 'mssa'?"
    assert second.path == ("encoder", "layer", 1, "primitive")
    at(second, path, 8, 7)
    assert second.hint == "did you mean 'ista'?"


def test_a_word_far_from_every_choice_gets_no_suggestion(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        zzzzzz: 1
        """,
    )
    problem = only(problems_of(path))
    assert problem.hint == "" and "unknown key 'zzzzzz'" in problem.message


# ---------------------------------------------------------------- types and required keys


def test_wrong_type_says_what_was_found(tmp_path):
    path = write(tmp_path, FULL.replace('args: {heads: "${heads}"}', "args: {heads: six}"))
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "layer", 0, "args", "heads")
    at(problem, path, 19, 14)
    assert "valid integer" in problem.message  # expected
    assert problem.message.endswith("found 'six'")  # found


def test_wrong_type_through_a_size_is_located_where_used_and_names_where_given(tmp_path):
    path = write(tmp_path, FULL.replace("  heads: 2\n", "  heads: six\n"))
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "layer", 0, "args", "heads")
    at(problem, path, 19, 14)
    assert problem.message.endswith(f"found 'six' (= ${{heads}}, given at {path}:4:3)")


def test_a_bad_size_from_the_command_line_names_the_override(tmp_path):
    path = write(tmp_path, FULL)
    with pytest.raises(SpecError) as caught:
        cc.load_spec(path, ["sizes.heads=-1"])
    problem = only(caught.value.problems)
    at(problem, path, 19, 14)
    assert problem.message.endswith("found -1 (= ${heads}, given at --set #1 'sizes.heads=-1')")


def test_a_size_must_be_a_scalar(tmp_path):
    path = write(tmp_path, FULL.replace("  heads: 2\n", "  heads: [1, 2]\n"))
    problems = problems_of(path)
    size = problems[0]
    assert size.path == ("sizes", "heads")  # one problem, not one per accepted type
    at(size, path, 4, 3)
    assert size.message == "a size is a number, a flag or a string; found list"
    assert [p.path for p in problems].count(("sizes", "heads")) == 1


def test_negative_or_zero_values_are_rejected_with_the_bound(tmp_path):
    path = write(tmp_path, FULL.replace("  depth: 2\n", "  depth: 0\n"))
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "depth")
    at(problem, path, 15, 3)
    assert "greater than or equal to 1" in problem.message
    assert problem.message.endswith(f"found 0 (= ${{depth}}, given at {path}:5:3)")


def test_missing_required_top_level_key(tmp_path):
    text = FULL[: FULL.index("encoder:")] + FULL[FULL.index("head:") :]
    path = write(tmp_path, text)
    problem = only(problems_of(path))
    assert problem.path == ("encoder",)
    assert problem.message == "required key is missing"
    at(problem, path, 1, 1)  # the document itself


def test_missing_required_key_of_a_step_is_located_at_the_step(tmp_path):
    path = write(tmp_path, FULL.replace("    - name: sparsify\n      primitive: ista\n", "    - primitive: ista\n"))
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "layer", 1, "name")
    assert problem.message == "required key is missing"
    at(problem, path, 20, 7)


# ---------------------------------------------------------------- YAML itself


def test_duplicate_yaml_key(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        sizes:
          d: 32
          heads: 2
          d: 64
        """,
    )
    problem = only(problems_of(path))
    assert problem.path == ("sizes", "d")
    assert problem.message == "key 'd' appears twice"
    at(problem, path, 5, 3)


def test_every_duplicate_key_is_reported(tmp_path):
    path = write(tmp_path, FULL + "name: again\nhead: []\n")
    problems = problems_of(path)
    assert [(p.path, p.location.line) for p in problems] == [(("name",), 26), (("head",), 27)]


def test_invalid_yaml_syntax_is_located(tmp_path, capsys):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        sizes:
          d: [32
          heads: 2
        """,
    )
    problem = only(problems_of(path))
    at(problem, path, 4, 8)
    assert problem.message == "not valid YAML: expected ',' or ']', but got ':'"
    code, _, err = run_cli(capsys, "validate", str(path))
    assert code == 2 and f"{path}:4:8: not valid YAML" in err and "Traceback" not in err


def test_bad_indentation_is_located(tmp_path):
    path = write(tmp_path, "name: x\nsizes:\n  d: 1\n bad: 2\n")
    problem = only(problems_of(path))
    assert problem.message.startswith("not valid YAML")
    assert problem.location.source == str(path) and problem.location.line == 4


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
        ("- a\n- b\n", "a spec is a mapping of keys; found list"),
        ("just words\n", "a spec is a mapping of keys; found str"),
        ("a: 1\n---\nb: 2\n", "not valid YAML: but found another document"),
    ],
)
def test_a_file_that_is_not_a_spec(tmp_path, text, message):
    path = write(tmp_path, text)
    problem = only(problems_of(path))
    assert problem.message == message and problem.location.source == str(path)


def test_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"name: x\nsizes:\n  d: \xff\n")
    problem = only(problems_of(path))
    assert "UTF-8" in problem.message
    at(problem, path, 3, 6)


def test_a_self_referencing_yaml_alias_is_a_problem_not_a_recursion(tmp_path):
    path = write(tmp_path, "extends: crate-tiny\nsizes: &loop\n  d: *loop\n")
    problem = only(problems_of(path))
    assert problem.path == ("sizes", "d")
    assert "alias" in problem.message
    assert problem.location.line == 2


def test_plain_yaml_aliases_still_work(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        sizes: {d: &width 32, heads: 2, head_dim: *width}
        """,
    )
    spec = cc.load_spec(path)
    assert spec.sizes["head_dim"] == 32 and spec.encoder.layer[0].args["head_dim"] == 32


# ---------------------------------------------------------------- ${size} references


def test_unknown_size_reference_suggests_the_closest(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        head:
          - name: classify
            primitive: classify
            args: {classes: "${clases}"}
        """,
    )
    problem = only(problems_of(path))  # and no follow-up type error on the unresolved value
    assert problem.path == ("head", 0, "args", "classes")
    at(problem, path, 5, 12)
    assert problem.message.startswith("unknown size '${clases}'; sizes declared: image_size, channels")
    assert problem.hint == "did you mean 'classes'?"


def test_size_used_before_it_is_declared(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        sizes:
          width: ${height}
          height: 4
        head:
          - name: classify
            primitive: classify
            args: {classes: "${width}"}
        """,
    )
    problem = only(problems_of(path))  # not a cascade of type errors on sizes.width or head.classes
    assert problem.path == ("sizes", "width")
    at(problem, path, 3, 3)
    assert problem.message == "size 'height' is used before it is declared; declare it earlier in 'sizes'"


def test_a_size_may_use_an_earlier_size(tmp_path):
    path = write(tmp_path, FULL.replace("  depth: 2\n", "  depth: 2\n  tag: crate-${d}x${depth}\n"))
    assert cc.load_spec(path).sizes["tag"] == "crate-32x2"


def test_sizes_that_is_not_a_mapping_is_one_problem(tmp_path):
    path = write(tmp_path, "extends: crate-tiny\nsizes: 5\n")
    problem = only(problems_of(path))  # not also one per '${...}' that could not resolve
    assert problem.path == ("sizes",)
    at(problem, path, 2, 1)
    assert problem.message.endswith("found 5")


# ---------------------------------------------------------------- step lists


def test_step_name_used_twice_in_a_layer(tmp_path):
    path = write(tmp_path, FULL.replace("    - name: sparsify\n", "    - name: compress\n"))
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "layer")
    at(problem, path, 16, 3)
    assert "step name 'compress' is used twice" in problem.message


def test_step_name_used_in_two_top_level_lists(tmp_path):
    path = write(tmp_path, FULL.replace("  - name: classify\n", "  - name: class_token\n"))
    problem = only(problems_of(path))
    assert "['class_token']" in problem.message and "more than one" in problem.message


def test_step_name_must_be_an_identifier(tmp_path):
    path = write(tmp_path, FULL.replace("name: sparsify", "name: 2sparse"))
    problem = only(problems_of(path))
    assert problem.path == ("encoder", "layer", 1, "name")
    at(problem, path, 20, 7)
    assert problem.message.endswith("found '2sparse'")


def test_spec_name_cannot_escape_the_output_folder(tmp_path):
    for bad in ["/", "../elsewhere", "a/b", ""]:
        problem = only(problems_of(write(tmp_path, FULL), [f"name={bad}"]))
        assert problem.path == ("name",) and "should match pattern" in problem.message, bad


# ---------------------------------------------------------------- extends


def test_extends_a_missing_file(tmp_path):
    path = write(tmp_path, "extends: nowhere.yaml\nname: x\n")
    problem = only(problems_of(path))
    assert problem.path == ("extends",)
    at(problem, path, 1, 1)
    assert problem.message == f"no such spec file: {tmp_path / 'nowhere.yaml'}"


def test_extends_a_misspelled_preset(tmp_path):
    path = write(tmp_path, "name: x\nextends: crate-tiyn\n")
    problem = only(problems_of(path))
    assert problem.path == ("extends",)
    at(problem, path, 2, 1)
    assert "'crate-tiyn' is neither a spec file nor a zoo preset" in problem.message
    assert problem.hint == "did you mean 'crate-tiny'?"


def test_extends_must_be_a_string(tmp_path):
    path = write(tmp_path, "name: x\nextends: 5\n")
    problem = only(problems_of(path))
    assert problem.path == ("extends",) and "must be a path or zoo name" in problem.message
    at(problem, path, 2, 1)


def test_extends_cycle(tmp_path, capsys):
    a = write(tmp_path, "extends: b.yaml\nname: a\n", "a.yaml")
    b = write(tmp_path, "name: b\nextends: a.yaml\n", "b.yaml")
    problem = only(problems_of(a))
    assert problem.path == ("extends",)
    at(problem, b, 2, 1)  # the 'extends' that closes the cycle
    assert problem.message == f"'extends' forms a cycle: {a} -> {b} -> {a}"
    code, _, err = run_cli(capsys, "validate", str(a))
    assert code == 2 and "forms a cycle" in err and "Traceback" not in err


def test_a_file_extending_itself(tmp_path):
    a = write(tmp_path, "extends: a.yaml\nname: a\n", "a.yaml")
    problem = only(problems_of(a))
    at(problem, a, 1, 1)
    assert "cycle" in problem.message


def test_problems_in_a_child_are_located_in_the_child(tmp_path):
    base = write(tmp_path, FULL, "base.yaml")
    child = write(tmp_path, "extends: base.yaml\nsizes:\n  heads: 2\nencoder:\n  depht: 3\n", "child.yaml")
    problem = only(problems_of(child))
    at(problem, child, 5, 3)
    assert problem.hint == "did you mean 'depth'?"
    # a problem in the inherited part is located in the parent file
    other = write(tmp_path, "extends: base.yaml\nencoder:\n  depth: -1\n", "other.yaml")
    assert only(problems_of(other)).location == Location(str(other), 3, 3)
    broken = write(tmp_path, FULL.replace("primitive: ista", "primitive: istaa"), "broken.yaml")
    child2 = write(tmp_path, "extends: broken.yaml\nname: child\n", "child2.yaml")
    at(only(problems_of(child2)), broken, 21, 7)
    assert base.exists()


# ---------------------------------------------------------------- --set overrides


def test_override_without_equals(tmp_path, capsys):
    problem = only(problems_of("crate-tiny", ["sizes.d=32", "sizes.d"]))
    assert problem.location == Location("--set #2 'sizes.d'")
    assert problem.message == "an override is written path=value, e.g. sizes.d=384"
    code, _, err = run_cli(capsys, "validate", "crate-tiny", "--set", "sizes.d")
    assert code == 2
    assert "--set #1 'sizes.d': an override is written path=value" in err


def test_override_with_an_empty_key():
    problem = only(problems_of("crate-tiny", ["=3"]))
    assert problem.message == "an override needs a key path before '='"


def test_override_into_a_step_that_does_not_exist():
    problem = only(problems_of("crate-tiny", ["encoder.layer.sparsfy.primitive=ista_soft"]))
    assert problem.path == ("encoder", "layer")
    assert problem.location == Location("--set #1 'encoder.layer.sparsfy.primitive=ista_soft'")
    assert problem.message == "no step named 'sparsfy' in this list; it has ['compress', 'sparsify']"
    assert problem.hint == "did you mean 'sparsify'?"


@pytest.mark.parametrize("index", ["5", "2", "-3"])
def test_override_index_out_of_range(index):
    problem = only(problems_of("crate-tiny", [f"encoder.layer.{index}.args.lambd=0.5"]))
    assert problem.path == ("encoder", "layer")
    assert problem.message == f"index {index} is out of range: the list has 2 items"


def test_override_inside_a_scalar():
    problem = only(problems_of("crate-tiny", ["sizes.d.x=1"]))
    assert problem.path == ("sizes", "d") and problem.message == "cannot set 'x' inside a int value"


def test_override_of_an_unknown_key_is_located_at_the_override():
    problem = only(problems_of("crate-tiny", ["encoder.dpeth=3"]))
    assert problem.path == ("encoder", "dpeth")
    assert problem.location == Location("--set #1 'encoder.dpeth=3'")
    assert problem.hint == "did you mean 'depth'?"


def test_override_with_a_value_of_the_wrong_type():
    problem = only(problems_of("crate-tiny", ["encoder.layer.compress.args.heads=six"]))
    assert problem.path == ("encoder", "layer", 0, "args", "heads")
    assert problem.location == Location("--set #1 'encoder.layer.compress.args.heads=six'")
    assert problem.message.endswith("found 'six'")


# ---------------------------------------------------------------- build-time (shape) problems


def test_image_not_divisible_by_patch_is_located(tmp_path, capsys):
    path = write(tmp_path, FULL.replace("shape: [3, 32, 32]", "shape: [3, 30, 30]"))
    cc.load_spec(path)  # the spec itself is well-formed ...
    problem = only(problems_of(path, build=True))  # ... the shapes are not
    assert problem.path == ("preprocess", 0)
    at(problem, path, 9, 5)
    assert "step 'patch_embed' (patch_embed, preprocess) cannot take input of shape (3, 30, 30)" in problem.message
    assert "not divisible by patch_size=8" in problem.message
    code, out, err = run_cli(capsys, "validate", str(path))
    assert code == 2 and out == ""
    assert f"{path}:9:5: preprocess[0]: step 'patch_embed'" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "build", str(path), "--out", str(tmp_path / "out"))
    assert code == 2 and not (tmp_path / "out").exists()


def test_image_not_divisible_by_patch_through_overrides():
    problem = only(problems_of("crate-tiny", [*SMALL, "sizes.image_size=30"], build=True))
    assert problem.path == ("preprocess", 0)
    assert problem.location == Location(CRATE_YAML, 21, 5)  # the step, in the file that declares it
    assert "image size 30x30 is not divisible by patch_size=8" in problem.message


def test_heads_not_dividing_d_is_located_at_the_layer_step(tmp_path):
    path = write(tmp_path, FULL.replace("  d: 32\n", "  d: 30\n").replace("  heads: 2\n", "  heads: 4\n"))
    problem = only(problems_of(path, build=True))
    assert problem.path == ("encoder", "layer", 0)
    at(problem, path, 17, 7)
    assert "encoder layer 0" in problem.message and "not divisible by heads=4" in problem.message


def test_absurd_sizes_are_a_problem_and_torch_logs_no_traceback(capfd, caplog):
    """Shape inference fails inside torch; its fake-tensor logger would print the kernel's traceback
    (outside pytest, logging's last-resort handler writes it to stderr)."""
    code = cli.main(["validate", "crate-tiny", "--set", "sizes.image_size=320000000", "--set", "sizes.patch_size=1"])
    out, err = capfd.readouterr()
    assert code == 2
    assert "cannot take input of shape (3, 320000000, 320000000)" in err
    assert "Traceback" not in err
    assert [r.getMessage() for r in caplog.records if r.name.startswith("torch")] == []


# ---------------------------------------------------------------- several problems at once


MULTI = """\
name: multi
sizes:
  d: 32
  heads: 2
input:
  shape: [3, 32, 32]
preprocess:
  - name: patch_embed
    primitive: patch_embed
    args: {patch_size: 8, dim: "${d}"}
encodr: 1
encoder:
  depht: 2
  layer:
    - name: compress
      primitive: msa
      args: {heads: "${heds}"}
    - name: sparsify
      primitive: ista
      args: {lambd: fast}
"""

MULTI_EXPECTED = [
    # line, column, path, start of the message, hint
    (11, 1, ("encodr",), "unknown key 'encodr'", "did you mean 'encoder'?"),
    (12, 1, ("encoder", "depth"), "required key is missing", ""),
    (13, 3, ("encoder", "depht"), "unknown key 'depht'", "did you mean 'depth'?"),
    (16, 7, ("encoder", "layer", 0, "primitive"), "unknown primitive 'msa'", "did you mean 'mssa'?"),
    (17, 14, ("encoder", "layer", 0, "args", "heads"), "unknown size '${heds}'", "did you mean 'heads'?"),
    (20, 14, ("encoder", "layer", 1, "args", "lambd"), "Input should be a valid number", ""),
]


def test_every_problem_is_reported_together_in_file_order(tmp_path):
    path = write(tmp_path, MULTI)
    problems = problems_of(path)
    assert len(problems) == len(MULTI_EXPECTED), "\n".join(map(str, problems))
    for problem, (line, column, key, message, hint) in zip(problems, MULTI_EXPECTED):
        at(problem, path, line, column)
        assert problem.path == key
        assert problem.message.startswith(message), problem.message
        assert problem.hint == hint
    assert problems[-1].message.endswith("found 'fast'")
    assert len({p.location.line for p in problems}) == len(problems)


def test_cli_prints_every_problem_one_per_line(tmp_path, capsys):
    path = write(tmp_path, MULTI)
    code, out, err = run_cli(capsys, "validate", str(path))
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == "error: 6 problems in the spec:"
    assert [line.split(": ")[0].strip() for line in lines[1:]] == [
        f"{path}:{line}:{column}" for line, column, *_ in MULTI_EXPECTED
    ]
    assert "(did you mean 'encoder'?)" in lines[1]


def test_problems_from_files_and_overrides_are_reported_together(tmp_path):
    path = write(tmp_path, FULL.replace("primitive: ista", "primitive: istaa"))
    problems = problems_of(path, ["encoder.layer.compress.args.heads=x", "nmae=y"])
    where = {p.path: p.location for p in problems}
    assert where[("encoder", "layer", 1, "primitive")] == Location(str(path), 21, 7)
    assert where[("encoder", "layer", 0, "args", "heads")] == Location("--set #1 'encoder.layer.compress.args.heads=x'")
    assert where[("nmae",)] == Location("--set #2 'nmae=y'")
    assert len(problems) == 3


# ---------------------------------------------------------------- spec references that do not exist


def test_nonexistent_spec_path(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    problem = only(problems_of(missing))
    assert problem.message == f"no such spec file: {missing}"
    assert problem.location == Location(str(missing))
    code, _, err = run_cli(capsys, "validate", str(missing))
    assert code == 2 and "no such spec file" in err


def test_unknown_preset_name_suggests_the_closest(capsys):
    problem = only(problems_of("crate-bsae"))
    assert problem.message.startswith("'crate-bsae' is neither a spec file nor a zoo preset; presets: ")
    assert "presets: bert-base, bert-mini, " in problem.message  # the zoo first, by name
    assert ", causal-crate-base, causal-crate-bytes, crate-alpha-" in problem.message
    assert problem.hint == "did you mean 'crate-base'?"
    code, _, err = run_cli(capsys, "inspect", "crate-bsae")
    assert code == 2 and "did you mean 'crate-base'?" in err


def test_build_dir_that_is_not_a_build(tmp_path, capsys):
    code, _, err = run_cli(capsys, "validate", str(tmp_path))
    assert code == 2 and "cannot read spec file: a directory" in err  # not "no such spec file"
    with pytest.raises(SpecError, match="not a crate-compose build: spec.yaml is missing"):
        cc.load_build(tmp_path)


# ---------------------------------------------------------------- the real command line


def test_command_line_exits_2_without_a_traceback(tmp_path):
    """Two real processes (run side by side: each pays for importing torch)."""
    bad = write(tmp_path, MULTI)
    from commands import CLI

    runs = [
        subprocess.Popen([*CLI, "validate", str(bad)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen(
            [*CLI, "build", "crate-tiny", "--set", "sizes.d", "--out", str(tmp_path / "out")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    (out1, err1), (out2, err2) = (run.communicate(timeout=60) for run in runs)
    assert runs[0].returncode == 2 and runs[1].returncode == 2
    assert "Traceback" not in err1 + err2 and out1 == "" and out2 == ""
    assert err1.startswith("error: 6 problems in the spec:\n")
    assert f"{bad}:17:14: encoder.layer[0].args.heads: unknown size '${{heds}}'" in err1
    assert "--set #1 'sizes.d': an override is written path=value" in err2
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- overrides that create sizes; decoder forms


def test_an_override_creating_a_size_nothing_uses_is_refused_at_the_set(capsys):
    code, out, err = run_cli(capsys, "validate", "specs/crate-digits.yaml", "--set", "sizes.deph=6")
    assert code == 2 and out == "" and "Traceback" not in err
    assert "--set #1 'sizes.deph=6': sizes.deph: no size 'deph' in spec 'crate-digits' (did you mean 'depth'?)" in err
    code, _, err = run_cli(capsys, "validate", "specs/crate-digits.yaml", "--set", "sizes.zzz=4")
    assert code == 2 and "no size 'zzz' in spec 'crate-digits' (nothing uses ${zzz}; sizes declared: " in err


def test_a_new_size_another_override_uses_is_kept():
    spec = cc.load_spec("specs/crate-digits.yaml", ["sizes.h=4", "encoder.layer.compress.args.heads=${h}"])
    assert spec.sizes["h"] == 4 and spec.encoder.layer[0].args["heads"] == 4
    assert cc.load_spec("specs/crate-digits.yaml", ["sizes.depth=3"]).sizes["depth"] == 3  # a declared size


DERIVED_AND_WRITTEN = FULL.replace(
    "head:",
    """\
decoder:
  derive: inverse
  depth: 2
  layer:
    - {name: back, primitive: dictionary}
head:""",
)


def test_a_decoder_both_derived_and_written_says_so_once(tmp_path, capsys):
    path = write(tmp_path, DERIVED_AND_WRITTEN)
    line = DERIVED_AND_WRITTEN.splitlines().index("  derive: inverse") + 2  # the depth after it
    code, _, err = run_cli(capsys, "validate", str(path))
    assert code == 2 and "Traceback" not in err and "unknown key" not in err
    assert err.startswith("error: 1 problem in the spec:\n")
    assert (
        f"{path}:{line}:3: decoder.depth: a decoder is either derived (derive: inverse, form) or written as a "
        "stack (depth, layer, pre, post), not both"
    ) in err
    typo = write(tmp_path, FULL.replace("head:", "decoder: {derive: inverse, frm: code}\nhead:"), "typo.yaml")
    code, _, err = run_cli(capsys, "validate", str(typo))
    assert code == 2 and "decoder.frm: unknown key 'frm'; expected one of: derive, form (did you mean 'form'?)" in err


def test_references_cite_the_projects_own_documents(capsys):
    """``inspect`` shows where a reference count comes from: a paper, or a document this repository has."""
    code, out, _ = run_cli(capsys, "inspect", "causal-crate-base")
    assert code == 0 and "counted in docs/language.md" in out and (ROOT / "docs" / "language.md").is_file()
    missing = "DES" + "IGN"  # a design note outside the repository
    cited = [
        str(path.relative_to(ROOT))
        for folder in ("crate_compose", "docs", "specs", "zoo", "tests")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".md", ".yaml") and missing in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert cited == []


def test_a_reference_count_of_zero_is_refused_where_it_is_given(capsys):
    """A paper's count of 0 parameters would make inspect divide by zero (found by the fuzz)."""
    assert cli.main(["inspect", "specs/vit.yaml", "--set", "reference.params=0"]) == 2
    err = capsys.readouterr().err
    assert "--set #1 'reference.params=0': reference.params: Input should be greater than 0" in err
    assert "Traceback" not in err

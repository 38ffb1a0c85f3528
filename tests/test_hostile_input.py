"""Hostile YAML: every refusal is located, nothing runs, nothing hangs or fills memory.

Each case is a spec file (or a ``--set``) a careful reviewer would try; the CLI must answer with
status 2, a located one-screen message and no traceback, within the bounds of
:mod:`crate_compose.spec_language.yamlread` (size, nesting, alias expansion).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import crate_compose as cc
from crate_compose import cli
from crate_compose.errors import SpecError
from crate_compose.spec_language import yamlread

VALID = """\
name: tiny
input: {shape: [1, 8, 8]}
preprocess:
  - {name: patch_embed, primitive: patch_embed, args: {patch_size: 4, dim: 8}}
encoder:
  depth: 1
  layer:
    - {name: compress, primitive: mssa, args: {heads: 2}}
head:
  - {name: classify, primitive: classify, args: {classes: 3}}
"""

CASES = {  # name: (text, what the message says, line of the problem)
    "nul byte": (VALID.replace("name: tiny", "name: ti\x00ny"), "U+0000 is not allowed", 1),
    "bel byte": (VALID.replace("name: tiny", 'name: "ti\x07ny"'), "U+0007 is not allowed", 1),
    "terminal escape": (VALID.replace("name: tiny", 'name: "\x1b[2Jtiny"'), "U+001B is not allowed", 1),
    "python tag": (
        VALID.replace("name: tiny", "name: !!python/name:os.system"),
        "'!!python/name:os.system' is not allowed",
        1,
    ),
    "python apply on a key": (
        VALID + "!!python/object/apply:os.system [echo PWNED]: 1\n",
        "'!!python/object/apply:os.system' is not allowed",
        11,
    ),
    "include tag": (VALID.replace("input:", "sizes: !include other.yaml\ninput:"), "'!include' is not allowed", 2),
    "binary": (VALID.replace("name: tiny", "name: !!binary aGVsbG8="), "'!!binary' is not allowed", 1),
    "timestamp": (VALID.replace("name: tiny", "name: !!timestamp 2024-13-01"), "'!!timestamp' is not allowed", 1),
    "merge key": (
        VALID.replace(
            "    - {name: compress, primitive: mssa, args: {heads: 2}}",
            "    - &c {name: compress, primitive: mssa, args: {heads: 2}}\n    - {<<: *c, name: again}",
        ),
        "merge keys (<<) are not supported",
        9,
    ),
    "int tag on a word": (VALID.replace("depth: 1", "depth: !!int twelve"), "not a valid int: 'twelve'", 6),
    "float tag on a word": (VALID.replace("heads: 2", "heads: !!float abc"), "not a valid float: 'abc'", 8),
}


def _problem(tmp_path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(SpecError) as error:
        cc.load_spec(path)
    return path, error.value.problems


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_yaml_feature_is_refused_where_it_is_written(tmp_path, capsys, case):
    text, says, line = CASES[case]
    path, problems = _problem(tmp_path, text)
    assert says in problems[0].message
    assert problems[0].location.source == str(path) and problems[0].location.line == line
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "\x1b" not in err and "\x07" not in err and "PWNED" not in err
    assert f"{path}:{line}:" in err and len(err.splitlines()) <= 5


def test_ten_thousand_levels_of_nesting_stop_at_the_bound(tmp_path):
    for deep in ("[" * 10_000 + "]" * 10_000, "{a: " * 10_000 + "1" + "}" * 10_000, "- " * 10_000 + "x"):
        _, problems = _problem(
            tmp_path,
            VALID.replace("name: tiny", f"name: tiny\ndescription: {deep}")
            if not deep.startswith("-")
            else VALID + f"extra:\n  {deep}\n",
        )
        assert f"nested more than {yamlread.MAX_DEPTH} levels" in problems[0].message
        assert problems[0].location.line in (2, 12)


def test_an_alias_bomb_stops_at_the_value_budget_quickly(tmp_path):
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    text = VALID + "sizes:\n" + "".join(f"  {line}\n" for line in lines)
    began = time.perf_counter()
    _, problems = _problem(tmp_path, text)
    assert time.perf_counter() - began < 5  # 10^9 values, refused after 10^5
    assert "expands to more than 10,000 values" in problems[0].message


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path):
    text = VALID + "sizes:\n" + "".join(f"  s{i}: {i}\n" for i in range(200_000))
    assert len(text) > yamlread.MAX_BYTES
    began = time.perf_counter()
    _, problems = _problem(tmp_path, text)
    assert time.perf_counter() - began < 2 and "a spec is at most 2,000,000" in problems[0].message


def test_directories_fifos_and_devices_are_named_for_what_they_are(tmp_path, capsys):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    for path, says in ((tmp_path, "a directory"), (fifo, "not a regular file"), ("/dev/zero", "not a regular file")):
        with pytest.raises(SpecError, match=f"cannot read spec file: {says}"):
            cc.load_spec(path)
        assert cli.main(["validate", str(path)]) == 2
        assert "Traceback" not in capsys.readouterr().err


def test_every_bad_override_is_reported_together(capsys):
    sets = [
        "encoder.depth=!!python/object/apply:os.system [echo ran]",
        "sizes." + ".".join(["a"] * 10_000) + "=1",
        "nonsense",
        "encoder.layer.compress.args.heads=" + "[" * 10_000 + "]" * 10_000,
    ]
    with pytest.raises(SpecError) as error:
        cc.load_spec("crate-digits", sets)
    messages = [p.message for p in error.value.problems]
    assert len(messages) == 4, messages
    assert "'!!python/object/apply:os.system' is not allowed" in messages[0]
    assert "a key path of 10,001 parts" in messages[1]
    assert "path=value" in messages[2]
    assert "nested more than" in messages[3]
    argv = ["validate", "crate-digits", *[arg for s in sets for arg in ("--set", s)]]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("--set #") >= 4
    assert max(len(line) for line in err.splitlines()) < 300  # a 10,000-part override is shown shortened


def test_plain_yaml_still_reads_as_before(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(VALID.replace("depth: 1", "depth: !!int 1").replace("\n", "\r\n"))  # standard tags, CRLF
    assert cc.load_spec(path).encoder.depth == 1


# ----------------------------------------------------------------------------- names, numbers, arguments


@pytest.mark.parametrize(
    "name, says",
    [
        ("forward", "attribute of every torch module"),
        ("training", "attribute of every torch module"),
        ("self", "attribute of every torch module"),
        ("class", "Python keyword"),
        ("lambda", "Python keyword"),
        ("None", "Python keyword"),
        ("_modules", "starting with a letter"),
        ("__init__", "starting with a letter"),
    ],
)
def test_a_name_python_or_torch_needs_is_refused(name, says):
    for override in (
        f"encoder.layer.0.name={name}",
        f"input.name={name}",
        f"stacks={{{name}: {{depth: 1, layer: [{{name: n, primitive: layernorm}}]}}}}",
    ):
        with pytest.raises(SpecError, match=says):
            cc.validate("crate-digits", [override])


def test_the_reserved_names_cover_every_public_module_attribute():
    """torch's own attributes, read in a fresh interpreter: a library imported by another test in this process
    (transformers adds nn.Module.smart_apply) does not count."""
    import json
    import subprocess
    import sys

    from crate_compose.spec_language.spec import MODULE_ATTRIBUTES

    code = (
        "import json, torch, torch.fx; print(json.dumps(sorted(n for n in set(dir(torch.nn.Module)) | "
        "set(dir(torch.fx.GraphModule)) if not n.startswith('_'))))"
    )
    public = set(
        json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    )
    assert public <= MODULE_ATTRIBUTES


@pytest.mark.parametrize(
    "override, says",
    [
        ("encoder.depth=true", "expected a number, not true"),
        ("encoder.layer.compress.args.heads=true", "expected a number, not true"),
        ("encoder.layer.sparsify.args.step_size=.inf", "finite number"),
        ("encoder.layer.sparsify.args.lambd=.nan", "finite number"),
        ("encoder.layer.compress.layer_scale=.inf", "finite number"),
        ("extends=vit", "extends is followed when a file is read"),
    ],
)
def test_silent_acceptances_are_now_refusals(override, says):
    with pytest.raises(SpecError, match=says):
        cc.load_spec("crate-digits", [override])


def test_booleans_and_ints_still_go_where_they_belong():
    spec = cc.load_spec(
        "crate-digits", ["encoder.layer.compress.args.causal=true", "encoder.layer.sparsify.args.lambd=1"]
    )
    assert spec.encoder.layer[0].args["causal"] is True and spec.encoder.layer[1].args["lambd"] == 1.0


@pytest.mark.parametrize(
    "argv, says",
    [
        (["build", "crate-digits", "--device", "banana"], "'banana' is not a device"),
        (["build", "crate-digits", "--device", "meta"], "meta holds no weights"),
        (["build", "crate-digits", "--seed", str(2**64)], "must be in [0, 9223372036854775807]"),
        (["build", "crate-digits", "--seed", "-1"], "must be in [0"),
        (["train", "crate-digits", "--steps", "0"], "--steps: 0: must be in [1, 100000000]"),
        (["train", "crate-digits", "--batch-size", "0"], "must be at least 1"),
        (["train", "crate-digits", "--lr", "nan"], "give a finite number"),
        (["train", "crate-digits", "--warmup", "-3"], "must be at least 0"),
        (["train", "crate-digits", "--label-smoothing", "2"], "must be in [0, 1)"),
        (["probe", "crate-digits", "--samples", "0"], "must be at least 1"),
        (["generate", "causal-crate-bytes", "--prompt", "x", "--tokens", "-1"], "must be at least 1"),
    ],
)
def test_bad_command_line_arguments_exit_2_naming_the_option(capsys, tmp_path, argv, says):
    with pytest.raises(SystemExit) as code:
        cli.main([*argv, *(["--out", str(tmp_path / "out")] if argv[0] in ("build", "train") else [])])
    err = capsys.readouterr().err
    assert code.value.code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_references_that_grow_a_text_exponentially_stop_at_the_bound(tmp_path):
    sizes = "".join(f'  s{i}: "${{s{i - 1}}}${{s{i - 1}}}"\n' for i in range(1, 45))
    text = VALID + "sizes:\n  s0: ab\n" + sizes + "description: ${s44}\n"
    began = time.perf_counter()
    _, problems = _problem(tmp_path, text)
    assert time.perf_counter() - began < 2
    assert any("at most 10,000" in p.message for p in problems) and len(problems) < 10


def test_an_extends_chain_too_long_is_refused(tmp_path):
    (tmp_path / "f0.yaml").write_text(VALID)
    for i in range(1, 60):
        (tmp_path / f"f{i}.yaml").write_text(f"extends: f{i - 1}.yaml\nname: f{i}\n")
    with pytest.raises(SpecError, match="an extends chain of more than 32 files"):
        cc.load_spec(tmp_path / "f59.yaml")
    assert cc.load_spec(tmp_path / "f20.yaml").name == "f20"  # a reasonable chain still loads


def test_weights_of_the_wrong_kind_or_not_finite_are_named(tmp_path, capsys):
    import torch
    from safetensors.torch import load_file, save_file

    model = cc.build("crate-digits", overrides=["sizes.depth=1"])
    cc.save(model, tmp_path / "build")
    weights = tmp_path / "build" / "model.safetensors"
    tensors = load_file(weights)
    save_file({k: v.to(torch.int32) for k, v in tensors.items()}, weights)
    with pytest.raises(SpecError, match=r"is torch.int32 in the file, torch.float32 in the spec"):
        cc.load_build(tmp_path / "build")
    save_file({k: torch.full_like(v, float("nan")) for k, v in tensors.items()}, weights)
    argv = [
        "probe",
        "crate-digits",
        "--set",
        "sizes.depth=1",
        "--weights",
        str(tmp_path / "build"),
        "--samples",
        "8",
        "--out",
        str(tmp_path / "probes"),
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "holds NaN or infinite values" in err and "Traceback" not in err
    assert not (tmp_path / "probes").exists()


DIGITS = Path(__file__).resolve().parent.parent / "specs" / "crate-digits.yaml"


def _child(tmp_path, text: str) -> Path:
    path = tmp_path / "child.yaml"
    path.write_text(f"extends: {DIGITS}\n{text}")
    return path


def test_a_size_given_in_a_child_file_is_named_where_a_parent_step_fails(tmp_path):
    with pytest.raises(SpecError) as caught:
        cc.validate(_child(tmp_path, "name: odd\nsizes:\n  patch_size: 3\n"))
    problem = caught.value.problems[0]
    assert str(problem.location).startswith(str(DIGITS))  # the step that fails is written in the parent
    assert f"${{patch_size}} given at {tmp_path / 'child.yaml'}:4:3" in problem.hint


def test_an_input_set_on_the_command_line_is_named_where_the_first_step_fails():
    with pytest.raises(SpecError) as caught:
        cc.validate("crate-digits", ["input.shape=[1,9,9]"])
    assert "the input shape is given at --set #1 'input.shape=[1,9,9]'" in caught.value.problems[0].hint


def test_integers_beyond_64_bits_are_refused_where_written(tmp_path):
    with pytest.raises(SpecError) as caught:
        cc.load_spec(_child(tmp_path, "name: big\nsizes:\n  classes: 1000000000000000000000000000000\n"))
    text = str(caught.value)
    assert "1e+30 is too large: integers in a spec fit in 64 bits" in text and "child.yaml:3:1: sizes" in text
    assert "Exception raised from" not in text and len(text.splitlines()) <= 4


def test_an_extends_that_cannot_be_read_is_reported_at_the_extends(tmp_path):
    (tmp_path / "folder").mkdir()
    child = tmp_path / "child.yaml"
    child.write_text("name: x\nextends: folder\n")
    with pytest.raises(SpecError) as caught:
        cc.load_spec(child)
    assert (
        str(caught.value.problems[0])
        == f"{child}:2:1: extends: {tmp_path / 'folder'}: cannot read spec file: a directory"
    )
    (tmp_path / "text.yaml").write_text("just a line of text\n")
    child.write_text("name: x\nextends: text.yaml\n")
    with pytest.raises(SpecError) as caught:
        cc.load_spec(child)
    assert f"in the file extended at {child}:2:1" in caught.value.problems[0].hint


def test_override_problems_are_located_at_the_override():
    with pytest.raises(SpecError) as caught:
        cc.load_spec("crate-digits", ["encoder.layer[1.args.lambd=0.5"])
    first = caught.value.problems[0]
    assert str(first.location) == "--set #1 'encoder.layer[1.args.lambd=0.5'" and "unbalanced brackets" in first.message
    with pytest.raises(SpecError) as caught:
        cc.load_spec("crate-digits", ["encoder.lyer.x=1"])  # a key the override creates: its problem is the override's
    second = caught.value.problems[0]
    assert str(second.location) == "--set #1 'encoder.lyer.x=1'" and "unknown key 'lyer'" in second.message


def _steps(count: int, depth: int = 1) -> str:
    listed = "\n".join(f"    - {{name: s{i}, primitive: ista, args: {{}}}}" for i in range(count))
    return f"name: many\nencoder:\n  depth: {depth}\n  layer:\n{listed}\n"


def test_a_network_of_more_than_1024_steps_is_refused_where_the_steps_come_from(tmp_path):
    with pytest.raises(SpecError) as caught:  # a long list of steps
        cc.load_spec(_child(tmp_path, _steps(1300)))
    problem = caught.value.problems[0]
    assert problem.path == ("encoder", "layer") and str(problem.location) == f"{tmp_path / 'child.yaml'}:5:3"
    assert "unrolls to 1,304 steps, 1,300 of them from here; at most 1,024" in problem.message
    with pytest.raises(SpecError) as caught:  # a short layer repeated: the depth is to blame
        cc.load_spec("crate-digits", ["sizes.depth=600"])
    assert caught.value.problems[0].path == ("encoder", "depth")
    assert "unrolls to 1,204 steps" in caught.value.problems[0].message
    assert cc.load_spec(_child(tmp_path, _steps(3, depth=300))).encoder.depth == 300  # 904 steps: allowed


def test_more_than_10000_yaml_values_are_refused_before_a_tree_is_built(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text("name: wide\nsizes:\n" + "".join(f"  s{i}: {i}\n" for i in range(6000)))
    with pytest.raises(SpecError, match="more than 10,000 values; a spec has a few hundred"):
        cc.load_spec(path)

"""Fast answers: what each command imports before it answers (issue 11).

Timings live in ``benchmarks/startup.py``; these tests check the causes, which do not depend on
the machine: ``--help`` and bad arguments never import torch; a wrong path or a YAML syntax
error is reported before torch is imported; ``validate``, ``inspect``, ``derive``, ``list`` and
``schema`` never import it (the primitives' footprints settle every shipped spec); shape inference on the meta device
never imports ``torch._dynamo`` (1.6 s of start-up).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "specs").glob("*.yaml"))

PROBE = """
import contextlib, io, json, sys
from crate_compose import cli
out, err = io.StringIO(), io.StringIO()
statuses = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            statuses.append(cli.main(argv))
        except SystemExit as stop:
            statuses.append(stop.code)
print(json.dumps({"statuses": statuses, "stderr": err.getvalue(),
                  "loaded": [m for m in ("torch", "torch._dynamo") if m in sys.modules]}))
"""


def _run(*commands: list[str], cwd: Path = ROOT) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(commands)], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_help_and_argument_errors_never_import_torch():
    seen = _run(
        ["--help"],
        ["validate", "--help"],
        ["train", "--help"],
        ["build", "x.yaml", "--seed", "-1"],
        ["list", "everything"],
    )
    assert seen["statuses"] == [0, 0, 0, 2, 2]
    assert "--seed: -1: must be in [0," in seen["stderr"]
    assert seen["loaded"] == []


def test_a_wrong_path_or_a_syntax_error_is_reported_before_torch_loads(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ninput: {shape: [3, 32, 32]\n")  # the flow mapping is never closed
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("name: !!python/object/apply:os.system [echo PWNED]\n")
    seen = _run(
        ["validate", str(tmp_path / "missing.yaml")],
        ["inspect", str(broken)],
        ["validate", str(tagged)],
        ["derive", str(tmp_path)],
    )
    assert seen["statuses"] == [2, 2, 2, 2]
    assert "no such spec file" in seen["stderr"] and "broken.yaml:3:1: not valid YAML" in seen["stderr"]
    assert "tagged.yaml:1:7" in seen["stderr"] and "a directory" in seen["stderr"]
    assert seen["loaded"] == []


def test_validate_inspect_and_derive_never_import_torch():
    """Every shipped spec validates and is inspected through the footprints alone, overrides
    included; a decoder is derived from them too; a step that does not fit is reported from them."""
    seen = _run(
        *(["validate", spec] for spec in SPECS),
        *(["inspect", spec] for spec in SPECS),
        ["validate", "crate-tiny", "--set", "sizes.depth=3"],
        ["derive", "crate-mae-small"],
        ["validate", "specs/crate.yaml", "--set", "sizes.image_size=100"],
    )
    assert seen["statuses"] == [0] * (2 * len(SPECS) + 2) + [2], seen["stderr"]
    assert "image size 100x100 is not divisible by patch_size=16" in seen["stderr"]
    assert seen["loaded"] == []


def test_shape_inference_never_imports_dynamo():
    """Every shipped spec is placed on the meta device (as build, render and a spec the footprints
    cannot settle are) without importing torch._dynamo."""
    script = f"""
import sys, crate_compose as cc
for spec in {SPECS!r}:
    cc.build(spec, meta=True)
print([m for m in ("torch", "torch._dynamo") if m in sys.modules])
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "['torch']", done.stdout + done.stderr


def test_the_marks_are_removed_after_inference():
    script = """
import sys, torch, crate_compose as cc
from crate_compose.building import placement as shapes
cc.build("specs/crate.yaml", meta=True)
marked = shapes._mark_references()  # all unmarked after inference, so all are marked again here
assert len(marked) > 50, f"torch wraps its references differently now: {len(marked)} marked"
for function in marked:
    delattr(function, "__dynamo_disable")
cc.build("specs/crate.yaml", meta=True)
assert not [f for f in marked if hasattr(f, "__dynamo_disable")], "a mark outlived inference"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("command", [["list", "primitives"], ["schema"], ["list", "zoo"], ["list", "data"]])
def test_listing_commands_load_no_builder(command):
    """list and schema need the primitives' declarations, never torch, the builder, the figures or
    the training code."""
    script = f"""
import contextlib, io, sys
from crate_compose import cli
with contextlib.redirect_stdout(io.StringIO()):
    assert cli.main({command!r}) == 0
heavy = [m for m in ("torch", "crate_compose.building.builder", "crate_compose.rendering.diagrams", "crate_compose.training.run", "graphviz",
                     "matplotlib", "safetensors", "torch._dynamo") if m in sys.modules]
print(heavy)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_refusals_of_an_output_path_or_a_spec_input_come_before_torch_loads(tmp_path):
    """Commands refused for their output path (a file, a device, someone else's files, inside a build or inside
    the source of an export) or for their spec's input (an image spec given to generate or to train --task lm)
    answer before torch is imported: under half a second, not after the ~2 s of torch and the data.
    (--device cuda on a machine without CUDA needs torch to be known: it is refused when the argument is
    parsed, before anything is read: tests/test_cli.py.)"""
    digits = str(ROOT / "specs" / "crate-digits.yaml")
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    build = tmp_path / "build"  # what makes a folder a build: its spec and its weights
    build.mkdir()
    (build / "spec.yaml").write_text("name: x\n")
    (build / "model.safetensors").write_bytes(b"\0" * 8)
    swap = ["--swap", "encoder.layer.sparsify.primitive=ista"]
    exit_1 = [
        ["train", digits, "--out", "/dev/null"],
        ["train", digits, "--out", str(afile)],
        ["train", digits, "--out", str(foreign)],
        ["train", digits, "--out", str(afile / "run")],
        ["build", digits, "--out", "/dev/null"],
        ["build", digits, "--out", str(foreign)],
        ["ablate", digits, *swap, "--out", str(foreign)],
        ["probe", digits, "--out", str(afile)],
        ["show", digits, "--out", str(afile)],
        ["import", "crate-tiny", str(afile), "--out", str(foreign)],
        ["evaluate", digits, "--weights", str(build), "--out", "/dev/null"],
        ["linear-probe", digits, "--out", "/dev/null"],
    ]
    exit_2 = [
        ["export", str(build), "--to", "crate", "--out", str(build / "model.safetensors")],
        ["probe", digits, "--out", str(build / "probes")],
        ["show", digits, "--out", str(build / "pictures")],
        ["generate", digits, "--prompt", "x"],
        ["train", digits, "--task", "lm", "--data", "text"],
    ]
    seen = _run(*exit_1, *exit_2, cwd=tmp_path)
    assert seen["statuses"] == [1] * len(exit_1) + [2] * len(exit_2), seen["stderr"]
    assert "Traceback" not in seen["stderr"] and seen["stderr"].count("error: ") == len(exit_1) + len(exit_2)
    assert seen["loaded"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "build", "mine"]  # nothing written


def test_a_typo_in_a_data_set_task_or_spec_answers_before_torch_loads(tmp_path):
    """Every name a run is given is checked before torch is imported, so each typo answers as fast as a spec's;
    so does a spec whose head is another task's (a SimDINO head trained as a classifier)."""
    out = str(tmp_path / "run")
    seen = _run(
        ["train", "crate-digits", "--data", "digitz", "--out", out],
        ["ablate", "crate-digits", "--data", "fashion-mnst", "--out", out],
        ["train", "crate-digitz", "--out", out],
        ["train", "crate-digits", "--task", "clasify", "--out", out],
        ["train", "crate-simdino-mini", "--task", "classify", "--data", "shapes", "--out", out],
    )
    assert seen["statuses"] == [2, 2, 2, 2, 2]
    assert "unknown data set 'digitz'" in seen["stderr"] and "did you mean 'fashion-mnist'" in seen["stderr"]
    assert "did you mean 'crate-digits'" in seen["stderr"] and "invalid choice: 'clasify'" in seen["stderr"]
    assert "--task simdino trains this spec" in seen["stderr"]
    assert seen["loaded"] == [] and not (tmp_path / "run").exists()

"""The command line (build, inspect, list, schema) and the build artifacts, in process."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import crate_compose as cc
from crate_compose import cli
from crate_compose.errors import SpecError
from crate_compose.spec_language import zoo

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "name=crate-tiny",
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=2",
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.classes=10",
]
SETS = [arg for override in SMALL for arg in ("--set", override)]
STEPS = [
    "preprocess.patch_embed",
    "preprocess.class_token",
    "preprocess.positions",
    "encoder.layer_0.compress",
    "encoder.layer_0.sparsify",
    "encoder.layer_1.compress",
    "encoder.layer_1.sparsify",
    "head.classify",
]
BUILD_FILES = {"spec.yaml", "code.py", "summary.txt", "model.safetensors"}

# Parameter counts of every preset in zoo/ (CRATE: exact, paper 003 Table 1; CRATE-MAE: this build,
# which leaves out the paper's unused Linear(d, d) decoder embedding, see test_mae.py).
ZOO_PARAMS = {
    "crate-tiny": 6_090_856,
    "crate-small": 13_116_328,
    "crate-base": 22_796_008,
    "crate-large": 77_641_192,
    "crate-mae-small": 24_960_000,
    "crate-mae-base": 43_896_576,
    "crate-mae-photos": 76_736,
    "crate-alpha-base16": 72_328_936,
    "tost-tiny": 5_769_328,
    "tost-small": 22_589_944,
    "vit-tiny": 5_717_416,
    "vit-small": 22_050_664,
    # language models: the head tied to the token embedding, counted once
    "gpt2-small": 124_439_808,
    "causal-crate-base": 60_665_088,  # 38,597,376 + 786,432 + 12 x 1,773,312 + 1,536 (docs/language.md)
    "tost-lm-base": 110_467_728,
    "crate-lm-base": 81_934_848,  # the authors' crate_overcomplete.py: 38,633,472 + 786,432 + 12 x 3,542,784 + 1,536
    # masked language models (BERT's embeddings with segments, a tied masked-LM head): transformers'
    # BertForMaskedLM(BertConfig()) exactly (tests/test_bert.py), and CRATE-BERT counted in specs/crate-bert.yaml
    "bert-base": 109_514_298,  # 23,837,184 + 12 x 7,087,872 + head 622,650
    "crate-bert-base": 45_741_114,  # 23,837,184 + 12 x 1,773,312 + 1,536 + 622,650
    # laptop variants (bytes:text's vocabulary of 261, context 128, d 256, 4 layers; 10 classes):
    # embeddings 66,816 + 32,768 + 512 + LN 512 = 100,608; the masked-LM head 65,792 + 512 + 261 = 66,565
    "bert-mini": 3_326_213,  # + 4 x (MHSA 263,168 + LN 512 + MLP 525,568 + LN 512) + head
    "crate-bert-mini": 959_237,  # + 4 x (LN 512 + U 65,536 + out 65,792 + LN 512 + D 65,536) + LN 512 + head
    "bert-mini-classify": 3_262_218,  # bert-mini - head 66,565 + Linear(256, 10) 2,570
    "crate-bert-mini-classify": 895_242,  # crate-bert-mini - head 66,565 + 2,570
    # byte-level laptop variants, counted by hand: embedding 256x128 + positions 128x128 = 49,152, final LN 256
    "causal-crate-bytes": 248_576,  # + 4 x (LN 256 + U 16,384 + out 16,512 + LN 256 + D 16,384)
    "gpt2-bytes": 842_496,  # + 4 x (LN 256 + qkv 49,536 + out 16,512 + LN 256 + MLP 131,712)
    "tost-lm-bytes": 713_488,  # + 4 x (LN 256 + W 16,512 + temp 4 + beta 512 + out 16,512 + MLP 131,712 + 2 x 128 LayerScale + LN 256)
    # 28x28 grey images, patch 4 (49 tokens), d 128, 12 layers, 10 classes; counted by hand
    "crate-mini": 607_754,  # Linear(16, 128) 2,176 + class 128 + positions 50 x 128 + 12 x (33,152 + 16,640) + LN + head 1,546
    "tost-mini": 2_467_834,  # stem 74,688 + Fourier 8,320 + 12 x (TSSA 33,412 + MLP 132,096) + class 128 + 2 x 198,528 + LN 256 + 1,290
    "crate-alpha-mini": 1_982_474,  # conv 2,176 + 128 + 6,400 + 12 x (MSSA 33,024 + ODL 131,328) + LN 256 + 1,290
    # 8x8 digits, patch 2 (16 tokens), d 64, 4 layers
    "tost-digits": 223_002,  # stem 704 + Fourier 4,160 + 4 x (8,516 + 33,280) + class 64 + CA 16,832 + MLP 33,280 + LN 128 + 650
    "crate-alpha-digits": 167_114,  # conv 320 + 64 + 17 x 64 + 4 x (8,320 + 32,896) + LN 128 + head 650
    "vit-mini": 2_389_514,  # conv 2,176 + class 128 + positions 6,400 + 12 x (MHSA 66,304 + MLP 131,968) + LN 256 + 1,290
    # DINO: the backbone without its classifier + DINO's head (LN d, Linear(d, hidden), Linear(hidden, hidden),
    # Linear(hidden, bottleneck), weight_v K x bottleneck, weight_g K)
    "crate-dino-small": 35_284_672,  # CRATE-S/16 13,116,328 - head 578,152 + 1,152 + 1,181,696 + 4,196,352 + 524,544 + 16,777,216 + 65,536
    "vit-dino-small": 44_017_792,  # timm's ViT-S/16 without classifier 21,665,664 + DINO's head 22,352,128
    "crate-dino-mini": 1_132_928,  # crate-mini 607,754 - head 1,546 + 256 + 66,048 + 262,656 + 65,664 + 131,072 + 1,024
    "vit-dino-mini": 2_914_688,  # vit-mini 2,389,514 - head 1,546 + the same head 526,720
    "crate-dino-digits": 167_552,  # crate-digits without head 51,904 + 128 + 16,640 + 65,792 + 16,448 + 16,384 + 256
    "crate-simdino-small": 18_441_920,  # CRATE-S/16 13,116,328 - head 578,152 + 1,152 + 1,181,696 + 4,196,352 + 524,544
    "vit-simdino-small": 27_175_040,  # timm's ViT-S/16 without classifier 21,665,664 + SimDINO's head 5,509,376
    "crate-simdino-mini": 1_000_832,  # crate-mini 607,754 - head 1,546 + 256 + 66,048 + 262,656 + 65,664
    "vit-simdino-mini": 2_782_592,  # vit-mini 2,389,514 - head 1,546 + the same head 394,624
    "crate-simdino-digits": 150_912,  # crate-digits without head 51,904 + 128 + 16,640 + 65,792 + 16,448
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def only_notes(err: str) -> bool:
    """Standard error holds nothing but notes (what loading did on its own, e.g. a dropped reference)."""
    return all(line.startswith("note: ") for line in err.splitlines())


def build_small(capsys, out: Path, *extra: str) -> str:
    code, stdout, err = run(capsys, "build", "crate-tiny", *SETS, "--out", out, *extra)
    assert code == 0 and only_notes(err), err
    return stdout


# ---------------------------------------------------------------- build


def test_build_writes_the_artifacts_and_prints_the_summary(tmp_path, capsys):
    out = tmp_path / "model"
    stdout = build_small(capsys, out)
    assert {p.name for p in out.iterdir()} == BUILD_FILES
    assert stdout.startswith("crate-tiny: input (B, 3, 32, 32) -> output (B, 10)\n")
    for step in STEPS:
        assert re.search(rf"^  {re.escape(step)}\s", stdout, re.M), step
    assert "parameters: 14,058 total, 14,058 trainable" in stdout
    assert stdout.rstrip().endswith(f"wrote {out}/: spec.yaml, code.py, summary.txt, model.safetensors")
    assert (out / "summary.txt").read_text() == stdout[: stdout.index("wrote ")]
    assert cc.load_spec(out / "spec.yaml") == cc.load_spec("crate-tiny", SMALL)
    with safe_open(out / "model.safetensors", "pt") as weights:
        assert weights.metadata() == {"format": "pt", "seed": "0", "dtype": "float32"}
        keys = set(weights.keys())
    assert keys == set(cc.build("crate-tiny", overrides=SMALL, meta=True).state_dict())
    assert {"encoder.layer_1.compress.subspaces.weight", "preprocess.class_token.token"} <= keys


def test_loaded_build_gives_identical_outputs(tmp_path, capsys):
    out = tmp_path / "model"
    build_small(capsys, out, "--seed", "7")
    built = cc.build("crate-tiny", overrides=SMALL, seed=7)
    loaded = cc.load_build(out)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x)["output"], built(x)["output"])
    assert loaded.state_dict().keys() == built.state_dict().keys()
    assert all(torch.equal(v, built.state_dict()[k]) for k, v in loaded.state_dict().items())
    assert cc.spec_of(loaded) == cc.spec_of(built)
    assert loaded.code == built.code


def test_load_build_never_unpickles(tmp_path, capsys, monkeypatch):
    out = tmp_path / "model"
    build_small(capsys, out)

    def forbidden(*args, **kwargs):
        raise AssertionError("crate_compose.load_build must not unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    real_open = builtins.open

    def watched_open(file, mode="r", *args, **kwargs):
        assert not str(file).endswith((".pt", ".pth", ".pkl", ".bin")), file
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watched_open)
    model = cc.load_build(out)
    assert isinstance(model, torch.fx.GraphModule)
    assert cc.spec_of(model).name == "crate-tiny"


def test_load_checks_the_weights_against_the_spec(tmp_path, capsys):
    out = tmp_path / "model"
    build_small(capsys, out)
    spec = (out / "spec.yaml").read_text()
    assert "encoder:\n  depth: 2\n" in spec
    (out / "spec.yaml").write_text(spec.replace("encoder:\n  depth: 2\n", "encoder:\n  depth: 3\n"))
    with pytest.raises(
        SpecError,
        match=r"weights do not match the spec: encoder\.layer_2\.compress\.norm\.weight is "
        r"missing from the file \(the spec has \(\d+,\)\)",
    ):
        cc.load_build(out)
    (out / "spec.yaml").write_text(spec.replace("d: 16", "d: 24") if "d: 16" in spec else spec)
    weights = (out / "model.safetensors").read_bytes()
    (out / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # a truncated file: named, no traceback
    with pytest.raises(SpecError, match="is not a readable safetensors file"):
        cc.load_build(out)
    (out / "model.safetensors").write_bytes(b"\x80\x04\x95 pickle")  # a pickle is never unpickled
    with pytest.raises(SpecError, match="is not a readable safetensors file"):
        cc.load_build(out)
    (out / "model.safetensors").unlink()
    with pytest.raises(SpecError, match="model.safetensors is missing"):
        cc.load_build(out)


def test_invalid_spec_leaves_no_output(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: crate-tiny\nencodr: {}\n")
    out = tmp_path / "model"
    code, stdout, err = run(capsys, "build", bad, "--out", out)
    assert code == 2 and stdout == "" and "did you mean 'encoder'?" in err
    code, _, _ = run(capsys, "build", "crate-tiny", *SETS, "--set", "sizes.image_size=30", "--out", out)
    assert code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no output, no temporary sibling


def test_failed_write_keeps_the_previous_build(tmp_path, capsys, monkeypatch):
    out = tmp_path / "model"
    build_small(capsys, out, "--seed", "1")
    before = load_file(out / "model.safetensors")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", disk_full)  # what files.save_tensors calls
    code, _, err = run(capsys, "build", "crate-tiny", *SETS, "--seed", "2", "--out", out)
    assert (
        code == 1 and "cannot write output" in err and f"No space left on device: '{out / 'model.safetensors'}'" in err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the staging directory is gone
    after = load_file(out / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_build_replaces_an_earlier_build(tmp_path, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "diagram.svg").write_text("<svg/>")  # a diagram of an earlier build --render
    (out / "model.safetensors").write_text("not weights")
    build_small(capsys, out)
    assert {p.name for p in out.iterdir()} == BUILD_FILES
    assert len(load_file(out / "model.safetensors")) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("foreign", ["notes.txt", "checkpoints/"])
def test_build_never_deletes_files_it_did_not_write(tmp_path, capsys, monkeypatch, foreign):
    """`--out .` or a directory of one's own must not be wiped by a build."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.safetensors").write_text("an earlier build's weights")
    if foreign.endswith("/"):
        (tmp_path / foreign).mkdir()
    else:
        (tmp_path / foreign).write_text("mine")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = run(capsys, "build", "crate-tiny", *SETS, "--out", ".")
    assert code == 1 and stdout == ""
    assert "not a crate-compose build" in err and foreign.rstrip("/") in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "model.safetensors").read_text() == "an earlier build's weights"


def test_an_out_that_cannot_take_the_output_exits_1_for_every_command_that_writes_a_folder(tmp_path, capsys):
    """The exit table: 1 is "an output cannot be written (a full disk, a read-only folder, a FIFO or a device
    given as --out)": the path given cannot take the output. A folder of someone else's files, a file where
    the folder goes, or a file where a run keeps its checkpoints are that, for train, ablate, probe and show
    as for build (they were 2, a bad argument, before). Nothing there is changed."""
    digits = str(ROOT / "specs" / "crate-digits.yaml")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "checkpoints").write_text("mine\n")
    commands = [
        ["build", digits, "--out", foreign],
        ["train", digits, "--out", foreign],
        ["ablate", digits, "--swap", "encoder.layer.sparsify.primitive=ista", "--out", foreign],
        ["build", digits, "--out", afile],
        ["train", digits, "--out", afile],
        ["train", digits, "--out", afile / "run"],
        ["ablate", digits, "--swap", "encoder.layer.sparsify.primitive=ista", "--out", afile],
        ["probe", digits, "--out", afile],
        ["show", digits, "--out", afile],
        ["train", digits, "--out", kept],
    ]
    for argv in commands:
        code, _, err = run(capsys, *argv)
        assert code == 1 and err.startswith("error: ") and "Traceback" not in err, (argv, err)
        assert str(argv[-1]) in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "kept", "mine"]
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"] and [p.name for p in kept.iterdir()] == ["checkpoints"]
    assert afile.read_text() == "mine\n"


def test_device_cuda_without_cuda_is_an_argument_error_before_anything_is_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, or one without CUDA
    with pytest.raises(SystemExit) as stop:
        cli.main(["build", "crate-tiny", "--device", "cuda"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--device" in err and "no CUDA device is available" in err, err
    # a run's device is checked once its launcher is known (on SLURM it is the nodes'), before anything is read
    for command in ("train", "ablate"):
        assert cli.main([command, "crate-tiny", "--device", "cuda", "--data", f"folder:{tmp_path / 'nowhere'}"]) == 2
        err = capsys.readouterr().err
        assert err == "error: --device cuda: no CUDA device is available to this torch; give cpu\n", err
    assert list(tmp_path.iterdir()) == []


def test_a_cuda_index_beyond_the_machine_is_an_argument_error_naming_its_devices(tmp_path, capsys, monkeypatch):
    """A machine with one GPU (as the lent ones): ``--device cuda:99`` is refused before anything is read,
    and the Python API refuses it with a located error rather than CUDA's traceback."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit) as stop:
        cli.main(["build", "crate-tiny", "--device", "cuda:99", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--device" in err and "cuda:99: this machine has 1 CUDA device (cuda:0)" in err, err
    with pytest.raises(SpecError, match=r"device 'cuda:3': this machine has 1 CUDA device \(cuda:0\)"):
        cc.build("crate-tiny", device="cuda:3")
    assert list(tmp_path.iterdir()) == []


def test_outputs_are_readable_as_the_umask_allows(tmp_path, capsys):
    previous = os.umask(0o022)
    try:
        out = tmp_path / "model"
        build_small(capsys, out)
        assert run(capsys, "derive", "crate-tiny", "--out", tmp_path / "derived.yaml")[0] == 0
    finally:
        os.umask(previous)
    assert out.stat().st_mode & 0o777 == 0o755
    assert {(p.stat().st_mode & 0o777) for p in out.iterdir()} == {0o644}
    assert (tmp_path / "derived.yaml").stat().st_mode & 0o777 == 0o644


def test_build_defaults_to_out_slash_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build_small_default = run(capsys, "build", "crate-tiny", *SETS, "--set", "name=tiny-small")
    assert build_small_default[0] == 0
    assert {p.name for p in (tmp_path / "out" / "tiny-small").iterdir()} == BUILD_FILES


def test_dtype_float64(tmp_path, capsys):
    out = tmp_path / "model"
    build_small(capsys, out, "--dtype", "float64")
    weights = load_file(out / "model.safetensors")
    assert weights and {t.dtype for t in weights.values()} == {torch.float64}
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata()["dtype"] == "float64"
    loaded = cc.load_build(out)
    assert {p.dtype for p in loaded.parameters()} == {torch.float64}
    assert loaded(torch.randn(1, 3, 32, 32, dtype=torch.float64))["output"].dtype == torch.float64
    assert loaded(torch.randn(1, 3, 32, 32))["output"].dtype == torch.float64  # float32 input is cast


def test_seed_changes_weights_and_reproduces_them(tmp_path, capsys):
    rng = torch.random.get_rng_state()
    weights = {}
    for name, seed in [("a", 1), ("b", 1), ("c", 2)]:
        build_small(capsys, tmp_path / name, "--seed", str(seed))
        weights[name] = load_file(tmp_path / name / "model.safetensors")
    assert torch.equal(torch.random.get_rng_state(), rng)  # the global generator is untouched
    assert weights["a"].keys() == weights["c"].keys()
    assert all(torch.equal(weights["a"][k], weights["b"][k]) for k in weights["a"])
    random_init = [k for k in weights["a"] if not torch.equal(weights["a"][k], weights["c"][k])]
    assert "encoder.layer_0.compress.subspaces.weight" in random_init
    assert "preprocess.class_token.token" in random_init


def test_generated_code_is_one_call_per_step_and_imports_nothing(tmp_path, capsys):
    out = tmp_path / "model"
    build_small(capsys, out)
    code = (out / "code.py").read_text()
    assert "import" not in code
    assert code.startswith("def forward(self, images):")
    calls = re.findall(r"self\.([\w.]+)\(", code)
    assert calls == ["cast", *STEPS]  # the input is cast to the model's dtype first
    assert "compress_0 = self.encoder.layer_0.compress(positions)" in code
    assert "sparsify_1 = self.encoder.layer_1.sparsify(compress_1)" in code
    assert code.count("self.encoder.layer_0.compress(") == 1


# ---------------------------------------------------------------- the graph


def test_node_meta_and_lint():
    model = cc.build("crate-tiny", overrides=SMALL, meta=True)
    spec = cc.spec_of(model)
    model.graph.lint()
    calls = [n for n in model.graph.nodes if n.op == "call_module" and n.target != "cast"]
    assert [n.target for n in calls] == STEPS
    for node in calls:
        meta = node.meta
        assert {"spec_path", "role", "layer", "primitive", "step", "shape"} <= set(meta)
        assert meta["role"] in ("preprocess", "encoder", "head") and node.target.startswith(meta["role"] + ".")
        assert (meta["layer"] is None) == (meta["role"] != "encoder")
        step = spec
        for part in meta["spec_path"]:
            step = step[part] if isinstance(part, int) else getattr(step, part)
        assert (step.name, step.primitive) == (meta["step"], meta["primitive"])
        expected_target = (
            f"encoder.layer_{meta['layer']}.{step.name}" if meta["layer"] is not None else f"{meta['role']}.{step.name}"
        )
        assert node.target == expected_target
        assert meta["shape"][0] == "B"
    assert [n.meta["layer"] for n in calls if n.meta["role"] == "encoder"] == [0, 0, 1, 1]
    assert calls[3].meta["spec_path"] == ("encoder", "layer", 0)
    assert calls[-1].meta["shape"] == ("B", 10)


# ---------------------------------------------------------------- inspect


def test_inspect_json(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, "inspect", "zoo/crate-base.yaml", "--json")
    assert code == 0 and only_notes(err), err
    summary = json.loads(out)  # one JSON object, nothing else on stdout
    assert summary["name"] == "crate-base"
    assert summary["params_total"] == 22_796_008
    assert summary["params_trainable"] == 22_796_008
    assert summary["input_shape"] == ["B", 3, 224, 224] and summary["output_shape"] == ["B", 1000]
    steps = summary["steps"]
    assert len(steps) == 3 + 2 * 12 + 1
    for step in steps:
        assert {"name", "primitive", "output_shape", "params"} <= set(step)
    assert sum(step["params"] for step in steps) == summary["params_total"]
    compress = next(s for s in steps if s["module"] == "encoder.layer_11.compress")
    assert compress == {
        **compress,
        "primitive": "mssa",
        "output_shape": ["B", 197, 768],
        "layer": 11,
        "params": 2 * 768 + 768 * 768 + 768 * 768 + 768,
    }
    assert summary["reference"]["params"] == 22_796_008 and summary["reference"]["deviation"] == 0


def test_inspect_table_mentions_every_step(capsys):
    code, out, _ = run(capsys, "inspect", "crate-tiny", *SETS)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "crate-tiny: input (B, 3, 32, 32) -> output (B, 10)"
    rows = [line.split() for line in lines if line.startswith("  ") and "." in line.split()[0]]
    assert [row[0] for row in rows] == STEPS
    assert [row[1] for row in rows] == [
        "patch_embed",
        "class_token",
        "positions",
        "mssa",
        "ista",
        "mssa",
        "ista",
        "classify",
    ]
    assert rows[3][-1] == "2,144" and rows[-1][-1] == "394"


def test_inspect_a_preset_by_name(capsys):
    code, out, err = run(capsys, "inspect", "crate-tiny")
    assert code == 0 and only_notes(err), err
    assert out.startswith("crate-tiny: input (B, 3, 224, 224) -> output (B, 1000)")
    assert "encoder.layer_11.sparsify" in out
    assert "parameters: 6,090,856 total" in out and "this build: exact" in out


def test_inspect_in_python_shows_the_table_the_command_prints(capsys):
    """``cc.inspect()`` in a REPL or printed: the table of ``crate-compose inspect``, not a dataclass's one-line
    repr of every row; its fields stay."""
    code, out, _ = run(capsys, "inspect", "crate-tiny", *SETS)
    summary = cc.inspect("crate-tiny", SMALL)
    assert code == 0 and repr(summary) == str(summary) == summary.table() == out.rstrip("\n")
    assert repr(summary).splitlines()[0] == "crate-tiny: input (B, 3, 32, 32) -> output (B, 10)"
    assert summary.name == "crate-tiny" and summary.params_total == summary.to_dict()["params_total"]
    assert [row.module for row in summary.steps] == STEPS


def test_validate_ok(capsys):
    code, out, err = run(capsys, "validate", "crate-tiny", *SETS)
    assert (code, out) == (0, "crate-tiny: ok (crate-tiny)\n") and only_notes(err)


@pytest.mark.parametrize("name", sorted(p.stem for p in zoo.zoo_dir().glob("*.yaml")))
def test_zoo_parameter_counts(name):
    assert name in ZOO_PARAMS, f"zoo/{name}.yaml has no expected parameter count: add it to ZOO_PARAMS in {__file__}"
    summary = cc.inspect(name)
    assert summary.params_total == ZOO_PARAMS[name]
    assert sum(step.params for step in summary.steps) == summary.params_total
    spec = cc.load_spec(name)
    if spec.reference is not None and spec.reference.exact:  # a laptop-sized preset has no paper count
        assert spec.reference.params == ZOO_PARAMS[name]


@pytest.mark.parametrize("name", [name for name in sorted(cc.presets()) if cc.load_spec(name).reference])
def test_every_preset_with_a_published_count_matches_it(name):
    """Zoo presets and specs/ (e.g. the ViT-S baseline, 22,050,664): exact where the source is exact, else 2%."""
    spec = cc.load_spec(name)
    total = cc.inspect(name).params_total
    if spec.reference.exact:
        assert total == spec.reference.params
    else:
        assert abs(total - spec.reference.params) / spec.reference.params < 0.02 and spec.reference.note


def test_every_expected_count_has_a_preset():
    assert sorted(ZOO_PARAMS) == sorted(p.stem for p in zoo.zoo_dir().glob("*.yaml"))


# ---------------------------------------------------------------- list, schema


def test_list_primitives(capsys):
    code, out, _ = run(capsys, "list", "primitives")
    assert code == 0
    lines = out.splitlines()
    primitives = cc.all_primitives()
    named = {line.split()[0]: line for line in lines if line and not line.startswith(" ")}
    assert list(named) == list(primitives)
    for name, primitive in primitives.items():
        assert primitive.equation in named[name] and primitive.kind in named[name]
        assert f"  {primitive.description}" in out
    assert named["mssa"].split()[1] == "compress" and "003 eq. 10-12, 115; Alg. 3" in named["mssa"]
    assert named["ista"].split()[1] == "sparsify" and "003 eq. 17; Alg. 3" in named["ista"]


def test_list_zoo(capsys):
    code, out, _ = run(capsys, "list", "zoo")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    zoo_names = sorted(path.stem for path in (ROOT / "zoo").glob("*.yaml"))
    assert names[: len(zoo_names)] == zoo_names  # the zoo first, by name; then the specs
    assert set(names) == set(cc.presets())
    line = next(line for line in out.splitlines() if line.startswith("crate-tiny "))
    assert "CRATE-T/16" in line and "6.09M" in line


def test_schema_is_json(capsys):
    code, out, _ = run(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and schema["title"] == "crate-compose spec"
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "mssa" in schema["$defs"]["Step"]["properties"]["primitive"]["enum"]


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["build"])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        cli.main(["build", "crate-tiny", "--dtype", "int8"])
    assert exit_.value.code == 2
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_an_argument_error_is_one_line_and_a_pointer_to_help(capsys):
    """Not the whole usage first (train's is 36 lines): what is wrong, and where the options are listed."""
    for argv, said in (
        (
            ["train", "crate-digits", "--steps", "x"],
            "crate-compose train: error: argument --steps: 'x' is not a whole number",
        ),
        (
            ["ablate", "crate-digits", "--launcher", "cloud"],
            "crate-compose ablate: error: argument --launcher: invalid choice: 'cloud'",
        ),
    ):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert stop.value.code == 2 and len(lines) == 2 and lines[0].startswith(said), err
        assert lines[1] == f"({' '.join(['crate-compose', argv[0]])} --help lists the options)" and "usage:" not in err

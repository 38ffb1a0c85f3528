"""The spec language: extends, ${size} references, --set overrides, load/dump round trips, the
JSON Schema, user primitives, and no code import by dotted path."""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import jsonschema  # a dev dependency (pyproject.toml [dev]): the schema test must run, never skip
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field
from torch import nn

import crate_compose as cc
from crate_compose import cli, registering, registry
from crate_compose.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
CRATE_YAML = ROOT / "specs" / "crate.yaml"
SMALL = [
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=2",
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.classes=10",
]
PRESETS = sorted(cc.presets())


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def data(spec: cc.Spec) -> dict:
    return spec.model_dump(mode="json")


# ---------------------------------------------------------------- extends


def test_zoo_presets_change_only_sizes_and_labels():
    parent, child = cc.load_spec(CRATE_YAML), cc.load_spec("crate-tiny")
    assert child.sizes == {**parent.sizes, "d": 384, "heads": 6, "head_dim": 64, "depth": 12}
    assert list(child.sizes) == list(parent.sizes)  # merged in place, the parent's order kept
    same_sizes = cc.load_spec(CRATE_YAML, [f"sizes.{k}={v}" for k, v in child.sizes.items()])
    different = {k for k in data(child) if data(child)[k] != data(same_sizes)[k]}
    assert different == {"name", "description", "reference"}
    assert child.preprocess[0].args["dim"] == 384 and child.encoder.layer[0].args["heads"] == 6


def test_a_child_overriding_sizes_only(tmp_path):
    path = write(tmp_path, f"extends: {CRATE_YAML}\nsizes:\n  d: 64\n  heads: 4\n")
    spec = cc.load_spec(path)
    network = {"name", "description"}
    same = cc.load_spec(CRATE_YAML, ["sizes.d=64", "sizes.heads=4"])
    assert spec.model_dump(exclude=network) == same.model_dump(exclude=network)
    assert spec != cc.load_spec(CRATE_YAML, ["sizes.d=64"])  # equality compares content
    # a child that changes the network is a variant: its own name (the file's), no inherited paper count
    assert spec.name == path.stem and spec.reference is None
    assert same.name == "crate-base.d-64.heads-4" and same.reference is None
    assert spec.preprocess[0].args["dim"] == 64 and spec.encoder.layer[0].args["heads"] == 4


def test_mappings_merge_key_by_key(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encoder:
          depth: 3
        reference:
          params: 5
        input:
          name: pixels
        """,
    )
    spec = cc.load_spec(path)
    assert spec.encoder.depth == 3
    assert [s.name for s in spec.encoder.layer] == ["compress", "sparsify"]  # kept from the parent
    assert spec.reference.params == 5 and spec.reference.source == "003 Table 1"
    assert spec.input.name == "pixels" and spec.input.shape == [3, 224, 224]


def test_lists_replace_wholesale(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encoder:
          layer:
            - name: sparsify
              primitive: ista_soft
        input:
          shape: [3, 64, 64]
        """,
    )
    spec = cc.load_spec(path)
    assert [(s.name, s.primitive) for s in spec.encoder.layer] == [("sparsify", "ista_soft")]
    assert spec.encoder.layer[0].args == {
        "step_size": 0.1,
        "lambd": 0.1,
        "norm": True,
        "eps": 1e-5,
    }  # not merged by index
    assert spec.encoder.depth == 12 and spec.input.shape == [3, 64, 64]


def test_extends_chains_and_is_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "nested").mkdir()
    write(tmp_path, "extends: crate-tiny\nname: middle\nsizes: {depth: 3}\n", "middle.yaml")
    leaf = write(tmp_path, "extends: ../middle.yaml\nname: leaf\nsizes: {heads: 3}\n", "nested/leaf.yaml")
    monkeypatch.chdir(ROOT / "docs")  # not where the files are
    spec = cc.load_spec(leaf)
    assert (spec.name, spec.encoder.depth, spec.encoder.layer[0].args["heads"], spec.sizes["d"]) == ("leaf", 3, 3, 384)
    assert spec.extends is None


def test_extends_a_relative_path_to_the_specs_folder():
    tiny = cc.load_spec(ROOT / "zoo" / "crate-tiny.yaml")
    assert tiny == cc.load_spec("crate-tiny")


# ---------------------------------------------------------------- ${size} references


def test_references_keep_the_type_of_the_size(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        sizes: {lam: 0.5, flag: false, pool_mode: mean, hidden: "${d}"}
        encoder:
          depth: ${depth}
          layer:
            - {name: compress, primitive: mssa, args: {heads: "${heads}", head_dim: "${hidden}", norm: "${flag}"}}
            - {name: sparsify, primitive: ista, args: {lambd: "${ lam }"}}
        head:
          - {name: classify, primitive: classify, args: {classes: "${classes}", pool: "${pool_mode}"}}
        """,
    )
    spec = cc.load_spec(path)
    compress, sparsify = spec.encoder.layer
    assert type(spec.encoder.depth) is int and spec.encoder.depth == 12
    assert type(compress.args["heads"]) is int and compress.args["heads"] == 6
    assert type(spec.sizes["hidden"]) is int and compress.args["head_dim"] == 384
    assert compress.args["norm"] is False
    assert type(sparsify.args["lambd"]) is float and sparsify.args["lambd"] == 0.5
    assert spec.head[0].args == {"classes": 1000, "pool": "mean", "norm": True, "eps": 1e-5}
    assert spec.input.shape == [3, 224, 224] and all(type(s) is int for s in spec.input.shape)


def test_references_interpolate_inside_strings(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        name: crate-${d}-L${depth}
        description: "d=${d}, K=${heads}, ratio ${ratio}"
        sizes: {ratio: 0.25}
        """,
    )
    spec = cc.load_spec(path)
    assert spec.name == "crate-384-L12"
    assert spec.description == "d=384, K=6, ratio 0.25"


def test_overrides_flow_through_references():
    spec = cc.load_spec("crate-tiny", ["sizes.d=64"])
    assert spec.sizes["d"] == 64 and type(spec.sizes["d"]) is int
    assert spec.preprocess[0].args["dim"] == 64


# ---------------------------------------------------------------- --set


@pytest.mark.parametrize(
    "override",
    [
        "encoder.layer.1.args.lambd=0.5",
        "encoder.layer[1].args.lambd=0.5",
        "encoder.layer[sparsify].args.lambd=0.5",
        "encoder.layer.sparsify.args.lambd=0.5",
        "encoder.layer.-1.args.lambd=0.5",
        " encoder.layer.1.args.lambd =0.5",
    ],
)
def test_override_a_step_argument(override):
    spec = cc.load_spec("crate-tiny", [override])
    assert spec.encoder.layer[1].args["lambd"] == 0.5
    assert spec.encoder.layer[0] == cc.load_spec("crate-tiny").encoder.layer[0]


def test_override_a_primitive_by_step_name():
    spec = cc.load_spec("crate-tiny", ["encoder.layer.sparsify.primitive=ista_soft"])
    assert [s.primitive for s in spec.encoder.layer] == ["mssa", "ista_soft"]
    model = cc.build(spec, meta=True)
    assert model.get_submodule("encoder.layer_11.sparsify").threshold == "soft"


@pytest.mark.parametrize(
    "override, where, value",
    [
        ("sizes.flag=true", ("sizes", "flag"), True),
        ("sizes.d=8", ("sizes", "d"), 8),
        ("sizes.tag='8'", ("sizes", "tag"), "8"),
        ("sizes.ratio=0.5", ("sizes", "ratio"), 0.5),
        ("description=", ("description",), ""),
        ("description=two words", ("description",), "two words"),
        ("input.shape=[1, 2]", ("input", "shape"), [1, 2]),
        ("encoder.layer.compress.args.head_dim=null", ("encoder", "layer", 0, "args", "head_dim"), None),
        ("encoder.layer.compress.args.causal=yes", ("encoder", "layer", 0, "args", "causal"), True),
        ("encoder.layer.compress.args.head_dim=${heads}", ("encoder", "layer", 0, "args", "head_dim"), 6),
    ],
)
def test_override_values_are_yaml(override, where, value):
    uses = [f"description=size ${{{where[1]}}}"] if where[0] == "sizes" else []  # a size an override creates is used
    node = data(cc.load_spec("crate-tiny", [override, *uses]))
    for part in where:
        node = node[part]
    assert node == value and type(node) is type(value)


def test_override_a_whole_mapping_and_later_overrides_win():
    spec = cc.load_spec("crate-tiny", ["encoder.layer.sparsify.args={lambd: 0.2}", "sizes.d=16", "sizes.d=24"])
    assert spec.encoder.layer[1].args == {"step_size": 0.1, "lambd": 0.2, "norm": True, "eps": 1e-5}
    assert spec.sizes["d"] == 24


def test_override_adds_a_step_argument_and_defaults_are_written_out():
    spec = cc.load_spec("crate-tiny", ["encoder.layer.compress.args.causal=true"])
    assert spec.encoder.layer[0].args == {
        "heads": 6,
        "head_dim": 64,
        "output": "learned",
        "bias": True,
        "causal": True,
        "step_size": 1.0,
        "norm": True,
        "eps": 1e-5,
        "kappa": None,
        "rate_eps": 0.5,
    }


def test_overrides_do_not_touch_the_file(tmp_path):
    path = write(tmp_path, "extends: crate-tiny\nsizes: {d: 48}\n")
    before = path.read_text()
    assert cc.load_spec(path, ["sizes.d=16"]).sizes["d"] == 16
    assert path.read_text() == before and cc.load_spec(path).sizes["d"] == 48


def test_loading_a_dict_does_not_mutate_it():
    raw = yaml.safe_load(cc.dump_spec(cc.load_spec("crate-tiny", SMALL)))
    snapshot = json.dumps(raw, sort_keys=True)
    spec = cc.load_spec(raw, ["sizes.d=64", "encoder.layer.1.args.lambd=0.3"])
    assert spec.sizes["d"] == 64 and spec.encoder.layer[1].args["lambd"] == 0.3
    assert json.dumps(raw, sort_keys=True) == snapshot


# ---------------------------------------------------------------- load -> dump -> load


def roundtrip(spec: cc.Spec) -> tuple[cc.Spec, str]:
    text = cc.dump_spec(spec)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "dumped.yaml"
        path.write_text(text)
        return cc.load_spec(path), text


@pytest.mark.parametrize("ref", [*PRESETS, str(CRATE_YAML)])
def test_dump_then_load_gives_the_same_spec(ref):
    spec = cc.load_spec(ref)
    again, text = roundtrip(spec)
    assert again == spec
    assert data(again) == data(spec)
    assert cc.dump_spec(again) == text  # dumping is stable
    assert "${" not in text and "extends" not in text
    raw = yaml.safe_load(text)
    assert "extends" not in raw and raw["name"] == spec.name
    for step in raw["encoder"]["layer"]:  # every default written out
        assert set(step["args"]) == set(registry.get(step["primitive"]).args.model_fields)


def test_dumped_spec_builds_the_same_network():
    spec = cc.load_spec("crate-tiny", SMALL)
    again, _ = roundtrip(spec)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(cc.build(spec, seed=3)(x)["output"], cc.build(again, seed=3)(x)["output"])


def crate_params(d: int, heads: int, head_dim: int, depth: int, patch: int, grid: int, classes: int) -> int:
    """CRATE's parameter count written out (003 App. B.1), independent of the builder."""
    patch_dim = 3 * patch * patch
    embed = 2 * patch_dim + patch_dim * d + d + 2 * d  # LN, Linear, LN
    tokens = d + (grid * grid + 1) * d  # class token, positions
    mssa = 2 * d + d * heads * head_dim + heads * head_dim * d + d  # LN, U, output Linear
    ista = 2 * d + d * d  # LN, D
    head = 2 * d + d * classes + classes  # LN, Linear
    return embed + tokens + depth * (mssa + ista) + head


def test_parameter_formula_matches_a_known_build():
    assert crate_params(384, 6, 64, 12, 16, 14, 1000) == 6_090_856  # CRATE-T/16, paper 003 Table 1


SIZES = dict(
    heads=st.integers(1, 4),
    per_head=st.sampled_from([2, 4, 8]),
    head_dim=st.sampled_from([4, 8, 16]),
    depth=st.integers(1, 2),
    patch=st.sampled_from([2, 4, 8]),
    grid=st.integers(1, 4),
    classes=st.integers(1, 20),
)


def size_overrides(heads, per_head, head_dim, depth, patch, grid, classes) -> list[str]:
    return [
        f"sizes.d={heads * per_head}",
        f"sizes.heads={heads}",
        f"sizes.head_dim={head_dim}",
        f"sizes.depth={depth}",
        f"sizes.patch_size={patch}",
        f"sizes.image_size={patch * grid}",
        f"sizes.classes={classes}",
    ]


@settings(max_examples=25, deadline=None)
@given(
    **SIZES,
    lambd=st.floats(0, 1, allow_nan=False),
    step_size=st.floats(1e-3, 1, allow_nan=False),
    pool=st.sampled_from(["cls", "mean"]),
    causal=st.booleans(),
    soft=st.booleans(),
)
def test_roundtrip_property(
    heads, per_head, head_dim, depth, patch, grid, classes, lambd, step_size, pool, causal, soft
):
    overrides = [
        *size_overrides(heads, per_head, head_dim, depth, patch, grid, classes),
        f"encoder.layer.sparsify.args.lambd={lambd!r}",
        f"encoder.layer.sparsify.args.step_size={step_size!r}",
        f"head.0.args.pool={pool}",
        f"encoder.layer.compress.args.causal={str(causal).lower()}",
        f"encoder.layer.sparsify.primitive={'ista_soft' if soft else 'ista'}",
    ]
    spec = cc.load_spec("crate-tiny", overrides)
    again, text = roundtrip(spec)
    assert again == spec
    assert "${" not in text and "extends" not in text
    assert again.sizes["d"] == heads * per_head and again.encoder.depth == depth
    assert again.encoder.layer[1].args["lambd"] == lambd  # floats survive YAML exactly
    assert again.encoder.layer[1].args["step_size"] == step_size
    assert again.head[0].args["pool"] == pool and again.encoder.layer[0].args["causal"] is causal


@settings(max_examples=10, deadline=None)
@given(**SIZES)
def test_random_sizes_build_with_the_expected_shapes_and_parameters(
    heads, per_head, head_dim, depth, patch, grid, classes
):
    d = heads * per_head
    summary = cc.inspect("crate-tiny", size_overrides(heads, per_head, head_dim, depth, patch, grid, classes))
    assert summary.input_shape == ["B", 3, patch * grid, patch * grid]
    assert summary.output_shape == ["B", classes]
    assert summary.steps[-2].output_shape == ["B", grid * grid + 1, d]
    assert summary.params_total == crate_params(d, heads, head_dim, depth, patch, grid, classes)


# ---------------------------------------------------------------- JSON Schema


def walk_properties(node, where=()):
    """Every (path, property schema) under any 'properties' mapping, recursively."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for name, prop in value.items():
                    yield (*where, name), prop
            yield from walk_properties(value, (*where, key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from walk_properties(item, (*where, i))


def test_schema_describes_every_property():
    schema = cc.json_schema()
    found = list(walk_properties(schema))
    assert len(found) > 50  # the walk reached the definitions
    assert {path[1] for path, _ in found if path[0] == "$defs"} >= {"Step", "Stack", "Input", "args_mssa", "args_ista"}
    undocumented = [path for path, prop in found if not prop.get("description") and "const" not in prop]
    assert undocumented == []
    for name, definition in schema["$defs"].items():
        assert definition.get("description"), f"$defs.{name} has no description"
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_schema_lists_every_primitive():
    schema = cc.json_schema()
    names = list(cc.all_primitives())
    assert {"mssa", "ista", "ista_soft", "patch_embed", "classify"} <= set(names)
    step = schema["$defs"]["Step"]
    assert step["properties"]["primitive"]["enum"] == names
    branches = {b["if"]["properties"]["primitive"]["const"]: b["then"] for b in step["allOf"]}
    assert set(branches) == set(names)
    for name in names:
        assert branches[name]["properties"]["args"]["$ref"] == f"#/$defs/args_{name}"
        assert set(schema["$defs"][f"args_{name}"].get("properties", {})) == set(
            cc.all_primitives()[name].args.model_fields
        )
    assert "003 eq. 17" in schema["$defs"]["args_ista"]["description"]


@functools.cache
def validator() -> jsonschema.Draft202012Validator:
    """The built-in primitives' schema (built once: checking it is the slow part)."""
    schema = cc.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("ref", PRESETS)
def test_dumped_presets_validate_against_the_schema(ref):
    dumped = yaml.safe_load(cc.dump_spec(cc.load_spec(ref)))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(dumped)]
    assert errors == []


@pytest.mark.parametrize("path", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.name)
def test_written_specs_with_references_validate_against_the_schema(path):
    raw = yaml.safe_load(path.read_text())
    assert "extends" not in raw  # full specs; children of 'extends' are partial by design
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(raw)]
    assert errors == []


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["encoder"]["layer"][0]["args"].update(haeds=2), "'haeds' was unexpected"),
        (lambda d: d["encoder"]["layer"][1].update(primitive="istaa"), "'istaa' is not one of"),
        (lambda d: d["encoder"].update(depth="six"), "is not valid under any of the given schemas"),
        (lambda d: d["encoder"].update(depth="x${depth}"), "is not valid under any of the given schemas"),
        (lambda d: d.pop("encoder"), "'encoder' is a required property"),
        (lambda d: d.update(encodr={}), "'encodr' was unexpected"),
    ],
)
def test_schema_rejects_what_the_loader_rejects(change, message):
    dumped = yaml.safe_load(cc.dump_spec(cc.load_spec("crate-tiny")))
    change(dumped)
    messages = [e.message for e in validator().iter_errors(dumped)]
    assert any(message in m for m in messages), messages
    with pytest.raises(SpecError):
        cc.load_spec(dumped)


def test_schema_command_prints_the_schema(capsys):
    assert cli.main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == cc.json_schema()


# ---------------------------------------------------------------- user primitives


class ScaleArgs(cc.Args):
    factor: float = Field(default=2.0, gt=0, description="Multiply the tokens by this.")


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


@pytest.fixture
def scale():
    """A primitive registered by 'user code', under a fresh name; unregistered afterwards."""
    name = f"scale_{uuid.uuid4().hex[:8]}"

    @cc.primitive(
        name,
        args=ScaleArgs,
        kind="sparsify",
        objective="none (a test step)",
        equation="test eq. 1",
        update="a Z",
        description="Scale the tokens by a constant.",
    )
    def build_scale(args: ScaleArgs, shape: tuple[int, ...]) -> nn.Module:
        registry.token_dim(shape, name)
        return Scale(args.factor)

    yield name
    registry._REGISTRY.pop(name, None)


def test_user_primitive_via_override(scale):
    model = cc.build(
        "crate-tiny",
        overrides=[*SMALL, f"encoder.layer.sparsify.primitive={scale}", "encoder.layer.sparsify.args={factor: 3}"],
    )
    step = model.get_submodule("encoder.layer_1.sparsify")
    assert isinstance(step, Scale) and step.factor == 3.0
    x = torch.randn(2, 17, 32)
    torch.testing.assert_close(step(x), 3 * x)
    primitives = [n.meta["primitive"] for n in model.graph.nodes if n.op == "call_module" and n.target != "cast"]
    assert primitives.count(scale) == 2
    assert model(torch.randn(2, 3, 32, 32))["output"].shape == (2, 10)


def test_user_primitive_in_a_written_spec_with_its_arguments_checked(scale, tmp_path, capsys):
    path = write(
        tmp_path,
        f"""\
        extends: crate-tiny
        encoder:
          layer:
            - name: compress
              primitive: mssa
              args: {{heads: 2, head_dim: 16}}
            - name: shrink
              primitive: {scale}
        """,
    )
    spec = cc.load_spec(path, SMALL)
    assert spec.encoder.layer[1].args == {"factor": 2.0}  # its own default
    assert isinstance(cc.build(spec).get_submodule("encoder.layer_0.shrink"), Scale)
    with pytest.raises(SpecError) as caught:
        cc.load_spec(path, ["encoder.layer.shrink.args.factr=1", "encoder.layer.shrink.args.factor=-1"])
    problems = {p.path[-1]: p for p in caught.value.problems}
    assert problems["factr"].hint == "did you mean 'factor'?"
    assert "greater than 0" in problems["factor"].message
    assert scale in cc.json_schema()["$defs"]["Step"]["properties"]["primitive"]["enum"]
    assert cli.main(["list", "primitives"]) == 0
    assert any(line.split()[:3] == [scale, "sparsify", "a"] for line in capsys.readouterr().out.splitlines())


def test_a_primitive_must_be_registered(scale):
    registry._REGISTRY.pop(scale)
    with pytest.raises(SpecError) as caught:
        cc.load_spec("crate-tiny", [f"encoder.layer.sparsify.primitive={scale}x"])
    assert caught.value.problems[0].message.startswith(f"unknown primitive '{scale}x'")


# ---------------------------------------------------------------- no import by dotted path


@pytest.mark.parametrize(
    "name", ["os.system", "torch.nn.Linear", "canary_mod.Canary", "canary_mod:Canary", "builtins.eval", "__import__"]
)
def test_a_spec_cannot_import_code_by_dotted_path(name, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "canary_mod.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\nclass Canary: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "canary_mod", raising=False)
    monkeypatch.setattr("os.system", lambda *a: pytest.fail("os.system was called"))
    imported: list[str] = []
    real_import_module = registry.import_module
    for module in (registry, registering):  # the plug-ins' import, and the registries' of their built-in modules
        monkeypatch.setattr(
            module, "import_module", lambda mod, *a: imported.append(mod) or real_import_module(mod, *a)
        )
    before = set(sys.modules)
    path = write(tmp_path, f"extends: crate-tiny\nencoder:\n  layer:\n    - {{name: step, primitive: '{name}'}}\n")
    with pytest.raises(SpecError) as caught:
        cc.load_spec(path)
    (problem,) = caught.value.problems
    assert problem.message.startswith(f"unknown primitive '{name}'; expected one of: ")
    assert problem.path == ("encoder", "layer", 0, "primitive")
    assert "canary_mod" not in sys.modules and not marker.exists()
    assert set(sys.modules) - before == set()
    assert set(imported) <= set(registry.BUILTIN)

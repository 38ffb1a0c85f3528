"""The primitive registry: metadata every primitive must carry, inverse rules, plugins."""

from importlib import metadata

import pytest
import torch
from pydantic import Field, ValidationError
from torch import nn

import crate_compose as cc
from crate_compose import registry

SMALL = [
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=1",
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.classes=10",
]


@pytest.mark.parametrize("name", list(cc.all_primitives()))
def test_every_primitive_documents_itself(name):
    primitive = cc.all_primitives()[name]
    for field in ("objective", "equation", "description"):
        assert getattr(primitive, field).strip(), f"{name} has no {field}"
    assert primitive.update_for().strip(), f"{name} has no update"
    assert primitive.kind in registry.KINDS
    for arg, info in primitive.args.model_fields.items():
        assert info.description, f"{name}.{arg} has no description"
    with pytest.raises(ValidationError):
        primitive.args.model_validate({"no_such_argument": 1})


@pytest.mark.parametrize("name", [n for n, p in cc.all_primitives().items() if p.inverse and p.inverse.primitive])
def test_inverse_rules_name_registered_primitives(name):
    assert cc.all_primitives()[name].inverse.primitive in cc.all_primitives()


def test_crate_steps_have_the_papers_inverses():
    primitives = cc.all_primitives()
    assert primitives["ista"].inverse.primitive == "dictionary"
    assert primitives["ista_soft"].inverse.primitive == "dictionary"
    assert primitives["mssa"].inverse.primitive == "mssa_ascent"
    assert primitives["mhsa"].inverse is None and primitives["mlp"].inverse is None


def test_registration_rejects_bad_names_and_duplicates():
    with pytest.raises(ValueError, match="identifier"):
        cc.primitive("not a name", kind="compress", objective="o", equation="e", update="u", description="d")
    with pytest.raises(ValueError, match="already registered"):
        cc.primitive("mssa", kind="compress", objective="o", equation="e", update="u", description="d")(
            lambda args, shape: nn.Identity()
        )
    with pytest.raises(ValueError, match="kind"):
        cc.primitive("fresh_name", kind="magic", objective="o", equation="e", update="u", description="d")


class HalveArgs(cc.Args):
    factor: float = Field(default=0.5, description="Multiplier.")


class Halve(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def _plugin_module():
    @cc.primitive(
        "plugin_halve",
        args=HalveArgs,
        kind="sparsify",
        objective="none",
        equation="plugin eq. 1",
        update="Z / 2",
        description="Halve the tokens (a plugin's primitive).",
    )
    def plugin_halve(args, shape):
        return Halve(args.factor)


def test_entry_point_plugins_are_loaded_on_first_use(monkeypatch):
    class FakeEntryPoint:
        name = "halve"

        def load(self):
            _plugin_module()

    def entry_points(group):
        return [FakeEntryPoint()] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)
    monkeypatch.setattr(metadata, "entry_points", entry_points)
    monkeypatch.delitem(registry._REGISTRY, "plugin_halve", raising=False)
    assert "plugin_halve" in cc.all_primitives()
    model = cc.build(
        "crate-tiny",
        overrides=[*SMALL, "encoder.layer.sparsify.primitive=plugin_halve", "encoder.layer.sparsify.args={}"],
    )
    x = torch.randn(2, 17, 32)
    torch.testing.assert_close(model.get_submodule("encoder.layer_0.sparsify")(x), x / 2)
    registry._REGISTRY.pop("plugin_halve")


def test_a_broken_entry_point_plugin_is_reported_on_every_look_up(monkeypatch, capsys):
    class BrokenEntryPoint:
        name, value = "broken", "broken_pkg.steps"

        def load(self):
            raise ImportError("No module named 'broken_pkg'")

    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)
    monkeypatch.setattr(registry, "_PLUGIN_FAILURES", [])
    monkeypatch.setattr(metadata, "entry_points", lambda group: [BrokenEntryPoint()])
    for _ in range(2):  # not only the first time: a half-loaded registry would build other networks silently
        with pytest.raises(registry.PluginError, match="broken .broken_pkg.steps.: ImportError"):
            cc.all_primitives()
    assert crate_compose_cli_main(["list", "primitives"]) == 2
    assert "primitive plugins failed to load" in capsys.readouterr().err


def crate_compose_cli_main(argv):
    from crate_compose import cli

    return cli.main(argv)


def test_schema_and_listings_show_updates_as_text(capsys):
    schema = cc.json_schema()
    for name in cc.all_primitives():
        assert "<function" not in schema["$defs"][f"args_{name}"]["description"], name
    needs_arguments = registry.Primitive(
        "needs", lambda a, s: nn.Identity(), HalveArgs, "sparsify", "o", "e", lambda args: f"{args.factor} Z", "d"
    )
    assert needs_arguments.update_for() == "0.5 Z"  # defaults
    dictionary = cc.all_primitives()["dictionary"]
    assert dictionary.update_for({"norm": False}) == "E · Z" and dictionary.update_for({}) == "E · LN Z"
    assert cc.all_primitives()["mssa"].update_for({}) == "(depends on its arguments)"  # heads is required


# ---------------------------------------------------------------- plug-ins that misbehave: one located line, exit 2

CLASH = """\
import crate_compose as cc
from torch import nn

@cc.primitive("ista", kind="sparsify", objective="o", equation="e", update="u", description="d")
def ista(args, shape):
    return nn.Identity()
"""

EXIT = """\
import sys
sys.exit(7)
"""

WRONG_FOOTPRINT = """\
import crate_compose as cc
from torch import nn

def footprint(args, shape, context):
    return cc.Footprint(shape, {"weight": (3,)})  # the module below has no parameter

@cc.primitive("identity_wrong_footprint", kind="sparsify", objective="o", equation="e", update="Z",
              description="d", footprint=footprint)
def identity(args, shape):
    return nn.Identity()
"""


@pytest.fixture
def plugin_file(tmp_path, monkeypatch):
    """Write a plug-in file; the modules and primitives it leaves behind are removed after the test."""
    import sys

    def write(name, text):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        monkeypatch.delitem(sys.modules, f"crate_compose_plugin_{name}", raising=False)  # restored after
        return path

    before = set(registry._REGISTRY)
    yield write
    for name in set(registry._REGISTRY) - before:
        registry._REGISTRY.pop(name)


def test_a_plugin_reusing_a_built_in_name_is_refused_at_its_line(plugin_file, capsys):
    path = plugin_file("clash", CLASH)
    code = crate_compose_cli_main(["validate", "specs/crate-digits.yaml", "--plugin", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(
        f"error: {path}:4: --plugin {path}: ValueError: primitive 'ista' is already registered by "
        "crate_compose.primitives."
    )
    assert "(a built-in primitive); register yours under another name" in err
    assert registry.get("ista").factory.__module__.startswith("crate_compose.primitives")  # the built-in stays


def test_a_plugin_calling_sys_exit_is_reported_not_obeyed(plugin_file, capsys):
    path = plugin_file("quits", EXIT)
    code = crate_compose_cli_main(["list", "primitives", "--plugin", str(path)])  # returns: no SystemExit escapes
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err == f"error: {path}:2: --plugin {path}: the plug-in called sys.exit(7) while being imported\n"


def test_an_entry_point_calling_sys_exit_is_a_plugin_error(monkeypatch):
    class Quits:
        name, value = "quits", "quits_pkg.steps"

        def load(self):
            raise SystemExit(3)

    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)
    monkeypatch.setattr(registry, "_PLUGIN_FAILURES", [])
    monkeypatch.setattr(metadata, "entry_points", lambda group: [Quits()])
    with pytest.raises(registry.PluginError, match=r"quits \(quits_pkg.steps\): the plug-in called sys.exit\(3\)"):
        cc.all_primitives()


def test_a_plugin_footprint_that_disagrees_with_its_module_is_located_at_the_step(plugin_file, tmp_path, capsys):
    path = plugin_file("wrong_footprint", WRONG_FOOTPRINT)
    swap = "encoder.layer.sparsify.primitive=identity_wrong_footprint"
    code = crate_compose_cli_main(
        ["build", "specs/crate-digits.yaml", "--plugin", str(path), "--set", swap, "--out", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not (tmp_path / "out").exists()
    assert (
        f"--set #1 '{swap}': encoder.layer[1].primitive: step 'sparsify' (identity_wrong_footprint, from "
        f"--plugin {path}): the primitive's footprint disagrees with the module it builds: parameters "
        "{'weight': (3,)} declared, {} built (a bug in the primitive's declaration, not the spec)"
    ) in err

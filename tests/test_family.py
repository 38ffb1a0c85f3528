"""The whole family on one spine: every preset, named stacks, ablation-safe builds, swaps and variants."""

from __future__ import annotations

import ast
import math
import textwrap
from pathlib import Path

import networkx as nx
import pytest
import torch

import crate_compose as cc
from crate_compose import cli
from crate_compose.building import march
from crate_compose.errors import SpecError
from crate_compose.modules.embed import sincos_2d

ROOT = Path(__file__).resolve().parents[1]
PRESETS = cc.presets()

# Small sizes for a forward pass of any preset: each applies only where the preset declares that size.
SMALL_SIZES = {
    "image_size": 32,
    "d": 32,
    "heads": 2,
    "head_dim": 16,
    "depth": 1,
    "class_depth": 1,
    "classes": 10,
    "tokens": 12,
    "subspaces": 2,
    "subspace_dim": 16,
    "vocab": 64,
    "context": 16,
}
TINY = [
    "sizes.d=32",
    "sizes.heads=2",
    "sizes.head_dim=16",
    "sizes.depth=2",
    "sizes.image_size=32",
    "sizes.patch_size=8",
    "sizes.classes=10",
]


def small(preset: str) -> list[str]:
    sizes = cc.load_spec(preset).sizes
    return [f"sizes.{key}={value}" for key, value in SMALL_SIZES.items() if key in sizes]


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- every preset


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_counts_what_it_states(preset):
    summary = cc.inspect(preset)
    reference = summary.reference
    if reference is None:
        assert cc.load_spec(preset).reference is None
        return
    if reference["exact"]:
        assert summary.params_total == reference["params"], reference["source"]
    else:
        assert abs(reference["deviation"]) < 0.02 and reference["note"], "an inexact count must say why"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_forward_on_a_small_input(preset):
    """The forward runs, finite and of the summarized shape; and under bf16 autocast on torch's own CPU kernels (an
    AVX2-only CPU), every product has one operand transposed, as ``nn.Linear``'s has (there a bf16 product of two
    row-major operands is about 20x slower; each primitive alone: tests/test_every_primitive.py)."""
    from test_every_primitive import RowMajorProducts, torchs_own_kernels

    model = cc.build(preset, overrides=small(preset))
    spec = cc.spec_of(model)
    if spec.input.dtype == "int64":  # token ids, a shorter sequence than the context
        x = torch.randint(0, 64, (2, spec.input.shape[0] - 3))
    else:
        x = torch.randn(2, *spec.input.shape)
    out = model(x)
    assert set(out) >= {"output"} and torch.isfinite(out["output"]).all()
    expected = list(cc.summarize(model).output_shape[1:])
    if spec.input.dtype == "int64" and len(expected) == 2:  # per token (a classifier of token ids: per sequence)
        expected[0] = x.shape[1]
    assert out["output"].shape[1:] == tuple(expected)
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        torchs_own_kernels(),
        RowMajorProducts() as found,
    ):
        model(x)
    assert not found.found, f"{preset}: row-major half products {found.found}"


EXACT = {  # the counts the papers give exactly (README.md, docs/language.md)
    "tost-tiny": 5_769_328,
    "tost-small": 22_589_944,
    "vit-tiny": 5_717_416,
    "vit-small": 22_050_664,
    "crate-alpha-base16": 72_328_936,
}


@pytest.mark.parametrize("preset, count", EXACT.items())
def test_family_counts(preset, count):
    assert cc.inspect(preset).params_total == count


def test_crate_alpha_is_within_half_a_percent_of_the_paper_and_says_why():
    summary = cc.inspect("crate-alpha-base16")
    assert abs(summary.params_total - 72_300_000) / 72_300_000 < 0.005
    assert "72,328,936" in summary.reference["note"]
    with_layer_scale = cc.inspect(
        "crate-alpha-base16", ["encoder.layer.compress.layer_scale=1e-5", "encoder.layer.sparsify.layer_scale=1e-5"]
    )
    assert with_layer_scale.params_total == 72_328_936 + 18_432  # the JAX original's ls1/ls2


# ---------------------------------------------------------------- named stacks


def test_tost_runs_class_attention_as_a_stack_of_its_own():
    model = cc.build("tost-tiny", overrides=small("tost-tiny"), meta=True)
    targets = [n.target for n in model.graph.nodes if n.op == "call_module"]
    assert targets[-5:] == [
        "class_attention.class_token",
        "class_attention.layer_0.attend",
        "class_attention.layer_0.mlp",
        "class_attention.norm",
        "head.classify",
    ]
    shapes_ = {row.module: row.output_shape for row in cc.summarize(model).steps}
    assert shapes_["encoder.layer_0.mlp"] == ["B", 4, 32] and shapes_["class_attention.class_token"] == ["B", 5, 32]
    assert "class attention (1 layers)" in cc.diagram(model).source


def test_stack_names_cannot_shadow_the_layout(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: tost-tiny
        stacks:
          head: {depth: 1, layer: [{name: norm, primitive: layernorm}]}
        """,
    )
    with pytest.raises(SpecError, match="stack name 'head'"):
        cc.load_spec(path)


def test_encoder_post_steps_run_after_its_layers():
    model = cc.build("crate-mae-base", overrides=TINY[:-1], meta=True)
    targets = [n.target for n in model.graph.nodes if n.op == "call_module"]
    assert targets.index("encoder.norm") == targets.index("encoder.layer_1.sparsify") + 1


# ---------------------------------------------------------------- per-step seeds and swaps


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "swap",
    [
        "encoder.layer.compress.primitive=tssa",
        "encoder.layer.sparsify.primitive=ista_mm",
        "encoder.layer.sparsify.primitive=ista_soft",
        "sizes.depth=3",
    ],
)
def test_a_variant_keeps_every_other_steps_initial_weights(swap):
    base = _weights(cc.build("crate-tiny", overrides=TINY, seed=7))
    variant = _weights(cc.build("crate-tiny", overrides=[*TINY, swap], seed=7))
    changed = swap.split(".")[2] if swap.startswith("encoder") else "layer_2."
    kept = {k for k in base if changed not in k}
    assert kept and kept <= set(variant)
    for key in kept:
        assert torch.equal(base[key], variant[key]), key
    other_seed = _weights(cc.build("crate-tiny", overrides=TINY, seed=8))
    assert not torch.equal(
        base["encoder.layer_0.compress.subspaces.weight"], other_seed["encoder.layer_0.compress.subspaces.weight"]
    )


def test_a_patch_through_extends_keeps_the_other_weights_too(tmp_path):
    path = write(
        tmp_path,
        f"""\
        extends: {ROOT / "zoo/crate-tiny.yaml"}
        encoder:
          layer:
            sparsify: {{primitive: ista_soft}}
        """,
        "soft.yaml",
    )
    variant = cc.build(path, overrides=TINY, seed=0)
    base = _weights(cc.build("crate-tiny", overrides=TINY, seed=0))
    assert variant.get_submodule("encoder.layer_0.sparsify").threshold == "soft"
    assert all(torch.equal(base[k], v) for k, v in variant.state_dict().items())  # same shapes, same draws


def test_swapping_mssa_for_tssa_drops_the_arguments_tssa_does_not_take():
    spec = cc.load_spec("crate-tiny", ["encoder.layer.compress.primitive=tssa"])
    assert spec.encoder.layer[0].args == {"heads": 6, "causal": False, "norm": True, "eps": 1e-5, "biases": True}
    assert any("swapped mssa -> tssa; dropped head_dim=64" in note for note in spec.notes())
    assert cc.inspect(spec).params_total == 6_090_856 + 12 * (384 + 6)  # TSSA adds a bias and K temperatures
    with pytest.raises(SpecError, match="unknown key 'bogus'"):  # arguments given with the swap are checked
        cc.load_spec("crate-tiny", ["encoder.layer.compress.primitive=tssa", "encoder.layer.compress.args.bogus=1"])


def test_a_swap_that_cannot_fit_says_why_and_what_would():
    with pytest.raises(SpecError) as caught:
        cc.validate("crate-tiny", ["encoder.layer.compress.primitive=fourier_positions"])
    problem = caught.value.problems[0]
    assert problem.path == ("encoder", "layer", 0) and problem.location is not None
    assert "cannot take input of shape (197, 384)" in problem.message
    assert problem.hint.startswith("swapped from mssa; compress steps that fit here: ")
    fits = problem.hint.split(": ", 1)[1].split(", ")
    assert {"mssa", "tssa", "aot", "coding_rate_step"} <= set(fits)


def test_layer_scale_applies_to_residual_steps_only():
    plain = cc.inspect("crate-tiny", TINY).params_total
    scaled = cc.build("crate-tiny", overrides=[*TINY, "encoder.layer.compress.layer_scale=0.25"])
    gamma = scaled.get_submodule("encoder.layer_1.compress").layer_scale
    assert torch.equal(gamma, torch.full((32,), 0.25))
    assert cc.summarize(scaled).params_total == plain + 2 * 32
    with pytest.raises(SpecError, match="layer_scale needs a residual step"):
        cc.validate("crate-tiny", [*TINY, "encoder.layer.sparsify.layer_scale=0.1"])


# ---------------------------------------------------------------- variants: names, references, extends


def test_an_ablated_build_gets_its_own_name_and_no_paper_count(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        cli.main(
            [
                "build",
                "crate-tiny",
                *sum((["--set", o] for o in TINY[:1]), []),
                "--set",
                "encoder.layer.sparsify.primitive=ista_soft",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert (tmp_path / "out" / "crate-tiny.d-32.sparsify-ista_soft" / "model.safetensors").is_file()
    assert not (tmp_path / "out" / "crate-tiny").exists()
    assert "paper:" not in captured.out and "note: reference count dropped" in captured.out  # in the table
    spec = cc.load_spec("crate-tiny", ["encoder.layer.sparsify.primitive=ista_soft", "name=mine"])
    assert spec.name == "mine" and spec.reference is None
    assert cc.load_spec("crate-tiny", ["description=same network"]).reference is not None


def test_extends_drops_a_reference_the_child_no_longer_matches(tmp_path):
    same = write(tmp_path, "extends: crate-tiny\nname: renamed\n", "renamed.yaml")
    assert cc.load_spec(same).reference.params == 6_090_856
    deeper = write(tmp_path, "extends: crate-tiny\nencoder: {depth: 6}\n", "deeper.yaml")
    spec = cc.load_spec(deeper)
    assert spec.name == "deeper" and spec.reference is None
    restated = write(
        tmp_path, "extends: crate-tiny\nname: x\nencoder: {depth: 6}\nreference: {params: 1, source: me}\n"
    )
    assert cc.load_spec(restated).reference.params == 1


def test_extends_patch_of_an_unknown_step_is_located(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: crate-tiny
        encoder:
          layer:
            sparsfy: {primitive: ista_soft}
        """,
    )
    with pytest.raises(SpecError) as caught:
        cc.load_spec(path)
    problem = caught.value.problems[0]
    assert "no step named 'sparsfy'" in problem.message and problem.hint == "did you mean 'sparsify'?"
    assert problem.location.line == 4


# ---------------------------------------------------------------- derived decoders keep their sizes


def test_derived_spec_keeps_size_references(tmp_path, capsys):
    out = tmp_path / "derived.yaml"
    assert cli.main(["derive", "specs/mae.yaml", "--out", str(out)]) == 0
    text = out.read_text()
    assert "heads: '${heads}'" in text and "patch_size: '${patch_size}'" in text and "depth: ${depth}" in text
    small_model = cc.inspect(
        out, ["sizes.d=64", "sizes.heads=2", "sizes.head_dim=32", "sizes.depth=1", "sizes.image_size=32"]
    )
    rows = {row.module: row for row in small_model.steps}
    assert rows["decoder.layer_0.inverse_compress"].output_shape == ["B", 5, 64]
    assert len([r for r in small_model.steps if r.role == "decoder" and r.layer is not None]) == 2


# ---------------------------------------------------------------- inputs, grids, dtypes


def test_sine_cosine_positions_follow_a_rectangular_grid():
    model = cc.build("crate-mae-base", overrides=[*TINY[:-1], "input.shape=[3, 32, 16]"])
    table = model.get_submodule("preprocess.positions").embedding[0]
    assert table.shape == (1 + 8, 32)
    torch.testing.assert_close(table, sincos_2d(32, (4, 2), leading=1))
    assert model(torch.randn(1, 3, 32, 16))["output"].shape == (1, 8, 192)


def test_positions_after_a_dropping_mask_are_refused(tmp_path):
    path = write(
        tmp_path,
        """\
        extends: mae-drop
        preprocess:
          - {name: patch_embed, primitive: patch_embed, args: {patch_size: 16, dim: 64}}
          - {name: mask, primitive: mask, args: {mode: drop}}
          - {name: positions, primitive: positions, args: {init: sincos2d}}
        """,
    )
    with pytest.raises(SpecError) as caught:
        cc.validate(path, ["sizes.image_size=32", "sizes.d=64", "sizes.heads=2", "sizes.head_dim=32"])
    problem = caught.value.problems[0]
    assert "add positions before the mask" in problem.message and problem.location.line == 5


def test_float64_weights_are_drawn_in_float64():
    model = cc.build("crate-tiny", overrides=TINY, dtype="float64")
    weight = model.get_submodule("encoder.layer_0.compress").subspaces.weight
    assert weight.dtype == torch.float64
    assert not torch.equal(weight, weight.float().double())  # not float32 draws cast up


def test_a_half_precision_model_casts_float32_inputs():
    model = cc.build("crate-tiny", overrides=TINY, dtype="bfloat16")
    out = model(torch.randn(2, 3, 32, 32))["output"]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    tokens = cc.build("aot-subspaces", dtype="float64")
    assert tokens(torch.randn(1, 48, 96))["output"].dtype == torch.float64


# ---------------------------------------------------------------- AoT on the data of Theorem 5.1, through the spec


def test_aot_spec_raises_every_subspace_snr_layer_after_layer():
    spec = cc.load_spec("aot-subspaces")
    K, p, n, delta = spec.sizes["subspaces"], spec.sizes["subspace_dim"], spec.sizes["tokens"], 0.05
    eta, tau = spec.sizes["step_size"], spec.sizes["tau"]
    gen = torch.Generator().manual_seed(0)
    U, _ = torch.linalg.qr(torch.randn(K * p, K * p, generator=gen, dtype=torch.float64))  # orthonormal U_1..U_K
    labels = torch.arange(n) % K
    coeffs = torch.randn(n, K, p, generator=gen, dtype=torch.float64) * delta  # e_ij
    coeffs[torch.arange(n), labels] = torch.randn(n, p, generator=gen, dtype=torch.float64)  # a_i
    Z = torch.einsum("dkp,nkp->nd", U.reshape(K * p, K, p), coeffs)  # eq. 5.3.1
    model = cc.build(spec, dtype="float64")
    for layer in range(spec.encoder.depth):
        model.get_submodule(f"encoder.layer_{layer}.denoise").subspaces.weight.data.copy_(U.T)

    def snr(tokens):  # book eq. 5.3.3, per subspace
        out = []
        for k in range(K):
            Zk, Uk = tokens[labels == k], U[:, k * p : (k + 1) * p]
            signal = Zk @ Uk @ Uk.T
            out.append(signal.norm() / (Zk - signal).norm())
        return torch.stack(out)

    values, x = [snr(Z)], Z[None]
    for layer in range(spec.encoder.depth):
        x = model.get_submodule(f"encoder.layer_{layer}.denoise")(x)
        values.append(snr(x[0]))
    ratios = torch.stack(values[1:]) / torch.stack(values[:-1])
    assert (ratios > 1).all()
    torch.testing.assert_close(ratios, torch.full_like(ratios, 1 + eta * tau), rtol=1e-6, atol=0)
    assert torch.equal(model(Z[None])["output"], x)  # the built graph is these steps


# ---------------------------------------------------------------- plug-ins from the command line

PLUGIN = """
import torch
from torch import nn
from pydantic import Field
import crate_compose as cc


class ShrinkArgs(cc.Args):
    factor: float = Field(default=0.5, description="Multiplier.")


class Shrink(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return self.factor * torch.relu(x)


@cc.primitive("{name}", args=ShrinkArgs, kind="sparsify", objective="none", equation="test",
              update="factor * ReLU(Z)", description="a user's step", example=cc.Example({{}}, (4, 8)))
def shrink(args, shape):
    return Shrink(args.factor)
"""


def test_a_plugin_primitive_is_usable_from_the_command_line(tmp_path, capsys, monkeypatch):
    plugin = tmp_path / "my_steps.py"
    plugin.write_text(PLUGIN.format(name="cli_shrink"))
    swap = ["--set", "encoder.layer.sparsify.primitive=cli_shrink", "--set", "encoder.layer.sparsify.args={}"]
    assert cli.main(["inspect", "crate-tiny", *swap]) == 2
    assert "unknown primitive 'cli_shrink'" in capsys.readouterr().err
    assert cli.main(["inspect", "crate-tiny", *swap, "--plugin", str(plugin)]) == 0
    assert "cli_shrink" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)  # a module name on the working directory's path
    plugin.with_name("lab_steps.py").write_text(PLUGIN.format(name="lab_shrink"))
    assert cli.main(["list", "primitives", "--plugin", "lab_steps"]) == 0
    assert "lab_shrink" in capsys.readouterr().out
    assert cli.main(["validate", "crate-tiny", "--plugin", "no_such_module"]) == 2
    assert "--plugin no_such_module: ModuleNotFoundError" in capsys.readouterr().err


# ---------------------------------------------------------------- the import graph


def _imports() -> nx.DiGraph:
    package = ROOT / "crate_compose"
    graph = nx.DiGraph()
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph.add_node(module)
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:  # imports for type hints only: never run
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [f"{target}.{a.name}" for a in node.names]
                graph.add_edges_from((module, n if _is_module(package.parent, n) else target) for n in names)
            elif isinstance(node, ast.Import):
                graph.add_edges_from((module, a.name) for a in node.names if a.name.startswith("crate_compose"))
    graph.remove_edges_from([(a, b) for a, b in graph.edges if a == b or b == "crate_compose"])
    return graph


def _is_module(root: Path, name: str) -> bool:
    """Whether ``name`` is a module or a package (``from .. import tasks`` imports the package tasks)."""
    path = root / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_the_import_graph_has_no_cycles():
    graph = _imports()
    assert ("crate_compose.building.builder", "crate_compose.building.derivation") in graph.edges  # the graph was read
    assert nx.is_directed_acyclic_graph(graph), nx.find_cycle(graph)
    assert not nx.has_path(
        graph, "crate_compose.spec_language.loader", "crate_compose.building.builder"
    )  # loading never compiles


# The layers, lowest first: a module imports only from its own layer or those below (docs/architecture.md).
LAYERS = [
    (
        "base",
        [
            "crate_compose.errors",
            "crate_compose.files",
            "crate_compose.options",
            "crate_compose.settings",
            "crate_compose.seeds",
            "crate_compose.memory",
            "crate_compose.registering",
            "crate_compose.version",
        ],
    ),
    ("spec language and the registry of primitives", ["crate_compose.spec_language", "crate_compose.registry"]),
    ("torch building blocks", ["crate_compose.modules"]),
    ("primitive declarations", ["crate_compose.primitives"]),
    ("building", ["crate_compose.building"]),
    ("rendering", ["crate_compose.rendering"]),
    ("other code's checkpoints", ["crate_compose.interop"]),
    ("data sets and batches", ["crate_compose.data"]),
    ("tasks: what a run learns", ["crate_compose.tasks"]),
    ("training runs", ["crate_compose.training"]),
    ("launchers: where runs start", ["crate_compose.launch"]),
    ("assessment of trained networks", ["crate_compose.assessment"]),
    ("pictures and generated text", ["crate_compose.pictures", "crate_compose.generation"]),
    ("ablation studies", ["crate_compose.ablation"]),
    ("command line", ["crate_compose.cli"]),
    ("package", ["crate_compose"]),
]


def _layer(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "crate_compose") or (
            module == "crate_compose" and "crate_compose" in prefixes
        ):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS (and to docs/architecture.md)")


def test_the_packages_import_each_other_without_a_circle():
    """The drawing of the packages (every module collapsed into its package under crate_compose: building, data,
    tasks, ...; a module at the top is its own) has no circle: a package can be read without those above it."""
    packages = nx.DiGraph()
    for a, b in _imports().edges:
        if a.startswith("crate_compose.") and b.startswith("crate_compose."):
            top_a, top_b = a.split(".")[1], b.split(".")[1]
            if top_a != top_b:
                packages.add_edge(top_a, top_b)
    assert ("training", "tasks") in packages.edges  # the drawing was read
    assert nx.is_directed_acyclic_graph(packages), nx.find_cycle(packages)


def test_the_import_graph_follows_the_layers():
    graph = _imports()
    upward = [
        f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
        for a, b in graph.edges
        if b.startswith("crate_compose") and _layer(a) < _layer(b)
    ]
    assert not upward, "\n".join(upward)
    assert len({_layer(m) for m in graph.nodes if m.startswith("crate_compose")}) == len(LAYERS)  # every layer read


def test_the_package_top_holds_only_entry_points_and_base():
    top = sorted(p.stem for p in (ROOT / "crate_compose").glob("*.py"))
    assert top == [
        "__init__",
        "errors",
        "files",
        "memory",
        "options",
        "registering",
        "registry",
        "seeds",
        "settings",
        "version",
    ], top
    assert (ROOT / "crate_compose" / "cli" / "__init__.py").is_file()  # the command line: a package, a module a command


def test_no_folder_of_the_package_holds_more_than_15_modules():
    """A folder is grouped by what it holds (data/image_sets, training/run_folder, ...) before it grows past 15
    modules; primitives/ and modules/ hold a module per family of steps and are exempt."""
    crowded = {
        str(folder.relative_to(ROOT)): count
        for folder in (ROOT / "crate_compose").rglob("*")
        if folder.is_dir()
        and folder.name not in ("primitives", "modules", "__pycache__")
        and (count := len(list(folder.glob("*.py")))) > 15
    }
    assert not crowded, crowded


def test_loading_a_spec_with_a_derived_decoder_builds_nothing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("loading marched through the steps")

    monkeypatch.setattr(march, "plan", fail)  # every walk and placement marches over the plan
    spec = cc.load_spec("crate-mae-base")
    assert spec.decoder.derive == "inverse"
    assert math.isfinite(len(cc.dump_spec(spec)))


def test_a_derived_autoencoder_is_named_apart_from_its_classifier():
    assert cc.derive("crate-tiny").name == "crate-tiny-autoencoder"  # never builds into out/crate-tiny
    assert cc.derive("crate-mae-base").name == "crate-mae-base"  # the same network, its decoder written out
    with pytest.raises(ValueError, match="derivation form"):
        cc.derive_decoder(cc.load_spec("crate-mae-base"), "listing4")


def test_variant_names_do_not_depend_on_how_overrides_are_spaced():
    many = [
        f"sizes.{k}={v}"
        for k, v in [
            ("d", 32),
            ("heads", 2),
            ("head_dim", 16),
            ("depth", 1),
            ("image_size", 32),
            ("patch_size", 8),
            ("classes", 10),
        ]
    ]
    spaced = [o.replace("=", " = ") for o in many]
    assert cc.load_spec("crate-tiny", many).name == cc.load_spec("crate-tiny", spaced).name

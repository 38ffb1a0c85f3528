"""Names that say what things are, and layers that do not leak (issue 18).

No two public classes of the package share a name, the torch building blocks (``crate_compose.modules``)
import nothing from the spec, the registry or the primitives' declarations, and the old names and module paths
of before the renames are gone (issue 36: the package keeps no compatibility layer), so importing it changes
nothing outside it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import crate_compose as cc
from crate_compose.assessment import layer_probes as probes

PACKAGE = Path(cc.__file__).resolve().parent


def test_probes_still_exports_the_measures():
    """``crate_compose.assessment.layer_probes.coding_rate`` etc. keep working: the measures live in modules/measures.py."""
    from crate_compose.modules import measures

    for name in (
        "Reading",
        "coding_rate",
        "heads_of",
        "lasso",
        "snr",
        "sparsity",
        "subspace_residual",
        "variational_rate",
        "coding_rate_measure",
        "sparsity_measures",
        "lasso_measure",
    ):
        assert getattr(probes, name) is getattr(measures, name)
    for name in probes.__all__:
        assert callable(getattr(probes, name))


def _modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_two_public_classes_share_a_name():
    where = defaultdict(list)
    for path, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(f"{path}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1} == {}


def _imported(path: str, tree: ast.Module) -> set[str]:
    """Every module ``path`` imports (relative imports resolved), TYPE_CHECKING blocks included."""
    package = path[: -len(".py")].replace("/", ".").rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_the_building_blocks_import_no_spec_registry_or_primitive():
    forbidden = ("crate_compose.primitives", "crate_compose.registry", "crate_compose.spec_language.spec")
    imported = {
        path: _imported(path, tree) for path, tree in _modules().items() if path.startswith("crate_compose/modules/")
    }
    assert "crate_compose.modules.residual" in imported["crate_compose/modules/compress.py"]  # resolved
    leaks = {path: sorted(name for name in names if name.startswith(forbidden)) for path, names in imported.items()}
    assert {path: names for path, names in leaks.items() if names} == {}


OLD_PATHS = (
    "crate_compose.train",
    "crate_compose.loader",
    "crate_compose.spec",
    "crate_compose.workbench",
    "crate_compose.workbench.train",
    "crate_compose.deprecation",
    "crate_compose.figures",
    # renamed so that no two modules share a name (issue 36), and homes moved
    "crate_compose.language",
    "crate_compose.language.loader",
    "crate_compose.tasks.registry",
    "crate_compose.cli.spec",
    "crate_compose.building.folders",
    "crate_compose.assessment.segmentation",
    "crate_compose.assessment.frozen_features",
)


def test_importing_the_package_changes_no_import_machinery_and_the_old_names_are_gone():
    """In a fresh interpreter: ``import crate_compose`` leaves ``sys.meta_path`` as it was, no old module path
    imports, and the old names are plain AttributeErrors."""
    code = f"""
import importlib.util, sys
before = list(sys.meta_path)
import crate_compose as cc, crate_compose.data, crate_compose.ablation, crate_compose.generation
from crate_compose.assessment import layer_probes
assert sys.meta_path == before, sys.meta_path
for old in {OLD_PATHS!r}:
    try:
        assert importlib.util.find_spec(old) is None, old
    except ModuleNotFoundError:  # its parent is gone too
        pass
for module, name in ((cc, "load"), (cc, "Decoder"), (layer_probes, "Objective"), (crate_compose.data, "load_data"),
                     (crate_compose.ablation, "ablate"), (crate_compose.generation, "generate_text")):
    assert not hasattr(module, name), (module.__name__, name)
assert cc.load_build and cc.CachedModel and layer_probes.Measure
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_module_imports_a_private_name_of_another():
    """A name shared between modules is public (no leading underscore): a private one is its module's own."""
    found = []
    modules = _modules()
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("crate_compose")):
                found += [
                    f"{path}:{node.lineno}: {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert "crate_compose/interop/peers.py" in modules  # the package was read
    assert not found, "\n".join(found)


# modules that share a name on purpose: a primitive's declaration and the module it builds, and a command over
# the function of the same name
PAIRED = ({"primitives", "modules"}, {"cli", "interop"}, {"cli", "generation"}, {"cli", "pictures"})


def test_no_two_modules_share_a_name_a_reader_could_confuse():
    """Two modules of one name in different packages are a pair by design (:data:`PAIRED`: ``primitives/mssa``
    declares what ``modules/mssa`` builds; ``cli/fill`` is the command over ``generation/fill``), never two
    things a reader could take one for the other (issue 36: two ``registry``, ``reading``, ``segmentation``,
    ``spec`` and ``folders`` modules were renamed)."""
    packages: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            packages[path.stem].add(path.parent.name)
    clashes = {name: places for name, places in packages.items() if len(places) > 1 and places not in PAIRED}
    assert not clashes, clashes
    subpackages = {path.parent.name for path in PACKAGE.rglob("__init__.py")}
    assert not subpackages & set(packages), subpackages & set(packages)  # no module named as a package

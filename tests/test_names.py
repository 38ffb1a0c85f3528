"""Names that say what things are, and layers that do not leak (issue 18).

Renamed public names keep their old name for one release: it gives the new name's value and warns
(``DeprecationWarning``) at every use. No two public classes of the package share a name, and the
torch building blocks (``crate_compose.modules``) import nothing from the spec, the registry or the
primitives' declarations.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

import crate_compose as cc
from crate_compose.assessment import layer_probes as probes
from crate_compose.building.artifacts import load_build
from crate_compose.deprecation import MOVED
from crate_compose.generation.decoding import CachedModel
from crate_compose.modules.measures import Measure

PACKAGE = Path(cc.__file__).resolve().parent


@pytest.mark.parametrize(
    "module, old, new, value",
    [(cc, "load", "load_build", load_build), (cc, "Decoder", "CachedModel", CachedModel),
     (probes, "Objective", "Measure", Measure)],
)
def test_an_old_name_still_works_and_warns_at_every_use(module, old, new, value):
    for _ in range(2):  # never cached as a global: the second use warns too
        with pytest.warns(DeprecationWarning, match=rf"{module.__name__}\.{old} is deprecated.*use "
                                                    rf"{module.__name__}\.{new}") as caught:
            assert getattr(module, old) is value
        assert caught[0].filename == __file__  # the warning points at the line that used the old name
    assert getattr(module, new) is value


def test_an_old_name_imported_by_name_warns():
    with pytest.warns(DeprecationWarning, match="crate_compose.load is deprecated"):
        from crate_compose import load
    assert load is load_build
    with pytest.warns(DeprecationWarning, match="crate_compose.assessment.layer_probes.Objective is deprecated"):
        from crate_compose.assessment.layer_probes import Objective
    assert Objective is Measure


def test_the_new_names_do_not_warn_and_unknown_names_still_fail():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cc.load_build is load_build and cc.CachedModel is CachedModel and probes.Measure is Measure
        for name in set(cc.__all__) - {"load", "Decoder"}:
            getattr(cc, name)
    assert "load" not in cc.__all__ and "Decoder" not in cc.__all__
    with pytest.raises(AttributeError):
        cc.no_such_name
    with pytest.raises(AttributeError):
        probes.no_such_name


def test_probes_still_exports_the_measures():
    """``crate_compose.assessment.layer_probes.coding_rate`` etc. keep working: the measures live in modules/measures.py."""
    from crate_compose.modules import measures

    for name in ("Reading", "coding_rate", "heads_of", "lasso", "snr", "sparsity", "subspace_residual",
                 "variational_rate", "coding_rate_measure", "sparsity_measures", "lasso_measure"):
        assert getattr(probes, name) is getattr(measures, name)
    for name in set(probes.__all__) - {"Objective"}:
        assert callable(getattr(probes, name))


def _modules() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(PACKAGE.rglob("*.py"))}


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
    forbidden = ("crate_compose.primitives", "crate_compose.registry", "crate_compose.language.spec")
    imported = {path: _imported(path, tree) for path, tree in _modules().items()
                if path.startswith("crate_compose/modules/")}
    assert "crate_compose.modules.residual" in imported["crate_compose/modules/compress.py"]  # resolved
    leaks = {path: sorted(name for name in names if name.startswith(forbidden)) for path, names in imported.items()}
    assert {path: names for path, names in leaks.items() if names} == {}


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_path_gives_the_module_at_its_new_path_and_warns(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported by an earlier test: import it afresh
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} is deprecated.*use {re.escape(new)}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


@pytest.mark.parametrize("package, name, module", [("crate_compose.data", "load_data", "sets"),
                                                   ("crate_compose.ablation", "ablate", "study"),
                                                   ("crate_compose.generation", "generate_text", "text")])
def test_a_package_that_took_a_modules_name_still_gives_its_names_and_warns(package, name, module):
    """``crate_compose.data`` was a module and is a package: ``from crate_compose.data import load_data`` still
    works, deprecated, and a submodule of the package is never mistaken for one of the old names."""
    with pytest.warns(DeprecationWarning, match=rf"{package}.{name} is deprecated.*use {package}.{module}.{name}"):
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(importlib.import_module(f"{package}.{module}"), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(f"{package}.{module}").__name__ == f"{package}.{module}"
    with pytest.raises(AttributeError):
        importlib.import_module(package).no_such_name

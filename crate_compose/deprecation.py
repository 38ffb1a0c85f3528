"""Old names kept for one release after a rename: each use warns and gives the new name's value.

A module keeps an old name with a module-level ``__getattr__`` (PEP 562) that returns
:func:`deprecated`, so the old name is never a global of its own and every use warns. A module
that moved into a subpackage keeps its old path through :class:`MovedModules` (:data:`MOVED`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import types
import warnings
from typing import Any


def deprecated(module: str, old: str, new: str, value: Any) -> Any:
    """Warn (``DeprecationWarning``, at the caller's line) that ``module.old`` is now ``module.new``;
    return ``value``, the new name's."""
    warnings.warn(
        f"{module}.{old} is deprecated and will be removed in the next release: use {module}.{new}",
        DeprecationWarning,
        stacklevel=3,  # deprecated <- the module's __getattr__ <- the line that used the old name
    )
    return value


# old module path -> where it lives now (the layout of subpackages); importing an old path warns
MOVED = {
    "crate_compose.yamlread": "crate_compose.language.yamlread", "crate_compose.spec": "crate_compose.language.spec",
    "crate_compose.loader": "crate_compose.language.loader", "crate_compose.schema": "crate_compose.language.schema",
    "crate_compose.zoo": "crate_compose.language.zoo",
    "crate_compose.footprints": "crate_compose.building.footprints",
    "crate_compose.shapes": "crate_compose.building.placement",
    "crate_compose.builder": "crate_compose.building.builder",
    "crate_compose.derivation": "crate_compose.building.derivation", "crate_compose.ties": "crate_compose.building.ties",
    "crate_compose.budget": "crate_compose.building.budget", "crate_compose.summary": "crate_compose.building.summary",
    "crate_compose.artifacts": "crate_compose.building.artifacts", "crate_compose.api": "crate_compose.building.inspection",
    "crate_compose.figures": "crate_compose.rendering.diagrams",
    "crate_compose.residual": "crate_compose.modules.residual",
    "crate_compose.objectives": "crate_compose.workbench.losses",
    **{f"crate_compose.{name}": f"crate_compose.workbench.{name}" for name in
       ("data", "corpus", "train", "checkpoint", "runs", "locks", "probes", "ablation", "grids", "generation",
        "decoding", "losses", "progress")},
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module paths kept for one release (``import crate_compose.train``): the import warns
    (``DeprecationWarning``) and gives the module at its new path, the very same module object."""

    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in self.moved else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} is deprecated and will be removed in the next release: use {self.moved[spec.name]}",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.moved[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """The module at the new path is already executed."""

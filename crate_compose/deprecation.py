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
from typing import Any, Callable


def deprecated(module: str, old: str, new: str, value: Any) -> Any:
    """Warn (``DeprecationWarning``, at the caller's line) that ``module.old`` is now ``module.new``;
    return ``value``, the new name's."""
    warnings.warn(
        f"{module}.{old} is deprecated and will be removed in the next release: use {module}.{new}",
        DeprecationWarning,
        stacklevel=3,  # deprecated <- the module's __getattr__ <- the line that used the old name
    )
    return value


# crate_compose.workbench.X, the one folder the workbench was, -> where X lives now (under crate_compose)
_WORKBENCH = {
    "ablation": "ablation.study", "grids": "ablation.grids", "archives": "data.archives", "corpus": "data.corpus",
    "data": "data.sets", "images": "data.folders", "loading": "data.batches", "evaluation": "tasks.registry",
    "losses": "tasks.masked_autoencoding", "train": "training.run", "runs": "training.identity",
    "checkpoint": "training.checkpoint", "locks": "training.locks", "optimizers": "training.optimizers",
    "recipes": "training.recipes", "distributed": "training.distributed", "eventlog": "training.eventlog",
    "progress": "training.progress", "finetune": "training.finetune", "preflight": "training.preflight",
    "assessment": "assessment.scoring", "linear_probe": "assessment.frozen_features",
    "probes": "assessment.layer_probes", "probing": "assessment.run_probes", "timelines": "assessment.timelines",
    "looking": "pictures.views", "pictures": "pictures.show", "drawings": "pictures.drawings",
    "decoding": "generation.decoding", "generation": "generation.text",
}
# crate_compose.X of the first, flat layout, which became workbench modules (crate_compose.data, .ablation and
# .generation are packages now, which keep the old module's names: moved_names)
_FLAT = ("corpus", "train", "checkpoint", "runs", "locks", "probes", "grids", "decoding", "losses", "progress")

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
    "crate_compose.objectives": "crate_compose.tasks.masked_autoencoding",
    **{f"crate_compose.workbench.{old}": f"crate_compose.{new}" for old, new in _WORKBENCH.items()},
    **{f"crate_compose.{old}": f"crate_compose.{_WORKBENCH[old]}" for old in _FLAT},
}


def moved_names(package: str, module: str) -> Callable[[str], Any]:
    """A package's ``__getattr__`` (PEP 562) for the names of the module that had the package's path
    (``crate_compose.data`` was the module now at ``crate_compose.data.sets``): each use warns and
    gives the name's value at its new place; any other name is an AttributeError, as usual."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is not None:
            # a submodule not imported yet (``from . import archives``): the import system loads it
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name, None)
        if value is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return deprecated(package, name, f"{module}.{name}", value)

    return __getattr__



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

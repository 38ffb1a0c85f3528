"""The workbench: data, training, checkpoints and runs, probes, ablation grids, generation.

Each module is imported where it is used (``crate_compose.workbench.train``), so reading a grid
file (:mod:`crate_compose.workbench.grids`) never imports torch. ``probe_run`` and ``probe_table``
(in :mod:`crate_compose.workbench.probing`) are kept here, deprecated, for one release.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..deprecation import deprecated

_MOVED = {"probe_run": "probing", "probe_table": "probing"}  # crate_compose.workbench.X before the subpackage


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_MOVED[name]}", __name__), name)
    return deprecated(__name__, name, f"{_MOVED[name]}.{name}", value)

"""The workbench's old home, kept for one release: its modules now live in the packages of what a researcher
does (:mod:`crate_compose.data`, :mod:`~crate_compose.tasks`, :mod:`~crate_compose.training`,
:mod:`~crate_compose.assessment`, :mod:`~crate_compose.pictures`, :mod:`~crate_compose.ablation`,
:mod:`~crate_compose.generation`). ``import crate_compose.workbench.train`` warns and gives
:mod:`crate_compose.training.run` (:data:`crate_compose.deprecation.MOVED`); ``probe_run`` and ``probe_table``
resolve here, deprecated, as before.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..deprecation import deprecated

_MOVED = {"probe_run": "crate_compose.assessment.run_probes", "probe_table": "crate_compose.assessment.run_probes"}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return deprecated(__name__, name, f"{_MOVED[name]}.{name}", getattr(import_module(_MOVED[name]), name))

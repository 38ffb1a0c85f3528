"""Old names kept for one release after a rename: each use warns and gives the new name's value.

A module keeps an old name with a module-level ``__getattr__`` (PEP 562) that returns
:func:`deprecated`, so the old name is never a global of its own and every use warns.
"""

from __future__ import annotations

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

"""Ablation studies: a grid of swaps (:mod:`.grids`) trained for several seeds and compared (:mod:`.study`).

``crate_compose.ablation`` was the module now at :mod:`.study`; its names still resolve here, deprecated, for one
release.
"""

from ..deprecation import moved_names

__getattr__ = moved_names(__name__, "study")

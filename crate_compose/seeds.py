"""Seeds derived from a run's seed: every random draw of a build or a run is seeded by its place.

A step's initial weights (:mod:`crate_compose.building.placement`), a training step's draws (masks, dropped
paths, augmentations, crops: :mod:`crate_compose.training.run`, :mod:`crate_compose.data.batches`,
:mod:`crate_compose.tasks`) and an evaluation's take :func:`step_seed` of the run's seed and a name of their
place, so that a resumed run draws exactly what the uninterrupted one drew, and a step's weights depend on the
seed and its place only.
"""

from __future__ import annotations

import hashlib


def step_seed(seed: int, place: str) -> int:
    """A 63-bit seed that is a function of ``seed`` and ``place`` only (the first 8 bytes of
    SHA-256(``"{seed}/{place}"``))."""
    digest = hashlib.sha256(f"{seed}/{place}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)

"""What the data sets share: the memory check before a set is held, the seeded stratified split, the per-channel
statistics images are standardized with, and the cache folder ``make data`` and the generated sets write to.

Imports no torch (what it is given are tensors already), so the set declarations read the cache folder before
torch loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..errors import DataError
from ..memory import human

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["Limit", "cache_path", "channel_stats", "check_memory", "data_home", "standardize", "stratified_split"]


Limit = tuple[float | None, str]  # bytes (None: no limit) and where the limit came from (memory.resolve_limit)


def check_memory(needed: float, what: str, limit: Limit, hint: str, held: str = "in memory") -> None:
    """Raise :class:`DataError` when ``needed`` bytes are over the memory limit: ``what`` would take
    ``needed`` (``held``), with the limit, where it came from, and ``hint``."""
    bound, source = limit
    if bound is not None and needed > bound:
        raise DataError(
            f"{what} would take about {human(needed)} {held}, over the memory limit of "
            f"{human(bound)} ({source}); {hint}, or set --memory-limit"
        )


def stratified_split(
    labels: Sequence[int], test_fraction: float, seed: int, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) of a seeded split keeping each class's share in both parts."""
    import numpy as np
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(labels))
    try:
        train, test = train_test_split(indices, test_size=test_fraction, stratify=labels, random_state=seed)
    except ValueError as error:
        raise DataError(f"{where}: cannot split it into train and test ({error})") from None
    return np.sort(train), np.sort(test)


def standardize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std per channel of (N, C, H, W) images."""
    return (images - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std over (N, C, H, W) images (std floored away from zero)."""
    flat = images.transpose(0, 1).reshape(images.shape[1], -1).double()
    return flat.mean(1).float(), flat.std(1).clamp_min(1e-6).float()


def data_home() -> Path:
    """Where the caches live: ``$CRATE_COMPOSE_DATA``, else ``~/.cache/crate-compose``."""
    return Path(os.environ.get("CRATE_COMPOSE_DATA") or Path.home() / ".cache" / "crate-compose")


def cache_path(name: str, home: Path | None = None) -> Path:
    return (home or data_home()) / f"{name}.safetensors"

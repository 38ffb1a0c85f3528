"""What the tasks share on the held-out split: the test batches as the training inputs are, and the probes' inputs."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from ..data.batches import renormalize, split_batches
from ..data.sets import Data
from ..seeds import step_seed
from ..settings import Settings


@contextlib.contextmanager
def evaluating(model: torch.nn.Module, seed: int) -> Iterator[torch.device]:
    """The model in eval mode without gradients, its random draws (a masked autoencoder's masks) seeded from
    ``seed`` alone, so every evaluation draws the same; the caller's RNG and training mode are restored."""
    device = next(model.parameters()).device
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(step_seed(seed, "evaluation"))
            yield device
    finally:
        model.train()


def test_batches(
    data: Data, settings: Settings, device: torch.device, size: int = 256, count: int | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The test split in order, ``size`` at a time, decoded in ``settings.workers`` processes (the same batches
    with any number) and standardized as the training inputs were (``settings.normalize``), on ``device``."""
    for x, y in split_batches(data.test, size, settings.workers, count=count):
        yield renormalize(x, data, settings.normalize).to(device), y.to(device)


def spread(length: int, count: int) -> list[int]:
    """``count`` indices spread evenly over ``length`` examples (``i * length // count``; all of them when there
    are fewer): a split stored class by class (Fashion-MNIST, MNIST, a folder) gives every class its share,
    where its first examples would all be of one class."""
    count = min(count, length)
    return [i * length // count for i in range(count)]


def probe_sample(data: Data, samples: int, normalize: str = "data") -> tuple[torch.Tensor, dict[str, Any]]:
    """``samples`` test inputs spread over the test split (:func:`spread`; standardized as ``normalize`` says),
    always the same ones, and the true subspaces and labels of synthetic tokens."""
    items = [data.test[i] for i in spread(len(data.test), samples)]
    inputs = renormalize(torch.stack([x for x, _ in items]), data, normalize)
    extra: dict[str, Any] = {}
    if data.subspaces is not None:
        extra = {"subspaces": data.subspaces, "labels": torch.stack([torch.as_tensor(y) for _, y in items])}
    return inputs, extra

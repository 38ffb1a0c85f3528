"""Trained weights assessed as the papers do: ``crate-compose evaluate`` and ``linear-probe``.

``evaluate`` runs a build's weights on the test split of a data set: top-1 accuracy and loss for a
classifier (top-5 as well when there are more than five classes), the masked MSE beside the
mean-patch baseline for a masked autoencoder, the cross-entropy per byte for a language model.
``linear_probe`` takes frozen features of the training and test splits
(:func:`crate_compose.tasks.frozen_features.features`) and reports the logistic regression's test
accuracy, the ``C`` it chose and the k-NN accuracy. Both answer as a dictionary the command line
prints as JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from .. import tasks
from ..building.builder import compile_spec
from ..data.batches import renormalize, split_batches
from ..data.sets import Data
from ..errors import WorkbenchError
from ..settings import Settings
from ..tasks.frozen_features import features, knn, linear_probe
from ..training.preparation import HEADLESS, prepare
from .run_probes import is_run, load_weights, resolve_subject, standardize

TOP_K = 5


def _loaded(
    command: str,
    spec_ref,
    data_name: str | None,
    weights: str | Path | None,
    overrides: Iterable[str],
    image_size: int | None,
    seed: int | None,
    normalize: str | None,
    keep: tuple[str, ...] = (),
    untrained: bool = False,
    task: "tasks.Task | None" = None,
):
    """The subject (a run folder resolved: :func:`crate_compose.assessment.run_probes.resolve_subject`), the
    spec fitted to its data, the data, the model with its weights (none, or ``untrained``: the network as
    the seed initializes it, the baseline of what training learned) and how its inputs are standardized
    (:func:`crate_compose.assessment.run_probes.standardize`: as the weights were trained, the untrained
    network alike). The data is in the form ``task`` (default: the run's) trains on."""
    said = (
        (lambda note: print(f"note: {note}; untrained: its weights are not read", file=sys.stderr))
        if untrained
        else None
    )
    subject = resolve_subject(command, spec_ref, weights, data_name, image_size, seed, normalize, say=said)
    spec, data = prepare(
        subject.spec,
        subject.data,
        list(overrides),
        subject.image_size,
        subject.seed,
        keep=keep,
        task=task or subject.task,
    )
    normalize = standardize(subject.weights, subject.normalize, data)
    model = compile_spec(spec, seed=subject.seed)
    if subject.weights is not None and not untrained:
        load_weights(model, subject.weights)
    return subject, spec, data, model, normalize


def _weights_said(subject, untrained: bool) -> str | None:
    """What the scores are of: the weights, or the untrained network of the seed (and the weights whose
    spec, data and seed it shares)."""
    if untrained:
        beside = f" (the spec, data and seed of {subject.weights})" if subject.weights is not None else ""
        return f"untrained, seed {subject.seed}{beside}"
    return str(subject.weights) if subject.weights is not None else None


def tensors_of(dataset, workers: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole split as two stacked tensors (inputs, targets), read 512 examples at a time (decoded in
    ``workers`` DataLoader processes when it is read from files)."""
    parts = list(split_batches(dataset, 512, workers))
    return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def evaluate_weights(
    spec_ref,
    data_name: str | None = None,
    weights: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    task: str | None = None,
    image_size: int | None = None,
    seed: int | None = None,
    normalize: str | None = None,
    workers: int = 0,
    untrained: bool = False,
) -> dict[str, Any]:
    """The test metrics of ``weights`` (a build folder: a run's ``final/`` or a checkpoint; or an authors'
    checkpoint file) on ``data_name`` (default: digits), its images standardized as ``normalize`` says
    (default: as the weights were trained, :func:`crate_compose.assessment.run_probes.normalization_of`),
    the masks drawn from ``seed`` (default 0). A run folder as ``spec_ref`` or ``weights`` gives its
    final weights, spec, data, image size, seed and standardization: its own test metrics come back.
    ``workers`` DataLoader processes decode a split read from files (the metrics are the same).
    ``untrained``: the same scores of the network the seed initializes (of a run: its spec, data and seed),
    the baseline beside which the trained scores mean something."""
    if weights is None and not is_run(spec_ref) and not untrained:
        raise WorkbenchError(
            "evaluate needs trained weights: --weights DIR (a run's final/ or a checkpoint, or "
            "an authors' checkpoint file), or a run folder: crate-compose evaluate RUN (or "
            "--untrained, the network as its seed initializes it)"
        )
    given = tasks.get(task) if task is not None else None  # the task asked for, looked up once
    subject, spec, data, model, normalize = _loaded(
        "evaluate",
        spec_ref,
        data_name,
        weights,
        overrides,
        image_size,
        seed,
        normalize,
        untrained=untrained,
        task=given,
    )
    chosen = tasks.of(given or subject.task, data)
    if chosen is None:
        raise WorkbenchError(
            f"data set '{data.name}' is for no task that evaluate scores ({', '.join(tasks.names())}); "
            f"measure the network on it with crate-compose probe"
        )
    task = chosen.name
    settings = Settings(task=task, data=subject.data, seed=subject.seed, normalize=normalize, workers=workers)
    top_k = TOP_K if (data.classes or 0) > TOP_K else None  # a classifier's top-5 beside its top-1
    metrics = chosen.evaluate(model, data, settings, top_k=top_k)
    chance = {"chance": 1 / data.classes} if data.classes else {}  # a uniform guess over the classes
    return {
        "spec": spec.name,
        "data": subject.data,
        "weights": _weights_said(subject, untrained),
        "task": task,
        "normalize": normalize,
        "examples": len(data.test),
        **metrics,
        **chance,
    }


def _features_of(
    model, data: Data, split, normalize: str, workers: int, layer: int | None, pool: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen features (:func:`crate_compose.tasks.frozen_features.features`) and the targets of a
    whole split, 512 examples at a time."""
    parts = [
        (features(model, renormalize(x, data, normalize), layer=layer, pool=pool), y)
        for x, y in split_batches(split, 512, workers)
    ]
    return torch.cat([f for f, _ in parts]), torch.cat([y for _, y in parts])


def linear_probe_weights(
    spec_ref,
    data_name: str | None = None,
    weights: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    layer: int | None = None,
    pool: str = "cls",
    image_size: int | None = None,
    seed: int | None = None,
    normalize: str | None = None,
    workers: int = 0,
    untrained: bool = False,
    baseline: bool = True,
) -> dict[str, Any]:
    """The linear probe and k-NN accuracy of frozen features of ``weights`` (none: the untrained
    network of ``seed``, a baseline; a run folder: its final weights, on its data) on ``data_name``'s
    splits (default: digits), standardized as ``normalize`` says (default: as the weights were
    trained). ``seed`` (default: a run's, else 0) initializes the untrained network and draws the validation split; ``workers`` DataLoader processes decode a split read
    from files. The features are taken batch by batch: only they are held, never the images. ``untrained``: the
    features of the network the seed initializes, even of a run (its spec and data), the baseline. Of trained
    weights, the same probe of that untrained network comes beside them in the same call (``untrained``: its
    accuracies; ``baseline=False`` leaves it out), and always ``chance``: the share of the test split's most
    common label, what a probe that learned nothing scores."""
    subject, spec, data, model, normalize = _loaded(
        "linear-probe",
        spec_ref,
        data_name,
        weights,
        overrides,
        image_size,
        seed,
        normalize,
        keep=HEADLESS,
        untrained=untrained,
    )
    data_name = subject.data
    train_f, train_y = _features_of(model, data, data.train, normalize, workers, layer, pool)
    test_f, test_y = _features_of(model, data, data.test, normalize, workers, layer, pool)
    labels = "classes"
    if not data.classes:
        if data.train.crops is None:
            raise WorkbenchError(f"data set '{data_name}' has no classes to probe for")
        # crops of photographs: the class of a crop is the photograph it was cut from (train crops from
        # each photo's left 75%, test crops from its right 25%)
        train_y, test_y, labels = data.train.crops[:, 0], data.test.crops[:, 0], "the photograph of each crop"
    result = linear_probe(train_f.numpy(), train_y.numpy(), test_f.numpy(), test_y.numpy(), seed=subject.seed)
    result.knn_accuracy = knn(train_f, train_y, test_f, test_y)
    found = {
        "spec": spec.name,
        "data": data_name,
        "weights": _weights_said(subject, untrained),
        "layer": "last" if layer is None else layer,
        "pool": pool,
        "labels": labels,
        "normalize": normalize,
        **result.to_dict(),
        "chance": float(test_y.bincount().max()) / len(test_y),
    }
    if baseline and not untrained and subject.weights is not None:  # the untrained network, in the same call
        same = linear_probe_weights(
            spec_ref,
            data_name,
            weights,
            overrides=overrides,
            layer=layer,
            pool=pool,
            image_size=image_size,
            seed=seed,
            normalize=normalize,
            workers=workers,
            untrained=True,
            baseline=False,
        )
        found["untrained"] = {key: same[key] for key in ("weights", "test_accuracy", "knn_accuracy", "c")}
    return found

"""A run's spec and data, fitted to each other, and what is refused before anything is allocated.

:func:`prepare` reads the spec once (:func:`crate_compose.spec_language.loader.read`), loads the data it names
and resolves the spec with the sizes the data fixes (input shape, classes, a text's context); the task
(:mod:`crate_compose.tasks`) then says what of the spec and the data it cannot train.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import torch

from .. import tasks
from ..building import budget
from ..data.batches import check as check_loading
from ..data.batches import held_batches
from ..data.set_registry import provided
from ..data.sets import Data, load_data
from ..data.sets import resolve as resolve_data
from ..errors import TrainError
from ..files import RUNS
from ..settings import AUGMENTATIONS, Settings
from ..spec_language import loader
from .optimizers import float32_copies
from .run_folder import identity


def check_run(task: tasks.Task, spec, data: Data, settings: Settings) -> None:
    """Refuse what the run cannot do before anything is written: the settings the data cannot take, then
    what the task says of the spec and the data (:meth:`crate_compose.tasks.Task.check`)."""
    if settings.augment not in AUGMENTATIONS:
        raise TrainError(f"unknown augmentation '{settings.augment}'; expected one of: {', '.join(AUGMENTATIONS)}")
    if settings.augment == "shift" and len(data.input_shape) != 3:
        raise TrainError(f"augment 'shift' moves images; data set '{data.name}' is not images")
    check_loading(settings, data, task.mixes_labels)  # crop-flip, randaugment, --normalize imagenet, --mixup, --cutmix
    if not any(data.provides in one.data_kinds for one in tasks.all_tasks()):  # say so once, not a hint per task
        trained = "; ".join(f"{one.name}: {one.trains_on}" for one in tasks.all_tasks())
        raise TrainError(
            f"data set '{data.name}' holds {provided(data.provides)}, which no task trains on "
            f"({trained}); measure spec '{spec.name}' on it with crate-compose probe"
        )
    task.check(spec, data)
    if settings.batch_size > len(data.train):
        raise TrainError(
            f"--batch-size {settings.batch_size:,} is larger than the training set of '{data.name}' "
            f"({len(data.train):,} examples)"
        )


def fingerprint(data: Data) -> str:
    """SHA-256 of what a data set holds: its tensors (built-in sets), or the relative path and size of
    every file (folders), and the tokenizer's JSON (tokenized text), so a run resumed on other data is refused."""
    digest = hashlib.sha256(data.name.encode())
    tokenizer = getattr(data, "tokenizer", None)
    if tokenizer is not None:
        digest.update(tokenizer.to_json().encode())
    for split in (data.train, data.test):
        files = getattr(split, "files", None)
        tensors = getattr(split, "tensors", None) or [
            getattr(split, name)
            for name in ("inputs", "targets", "tokens")
            if isinstance(getattr(split, name, None), torch.Tensor)
        ]
        if files is not None:
            for path, label in zip(files, split.labels):
                digest.update(f"{path}\0{_size(path)}\0{label}\n".encode())
            digest.update(repr(getattr(split, "size", "")).encode())
        for tensor in tensors:
            digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
            digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        digest.update(str(len(split)).encode())
    return digest.hexdigest()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


HEADLESS = ("classes",)  # the sizes only a head uses: kept the weights' where the head is not used (prepare's keep)


class Loaded:
    """The data sets one command has loaded, by what they were loaded with, and the specs fitted to them, so that
    a grid's variants and seeds, its checks and its probes share one loading and one fitting. A set that follows
    the spec (text: its context; synthetic tokens: its sizes) is loaded again for a spec whose input or sizes
    differ; a set that draws from the seed, for each seed (:attr:`crate_compose.data.set_registry.DataChoice.takes`)."""

    def __init__(self) -> None:
        self._sets: dict[tuple, Data] = {}
        self._fitted: dict[tuple, Any] = {}

    def load(self, data: Any, *, image_size: int | None, seed: int, spec: Any, memory_limit) -> Data:
        """The data set ``data`` (a name, or its parsed choice), loaded once for what it follows."""
        choice = resolve_data(data)
        key = self._key(choice, image_size, seed, spec, memory_limit)
        if key not in self._sets:
            self._sets[key] = load_data(choice, image_size=image_size, seed=seed, spec=spec, memory_limit=memory_limit)
        return self._sets[key]

    @staticmethod
    def _key(choice: Any, image_size: int | None, seed: int, spec: Any, memory_limit) -> tuple:
        takes = choice.takes
        return (
            choice.name,
            image_size,
            str(memory_limit),
            seed if "seed" in takes else None,
            (tuple(spec.input.shape), tuple(sorted(spec.sizes.items()))) if "spec" in takes else None,
        )

    def prepare(self, described: Any, memory_limit) -> tuple[Any, Data]:
        """The spec of the run ``described`` (:class:`.description.RunDescription`) fitted to its data, and the
        data: each loaded and fitted once for every run that reads them alike."""
        settings = described.settings
        data = self.load(
            described.data,
            image_size=settings.image_size,
            seed=settings.seed,
            spec=described.spec,
            memory_limit=memory_limit,
        )
        data = in_task_form(data, described.task)
        key = (
            described.overrides,
            data.provides,
            self._key(described.data, settings.image_size, settings.seed, described.spec, memory_limit),
        )
        if key not in self._fitted:
            self._fitted[key] = fit(described.source, described.spec, described.overrides, data)
        return self._fitted[key], data


def fit(
    source: Any, spec: Any, overrides: Iterable[str], data: Data, keep: Iterable[str] = (), *, renamed: bool = False
) -> Any:
    """``spec`` (``source`` resolved with ``overrides``) with the sizes ``data`` fixes (input shape, classes, a
    text's context), resolved again from the same reading when it fixes any; sizes named in ``keep`` stay the
    spec's (``classes`` for a linear probe: the head is not used, the weights' fits).

    The fitted spec keeps ``spec``'s name (the name as written with the user's own overrides): what the data
    fixes does not rename the network. ``renamed=True`` gives the name the data's overrides made before
    (``crate-mini.shape-_3_32_32.channels-3.image_size-32``), which runs recorded then carry
    (:func:`as_recorded`)."""
    fixed = [o for o in data.spec_overrides(spec) if not o.startswith(tuple(f"sizes.{k}=" for k in keep))]
    if not fixed:
        return spec
    named = [] if renamed else [f"name={json.dumps(spec.name)}"]  # a JSON string is a YAML string, quoted
    return loader.load(source, [*fixed, *overrides, *named])


def as_recorded(spec: Any, described: Any, data: Data, run: Path) -> Any:
    """The fitted ``spec`` of the run ``described``, under the name the run recorded in ``run`` carries when
    that run was recorded before fitting kept the spec's name (its name has the data's overrides in it,
    :func:`fit` with ``renamed=True``), so that a run recorded then resumes as itself; else ``spec``. Only the
    name is chosen here: whether the run may be resumed is checked when its folder is opened."""
    if not (run / identity.RUN_FILE).is_file():
        return spec
    try:
        record = identity.read(run)
    except identity.RunRecordError:
        return spec  # said when the run folder is opened
    recorded = record.identity.get("spec") if record is not None else None
    name = recorded.get("name") if isinstance(recorded, dict) else None
    if not isinstance(name, str) or name == spec.name:
        return spec
    former = fit(described.source, described.spec, described.overrides, data, renamed=True)
    return former if former.name == name else spec


def in_task_form(data: Data, task: "tasks.Task | str | None") -> Data:
    """``data`` as ``task`` (a task or its name; None: the data's own) trains on it: a tokenized text set's token
    streams in a language model's windows for ``lm`` (:meth:`crate_compose.data.record.Data.for_kinds`)."""
    if isinstance(task, str):
        task = tasks.get(task) if task in tasks.names() else None
    return data if task is None else data.for_kinds(task.data_kinds)


def prepare(
    spec_ref,
    data_name: Any,
    overrides: Iterable[str] = (),
    image_size: int | None = None,
    seed: int = 0,
    memory_limit: str | float | None = None,
    *,
    keep: Iterable[str] = (),
    loaded: Loaded | None = None,
    task: "tasks.Task | str | None" = None,
):
    """The spec and the data, the spec's input size set from the data (text: windows of the spec's context);
    images over ``memory_limit`` are refused from their headers. Sizes named in ``keep`` stay the spec's
    (:func:`fit`). ``spec_ref`` is read once (:func:`crate_compose.spec_language.loader.read`; a reading already made
    is used as it is, opening no file). ``loaded`` shares data sets already loaded by the same command; ``task``
    (a run's) takes the data in its form (:func:`in_task_form`)."""
    source = loader.read(spec_ref)
    spec = loader.load(source, list(overrides))
    data = (loaded or Loaded()).load(data_name, image_size=image_size, seed=seed, spec=spec, memory_limit=memory_limit)
    data = in_task_form(data, task)
    return fit(source, spec, overrides, data, keep), data


def default_run(spec) -> Path:
    """``runs/<spec name>``: the spec named as written with its overrides (before it is fitted to the data)."""
    return RUNS / spec.name


def check_run_memory(spec, settings: Settings, per_process: int, device: torch.device | str, memory_limit) -> None:
    """Refuse a run whose memory estimate is over the limit (:func:`crate_compose.building.budget.check_training`):
    the float32 copies its optimizer and EMA keep, the batch each process takes, and on the CPU the input
    batches its workers prepare ahead."""
    budget.check_training(
        spec,
        per_process,
        str(device),
        memory_limit,
        copies=float32_copies(settings),
        batches=held_batches(settings, device),
    )

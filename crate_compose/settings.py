"""The choices a user makes besides the spec: run settings, dtypes, diagram formats.

Nothing here imports torch, so the command line can list its options (``--help``) and check
them before the heavy modules load (see :mod:`crate_compose.cli`).
"""

from __future__ import annotations

from dataclasses import dataclass

TASKS = ("classify", "mae", "lm")
METRIC = {"classify": "test_accuracy", "mae": "test_masked_mse", "lm": "test_loss"}  # the number a task reports
AUGMENTATIONS = ("none", "shift")
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

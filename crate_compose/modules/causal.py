"""The torch building blocks of causal steps that decode token by token.

A causal step that mixes tokens keeps a state of what it has seen, ``decode(x_new, state) ->
(y_new, state)`` (see :mod:`crate_compose.generation.decoding`, which runs a model's steps with these states):
:class:`Growing` is the cache of keys and values that grows along the token axis, and
:func:`causal_attention` attends the newest queries to every cached key. :func:`kind_of` tells how a
step decodes, :func:`state_bytes` what its state holds. :func:`attention_weights` writes out the
softmax weights that fused attention applies (what ``crate-compose show`` draws).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import WorkbenchError
from . import paths
from .precision import float32, linear_layout, softmax


class DecodingError(WorkbenchError):
    """A model that cannot be decoded token by token, or a request past its context."""


class Growing:
    """A cache that grows along the token axis (dim -2), doubling its storage when full, so appending
    a token is amortized O(1) copies; :attr:`nbytes` is the storage it holds."""

    def __init__(self) -> None:
        self.storage: torch.Tensor | None = None
        self.length = 0

    def extend(self, new: torch.Tensor) -> torch.Tensor:
        """Append ``new`` of shape ``(..., s, p)``; return everything so far, ``(..., length, p)``."""
        end = self.length + new.shape[-2]
        if self.storage is None or end > self.storage.shape[-2]:
            capacity = max(end, 2 * (self.storage.shape[-2] if self.storage is not None else 0), 16)
            grown = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
            if self.storage is not None:
                grown[..., : self.length, :] = self.storage[..., : self.length, :]
            self.storage = grown
        self.storage[..., self.length : end, :] = new
        self.length = end
        return self.storage[..., :end, :]

    @property
    def nbytes(self) -> int:
        return 0 if self.storage is None else self.storage.numel() * self.storage.element_size()


# On CPU, PyTorch's fused (flash) attention kernel runs bfloat16 at about its float32 speed, while the
# products written out run at the bfloat16 matrix rate: one MSSA head block of CRATE-B (8 x 12 heads,
# 197 tokens) takes 27 ms forward and backward written out against 55 ms fused, and the written-out
# form stays ahead up to the 1024 keys measured (benchmarks/RESULTS.md, "train_step.py"). In float32
# the fused kernel is the faster one (26 against 35 ms), and on CUDA it always is.
EXPLICIT_BF16_CPU_KEYS = 1024


def visible(n: int, t: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    """``(n, t)`` booleans, True where query i may see key j: ``j <= i + offset`` (``offset = 0``: the
    causal mask aligned top-left, as ``scaled_dot_product_attention(is_causal=True)`` aligns it)."""
    return torch.ones(n, t, dtype=torch.bool, device=device).tril(diagonal=offset)


def written_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(q k^T * scale + M) v`` as written (``M = -inf`` where ``mask`` is False; ``scale``
    ``p^-1/2`` unless given): the scores, their softmax (in float32 for half inputs, cast back to the
    values' dtype, as :mod:`.precision` computes it) and its product with the values, each its own op."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale  # (..., n, t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1).to(v.dtype) @ v


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """``softmax(q k^T * scale [+ causal mask]) v`` (``scale`` ``p^-1/2`` unless given; the causal mask
    aligned top-left), ``(..., n, p)``: :func:`F.scaled_dot_product_attention`, whose fused kernels
    accumulate in float32, except for bfloat16 on CPU with at most :data:`EXPLICIT_BF16_CPU_KEYS` keys,
    where the three products are written out: logits in bfloat16 (float32's range, so no overflow) and
    the softmax computed in float32 by the CPU kernel and rounded to bfloat16, as the fused kernel
    rounds the weights it applies. ``q is k is v`` (MSSA) is made contiguous once; where torch's own kernels
    compute the products (:func:`.precision.fallback_products`), ``v`` is read through a transposed copy
    (:func:`.precision.linear_layout`), many times faster there. With the formulas as
    written (:mod:`crate_compose.modules.paths`): :func:`written_attention`."""
    if not paths.fast():
        mask = visible(q.shape[-2], k.shape[-2], q.device) if causal else None
        return written_attention(q, k, v, scale=scale, mask=mask)
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and k.shape[-2] <= EXPLICIT_BF16_CPU_KEYS:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if q is k and k is v:
            q = k = v = q.contiguous()  # one copy for batched products that need no more
        else:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        scores = (q * scale) @ k.transpose(-1, -2)  # (..., n, t)
        if causal:
            scores = scores.masked_fill(~visible(*scores.shape[-2:], scores.device), float("-inf"))
        return torch.softmax(scores, dim=-1) @ linear_layout(v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(p) + M) v`` for the *last* ``s`` positions of ``t`` keys: query i sits at
    position ``t - s + i`` and sees keys up to there. (``scaled_dot_product_attention(is_causal=True)``
    aligns the mask top-left, so one query would see only the first key.)"""
    s, t = q.shape[-2], k.shape[-2]
    if s == 1:  # the newest token sees every key
        return softmax_attention(q, k, v)
    if s == t:
        return softmax_attention(q, k, v, causal=True)
    mask = visible(s, t, q.device, offset=t - s)
    if not paths.fast():
        return written_attention(q, k, v, mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_weights(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """``softmax(q k^T / sqrt(p))`` of shape ``(..., n, n)``: the weights that
    ``scaled_dot_product_attention(q, k, v, is_causal=causal)`` applies to ``v`` (it computes them fused
    and never returns them). With ``causal``, the mask is aligned top-left as there (query i sees keys
    0..i). Computed in float32 for half-precision inputs (the result too)."""
    scores = float32(q) @ float32(k).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~visible(*scores.shape[-2:], scores.device), float("-inf"))
    return torch.softmax(scores, dim=-1)


def kind_of(module: nn.Module) -> str | None:
    """``"state"`` (has ``decode``), ``"tokenwise"``, or None (cannot be decoded incrementally)."""
    if callable(getattr(module, "decode", None)):
        return "state"
    if getattr(module, "tokenwise", False) or isinstance(module, (nn.LayerNorm, nn.Identity)):
        return "tokenwise"
    return None


def state_bytes(state: Any) -> int:
    """Bytes a step's decoding state holds (its caches and running sums)."""
    if isinstance(state, Growing):
        return state.nbytes
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, (tuple, list)):
        return sum(state_bytes(s) for s in state)
    if isinstance(state, dict):
        return sum(state_bytes(s) for s in state.values())
    return 0

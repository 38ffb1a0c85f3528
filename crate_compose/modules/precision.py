"""Half-precision builds compute their statistics in float32.

A ``bfloat16`` or ``float16`` build keeps its weights and token streams in half precision, but
the quantities that overflow or lose all their digits there are computed in float32 and cast back:
softmax and its logits (scores grow with the square of the tokens; float16 ends at 65504),
LayerNorm's mean and variance, and TSSA's statistics (squared projections, memberships, second
moments, and the running sums of the causal scan). Float32 and float64 builds are untouched.
Fused attention (``F.scaled_dot_product_attention``) already accumulates in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import paths

HALF = (torch.float16, torch.bfloat16)


def float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is a half type; unchanged otherwise (float64 stays float64)."""
    return x.float() if x.dtype in HALF else x


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``softmax(x)`` computed in float32 for half inputs; the result in float32 too (the caller
    casts it back where it meets the token stream)."""
    return torch.softmax(float32(x), dim=dim)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters, same state-dict names) that normalizes half-precision
    tokens in float32 and returns their dtype (on the CPU without gradients through PyTorch's mixed-precision
    kernel, a fast path: :mod:`crate_compose.modules.paths`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in HALF:
            return super().forward(x)
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        if x.device.type == "cpu" and not torch.is_grad_enabled() and paths.fast():
            # PyTorch's CPU kernel takes half tokens with float32 parameters and computes in float32
            # itself (statistics and arithmetic; the same values to the last place), without the two
            # copies of the tokens below: 9x faster at CRATE-B's (8, 197, 768). Not while gradients are
            # taken: its weight and bias gradients accumulate in half precision (5e-2 off at that size).
            return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)

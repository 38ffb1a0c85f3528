"""Half-precision builds compute their statistics in float32.

A ``bfloat16`` or ``float16`` build keeps its weights and token streams in half precision, but
the quantities that overflow or lose all their digits there are computed in float32 and cast back:
softmax and its logits (scores grow with the square of the tokens; float16 ends at 65504),
LayerNorm's mean and variance, and TSSA's statistics (squared projections, memberships, second
moments, and the running sums of the causal scan). Float32 and float64 builds are untouched.
Fused attention (``F.scaled_dot_product_attention``) already accumulates in float32.

Where torch computes half-precision products on the CPU with its own portable kernels (:func:`fallback_products`:
a CPU on which oneDNN has no bf16, such as an AVX2-only one), they read their right operand in the layout
``nn.Linear`` reads its weight in (:func:`linear_layout`): there a bf16 product of two row-major operands is
about 20x slower than one of this layout (``benchmarks/train_step.py --onednn off``).
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


def fallback_products() -> bool:
    """Whether torch computes the CPU's bf16 matrix products with its own portable kernels rather than oneDNN's:
    oneDNN has no bf16 on this CPU (no AVX-512, as on an AVX2-only AMD EPYC), or it is switched off
    (``torch.backends.mkldnn.flags(enabled=False)``). Their speed depends on the operands' layout."""
    return not (
        torch.backends.mkldnn.is_available()
        and torch._C._get_mkldnn_enabled()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def linear_layout(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix``, the right operand of a product, as a transposed view of a copy of its transpose (the layout in
    which ``nn.Linear`` reads its weight) when the product is a half-precision one on a CPU of
    :func:`fallback_products`: a half ``matrix``, or a float32 one under the CPU's autocast to a half type (cast
    here, as autocast would cast it). There a bf16 product of two row-major operands is about 20x slower than one
    of this layout; elsewhere (oneDNN, float32, CUDA) ``matrix`` is returned as it is, since the copy would cost
    without gaining. Batched operands ``(..., k, m)`` keep their batch dimensions."""
    if matrix.device.type != "cpu" or not fallback_products():
        return matrix
    if matrix.dtype == torch.float32 and torch.is_autocast_enabled("cpu"):
        matrix = matrix.to(torch.get_autocast_dtype("cpu"))
    if matrix.dtype not in HALF:
        return matrix
    return matrix.transpose(-1, -2).contiguous().transpose(-1, -2)


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

"""Residual steps and LayerScale, in one place for every primitive.

Many optimization steps are written ``Z + step(Z)``: the identity term is the gradient step's
``Z`` (MSSA, 003 eq. 10), a skip connection (MLP), or the un-normalized input of a decoder step
(001, the authors' code). A primitive with such a form subclasses :class:`Residual` and writes
only :meth:`Residual.split`, which returns ``(skip, branch)``; the forward pass is
``skip + branch``, or ``skip + gamma * branch`` once the spec asks for LayerScale
(``layer_scale: 1e-5`` on a step; ToST, CRATE-alpha, CaiT): a learned ``gamma`` of shape ``(d,)``
initialized to that value. No primitive implements LayerScale itself.
"""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    """A step ``skip(Z) + branch(Z)``; with LayerScale, ``skip(Z) + gamma * branch(Z)``."""

    layer_scale: nn.Parameter | None
    drop_path = 0.0  # stochastic depth: while training, the branch of each example is dropped with this probability
    adds_skip = True  # an instance may say False: its forward is the branch alone (and takes no LayerScale)

    def __init__(self) -> None:
        super().__init__()
        self.layer_scale = None

    def split(self, x: torch.Tensor, *extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(skip, branch)`` of shape ``(B, n, d)`` each."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        return self.combine(*self.split(x, *extra))

    def combine(self, skip: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """``skip + branch``, or ``skip + gamma * branch`` with LayerScale (also for cached decoding)."""
        if self.layer_scale is not None:
            branch = self.layer_scale * branch
        if self.drop_path and self.training:  # kept branches scaled by 1/(1-p): the expectation is unchanged
            keep = torch.rand(branch.shape[0], *(1,) * (branch.ndim - 1), device=branch.device) >= self.drop_path
            branch = branch * keep.to(branch.dtype) / (1 - self.drop_path)
        return skip + branch

    def enable_layer_scale(self, dim: int, init: float) -> None:
        """Scale the branch by a learned ``gamma`` of shape ``(dim,)``, initialized to ``init``."""
        self.layer_scale = nn.Parameter(torch.full((dim,), float(init)))


def stochastic_depth(model: nn.Module, rate: float) -> None:
    """Drop residual branches while training (Huang et al. 2016), with probability rising linearly
    over the network's residual steps from 0 to ``rate`` at the last (DeiT's and XCiT's schedule)."""
    steps = [m for m in model.modules() if isinstance(m, Residual) and m.adds_skip]
    for i, module in enumerate(steps):
        module.drop_path = rate * i / max(1, len(steps) - 1)

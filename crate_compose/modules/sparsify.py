"""The modules of :mod:`crate_compose.primitives.sparsify`: the ISTA family of sparsification
steps (003 eq. 17, 92; CRATE-alpha).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .precision import LayerNorm
from .residual import Residual


class ISTA(nn.Module):
    """``ISTA(LN z | D)``: one proximal-gradient step on ``lambda ||x||_1 + 1/2 ||z - D x||^2`` (003 eq. 17)."""

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self,
        dim: int,
        *,
        step_size: float = 0.1,
        lambd: float = 0.1,
        threshold: str = "relu",
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.step_size, self.lambd, self.threshold = step_size, lambd, threshold
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, dim))  # D
        nn.init.kaiming_uniform_(self.dictionary)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        u = self.norm(z)  # (B, n, d)
        grad = F.linear(u - F.linear(u, self.dictionary), self.dictionary.t())  # D^T (u - D u), columns
        step = u + self.step_size * grad
        if self.threshold == "soft":  # S_{eta lambda}, 003 eq. 116-117
            return F.softshrink(step, self.step_size * self.lambd)
        return F.relu(step - self.step_size * self.lambd)


class ISTAMM(nn.Module):
    """``ReLU((1 + 4/(9(1+alpha))) D^* LN(z) - 4 lambda/(9 alpha))``: one proximal MM step (003 eq. 77-92).

    The step minimizes a quadratic majorizer of ``lambda ||Z||_1 + chi_{Z >= 0} - R(Z)`` with
    ``R(Z) = 1/2 logdet(I + alpha Z^* Z)``, ``alpha = d / (N eps^2)`` (003 eq. 77), around the
    post-compression iterate rotated by an orthogonal dictionary ``D``. In rows: ``u @ D``. No skip.
    With ``alpha`` not given, it is computed from its definition for the tokens at hand
    (``d`` features, ``N`` tokens, precision ``eps`` of the coding rate); the paper leaves it a
    hyperparameter and reports no value.
    """

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self,
        dim: int,
        *,
        alpha: float | None = None,
        precision: float = 0.5,
        lambd: float = 0.1,
        norm: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.alpha, self.precision, self.lambd = alpha, precision, lambd
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, dim))  # D (orthogonal in the derivation; learned here)
        nn.init.kaiming_uniform_(self.dictionary)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        u = self.norm(z)  # (B, n, d)
        alpha = self.alpha if self.alpha is not None else z.shape[-1] / (z.shape[-2] * self.precision**2)
        gain = 1 + 4 / (9 * (1 + alpha))  # eq. 86: the minimizer of the majorizer
        return F.relu(gain * (u @ self.dictionary) - 4 * self.lambd / (9 * alpha))  # eq. 87-88, 92


class ISTAODL(Residual):
    """``x + ISTA_2(LN x | D) D1^T``: two non-negative ISTA steps from 0, overcomplete (CRATE-alpha).

    ``D`` (``dictionary``) and ``D1`` (``synthesis``; the authors' ``D`` and ``D1``) have shape
    ``(d, ratio*d)``; in rows, with ``u = LN(x)``::

        a1  = ReLU(eta u D - eta lambda)                      # first step from a = 0
        a2  = ReLU(a1 - eta (a1 D^T - u) D - eta lambda)      # second step
        out = x + a2 D1^T

    ``tied``: ``D1`` is ``D`` (no ``synthesis`` parameter); ``residual=False``: ``out = a2 D1^T``
    (crate-lm's language models).

    No inverse: the step's output is a token (the code is decoded by ``D1`` and added back), not a
    sparse code, so the ``dictionary`` synthesis that undoes ISTA (001 Listing 3) does not undo it,
    and no paper derives a decoder step for it.
    """

    tokenwise = True  # each token alone (cached decoding)

    def __init__(
        self,
        dim: int,
        *,
        ratio: int = 4,
        step_size: float = 0.1,
        lambd: float = 0.1,
        norm: bool = True,
        eps: float = 1e-5,
        tied: bool = False,
        residual: bool = True,
    ) -> None:
        super().__init__()
        self.step_size, self.lambd, self.adds_skip = step_size, lambd, residual
        self.norm = LayerNorm(dim, eps=eps) if norm else nn.Identity()
        self.dictionary = nn.Parameter(torch.empty(dim, ratio * dim))  # D
        nn.init.kaiming_uniform_(self.dictionary)
        self.synthesis = None if tied else nn.Parameter(torch.empty(dim, ratio * dim))  # D1
        if self.synthesis is not None:
            nn.init.kaiming_uniform_(self.synthesis)

    def code(self, x: torch.Tensor) -> torch.Tensor:
        """The sparse code ``a2`` of shape ``(B, n, ratio*d)`` (``LN`` applied here)."""
        eta, threshold = self.step_size, self.step_size * self.lambd
        u = self.norm(x)  # (B, n, d)
        a1 = F.relu(eta * (u @ self.dictionary) - threshold)  # (B, n, r*d)
        return F.relu(a1 - eta * ((a1 @ self.dictionary.t() - u) @ self.dictionary) - threshold)  # (B, n, r*d)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        synthesis = self.dictionary if self.synthesis is None else self.synthesis
        return x, self.code(x) @ synthesis.t()  # (B, n, d)

    def combine(self, skip: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """``skip + branch`` (LayerScale applied by :class:`Residual`), or the branch alone without residual."""
        return super().combine(skip, branch) if self.adds_skip else branch

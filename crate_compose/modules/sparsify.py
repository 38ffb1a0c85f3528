"""The modules of :mod:`crate_compose.primitives.sparsify`: the ISTA family of sparsification
steps (003 eq. 17, 92; CRATE-alpha).

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import paths
from .precision import LayerNorm, linear_layout
from .residual import Residual


def _threshold(x: torch.Tensor, shift: float, threshold: str) -> torch.Tensor:
    """``ReLU(x - shift)``, or ``S_shift(x) = sign(x) max(|x| - shift, 0)`` for ``threshold="soft"`` (003 eq. 116-117)."""
    return F.softshrink(x, shift) if threshold == "soft" else torch.relu(x - shift)


def ista_written(
    u: torch.Tensor, dictionary: torch.Tensor, step_size: float, lambd: float, threshold: str = "relu"
) -> torch.Tensor:
    """``ReLU(u + eta (u - u D^T) D - eta lambda)`` (003 eq. 17 in rows), as written: the residual
    ``u - u D^T``, its product with ``D``, the step and the threshold, each its own op."""
    return _threshold(u + step_size * ((u - u @ dictionary.t()) @ dictionary), step_size * lambd, threshold)


def lowered(rows: torch.Tensor) -> bool:
    """Whether autocast computes products of ``rows`` in a lower precision than ``rows`` is held in
    (float32 tokens under bf16 or fp16 autocast): then a step adds its input outside the product,
    in the input's precision, as every residual sum is kept, instead of inside a lowered ``addmm``.

    The meta device (a build's shape check) has no autocast. It is named rather than asked
    (``torch.amp.is_autocast_available``): TorchDynamo cannot trace that call in torch 2.11, and a graph
    break in every ISTA step made a compiled CRATE-B's bf16 training step slower than eager on an H100."""
    device = rows.device.type
    if device == "meta":
        return False
    return torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device).itemsize < rows.dtype.itemsize


def ista_step(
    u: torch.Tensor,
    dictionary: torch.Tensor,
    step_size: float,
    lambd: float,
    threshold: str = "relu",
    *,
    folded: bool | None = None,
) -> torch.Tensor:
    """``ReLU(u + eta (u - u D^T) D - eta lambda)`` in rows (``threshold="soft"``: ``S_{eta lambda}(.)``),
    for ``u`` of shape ``(..., d)`` and ``D`` of shape ``(d, d)``: :class:`ISTA`'s step, in as few passes
    over the tokens as the sizes allow.

    * Two products (``folded=False``): ``r = u - u D^T`` and ``u + eta r D``, each one ``addmm`` whose
      add and scale run inside the matrix product; then the threshold, in place.
    * One product (``folded=True``): the step is linear in ``u`` before its threshold,
      ``u + eta (u - u D^T) D = u M`` with ``M = I + eta (D - D^T D)``, so it is one ``addmm`` with the
      bias ``-eta lambda`` and one threshold in place. Forming ``M`` costs ``d^3`` multiply-adds, the
      product it saves ``N d^2`` (``N`` tokens in all), in the backward pass likewise.

    Under autocast to a lower precision than the tokens' (:func:`lowered`: float32 tokens, bf16 or fp16
    products) the identity is kept out of the product: ``u + u K`` with ``K = eta (D - D^T D)``
    (two products: ``u + eta (u - u D^T) D``), the product lowered and the sum in the tokens' precision,
    as the formula written out computes it. Folding ``u`` into the lowered ``addmm`` would round the
    token stream itself to bf16 at every ISTA step: 5x the formula's error on a whole CRATE-B/16
    (``docs/precision.md``).

    ``M`` (``K``) is formed as its transpose and read through a transposed view, as ``nn.Linear`` reads its
    weight, at no cost: where torch computes bf16 products with its own kernels (an AVX2-only CPU), a product of
    two row-major operands is about 20x slower than one of this layout
    (:func:`~crate_compose.modules.precision.fallback_products`; oneDNN, float32 and CUDA do not care).

    ``folded=None`` takes the one product when there are at least ``d`` tokens (a training batch), the
    two otherwise (decoding a few tokens), and :func:`ista_written` when the formulas are as written
    (:mod:`crate_compose.modules.paths`). They compute the same step and differ by rounding
    (``tests/test_speed_paths.py``: 1e-10 in float64, the dtype's precision in half; ``docs/precision.md``).
    ``folded=True`` or ``False`` takes that form whatever the switch says.
    """
    if folded is None and not paths.fast():
        return ista_written(u, dictionary, step_size, lambd, threshold)
    rows = u.reshape(-1, u.shape[-1])  # (N, d)
    shift = step_size * lambd
    if folded is None:
        folded = rows.shape[0] >= rows.shape[1]
    if lowered(rows):  # the products in half precision, u added in its own
        d = dictionary.to(torch.get_autocast_dtype(rows.device.type))  # D cast once (autocast casts D^T apart)
        if folded:
            k = torch.addmm(d.t(), d.t(), d, beta=step_size, alpha=-step_size).t()  # eta (D - D^T D), K^T stored
            step = rows + rows @ k
        else:
            step = torch.add(rows, (rows - rows @ d.t()) @ linear_layout(d), alpha=step_size)
        out = F.softshrink(step, shift) if threshold == "soft" else step.sub_(shift).relu_()
    elif folded:
        m = torch.addmm(dictionary.t(), dictionary.t(), dictionary, beta=step_size, alpha=-step_size)  # M^T stored
        m.diagonal().add_(1.0)  # + I
        m = m.t()  # M = I + eta (D - D^T D), read as nn.Linear reads its weight (see above)
        if threshold == "soft":  # S_{eta lambda}, 003 eq. 116-117
            out = F.softshrink(rows @ m, shift)
        else:
            out = torch.addmm(rows.new_full((1,), -shift), rows, m).relu_()
    else:
        r = torch.addmm(rows, rows, dictionary.t(), alpha=-1.0)  # u - u D^T
        step = torch.addmm(rows, r, linear_layout(dictionary), alpha=step_size)  # u + eta r D
        out = F.softshrink(step, shift) if threshold == "soft" else step.sub_(shift).relu_()
    return out.view(u.shape)


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
        return ista_step(self.norm(z), self.dictionary, self.step_size, self.lambd, self.threshold)


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
        if not paths.fast():  # as written
            return torch.relu(gain * (u @ self.dictionary) - 4 * self.lambd / (9 * alpha))
        rows = u.reshape(-1, u.shape[-1])
        out = torch.addmm(
            rows.new_full((1,), -4 * self.lambd / (9 * alpha)), rows, linear_layout(self.dictionary), alpha=gain
        )
        return out.relu_().view(u.shape)  # eq. 87-88, 92: ReLU(gain u D - 4 lambda / (9 alpha)), one addmm


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
        if not paths.fast():
            return self.code_written(u)
        rows = u.reshape(-1, u.shape[-1])  # (N, d)
        dictionary = linear_layout(self.dictionary)  # D as u D reads it fast in half precision (D^T as it is)
        first = torch.addmm(rows.new_full((1,), -threshold), rows, dictionary, alpha=eta)  # eta u D - eta lambda
        a1 = F.relu(first)  # (N, r*d)
        # a1 - eta (a1 D^T - u) D - eta lambda = (a1 + first) - eta (a1 D^T) D: one product and one addmm
        a2 = torch.addmm(a1 + first, a1 @ self.dictionary.t(), dictionary, alpha=-eta).relu_()
        return a2.view(*u.shape[:-1], a2.shape[-1])  # (B, n, r*d)

    def code_written(self, u: torch.Tensor) -> torch.Tensor:
        """``a2`` from ``u = LN(x)`` as written: ``a1 = ReLU(eta u D - eta lambda)``, then
        ``a2 = ReLU(a1 - eta (a1 D^T - u) D - eta lambda)``."""
        eta, lambd, dictionary = self.step_size, self.lambd, self.dictionary
        a1 = torch.relu(eta * (u @ dictionary) - eta * lambd)
        return torch.relu(a1 - eta * ((a1 @ dictionary.t() - u) @ dictionary) - eta * lambd)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        synthesis = self.dictionary if self.synthesis is None else self.synthesis
        return x, self.code(x) @ synthesis.t()  # (B, n, d)

    def combine(self, skip: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """``skip + branch`` (LayerScale applied by :class:`Residual`), or the branch alone without residual."""
        return super().combine(skip, branch) if self.adds_skip else branch

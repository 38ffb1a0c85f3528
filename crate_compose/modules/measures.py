"""Measures: the objective each optimization step claims to move, and how to evaluate it on the step.

A primitive that is a step on a named objective declares a *measure* (``measure=`` of
:func:`crate_compose.registry.primitive`): one or more :class:`Measure` s, each a function
``(module, inputs, output) -> Reading`` that evaluates the objective on the step's output (and,
where the step has a natural starting point, on that point too: ``Reading.before``), and the
direction the step claims to move it (``"down"`` or ``"up"``). :func:`crate_compose.assessment.layer_probes.probe`
runs a built model with forward hooks and reads them, layer by layer.

The objectives (``docs/workbench.md``, Probe; tokens are rows, ``Z`` of shape ``(B, n, d)``):

* :func:`coding_rate`: ``R^c(Z | U) = 1/2 sum_k logdet(I + a (U_k^T Z)^T (U_k^T Z))`` (003 eq. 7),
  ``a = p / (N eps^2)`` in the papers' form; the authors' measuring tool (CRATE repository,
  ``vis_utils/coding_rate.py``) first scales each token's projection ``U_k^T z`` to unit norm and
  uses ``a = p / (N eps)`` with ``eps = 0.01``: that is the default here (``normalize=True``).
* :func:`sparsity`: the fraction of exactly-zero entries, ``1 - ||Z||_0 / (d N)``; the papers plot
  the *density* ``||Z||_0 / (d N)`` (003 Fig. 3-4, lower is sparser), reported as ``l0_density``.
* :func:`snr`: per subspace, ``||U_k U_k^T Z_k||_F / ||(I - U_k U_k^T) Z_k||_F`` over the tokens of
  group ``k`` (book eq. 5.3.3), for synthetic data with known subspaces and labels.
* :func:`subspace_residual`: the relative distance of each token to its nearest subspace,
  ``min_k ||(I - P_k) z|| / ||z||``, what the denoiser of 003 eq. 6 reduces.
* :func:`variational_rate`: ToST's ``R^var_{c,f}(Z, Pi | U)`` with ``f(x) = log(1 + x)`` (book
  eq. 5.3.8), the objective TSSA takes a gradient step on.
* :func:`lasso`: ``lambda ||A||_1 + 1/2 ||U - A D^T||_F^2`` per token, the objective of the ISTA steps.

:func:`coding_rate_measure`, :func:`sparsity_measures` and :func:`lasso_measure` make the
:class:`Measure` s the built-in steps declare.

Batches: every measure of a ``(B, n, d)`` batch of token sets is computed per token set (``N = n``)
and averaged over the ``B`` sets, as the papers do ("evaluated at the per-sample level and
averaged", 003 Sec. 3.1); the exceptions, pooled over the batch, are said in their docstrings.
All arithmetic is in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

Direction = Literal["down", "up"]
DEFAULT_EPS = 0.01  # the authors' measuring tool (normalized form)
DEFAULT_PRECISION = 0.5  # eps of the papers' form when a step has no precision of its own


class Reading(NamedTuple):
    """One measurement: the objective on the step's output (``value``) and, where the step has a
    natural starting point (its input, as the step sees it), on that point (``before``)."""

    value: float
    before: float | None = None


@dataclass(frozen=True)
class Measure:
    """What a step claims to move and how to measure it.

    ``name``: the row key (``coding_rate``, ``sparsity``, ...); ``direction``: which way the step
    claims to move it; ``fn(module, inputs, output, **options)``: a float, a :class:`Reading`, or
    ``None`` when this module has nothing to measure (e.g. AoT's ``mhsa`` variant has no shared
    subspaces); ``label``: the axis label of plots; ``description``: one sentence for summaries.
    ``options`` are :func:`crate_compose.assessment.layer_probes.probe`'s ``normalize`` and ``eps``; a function ignores
    those it does not use.
    """

    name: str
    direction: Direction
    fn: Callable[..., "float | Reading | None"]
    label: str
    description: str = ""

    def __post_init__(self) -> None:
        if self.direction not in ("down", "up"):
            raise ValueError(f"measure {self.name!r}: direction must be 'down' or 'up', not {self.direction!r}")

    def __call__(
        self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: Any, **options: Any
    ) -> Reading | None:
        with torch.no_grad():
            result = self.fn(module, inputs, tokens_of(output), **options)
        if result is None or isinstance(result, Reading):
            return result
        return Reading(float(result))


def tokens_of(output: Any) -> Any:
    """The token stream of a step's output (steps that publish values return a tuple, tokens first)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def _batched(z: torch.Tensor) -> torch.Tensor:
    """``(n, d)`` or ``(B, n, d)`` as ``(B, n, d)`` float64."""
    if z.dim() == 2:
        z = z.unsqueeze(0)
    if z.dim() != 3:
        raise ValueError(f"expected tokens of shape (n, d) or (B, n, d); got {tuple(z.shape)}")
    return z.detach().to(torch.float64)


# --------------------------------------------------------------------------------------- coding rate


def heads_of(z: torch.Tensor, subspaces: torch.Tensor, heads: int) -> torch.Tensor:
    """Per-head projections ``U_k^T z`` of shape ``(B, K, n, p)``.

    ``z``: ``(n, d)`` or ``(B, n, d)``; ``subspaces``: ``U = [U_1 .. U_K]`` of shape ``(d, K*p)``
    (an ``nn.Linear(d, K*p)``'s weight is ``U^T``).
    """
    z = _batched(z)
    u = subspaces.detach().to(device=z.device, dtype=torch.float64)
    if u.shape[0] != z.shape[-1] or u.shape[1] % heads:
        raise ValueError(
            f"subspaces of shape {tuple(u.shape)} do not fit tokens of dimension {z.shape[-1]} "
            f"and {heads} heads (expected (d, K*p))"
        )
    return (z @ u).unflatten(-1, (heads, -1)).transpose(1, 2)


def rate_of_heads(w: torch.Tensor, *, eps: float = DEFAULT_EPS, normalize: bool = True) -> float:
    """``R^c`` from projections ``w = U_k^T Z`` of shape ``(B, K, n, p)``: summed over heads, averaged over B.

    ``logdet(I_n + a W W^T) = logdet(I_p + a W^T W)`` (Sylvester): the ``p x p`` form is used.
    """
    w = w.detach().to(torch.float64)
    n, p = w.shape[-2:]
    if normalize:
        w = F.normalize(w, dim=-1)  # each token's projection to unit norm (a zero projection stays zero)
        a = p / (n * eps)
    else:
        a = p / (n * eps**2)
    gram = torch.eye(p, dtype=w.dtype, device=w.device) + a * w.transpose(-1, -2) @ w  # (B, K, p, p)
    logdet = 2 * torch.linalg.cholesky(gram).diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (B, K), gram is SPD
    return float((0.5 * logdet).sum(-1).mean())


def coding_rate(
    z: torch.Tensor, subspaces: torch.Tensor, heads: int, *, eps: float = DEFAULT_EPS, normalize: bool = True
) -> float:
    """The compression term ``R^c(Z | U) = 1/2 sum_k logdet(I + a (U_k^T Z)^T (U_k^T Z))`` (003 eq. 7).

    Args:
        z: tokens ``(n, d)``, or a batch of token sets ``(B, n, d)``: ``R^c`` of each set (``N = n``),
            averaged over the batch.
        subspaces: ``U = [U_1 .. U_K]`` of shape ``(d, K*p)``.
        heads: ``K``.
        normalize: ``True`` (default): the authors' measuring tool (CRATE ``vis_utils/coding_rate.py``,
            the numbers of 003 Fig. 3-4): each token's projection ``U_k^T z`` is scaled to unit norm and
            ``a = p / (N eps)``. ``False``: the papers' formula, ``a = p / (N eps^2)`` on the raw projections.
        eps: the quantization precision (default 0.01, the tool's).
    """
    return rate_of_heads(heads_of(z, subspaces, heads), eps=eps, normalize=normalize)


# --------------------------------------------------------------------------------------- sparsity, SNR, ...


def sparsity(z: torch.Tensor, *, atol: float = 0.0) -> float:
    """Fraction of entries that are zero (``|z| <= atol``): ``1 - ||Z||_0 / (d N)``, higher is sparser.

    The papers plot ``||Z||_0 / (d N)`` (003 Fig. 3-4; App. B.7 Fig. 12 also counts ``|z| < tau``
    for thresholds tau): that is ``1 - sparsity(Z)``. Any shape; the fraction is over all entries,
    which for equal-size token sets is the batch average.
    """
    if z.numel() == 0:
        raise ValueError("sparsity of an empty tensor")
    return float((z.detach().abs() <= atol).to(torch.float64).mean())


def snr(z: torch.Tensor, subspaces: torch.Tensor, labels: torch.Tensor, heads: int) -> list[float]:
    """Per subspace ``k``: ``||U_k U_k^T Z_k||_F / ||(I - U_k U_k^T) Z_k||_F`` (book eq. 5.3.3).

    ``Z_k`` are the tokens labeled ``k``; ``U`` (``(d, K*p)``) must have orthonormal columns (the
    true subspaces of the synthetic data, book eq. 5.3.1/5.3.4). ``labels``: ``(n,)`` or ``(B, n)``
    group indices in ``[0, K)``. For a batch the Frobenius norms are pooled over all token sets
    (the ratio of the batch's norms, not an average of ratios). ``nan`` for a group with no tokens.
    """
    z = _batched(z)  # (B, n, d)
    labels = torch.as_tensor(labels, device=z.device).expand(z.shape[:2])
    u = subspaces.detach().to(device=z.device, dtype=torch.float64).unflatten(-1, (heads, -1))  # (d, K, p)
    values = []
    for k in range(heads):
        zk = z[labels == k]  # (m, d)
        if zk.shape[0] == 0:
            values.append(math.nan)
            continue
        signal = zk @ u[:, k] @ u[:, k].T  # U_k U_k^T z for every token (rows)
        values.append(float(signal.norm() / (zk - signal).norm()))
    return values


def subspace_residual(z: torch.Tensor, subspaces: torch.Tensor, heads: int) -> float:
    """Mean over tokens of ``min_k ||(I - P_k) z|| / ||z||``: each token's relative distance (the sine
    of its angle) to the nearest of the K subspaces, ``P_k`` the orthogonal projector onto span(U_k).

    This is what the denoiser of 003 eq. 6 reduces: for tokens near a mixture of subspaces it
    returns ``sum_k pi_k U_k U_k^T z`` with memberships ``pi`` largest for the nearest subspace, so
    (orthonormal ``U``) the components off that subspace shrink relative to the one on it. For
    orthonormal ``U_k``, ``P_k = U_k U_k^T`` and the nearest subspace is the one the denoiser's
    softmax weights most (the *assigned* k). Batches: averaged over all tokens (equal-size sets: the batch average).
    """
    z = _batched(z)
    u = subspaces.detach().to(device=z.device, dtype=torch.float64)
    u = u.unflatten(-1, (heads, -1)).permute(1, 0, 2)  # (K, d, p)
    q = torch.linalg.qr(u).Q  # orthonormal bases of span(U_k), (K, d, p)
    energy = z.pow(2).sum(-1, keepdim=True)  # (B, n, 1)
    on = torch.einsum("bnd,kdp->bnkp", z, q)  # Q_k^T z
    off = (energy - on.pow(2).sum(-1)).clamp_min(0)  # (B, n, K): ||(I - P_k) z||^2
    ratio = (off.min(-1).values / energy.squeeze(-1).clamp_min(1e-300)).sqrt()
    return float(ratio.mean())


def variational_rate(w: torch.Tensor, pi: torch.Tensor) -> float:
    """ToST's ``R^var_{c,f}(Z, Pi | U) = 1/2 sum_k (N_k/N) sum_j f((1/N_k) sum_i Pi_ik (U_k^T z_i)_j^2)``
    with ``f(x) = log(1 + x)`` (book eq. 5.3.8; ``1 / (1 + m)`` in TSSA is this ``f``'s gradient).

    ``w``: projections ``(B, K, n, p)``; ``pi``: memberships ``(B, K, n)`` (sum 1 over K);
    ``N_k = sum_i Pi_ik`` (+1e-8, as TSSA). Averaged over the batch.
    """
    w, pi = w.detach().to(torch.float64), pi.detach().to(torch.float64)
    n = w.shape[-2]
    mass = pi.sum(-1)  # (B, K): N_k
    moments = (pi.unsqueeze(-2) @ w.pow(2)).squeeze(-2) / (mass.unsqueeze(-1) + 1e-8)  # (B, K, p)
    return float((0.5 * (mass / n) * torch.log1p(moments).sum(-1)).sum(-1).mean())


def lasso(code: torch.Tensor, target: torch.Tensor, dictionary: torch.Tensor, lambd: float) -> float:
    """``lambda ||a||_1 + 1/2 ||u - D a||^2`` per token (columns; in rows ``u - a D^T``), averaged over all tokens.

    ``code``: ``(..., m)``; ``target``: ``(..., d)``; ``dictionary`` ``D``: ``(d, m)``. The objective of
    the ISTA steps (003 eq. 17; CRATE-alpha's two steps against an overcomplete ``D``).
    """
    code, target = code.detach().to(torch.float64), target.detach().to(torch.float64)
    d = dictionary.detach().to(device=code.device, dtype=torch.float64)
    fit = 0.5 * (target - code @ d.T).pow(2).sum(-1)
    return float((fit + lambd * code.abs().sum(-1)).mean())


# --------------------------------------------------------------------------------------- measures of steps


def _precision(module: nn.Module, normalize: bool, eps: float | None) -> float:
    """``eps`` as given; else 0.01 for the authors' normalized form, and the step's own precision
    (``precision``, or ``rate_eps`` of eq. 10) or 0.5 for the papers' form."""
    if eps is not None:
        return eps
    if normalize:
        return DEFAULT_EPS
    return float(getattr(module, "precision", None) or getattr(module, "rate_eps", None) or DEFAULT_PRECISION)


def _linear_subspaces(module: nn.Module) -> torch.Tensor:
    return module.subspaces.weight.t()  # nn.Linear(d, K*p).weight is U^T


def coding_rate_measure(
    direction: Direction = "down",
    *,
    subspaces: Callable[[nn.Module], torch.Tensor | None] = _linear_subspaces,
    description: str = "",
) -> Measure:
    """``R^c(LN Z | U)`` of a compression step against its own subspaces ``U`` (``subspaces(module)``).

    The step takes its gradient at ``LN Z`` (its own LayerNorm; ``norm: false``: ``Z``), so that is
    where it is measured: ``value`` on the step's output, ``before`` on its input. (``before`` is
    exactly the authors' tool, which hooks the ``qkv`` projection of ``LN Z``.)
    """

    def measure(module, inputs, output, *, normalize: bool = True, eps: float | None = None, **_):
        u = subspaces(module)
        if u is None:
            return None
        heads, norm = module.heads, getattr(module, "norm", nn.Identity())
        precision = _precision(module, normalize, eps)
        rate = lambda z: coding_rate(norm(z), u, heads, eps=precision, normalize=normalize)  # noqa: E731
        return Reading(rate(output), rate(inputs[0]))

    return Measure(
        "coding_rate",
        direction,
        measure,
        "R^c(Z | U)",
        description or "coding rate of the step's tokens against its own subspaces (003 eq. 7)",
    )


def sparsity_measures(
    code: Callable[[nn.Module, tuple, torch.Tensor], torch.Tensor] | None = None, *, start: bool = True
) -> tuple[Measure, Measure]:
    """``sparsity`` (fraction of zeros, up) and ``l0_density`` (``||Z||_0 / (dN)``, down) of a sparse code.

    ``code(module, inputs, output)``: the code to measure (default: the step's output). ``start``:
    also measure the step's starting point ``LN Z`` of its input (``before``); CRATE-alpha's steps
    start from the zero code, where ``before`` says nothing, so it has ``start=False``.
    """

    def zeros(module, inputs, output, **_):
        a = output if code is None else code(module, inputs, output)
        before = sparsity(getattr(module, "norm", nn.Identity())(inputs[0])) if start else None
        return Reading(sparsity(a), before)

    def density(module, inputs, output, **_):
        value, before = zeros(module, inputs, output)
        return Reading(1 - value, None if before is None else 1 - before)

    return (
        Measure("sparsity", "up", zeros, "fraction of zeros", "1 - ||Z||_0/(dN) of the step's sparse code"),
        Measure("l0_density", "down", density, "‖Z‖₀ / (d·N)", "||Z||_0/(dN) of the step's sparse code (003 Fig. 3)"),
    )


def lasso_measure(
    code: Callable[[nn.Module, tuple, torch.Tensor], torch.Tensor] | None = None,
    *,
    start: Literal["input", "zero"] = "input",
) -> Measure:
    """The LASSO of an ISTA step: ``lambda ||A||_1 + 1/2 ||LN Z - A D^T||^2`` per token (003 eq. 17).

    ``value`` at the step's code, ``before`` at its starting point: ``LN Z`` itself (CRATE's step
    starts at ``A = LN Z``, which may be negative: the non-negative problem's indicator is not
    counted there) or the zero code (CRATE-alpha's two steps).
    """

    def measure(module, inputs, output, **_):
        u = getattr(module, "norm", nn.Identity())(inputs[0])
        a = output if code is None else code(module, inputs, output)
        first = u if start == "input" else torch.zeros_like(a)
        return Reading(lasso(a, u, module.dictionary, module.lambd), lasso(first, u, module.dictionary, module.lambd))

    return Measure("lasso", "down", measure, "λ‖A‖₁ + ½‖Z − DA‖²", "the LASSO the step takes proximal steps on")

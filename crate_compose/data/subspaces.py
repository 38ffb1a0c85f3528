"""Token sets generated from a seed: the mixture of low-rank Gaussians of book eq. 5.3.1 (``subspaces``).

K orthonormal subspaces U_k of dimension p in R^d (:func:`random_subspaces`); a sample is a set of n
tokens, each in one group, its coefficients N(0, I_p) on its own subspace and N(0, delta^2 I_p) on
every other (:func:`sample_tokens`). :func:`load_subspaces` makes the ``subspaces`` data set, its K,
p, n and d following the spec's sizes where it declares them (see :mod:`crate_compose.data.sets`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DataError
from .record import Data, Tensors, declared_sizes
from .set_registry import TOKEN_GROUPS

__all__ = ["SUBSPACE_DEFAULTS", "load_subspaces", "random_subspaces", "sample_tokens"]


def random_subspaces(d: int, K: int, p: int, generator: torch.Generator) -> torch.Tensor:
    """[U_1 .. U_K]: K*p orthonormal columns in R^d (QR of a Gaussian matrix), shape (d, K*p)."""
    gaussian = torch.randn(d, K * p, generator=generator, dtype=torch.float64)
    basis, upper = torch.linalg.qr(gaussian)
    return (basis * torch.sign(torch.diagonal(upper))).float()  # a unique QR: positive diagonal


def sample_tokens(
    U: torch.Tensor, K: int, count: int, n: int, delta: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` sets of ``n`` tokens of eq. 5.3.1 and their group labels: (count, n, d), (count, n).

    A token of group k has coefficients a ~ N(0, I_p) on U_k and e_j ~ N(0, delta^2 I_p) on every
    other U_j. Token i is in group i mod K; each set's tokens are then shuffled.
    """
    p = U.shape[1] // K
    labels = torch.arange(n) % K
    order = torch.argsort(torch.rand(count, n, generator=generator), dim=1)
    labels = labels[order]  # (count, n)
    coefficients = delta * torch.randn(count, n, K, p, generator=generator)
    signal = torch.randn(count, n, p, generator=generator)
    coefficients[torch.arange(count)[:, None], torch.arange(n)[None, :], labels] = signal
    tokens = coefficients.reshape(count, n, K * p) @ U.T
    return tokens, labels


SUBSPACE_DEFAULTS = {"subspaces": 3, "subspace_dim": 16, "tokens": 48}  # K, p, n when neither given nor declared


def load_subspaces(
    *,
    seed: int = 0,
    K: int | None = None,
    p: int | None = None,
    n: int | None = None,
    delta: float = 0.1,
    d: int | None = None,
    train_count: int = 1024,
    test_count: int = 256,
    spec: Any = None,
) -> Data:
    """Token sets from K orthonormal p-dimensional subspaces of R^d (book eq. 5.3.1), seeded.

    The data follows the spec it is for: K, p, n and d that are not given are the spec's sizes
    ``subspaces``, ``subspace_dim``, ``tokens`` and ``d`` where it declares them (so
    ``specs/aot-subspaces.yaml`` gets the K = 3 subspaces of dimension 32 in R^96 it was written
    for, and :func:`~.record.spec_overrides` changes nothing), else 3, 16, 48 and K*p.
    """
    declared = {k: v for k, v in declared_sizes(spec).items() if isinstance(v, int) and not isinstance(v, bool)}
    sizes = {**SUBSPACE_DEFAULTS, **declared}
    K = sizes["subspaces"] if K is None else K
    p = sizes["subspace_dim"] if p is None else p
    n = sizes["tokens"] if n is None else n
    d = sizes.get("d", K * p) if d is None else d
    if min(K, p, n, train_count, test_count) < 1 or d < K * p or delta < 0:
        named = ", ".join(f"{k}={v}" for k, v in declared.items() if k in (*SUBSPACE_DEFAULTS, "d"))
        raise DataError(
            f"subspaces: need K, p, n, counts >= 1, delta >= 0 and d >= K*p; got K={K}, p={p}, n={n}, "
            f"d={d}, delta={delta}, counts={train_count}/{test_count}"
            + (f" (from the spec's sizes {named})" if named else "")
        )
    generator = torch.Generator().manual_seed(seed)
    U = random_subspaces(d, K, p, generator)
    train = Tensors(*sample_tokens(U, K, train_count, n, delta, generator))
    test = Tensors(*sample_tokens(U, K, test_count, n, delta, generator))
    return Data(
        name="subspaces",
        train=train,
        test=test,
        input_shape=(n, d),
        classes=None,
        provides=TOKEN_GROUPS,
        subspaces=U,
        sizes={"tokens": n, "d": d, "subspaces": K, "subspace_dim": p},
    )

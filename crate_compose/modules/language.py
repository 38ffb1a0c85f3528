"""The modules of :mod:`crate_compose.primitives.language`: token embedding, language-model and masked-LM heads.

Their arguments, equations and footprints are declared there; each class's docstring gives
the update it computes.
"""

from __future__ import annotations

import torch
from torch import nn

from .precision import LayerNorm


class TokenEmbedding(nn.Module):
    """``(B, n)`` token ids -> ``(B, n, d)`` rows of ``E`` (GPT-2: init N(0, 0.02^2)); with ``segments``,
    ``E[ids] + S[s]`` where ``s_i = min(#{j < i: ids_j = sep}, segments - 1)``: BERT's token types
    (Devlin et al. 2019, Sec. 3), derived from the ids themselves. For ``[CLS] A [SEP] B [SEP]``, ``A``
    and its ``[SEP]`` are segment 0, the rest segment 1."""

    tokenwise = True  # each output token depends on its own id only (cached decoding); not with segments

    def __init__(self, vocab: int, dim: int, *, std: float = 0.02, segments: int = 0, sep: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # E, the name GPT-2 and nn.Embedding use
        nn.init.normal_(self.weight, std=std)
        if segments:
            if sep is None:
                raise ValueError("token_embed with segments needs sep, the id of the [SEP] token")
            self.segments, self.sep = segments, sep
            self.segment = nn.Embedding(segments, dim)  # S: segment.weight, BERT's token_type_embeddings
            nn.init.normal_(self.segment.weight, std=std)
            self.tokenwise = False  # a token's segment depends on the [SEP] tokens before it

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.is_floating_point():
            raise ValueError("token_embed takes integer token ids (set input.dtype: int64)")
        z = nn.functional.embedding(ids, self.weight)
        if not hasattr(self, "segment"):
            return z
        return z + nn.functional.embedding(self.segment_ids(ids), self.segment.weight)

    def segment_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Each token's segment ``(B, n)``: the number of ``[SEP]`` tokens strictly before it, at most
        ``segments - 1``."""
        sep = (ids == self.sep).long()
        return (sep.cumsum(-1) - sep).clamp(max=self.segments - 1)


class LMHead(nn.Module):
    """``(B, n, d)`` -> ``(B, n, V)`` logits ``z W^T`` (+ b), one distribution per position."""

    tokenwise = True

    def __init__(self, dim: int, vocab: int, *, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # W; tied to E in GPT-2 and causal CRATE
        nn.init.normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(vocab)) if bias else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(z, self.weight, self.bias)


class MLMHead(nn.Module):
    """``(B, n, d)`` -> ``(B, n, V)`` logits ``LN(GELU(z W_t^T + b_t)) W^T + b`` at every position: BERT's
    masked-LM head (``BertLMPredictionHead``; Devlin et al. 2019, Sec. 3.1), exact (erf) GELU. ``W`` is
    meant to be tied to the token embedding, as BERT's decoder is; ``b`` starts at zero."""

    tokenwise = True

    def __init__(self, dim: int, vocab: int, *, eps: float = 1e-12) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)  # W_t, b_t: BERT's transform.dense (init N(0, 0.02^2), zero bias)
        nn.init.normal_(self.dense.weight, std=0.02)
        nn.init.zeros_(self.dense.bias)
        self.norm = LayerNorm(dim, eps=eps)
        self.weight = nn.Parameter(torch.empty(vocab, dim))  # W; tied to E in BERT
        nn.init.normal_(self.weight, std=0.02)
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.norm(nn.functional.gelu(self.dense(z)))
        return nn.functional.linear(h, self.weight, self.bias)

"""An independent eager CRATE, transcribed from the PyTorch-style pseudocode of paper 003, App. B.1.

Algorithm 1 (CRATE network), Algorithm 2 (Transformer block) and Algorithm 3 (Attention = MSSA block,
FeedForward = ISTA block), line by line, in plain torch + einops. Dropout is 0 in every configuration the
paper trains with, so it is left out (it would be an identity). Nothing here imports or mirrors
``crate_compose``'s own modules: the point of this file is to be a second, separate reading of the paper,
so that the built fx graph can be checked against it.

``load_from_built`` copies a built model's weights into this reference through an explicit key mapping.
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn
from torch.nn import functional as F


def pair(t):
    return t if isinstance(t, tuple) else (t, t)


class PreNorm(nn.Module):
    """Algorithm 2's ``[LayerNorm(dim, fn)]``: ``fn(LayerNorm(x))``."""

    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.norm(x))


class FeedForward(nn.Module):
    """Algorithm 3, FeedForward: one ISTA step with the three matrix products of the pseudocode."""

    def __init__(self, dim, hidden_dim, dropout=0.0, step_size=0.1, lambd=0.1):
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(dim, dim))
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.weight)
        self.step_size = step_size
        self.lambd = lambd

    def forward(self, x):
        x1 = F.linear(x, self.weight, bias=None)  # x W^T
        grad_1 = F.linear(x1, self.weight.t(), bias=None)  # x W^T W
        grad_2 = F.linear(x, self.weight.t(), bias=None)  # x W
        grad_update = self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd
        output = F.relu(x + grad_update)
        return output


class Attention(nn.Module):
    """Algorithm 3, Attention: MSSA with query = key = value = qkv(x), explicit matmul + softmax."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        project_out = not (heads == 1 and dim_head == dim)
        self.heads = heads
        self.scale = dim_head**-0.5
        self.attend = nn.Softmax(dim=-1)
        self.qkv = nn.Linear(dim, inner_dim, bias=False)
        # Sequential(Linear, Dropout(0)) in the paper; Dropout(0) is dropped, the index 0 is kept.
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim)) if project_out else nn.Identity()

    def forward(self, x):
        w = rearrange(self.qkv(x), "b n (h d) -> b h n d", h=self.heads)
        dots = torch.matmul(w, w.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        out = torch.matmul(attn, w)
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)


class Transformer(nn.Module):
    """Algorithm 2: ``x_ = attn(x) + x; x = ff(x_)`` (no residual around the ISTA block)."""

    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0.0, step_size=0.1, lambd=0.1):
        super().__init__()
        self.layers = nn.ModuleList()
        self.depth = depth
        for _ in range(depth):
            self.layers.append(
                nn.ModuleList(
                    [
                        PreNorm(dim, Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout)),
                        PreNorm(dim, FeedForward(dim, mlp_dim, dropout=dropout, step_size=step_size, lambd=lambd)),
                    ]
                )
            )

    def forward(self, x):
        for attn, ff in self.layers:
            x_ = attn(x) + x
            x = ff(x_)
        return x


class CRATE(nn.Module):
    """Algorithm 1."""

    def __init__(
        self,
        *,
        image_size,
        patch_size,
        num_classes,
        dim,
        depth,
        heads,
        mlp_dim=None,
        pool="cls",
        channels=3,
        dim_head=64,
        dropout=0.0,
        emb_dropout=0.0,
        step_size=0.1,
        lambd=0.1,
    ):
        super().__init__()
        image_height, image_width = pair(image_size)
        patch_height, patch_width = pair(patch_size)
        assert image_height % patch_height == 0 and image_width % patch_width == 0
        num_patches = (image_height // patch_height) * (image_width // patch_width)
        patch_dim = channels * patch_height * patch_width
        assert pool in {"cls", "mean"}
        self.to_patch_embedding = nn.Sequential(
            Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch_height, p2=patch_width),
            nn.LayerNorm(patch_dim),
            nn.Linear(patch_dim, dim),
            nn.LayerNorm(dim),
        )
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.transformer = Transformer(
            dim,
            depth,
            heads,
            dim_head,
            mlp_dim if mlp_dim is not None else dim,
            dropout,
            step_size=step_size,
            lambd=lambd,
        )
        self.pool = pool
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))

    def forward(self, img):
        x = self.to_patch_embedding(img)
        b, n, _ = x.shape
        cls_tokens = repeat(self.cls_token, "1 1 d -> b 1 d", b=b)
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.pos_embedding[:, : (n + 1)]
        x = self.transformer(x)
        x = x.mean(dim=1) if self.pool == "mean" else x[:, 0]
        x = self.to_latent(x)
        return self.mlp_head(x)


def key_mapping(depth: int) -> dict[str, str]:
    """Built model's state_dict key -> this reference's state_dict key, written out explicitly."""
    mapping = {
        "preprocess.patch_embed.norm_in.weight": "to_patch_embedding.1.weight",
        "preprocess.patch_embed.norm_in.bias": "to_patch_embedding.1.bias",
        "preprocess.patch_embed.project.weight": "to_patch_embedding.2.weight",
        "preprocess.patch_embed.project.bias": "to_patch_embedding.2.bias",
        "preprocess.patch_embed.norm_out.weight": "to_patch_embedding.3.weight",
        "preprocess.patch_embed.norm_out.bias": "to_patch_embedding.3.bias",
        "preprocess.class_token.token": "cls_token",
        "preprocess.positions.embedding": "pos_embedding",
        "head.classify.norm.weight": "mlp_head.0.weight",
        "head.classify.norm.bias": "mlp_head.0.bias",
        "head.classify.classifier.weight": "mlp_head.1.weight",
        "head.classify.classifier.bias": "mlp_head.1.bias",
    }
    for i in range(depth):
        built, ref = f"encoder.layer_{i}", f"transformer.layers.{i}"
        mapping.update(
            {
                f"{built}.compress.norm.weight": f"{ref}.0.norm.weight",
                f"{built}.compress.norm.bias": f"{ref}.0.norm.bias",
                f"{built}.compress.subspaces.weight": f"{ref}.0.fn.qkv.weight",
                f"{built}.compress.out.weight": f"{ref}.0.fn.to_out.0.weight",
                f"{built}.compress.out.bias": f"{ref}.0.fn.to_out.0.bias",
                f"{built}.sparsify.dictionary": f"{ref}.1.fn.weight",
                f"{built}.sparsify.norm.weight": f"{ref}.1.norm.weight",
                f"{built}.sparsify.norm.bias": f"{ref}.1.norm.bias",
            }
        )
    return mapping


def load_from_built(reference_model: CRATE, built_state_dict) -> dict[str, str]:
    """Copy a built model's weights into ``reference_model``; every key on both sides must be used.

    Shapes must match exactly (no reshaping or transposition is done: the built layout is the paper's).
    Returns the mapping used (built key -> reference key).
    """
    depth = len(reference_model.transformer.layers)
    mapping = key_mapping(depth)
    built_keys, ref_state = set(built_state_dict), reference_model.state_dict()
    unmapped = built_keys - set(mapping)
    missing = set(mapping) - built_keys
    if unmapped or missing:
        raise KeyError(f"built keys without a mapping: {sorted(unmapped)}; mapped keys not built: {sorted(missing)}")
    if set(mapping.values()) != set(ref_state):
        raise KeyError(f"reference keys not filled: {sorted(set(ref_state) - set(mapping.values()))}")
    new_state = {}
    for built_key, ref_key in mapping.items():
        value = built_state_dict[built_key]
        if tuple(value.shape) != tuple(ref_state[ref_key].shape):
            raise ValueError(f"{built_key} {tuple(value.shape)} -> {ref_key} {tuple(ref_state[ref_key].shape)}")
        new_state[ref_key] = value.detach().clone().to(ref_state[ref_key].dtype)
    reference_model.load_state_dict(new_state, strict=True)
    return mapping

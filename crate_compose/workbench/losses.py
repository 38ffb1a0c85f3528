"""Training losses that read a built model's outputs.

``masked_reconstruction_loss`` is CRATE-MAE's (and MAE's) loss: the mean squared error between
predicted and true pixels, on hidden patches only (001 App. B.1).
"""

from __future__ import annotations

import torch
from torch import fx

from ..building.builder import spec_of
from ..modules.embed import patchify


def masked_reconstruction_loss(
    prediction: torch.Tensor,
    images: torch.Tensor,
    mask: torch.Tensor,
    patch_size: int,
    *,
    normalize_pixels: bool = False,
) -> torch.Tensor:
    """MSE on hidden patches.

    Args:
        prediction: ``(B, m, P*P*C)`` predicted patches, ``(p1 p2 c)`` order (a ``pixel_head`` output).
        images: ``(B, C, H, W)`` the input images.
        mask: ``(B, m)``, 1 where a patch was hidden (the ``mask`` step's output).
        normalize_pixels: compare against per-patch standardized pixels (MAE's ``norm_pix_loss``).
    """
    target = patchify(images, patch_size)  # (B, m, P*P*C)
    if normalize_pixels:
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
    per_patch = (prediction - target).pow(2).mean(-1)  # (B, m)
    return (per_patch * mask).sum() / mask.sum().clamp_min(1)


def patch_size_of(model: fx.GraphModule) -> int:
    """The patch size of a model's ``patch_embed`` step."""
    for step in spec_of(model).preprocess:
        if "patch_size" in step.args:
            return int(step.args["patch_size"])
    raise ValueError("the model has no patch_embed step, so it has no patch size")


def reconstruction_loss(model: fx.GraphModule, images: torch.Tensor, **options) -> torch.Tensor:
    """Run a masked autoencoder built from a spec and return its masked reconstruction loss."""
    outputs = model(images)
    if not isinstance(outputs, dict) or "mask" not in outputs:
        raise ValueError("the model has no mask step: its outputs carry no 'mask' to score against")
    return masked_reconstruction_loss(outputs["output"], images, outputs["mask"], patch_size_of(model), **options)

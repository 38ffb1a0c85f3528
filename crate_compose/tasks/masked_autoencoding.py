"""Masked autoencoding (CRATE-MAE, MAE): pixels of the hidden patches predicted from the visible ones.

The loss is the mean squared error between predicted and true pixels on hidden patches only (paper 001,
App. B.1); the test split reports it beside a baseline that predicts every hidden patch as the mean of the
same image's visible patches. The spec needs a ``mask`` step; its masks are drawn from the run's seed, the
same at every evaluation, so evaluations compare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..data.set_registry import IMAGES, LABELED_IMAGES
from ..errors import TrainError
from .task_registry import ExampleRun, Task, task

if TYPE_CHECKING:
    import torch
    from torch import fx

__all__ = ["MaskedAutoencoding", "masked_reconstruction_loss", "patch_size_of", "reconstruction_loss"]


@task
class MaskedAutoencoding(Task):
    name = "mae"
    summary = "MSE of the hidden patches' pixels (a mask step); beside the mean-visible-patch baseline"
    trains_on = "images (labels unused) and a spec with a mask step"
    data_kinds = (IMAGES, LABELED_IMAGES)  # the unlabeled photographs, and labeled images
    columns = ("test_masked_mse", "test_mean_patch_mse")
    metric = "test_masked_mse"
    maximize = False
    example = ExampleRun(
        "crate-mae-photos", "photos", ("sizes.d=16", "sizes.heads=2", "sizes.head_dim=8", "sizes.depth=1")
    )

    heads_said = "it trains a spec with a mask step and no other task's head"

    def check_head(self, spec: Any) -> None:
        """No other task's head, and a mask step."""
        super().check_head(spec)
        if not any(step.primitive == "mask" for step in spec.preprocess):
            raise TrainError(f"spec '{spec.name}' has no mask step, so it cannot be trained as a masked autoencoder")

    def loss(self, outputs, x, y, *, model, smoothing=0.0):
        from ..modules.precision import float32

        return masked_reconstruction_loss(float32(outputs["output"]), x.float(), outputs["mask"], patch_size_of(model))

    def evaluate(self, model, data, settings, *, top_k=None):
        """The MSE on hidden patches, and that of the mean-patch baseline."""
        from ..modules.embed import patchify
        from .held_out import evaluating, test_batches

        total, loss_sum, baseline_sum = 0, 0.0, 0.0
        patch = patch_size_of(model)
        with evaluating(model, settings.seed) as device:
            for x, y in test_batches(data, settings, device):
                outputs = model(x)
                loss_sum += self.loss(outputs, x, y, model=model).item() * len(x)
                patches, visible = patchify(x.float(), patch), (1 - outputs["mask"]).unsqueeze(-1)
                mean_patch = (patches * visible).sum(1, keepdim=True) / visible.sum(1, keepdim=True).clamp_min(1)
                baseline = mean_patch.expand_as(patches)
                baseline_sum += masked_reconstruction_loss(baseline, x.float(), outputs["mask"], patch).item() * len(x)
                total += len(x)
        return {"test_masked_mse": loss_sum / total, "test_mean_patch_mse": baseline_sum / total}


def masked_reconstruction_loss(
    prediction: "torch.Tensor",
    images: "torch.Tensor",
    mask: "torch.Tensor",
    patch_size: int,
    *,
    normalize_pixels: bool = False,
) -> "torch.Tensor":
    """MSE on hidden patches.

    Args:
        prediction: ``(B, m, P*P*C)`` predicted patches, ``(p1 p2 c)`` order (a ``pixel_head`` output).
        images: ``(B, C, H, W)`` the input images.
        mask: ``(B, m)``, 1 where a patch was hidden (the ``mask`` step's output).
        normalize_pixels: compare against per-patch standardized pixels (MAE's ``norm_pix_loss``).
    """
    from ..modules.embed import patchify

    target = patchify(images, patch_size)  # (B, m, P*P*C)
    if normalize_pixels:
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
    per_patch = (prediction - target).pow(2).mean(-1)  # (B, m)
    return (per_patch * mask).sum() / mask.sum().clamp_min(1)


def patch_size_of(model: "fx.GraphModule") -> int:
    """The patch size of a model's ``patch_embed`` step."""
    from ..building.builder import spec_of

    for step in spec_of(model).preprocess:
        if "patch_size" in step.args:
            return int(step.args["patch_size"])
    raise ValueError("the model has no patch_embed step, so it has no patch size")


def reconstruction_loss(model: "fx.GraphModule", images: "torch.Tensor", **options) -> "torch.Tensor":
    """Run a masked autoencoder built from a spec and return its masked reconstruction loss."""
    outputs = model(images)
    if not isinstance(outputs, dict) or "mask" not in outputs:
        raise ValueError("the model has no mask step: its outputs carry no 'mask' to score against")
    return masked_reconstruction_loss(outputs["output"], images, outputs["mask"], patch_size_of(model), **options)

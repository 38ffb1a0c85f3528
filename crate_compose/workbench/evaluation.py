"""Evaluation on the held-out split: the task's loss on a batch, test metrics, the baselines.

``evaluate`` gives a classifier's accuracy and loss, a masked autoencoder's MSE on hidden patches
beside the mean-patch baseline, or a language model's cross-entropy per byte beside the unigram
baseline. Masks are drawn from the same seed at every evaluation, so evaluations compare.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..building.placement import step_seed
from ..modules.embed import patchify
from ..modules.precision import float32
from ..settings import Settings
from .data import Data
from .loading import renormalize, split_batches
from .losses import masked_reconstruction_loss

EVAL_WINDOWS = 1024  # held-out windows a language model is evaluated on (the first ones, always the same)


def loss_of(task: str, outputs: dict, x: torch.Tensor, y: torch.Tensor, patch: int | None, smoothing: float = 0.0):
    """The task's loss on one batch: cross-entropy of the class or of every next token, or MSE on
    masked patches (001 App. B.1). A classifier's targets are class indices (B,) or, from mixup and
    cutmix, class probabilities (B, classes); label smoothing applies to both (``(1 - e) y + e / classes``)."""
    output = float32(outputs["output"])  # half outputs in float32 (a float64 model's stay float64)
    if task == "classify":
        return F.cross_entropy(output, y, label_smoothing=smoothing)
    if task == "lm":
        return F.cross_entropy(output.flatten(0, 1), y.flatten(), label_smoothing=smoothing)
    return masked_reconstruction_loss(output, x.float(), outputs["mask"], patch)


def evaluate(model: nn.Module, task: str, data: Data, settings: Settings, patch: int | None,
             top_k: int | None = None) -> dict[str, float]:
    """Test metrics: accuracy and loss (classify), or the MSE on hidden patches and that of the mean-patch
    baseline, which predicts every hidden patch as the mean of the same image's visible patches (mae).
    ``top_k``: also the share of examples whose class is among the ``k`` largest logits
    (``test_top{k}``). The test split is read in order, in ``settings.workers`` DataLoader processes
    when it is read from files (the same batches, so the same metrics, with any number)."""
    model.eval()
    device = next(model.parameters()).device
    if task == "lm":
        return _evaluate_lm(model, data, device)
    total, correct, among, loss_sum, baseline_sum = 0, 0, 0, 0.0, 0.0
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(step_seed(settings.seed, "evaluation"))  # the same masks at every evaluation
        for x, y in split_batches(data.test, 256, settings.workers):  # decoded in --workers processes
            x, y = renormalize(x, data, settings.normalize).to(device), y.to(device)  # as the training inputs (--normalize)
            outputs = model(x)
            n = len(x)
            loss_sum += loss_of(task, outputs, x, y, patch).item() * n
            if task == "classify":
                correct += (outputs["output"].argmax(-1) == y).sum().item()
                if top_k:
                    among += (outputs["output"].topk(top_k, dim=-1).indices == y[:, None]).any(-1).sum().item()
            else:  # predicting every hidden patch by the mean of the image's visible patches
                patches, visible = patchify(x.float(), patch), (1 - outputs["mask"]).unsqueeze(-1)
                mean_patch = (patches * visible).sum(1, keepdim=True) / visible.sum(1, keepdim=True).clamp_min(1)
                baseline = mean_patch.expand_as(patches)
                baseline_sum += masked_reconstruction_loss(baseline, x.float(), outputs["mask"], patch).item() * n
            total += n
    model.train()
    if task == "classify":
        return {"test_accuracy": correct / total, "test_loss": loss_sum / total,
                **({f"test_top{top_k}": among / total} if top_k else {})}
    return {"test_masked_mse": loss_sum / total, "test_mean_patch_mse": baseline_sum / total}


def _evaluate_lm(model: nn.Module, data: Data, device: torch.device) -> dict[str, float]:
    """Held-out cross-entropy per byte (nats and bits) on the first windows, and the unigram baseline."""
    count = min(len(data.test), EVAL_WINDOWS)
    loss_sum = 0.0
    with torch.no_grad():
        for x, y in split_batches(data.test, 64, count=count):
            outputs = model(x.to(device))
            loss_sum += loss_of("lm", outputs, x, y.to(device), None).item() * len(x)
    model.train()
    loss = loss_sum / count
    return {"test_loss": loss, "test_bits_per_byte": loss / math.log(2), "test_unigram_loss": data.unigram_loss}

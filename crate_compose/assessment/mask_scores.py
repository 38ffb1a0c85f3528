"""How well attention segments an image: the measurement of ``crate-compose segment``.

The attention a class token pays to the patches is read as a segmentation of the image, and compared
with a ground-truth mask (``pasted-digits``: the pixels of the pasted digit), in two ways:

* **DINO's protocol** (Caron et al. 2021, ``visualize_attention.py``, ``--threshold 0.6``): a head's
  attention over the patches, normalized to sum to one, is sorted in descending order and the smallest
  set of patches whose cumulative mass reaches ``threshold`` (60%) is kept (:func:`mass_mask`; patches of
  equal attention are taken in patch order, the lower index first, so ties are settled the same way
  every time). The kept patches, upsampled to pixels (nearest: each patch's pixels, :func:`to_pixels`),
  are compared with the mask by their **Jaccard index**, intersection over union (:func:`jaccard`).
* **A threshold-free score**: the attention of each patch, upsampled to its pixels, ranks the pixels,
  and the **average precision** of that ranking for the mask's pixels (:func:`average_precision`,
  scikit-learn's definition: ``sum_n (R_n - R_{n-1}) P_n`` over the distinct thresholds, pixels of one
  patch tied). Average precision rather than AUROC: the mask is a small share of the pixels (a tenth
  on ``pasted-digits``), and AP asks what the 60% rule asks, how pure the top of the ranking is,
  where AUROC is dominated by the many easy background pixels; its chance level (a ranking that knows
  nothing) is the mask's share of the pixels, reported beside it. The AUROC (:func:`roc_auc`, ties
  counted half) is in the JSON too.

Both are computed per image and per head, and for the mean of the heads' maps; :func:`summarize`
averages them over the images (per head, the best head, the mean map). Pixels right or below the
patch grid (an image side that is not a multiple of the patch side) are seen by no patch: the mask is
cropped to the grid, as DINO crops the image.

numpy only: the attention is gathered by :mod:`crate_compose.pictures.segmentation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = [
    "THRESHOLD",
    "Scores",
    "average_precision",
    "chance",
    "jaccard",
    "mass_mask",
    "roc_auc",
    "score",
    "summarize",
    "table",
    "to_pixels",
]

THRESHOLD = 0.6  # DINO's --threshold: the share of the attention mass kept
MEASURES = ("jaccard", "average_precision", "auroc", "kept")  # per image and map; kept: the share of patches kept
SLACK = 1e-9  # a cumulative mass within this of the threshold has reached it (0.3 + 0.3 reaches 0.6)


def mass_mask(attention, threshold: float = THRESHOLD) -> np.ndarray:
    """DINO's rule over the last axis of ``attention`` (``(..., n)``, non-negative): the patches kept, bool of
    the same shape: in descending order of attention (ties: the lower index first), each patch while the mass
    of the patches before it is below ``threshold`` of the total, so the kept set is the smallest whose mass
    reaches it. ``[0.5, 0.3, 0.1, 0.1]`` keeps the first two (0.5 < 0.6, 0.8 >= 0.6). An all-zero row keeps
    every patch."""
    values = np.asarray(attention, dtype=np.float64)
    total = values.sum(-1, keepdims=True)
    shares = np.divide(values, total, out=np.zeros_like(values), where=total > 0)
    order = np.argsort(-shares, axis=-1, kind="stable")
    ranked = np.take_along_axis(shares, order, -1)
    before = np.cumsum(ranked, -1) - ranked  # the mass ranked above each patch
    before[..., 0] = 0.0
    keep = (before < threshold - SLACK) | (total <= 0)
    kept = np.empty_like(keep)
    np.put_along_axis(kept, order, keep, -1)
    return kept


def to_pixels(values, patch_size: int) -> np.ndarray:
    """Values over a patch grid ``(..., rows, cols)`` upsampled to pixels ``(..., rows * P, cols * P)`` by
    repeating each patch's value over its ``P x P`` pixels (nearest)."""
    values = np.asarray(values)
    return values.repeat(patch_size, -2).repeat(patch_size, -1)


def jaccard(predicted, truth) -> float:
    """Intersection over union of two boolean masks of one shape; 1.0 when both are empty."""
    predicted, truth = np.asarray(predicted, dtype=bool), np.asarray(truth, dtype=bool)
    if predicted.shape != truth.shape:
        raise ValueError(f"masks of shapes {predicted.shape} and {truth.shape}")
    union = np.logical_or(predicted, truth).sum()
    return 1.0 if union == 0 else float(np.logical_and(predicted, truth).sum() / union)


def _ranked(scores, truth, weights) -> tuple[np.ndarray, np.ndarray]:
    """The true and false positives counted down the ranking, at each distinct score (ties grouped)."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    truth = np.asarray(truth, dtype=bool).ravel()
    weights = np.ones_like(scores) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    order = np.argsort(-scores, kind="stable")
    scores, truth, weights = scores[order], truth[order], weights[order]
    last = np.r_[scores[1:] != scores[:-1], True]  # the end of each run of equal scores
    return np.cumsum(weights * truth)[last], np.cumsum(weights * ~truth)[last]


def average_precision(scores, truth, weights=None) -> float:
    """The average precision of ``scores`` ranking the ``truth`` pixels (scikit-learn's
    ``average_precision_score``, exactly: ``sum_n (R_n - R_{n-1}) P_n`` over the distinct scores; ``weights``:
    how many pixels each entry stands for). Needs a positive; a ranking that puts every positive first is
    1.0, one that ties everything is the positives' share."""
    positives, negatives = _ranked(scores, truth, weights)
    if positives[-1] <= 0:
        raise ValueError("average precision needs at least one positive")
    precision = positives / np.maximum(positives + negatives, np.finfo(float).tiny)
    recall = positives / positives[-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def roc_auc(scores, truth, weights=None) -> float:
    """The area under the ROC curve of ``scores`` for the ``truth`` pixels (scikit-learn's ``roc_auc_score``:
    the trapezoids, ties counted half); needs a positive and a negative."""
    positives, negatives = _ranked(scores, truth, weights)
    if positives[-1] <= 0 or negatives[-1] <= 0:
        raise ValueError("the AUROC needs a positive and a negative")
    tpr, fpr = np.r_[0.0, positives / positives[-1]], np.r_[0.0, negatives / negatives[-1]]
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


@dataclass
class Scores:
    """Every number of one network on ``N`` images: per measure (:data:`MEASURES`) an ``(N, K + 1)`` array,
    one column per head and the last for the mean of the heads' maps; ``kept`` the 60%-mass patch masks
    ``(N, K + 1, rows, cols)``; ``share`` each image's mask's share of the pixels (AP's chance level)."""

    values: dict[str, np.ndarray]
    kept: np.ndarray
    share: np.ndarray
    heads: int = 0


def score(
    maps, masks, patch_size: int, threshold: float = THRESHOLD, done: Callable[[int], Any] | None = None
) -> Scores:
    """Score attention ``maps`` ``(N, K, rows, cols)`` (each head's attention to every patch) against the
    ground-truth ``masks`` ``(N, H, W)``: each head's and the mean map's 60%-mass mask (:func:`mass_mask`),
    upsampled to pixels, by its Jaccard index with the mask (cropped to the grid), and each map's pixels by
    their average precision and AUROC for the mask. ``done(1)`` is called after each image (a progress bar)."""
    maps = np.asarray(maps, dtype=np.float64)
    masks = np.asarray(masks, dtype=bool)
    count, heads, rows, cols = maps.shape
    if (
        masks.ndim != 3
        or len(masks) != count
        or masks.shape[1] < rows * patch_size
        or masks.shape[2] < cols * patch_size
    ):
        raise ValueError(f"masks of shape {masks.shape} for {count} maps of {rows}x{cols} patches of {patch_size}")
    maps = np.concatenate([maps, maps.mean(1, keepdims=True)], 1)  # the heads, and their mean
    truth = masks[:, : rows * patch_size, : cols * patch_size]
    kept = mass_mask(maps.reshape(count, heads + 1, rows * cols), threshold).reshape(maps.shape)
    inside = truth.reshape(count, rows, patch_size, cols, patch_size).sum((2, 4)).reshape(count, -1)  # per patch
    pixels = patch_size * patch_size
    values = {name: np.empty((count, heads + 1)) for name in MEASURES}
    for i in range(count):
        empty = not truth[i].any()
        if empty or truth[i].all():
            raise ValueError(
                f"image {i}'s mask is {'empty' if empty else 'every pixel'} within the patch grid: it cannot be scored"
            )
        # a patch stands for its pixels: `inside` of them on the mask, the rest off it (the same numbers as
        # ranking every pixel, each with its patch's attention)
        labels = np.r_[np.ones(rows * cols, bool), np.zeros(rows * cols, bool)]
        weights = np.r_[inside[i], pixels - inside[i]]
        for k in range(heads + 1):
            flat = maps[i, k].ravel()
            values["jaccard"][i, k] = jaccard(to_pixels(kept[i, k], patch_size), truth[i])
            values["average_precision"][i, k] = average_precision(np.r_[flat, flat], labels, weights)
            values["auroc"][i, k] = roc_auc(np.r_[flat, flat], labels, weights)
            values["kept"][i, k] = kept[i, k].mean()
        if done is not None:
            done(1)
    return Scores(values, kept, truth.reshape(count, -1).mean(1), heads)


def _mean(column: np.ndarray) -> float:
    return float(np.mean(column))


def summarize(scores: Scores) -> dict[str, Any]:
    """The means over the images: per head, the best head (by Jaccard, and by average precision) and the
    mean map, and every image's numbers (``per_image``: a list per measure, a row per image, the heads then
    the mean map)."""
    values, heads = scores.values, scores.heads
    per_head = [{"head": k + 1, **{name: _mean(values[name][:, k]) for name in MEASURES}} for k in range(heads)]
    best = {}
    for name in ("jaccard", "average_precision"):
        top = max(range(heads), key=lambda k: (per_head[k][name], -k))  # ties: the lower head
        best[f"by_{name}"] = dict(per_head[top])
    return {
        "heads": per_head,
        "best_head": best,
        "mean_map": {name: _mean(values[name][:, heads]) for name in MEASURES},
        "per_image": {name: values[name].tolist() for name in MEASURES},
    }


def chance(scores: Scores) -> dict[str, float]:
    """What a map that knows nothing scores: the average precision of a ranking that ties every pixel and the
    Jaccard index of a mask of every pixel are both the mask's share of the pixels; the AUROC is 0.5."""
    share = float(np.mean(scores.share))
    return {"mask_share": share, "average_precision": share, "jaccard_every_pixel": share, "auroc": 0.5}


def table(runs: dict[str, dict[str, Any]]) -> str:
    """The summaries of :func:`summarize` for each run (trained, untrained) as aligned text: a row per head,
    then the best head and the mean map; Jaccard and average precision, a column per run."""
    names = list(runs)
    columns = [(measure, name) for measure in ("jaccard", "average_precision") for name in names]
    titles = {"jaccard": "Jaccard", "average_precision": "AP"}
    width = max(18, *(len(f"{titles[m]} {n}") for m, n in columns))

    def row(label: str, cells: list[str]) -> str:
        return f"{label:<18}" + "".join(f"  {cell:>{width}}" for cell in cells)

    lines = [row("", [f"{titles[m]} {n}" for m, n in columns])]
    for k in range(len(runs[names[0]]["heads"])):
        lines.append(row(f"head {k + 1}", [f"{runs[n]['heads'][k][m]:.3f}" for m, n in columns]))
    best = [runs[n]["best_head"][f"by_{m}"] for m, n in columns]
    lines.append(row("best head", [f"(head {b['head']}) {b[m]:.3f}" for b, (m, _) in zip(best, columns)]))
    lines.append(row("mean map (of the heads)", [f"{runs[n]['mean_map'][m]:.3f}" for m, n in columns]))
    return "\n".join(lines)

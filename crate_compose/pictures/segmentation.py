"""Segmentation from attention, measured against ground truth (``crate-compose segment``).

:func:`segment` loads the spec, a data set with masks (``pasted-digits``) and the weights, gathers the class
token's attention to the patches in the last encoder layer (or ``layer``) on the first ``samples`` test images,
per head, with :func:`crate_compose.pictures.views.look` (the attention each step applies, recomputed from its
input caught by a forward hook), scores it against the masks (:mod:`crate_compose.assessment.mask_scores`:
DINO's 60%-mass masks by their Jaccard index, the maps by their average precision), for the trained network and
the untrained one of the same seed, and writes, all new or none, holding the folder's lock:

* ``segmentation.json``: every number (per head, the best head, the mean of the heads' maps, per image), the
  protocol written out (the step, layer, threshold, samples, upsampling) and the chance levels;
* ``segmentation-trained.png`` (with weights) and ``segmentation-untrained.png``: a row per test image, the
  image with its mask outlined, then each head's attention map and the mean map, the mask outlined in green
  and the 60%-mass patches in cyan, each cell with its Jaccard index and average precision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from tqdm import tqdm

from ..assessment import mask_scores as measure
from ..assessment.run_probes import PROBE_SAMPLES, is_run, load_weights, resolve_subject, standardize
from ..building.builder import compile_spec, spec_of
from ..data.batches import normalization, renormalize
from ..errors import Problem, SpecError, WorkbenchError
from ..files import writable, write_together
from ..spec_language import loader
from ..tasks.frozen_features import feature_site
from ..training.preparation import HEADLESS, prepare
from ..training.run_folder.locks import hold
from . import drawings
from .show import picture_folder
from .views import display, kind_of, look

__all__ = ["Segmented", "class_attention", "segment", "segmentation_folder"]

IMAGES, MAX_IMAGES = 4, 16  # test images pictured by default, and at most (a row each)
CHUNK = 32  # images gathered at once (the attention of every token to every token is held for them)
FILE = "segmentation.json"
TRUTH, KEPT = "lime", "cyan"  # the outline of the mask, and of the 60%-mass patches
SUBDIVIDE = 4  # a mask is outlined on a grid this much finer than its pixels, so the outline follows their edges


@dataclass
class ClassTokenMaps:
    """The class token's attention to the patches at one step: ``maps`` ``(N, K, rows, cols)`` (float64)."""

    module: str
    primitive: str
    layer: int
    last: bool  # whether it is the encoder's last layer
    maps: torch.Tensor
    patch_size: int


@dataclass
class Segmented:
    """What :func:`segment` measured and wrote: the folder, each file with what it holds, the JSON's contents,
    the table printed, and notes."""

    folder: Path
    files: list[tuple[Path, str]]
    result: dict[str, Any]
    table: str
    notes: list[str]


def segmentation_folder(weights: str | Path | None, spec_name: str, out: str | Path | None = None) -> Path:
    """Where ``segment`` writes: ``out`` when given; beside a run's weights ``RUN/final`` or
    ``RUN/checkpoints/step-N``, ``RUN/segmentation/final`` or ``RUN/segmentation/step-N``; beside other weights
    ``W``, ``W/../segmentation/<W's name>``; without, ``segmentation/<spec name>``; never inside a build
    (:func:`crate_compose.pictures.show.picture_folder`)."""
    return picture_folder(weights, spec_name, out, under="segmentation")


def _attention_steps(model, layer: int | None) -> tuple[int, bool, list]:
    """The encoder layer read (``layer``, default the last), whether it is the last, and its steps with
    attention; a spec whose layer has none is refused (:class:`SpecError`, located at its encoder) naming what
    it has."""
    feature_site(model, layer)  # refuses a layer the encoder does not have, naming its range
    spec = spec_of(model)
    encoder = [n for n in model.graph.nodes if n.op == "call_module" and n.meta.get("role") == "encoder"]
    layers = sorted({n.meta["layer"] for n in encoder if n.meta.get("layer") is not None})
    chosen = layer if layer is not None else layers[-1]
    steps = [n for n in encoder if n.meta.get("layer") == chosen]
    attending = [n for n in steps if kind_of(model.get_submodule(str(n.target))) == "attention"]
    if not attending:
        which = "the last encoder layer" if layer is None else "encoder layer"
        has = ", ".join(f"{n.target} ({n.meta.get('primitive')})" for n in steps)
        stacked = [
            str(n.target)
            for n in model.graph.nodes
            if n.op == "call_module"
            and n.meta.get("role") not in ("encoder", "decoder", None)
            and n.meta.get("part") == "layer"
            and kind_of(model.get_submodule(str(n.target))) == "attention"
        ]
        beside = (
            f"; the class attention beside the encoder ({', '.join(stacked)}) is not what segment reads"
            if stacked
            else ""
        )
        raise SpecError(
            [
                Problem(
                    f"{which} ({chosen}) of '{spec.name}' has no step with attention (it has {has}): segment reads the "
                    "class token's attention to the patches in that layer, which mssa, mssa_ascent, mhsa and aot steps "
                    f"give (tssa's memberships are no attention of the class token){beside}",
                    ("encoder",),
                    spec.locate(("encoder",)),
                )
            ]
        )
    return chosen, chosen == layers[-1], attending


def class_attention(
    model,
    inputs: torch.Tensor,
    layer: int | None = None,
    notes: list[str] | None = None,
    done: Callable[[int], Any] | None = None,
) -> ClassTokenMaps:
    """The class token's attention to every patch, per head, at the last attention step of encoder layer
    ``layer`` (default: the last), on ``inputs`` ``(N, C, H, W)``, gathered by
    :func:`crate_compose.pictures.views.look` ``CHUNK`` images at a time. Refused (:class:`SpecError`): a layer
    without attention, a step that sees no class token."""
    spec = spec_of(model)
    chosen, last, attending = _attention_steps(model, layer)
    step = attending[-1]
    name = str(step.target)
    if len(attending) > 1 and notes is not None:
        notes.append(
            f"encoder layer {chosen} has {len(attending)} steps with attention; segment reads the last, {name}"
        )
    parts, size = [], None
    for start in range(0, len(inputs), CHUNK):
        views = look(model, inputs[start : start + CHUNK], layer=chosen)
        view = next((v for v in views.steps if v.module == name), None)
        if view is None or view.prefix < 1:
            sees = (
                f"sees {view.values.shape[-1]} tokens, the {views.grid[0]}x{views.grid[1]} patches alone"
                if view is not None
                else "sees fewer tokens than the patch grid"
            )
            raise SpecError(
                [
                    Problem(
                        f"{name} ({step.meta.get('primitive')}) {sees}: '{spec.name}' has no class token (a class_token "
                        "step in preprocess), so there is no class-token attention to segment with",
                        ("preprocess",),
                        spec.locate(("preprocess",)),
                    )
                ]
            )
        parts.append(view.maps(views.grid, 0))
        size = views.patch_size
        if done is not None:
            done(len(inputs[start : start + CHUNK]))
    return ClassTokenMaps(name, str(step.meta.get("primitive")), chosen, last, torch.cat(parts), size)


def _outline(axes, mask: np.ndarray, scale: int, colour: str) -> None:
    """``mask`` ``(h, w)`` (each entry ``scale`` pixels a side) outlined with matplotlib's ``contour``."""
    if not mask.any():
        return
    fine = mask.repeat(scale * SUBDIVIDE, 0).repeat(scale * SUBDIVIDE, 1).astype(float)
    centres = (np.arange(fine.shape[1]) + 0.5) / SUBDIVIDE, (np.arange(fine.shape[0]) + 0.5) / SUBDIVIDE
    axes.contour(*centres, fine, levels=[0.5], colors=colour, linewidths=0.9)


def figure_png(
    images: torch.Tensor,
    attention: ClassTokenMaps,
    scores: measure.Scores,
    masks: np.ndarray,
    *,
    title: str,
    labels: list[str],
) -> bytes:
    """A row per image: the image with its mask outlined, then each head's attention map and the mean map over
    it (one scale, a colour bar), the mask outlined in green and the 60%-mass patches in cyan."""
    count, heads = len(images), attention.maps.shape[1]
    maps = torch.cat([attention.maps[:count], attention.maps[:count].mean(1, keepdim=True)], 1)
    figure, axes = drawings.grid_figure(count, heads + 2, title, bar=True)
    top = max(float(maps.max()), 1e-12)
    rows, cols = maps.shape[-2:]
    for i in range(count):
        drawings.show_image(axes[i][0], images[i])
        _outline(axes[i][0], masks[i], 1, TRUTH)
        for k in range(heads + 1):
            cell = axes[i][k + 1]
            drawings.show_image(cell, images[i])
            drawings.show_map(cell, maps[i, k], attention.patch_size, top=top)
            _outline(cell, masks[i][: rows * attention.patch_size, : cols * attention.patch_size], 1, TRUTH)
            _outline(cell, scores.kept[i, k], attention.patch_size, KEPT)
            cell.text(
                0.02,
                0.02,
                f"J {scores.values['jaccard'][i, k]:.2f}  AP {scores.values['average_precision'][i, k]:.2f}",
                transform=cell.transAxes,
                fontsize=5,
                color="white",
                va="bottom",
                ha="left",
                bbox={"facecolor": "black", "alpha": 0.5, "pad": 1, "linewidth": 0},
            )
    drawings.colour_bar(
        figure,
        top,
        f"attention weight (the tick: uniform, 1/{rows * cols} patches); outlined: the "
        f"mask ({TRUTH}), the patches holding the mass kept ({KEPT})",
        1 / (rows * cols),
    )
    axes[0][0].set_title("image, its mask", fontsize=7)
    for k in range(heads):
        axes[0][k + 1].set_title(f"head {k + 1}", fontsize=7)
    axes[0][heads + 1].set_title("mean of the heads", fontsize=7)
    drawings.row_labels(axes, labels)
    return drawings.png_bytes(figure)


def _masks_of(data, name: str, run: Path | None) -> torch.Tensor:
    """The test split's ground-truth masks; a data set without them is refused."""
    masks = getattr(data.test, "masks", None)
    if masks is None:
        if run is not None:
            raise WorkbenchError(
                f"the run {run} was trained on '{name}', which has no ground-truth masks: segment "
                "scores attention against masks; train on a set that has them (crate-compose train "
                "SPEC --data pasted-digits) and segment that run"
            )
        raise WorkbenchError(
            f"data set '{name}' has no ground-truth masks: segment scores attention against masks, "
            "so give a data set that has them: --data pasted-digits"
        )
    return masks


def segment(
    spec_ref,
    data_name: str | None = None,
    *,
    weights: str | Path | None = None,
    overrides: Iterable[str] = (),
    layer: int | None = None,
    samples: int = PROBE_SAMPLES,
    images: int = IMAGES,
    threshold: float = measure.THRESHOLD,
    out: str | Path | None = None,
    seed: int | None = None,
    image_size: int | None = None,
    normalize: str | None = None,
) -> Segmented:
    """Measure how the class token's attention of ``spec_ref`` with ``weights`` (a build folder, an authors'
    checkpoint file, or none; a run folder as ``spec_ref`` or ``weights`` gives its weights, spec, data, image
    size, seed and standardization, as for ``show``) segments the first ``samples`` test images of ``data_name``
    (a set with masks; default: a run's own, else pasted-digits), beside the untrained network of the same seed,
    and write ``segmentation.json`` and the pictures of the first ``images`` into ``out`` (default:
    :func:`segmentation_folder`), all new or none, holding the folder's lock. Everything is checked, measured
    and drawn before the first file is written."""
    overrides = list(overrides)
    if not 1 <= images <= MAX_IMAGES:
        raise WorkbenchError(f"--images {images}: picture 1 to {MAX_IMAGES} images")
    if samples < 1:
        raise WorkbenchError(f"--samples {samples}: give at least 1")
    if not 0 < threshold <= 1:
        raise WorkbenchError(f"--threshold {threshold}: the share of the attention mass kept, in (0, 1]")
    run = spec_ref if is_run(spec_ref) else weights if weights is not None and is_run(weights) else None
    if data_name is None and run is None:
        data_name = "pasted-digits"  # the set with masks
    subject = resolve_subject("segment", spec_ref, weights, data_name, image_size, seed, normalize)
    first = loader.load(subject.spec, overrides)
    if len(first.input.shape) != 3:  # token input: refused before any data is read
        raise SpecError(
            [
                Problem(
                    f"'{first.name}' takes input of shape {list(first.input.shape)}, not images cut into "
                    "patches (a patch_embed step on [channels, height, width]): segment measures image "
                    "networks only",
                    ("input", "shape"),
                    first.locate(("input", "shape")),
                )
            ]
        )
    spec, data = prepare(subject.spec, subject.data, overrides, subject.image_size, subject.seed, keep=HEADLESS)
    masks = _masks_of(data, subject.data, run)
    folder = segmentation_folder(subject.weights, spec.name, out)  # refused before anything is computed
    normalize = standardize(subject.weights, subject.normalize, data)
    count = min(samples, len(data.test))
    inputs = renormalize(torch.stack([data.test[i][0] for i in range(count)]), data, normalize)
    truth = masks[:count].numpy()
    notes: list[str] = []
    networks = {}
    untrained = compile_spec(spec, seed=subject.seed)
    _attention_steps(untrained, layer)  # a spec without attention there is refused before the weights are read
    if subject.weights is not None:
        trained = compile_spec(spec, seed=subject.seed)
        load_weights(trained, Path(subject.weights))
        networks["trained"] = trained
    networks["untrained"] = untrained
    gathered, scored = {}, {}
    with tqdm(
        total=2 * count * len(networks),
        desc=f"segment: attention and scores of {count:,} images",
        unit="image",
        leave=False,
        disable=None if count > 64 else True,
    ) as bar:
        for name, model in networks.items():  # a bar on a terminal: 1,000 images take minutes on a CPU
            gathered[name] = class_attention(model, inputs, layer, notes if not gathered else None, done=bar.update)
            scored[name] = measure.score(
                gathered[name].maps.numpy(), truth, gathered[name].patch_size, threshold, done=bar.update
            )
    runs = {name: measure.summarize(s) for name, s in scored.items()}
    step = next(iter(gathered.values()))
    result = {
        "spec": spec.name,
        "data": subject.data,
        "weights": str(subject.weights) if subject.weights else None,
        "seed": subject.seed,
        "normalize": normalize,
        "protocol": _protocol(step, data, count, threshold, truth.shape[1:]),
        "chance": measure.chance(next(iter(scored.values()))),
        "runs": runs,
    }
    scale = normalization(data, normalize)
    mean, std = (scale[0].tolist(), scale[1].tolist()) if scale is not None else (None, None)
    shown = min(images, count)
    pictures = display(inputs[:shown], mean, std)
    files: dict[str, tuple[bytes | str, str]] = {
        FILE: (
            json.dumps(result, indent=2) + "\n",
            (
                f"every number: Jaccard index of the {threshold:.0%}-mass masks, average precision and AUROC of the maps, "
                "per head, best head, mean map, per image; the protocol"
            ),
        )
    }
    for name in networks:
        who = f"weights {drawings.shown(subject.weights)}" if name == "trained" else f"untrained (seed {subject.seed})"
        title = (
            f"{spec.name} on {subject.data}, {who}: class-token attention at {step.module} ({step.primitive}), "
            f"encoder layer {step.layer}; green: the mask, cyan: the patches holding {threshold:.0%} of the mass"
        )
        files[f"segmentation-{name}.png"] = (
            figure_png(
                pictures,
                gathered[name],
                scored[name],
                truth[:shown],
                title=title,
                labels=[f"test image {i}" for i in range(shown)],
            ),
            f"the first {shown} test images: the mask, each head's attention and "
            f"the mean map, with the {threshold:.0%}-mass patches ({name})",
        )
    paths = {folder / name: content for name, (content, _) in files.items()}
    for path in paths:
        writable(path)
    with hold(folder, "write the segmentation into"):
        write_together(paths)
    header = (
        f"{spec.name} on {subject.data}: class-token attention at {step.module} ({step.primitive}), encoder "
        f"layer {step.layer}, on the first {count} test images; Jaccard of the {threshold:.0%}-mass masks, "
        f"average precision (AP) of the maps (chance: {result['chance']['average_precision']:.3f}, the mask's "
        "share of the pixels)"
    )
    return Segmented(
        folder,
        [(folder / name, what) for name, (_, what) in files.items()],
        result,
        header + "\n" + measure.table(runs),
        notes,
    )


def _protocol(step: ClassTokenMaps, data, count: int, threshold: float, pixels) -> dict[str, Any]:
    rows, cols = step.maps.shape[-2:]
    return {
        "attention": "the class token's (token 0's) attention to every patch, per head, as the step applies it "
        "(recomputed from the step's input with its own weights), in eval mode, no patch masked",
        "step": step.module,
        "primitive": step.primitive,
        "layer": step.layer,
        "last_layer": step.last,
        "heads": int(step.maps.shape[1]),
        "grid": [int(rows), int(cols)],
        "patch_size": step.patch_size,
        "image_size": [int(p) for p in pixels],
        "samples": count,
        "images": f"the first {count} test images of {data.name}",
        "threshold": threshold,
        "mask_rule": f"DINO (visualize_attention.py): a map normalized to sum to 1 over the patches, sorted in "
        f"descending order (ties: the lower patch index first); the smallest set of patches whose "
        f"cumulative attention reaches {threshold} is kept",
        "upsampling": f"nearest: each patch's value over its {step.patch_size}x{step.patch_size} pixels; pixels "
        "outside the patch grid left out of the mask",
        "ground_truth": "the test split's masks (pasted-digits: the pixels where the pasted digit's alpha is "
        "above 0.5)",
        "jaccard": "intersection over union of the kept patches' pixels and the mask, per image, then the mean",
        "average_precision": "of the map's values (upsampled to pixels) ranking the mask's pixels, scikit-learn's "
        "definition (sum over thresholds of recall gained times precision), per image, then "
        "the mean; chance: the mask's share of the pixels",
        "auroc": "the area under the ROC curve of the same ranking (ties counted half), per image, then the mean; "
        "chance 0.5",
        "mean_map": "the mean over the heads of their maps, scored as a head is",
        "best_head": "the head with the highest mean Jaccard index (by_jaccard), or average precision "
        "(by_average_precision)",
        "kept": f"the share of the patches the {threshold:.0%}-mass rule keeps",
        "per_image": "every image's numbers: a row per image (the first samples of the test split, in order), a "
        "column per head, then the mean map",
    }

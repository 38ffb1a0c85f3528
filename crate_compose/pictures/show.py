"""Pictures of what a network does (``crate-compose show``): attention maps, memberships, the PCA of
the patch features, masked reconstructions, as PNG files.

:func:`show` loads the spec, the data and the weights, gathers what the network does at one encoder
layer (:func:`crate_compose.pictures.views.look`), draws the figures
(:mod:`crate_compose.pictures.drawings`) and writes them into a folder, all new or none:

* ``attention-cls-<step>.png``: for a step with attention (``mssa``, ``mhsa``, ``aot``) that sees a
  class token, the class token's attention to every patch, per head (a row per image);
* ``attention-patch<P>-<step>.png``: the same for patch ``P``'s attention;
* ``membership-<step>.png``: for a ``tssa`` step, the memberships ``Pi`` of the patches, per head;
* ``pca-<step>.png``: the top three principal components of the layer's patch features as RGB;
* ``reconstruction.png``: for a masked autoencoder, masked input | reconstruction | reconstruction
  with the visible patches | original.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch

from ..assessment.run_probes import CHECKPOINT, load_weights, resolve_subject, standardize
from ..building import outputs
from ..building.builder import compile_spec
from ..data.batches import normalization, renormalize
from ..errors import Problem, SpecError, WorkbenchError
from ..files import writable, write_together
from ..spec_language import loader
from ..tasks.held_out import spread
from ..training.preparation import HEADLESS, prepare
from ..training.run_folder.locks import hold
from . import drawings
from .views import StepView, Views, look, not_images, pca_rgb

__all__ = ["Shown", "StepView", "Views", "draw", "look", "pca_rgb", "picture_folder", "show"]

IMAGES, MAX_IMAGES = 4, 16  # images shown by default, and at most (a row each)


@dataclass
class Shown:
    """What :func:`show` wrote: the folder, and each file with what it shows."""

    folder: Path
    files: list[tuple[Path, str]]
    notes: list[str]


def draw(views: Views, title: str, labels: list[str] | None = None) -> dict[str, tuple[bytes, str]]:
    """Every figure of ``views`` as ``{file name: (PNG bytes, what it shows)}``; ``labels``: each
    image's row label."""
    out: dict[str, tuple[bytes, str]] = {}
    cols = views.grid[1]
    patch_cell = divmod(views.patch, cols)
    for step in views.steps:
        heads = step.values.shape[1]
        where = f"{step.module} ({step.primitive})"
        if step.kind == "membership":
            text = f"memberships Π of the patches, {where}, per head (softmax over the {heads} heads; colours 0 to 1)"
            out[f"membership-{step.module}.png"] = (
                drawings.maps_png(
                    views.images,
                    step.maps(views.grid),
                    views.patch_size,
                    title=f"{title}\n{text}",
                    fixed=True,
                    labels=labels,
                ),
                text,
            )
            continue
        queries = ([("cls", 0, None, "the class token")] if step.prefix else []) + (
            [
                (
                    f"patch{views.patch}",
                    step.prefix + views.patch,
                    patch_cell,
                    f"patch {views.patch} (row {patch_cell[0]}, column {patch_cell[1]})",
                )
            ]
            if step.values.shape[2] > 1
            else []
        )  # class attention: the class token alone queries
        for label, query, cell, who in queries:
            text = f"attention of {who} to the patches, {where}, per head (one scale for every map: the colour bar)"
            out[f"attention-{label}-{step.module}.png"] = (
                drawings.maps_png(
                    views.images,
                    step.maps(views.grid, query),
                    views.patch_size,
                    title=f"{title}\n{text}",
                    query=cell,
                    labels=labels,
                ),
                text,
            )
    if views.pca is not None:
        text = f"top three principal components of the patch features of {views.pca_site} as RGB"
        out[f"pca-{views.pca_site}.png"] = (
            drawings.pca_png(views.images, views.pca, views.patch_size, title=f"{title}\n{text}", labels=labels),
            text,
        )
    if views.reconstruction is not None:
        text = "masked input | reconstruction | reconstruction with the visible patches | original"
        out["reconstruction.png"] = (
            drawings.reconstruction_png(views.reconstruction, title=f"{title}\n{text}", labels=labels),
            text,
        )
    return out


def picture_folder(
    weights: str | Path | None, spec_name: str, out: str | Path | None = None, *, under: str = "pictures"
) -> Path:
    """Where ``show`` writes: ``out`` when given; beside a run's weights ``RUN/final`` or
    ``RUN/checkpoints/step-N``, ``RUN/pictures/final`` or ``RUN/pictures/step-N``; beside other
    weights ``W``, ``W/../pictures/<W's name>``; without weights, ``pictures/<spec name>``
    (``under`` names the ``pictures`` folder: ``segment`` writes into ``segmentation``). Refused
    (:class:`WorkbenchError`): a folder inside a build (a folder holding model.safetensors and
    spec.yaml) or inside the weights folder; (:class:`~crate_compose.errors.OutputError`, status 1) a file
    where the folder goes (:func:`crate_compose.building.outputs.check_picture_folder`)."""
    named = Path(weights) if weights is not None else None
    if named is not None and named.name in ("", ".", ".."):
        named = named.resolve()
    if out is not None:
        folder = Path(out)
    elif named is None:
        folder = Path(under) / spec_name
    elif named.parent.name == "checkpoints" and CHECKPOINT.fullmatch(named.name):
        folder = named.parent.parent / under / named.name
    else:
        folder = named.parent / under / named.name
    outputs.check_picture_folder(folder, f"--out {folder}" if out is not None else str(folder), named)
    return folder


def show(
    spec_ref,
    data_name: str | None = None,
    *,
    weights: str | Path | None = None,
    overrides: Iterable[str] = (),
    layer: int | None = None,
    images: int = IMAGES,
    patch: int | None = None,
    out: str | Path | None = None,
    seed: int = 0,
    image_size: int | None = None,
    normalize: str | None = None,
) -> Shown:
    """Draw the pictures of ``spec_ref`` (its input size set from ``data_name``) with ``weights`` (a
    build folder: a run's ``final/`` or a checkpoint; none: the untrained network of ``seed``) on
    ``images`` test images spread evenly over the test split (``i * len(test) // images``), at encoder layer ``layer`` (default: the last), and write them as
    PNG files into ``out`` (default: :func:`picture_folder`), all new or none, holding the folder's
    lock. Everything is checked, gathered and drawn before the first file is written. The images are
    standardized as ``normalize`` says (default: as the weights were trained,
    :func:`crate_compose.assessment.run_probes.normalization_of`). A run folder as ``spec_ref`` or
    ``weights`` gives its final weights, spec, data, image size and standardization; ``data_name``
    defaults to digits otherwise."""
    overrides = list(overrides)
    if not 1 <= images <= MAX_IMAGES:
        raise WorkbenchError(f"--images {images}: show 1 to {MAX_IMAGES} images")
    subject = resolve_subject("show", spec_ref, weights, data_name, image_size, seed, normalize)
    spec_ref, weights, data_name, image_size = subject.spec, subject.weights, subject.data, subject.image_size
    first = loader.load(spec_ref, overrides)
    if len(first.input.shape) != 3:  # token input (a language model): refused before any data is read
        raise SpecError([Problem(not_images(first), ("input", "shape"), first.locate(("input", "shape")))])
    spec, data = prepare(spec_ref, data_name, overrides, image_size, seed, keep=HEADLESS)  # the head is not shown
    if len(data.input_shape) != 3:
        raise WorkbenchError(
            f"data set '{data_name}' is not images (its inputs have shape {list(data.input_shape)}): "
            "give an image data set (digits, photos, folder:PATH)"
        )
    folder = picture_folder(weights, spec.name, out)  # refused before anything is computed
    normalize = standardize(weights, subject.normalize, data)
    model = compile_spec(spec, seed=seed)
    if weights is not None:
        load_weights(model, Path(weights))
    count = min(images, len(data.test))
    chosen = spread(len(data.test), count)  # spread over the test split: every class its share
    inputs = renormalize(torch.stack([data.test[i][0] for i in chosen]), data, normalize)
    scale = normalization(data, normalize)  # how the inputs turn back into pixels
    mean, std = (scale[0].tolist(), scale[1].tolist()) if scale is not None else (None, None)
    views = look(model, inputs, layer=layer, patch=patch, mean=mean, std=std, seed=seed)
    trained = f"untrained (seed {seed})" if weights is None else f"weights {drawings.shown(weights)}"
    figures = draw(views, f"{spec.name} on {data_name}, {trained}", [f"test image {i}" for i in chosen])
    paths = {folder / name: content for name, (content, _) in figures.items()}
    for path in paths:
        writable(path)
    with hold(folder, "write pictures into"):
        write_together(paths)
    return Shown(folder, [(folder / name, text) for name, (_, text) in figures.items()], views.notes)

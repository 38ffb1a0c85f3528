"""What an image network does at one encoder layer, gathered for ``crate-compose show``
(:mod:`crate_compose.pictures.show` draws and writes it).

:func:`look` runs a built image network once on a few images and gathers, at one encoder layer:

* for every step whose module has an ``attention(x)`` method (``mssa``, ``mssa_ascent``, ``mhsa``,
  ``aot``: it recomputes, from the step's own input and weights, the ``(B, K, n, n)`` weights its
  forward applies), the attention of every token to every token, per head;
* for every step whose module has ``membership(x)`` (``tssa``), the memberships ``Pi`` ``(B, K, n)``
  (a softmax over the heads);
* in the last layer of a class-attention stack (ToST), the class token's attention ``(B, K, 1, n)`` to the
  patch tokens it summarizes;
* the top three principal components of the patch features the layer outputs (fitted on the patches
  of the images shown), as RGB (:func:`pca_rgb`);
* for a masked autoencoder (a ``mask`` step and an output of pixel patches), the masked input, the
  reconstruction, the reconstruction with the visible patches pasted back, and the original.

The steps' inputs are captured by forward hooks on their modules, so nothing the network computes
changes. The attention, membership and PCA pictures see every patch: a ``mask`` step hides none
while they are gathered (a forward hook replaces its output by its input, an empty mask and the
identity order); the reconstruction uses the mask as trained, drawn from ``seed``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import fx, nn

from ..building.builder import spec_of
from ..errors import Problem, SpecError, WorkbenchError, format_path
from ..modules.mask import Mask, unmasked
from ..seeds import step_seed
from ..tasks.frozen_features import feature_site
from ..tasks.masked_autoencoding import patch_size_of

KINDS = {"attention": "attention(x)", "membership": "membership(x)"}  # module methods that give a picture


@dataclass
class StepView:
    """What one step computes at the images: its attention ``(B, K, n, n)`` or memberships
    ``(B, K, n)`` (float64), and how many tokens come before the patch grid (a class token)."""

    module: str
    primitive: str
    layer: int
    kind: str
    values: torch.Tensor
    prefix: int

    def maps(self, grid: tuple[int, int], query: int | None = None) -> torch.Tensor:
        """``(B, K, rows, cols)`` over the patch grid: the memberships, or the attention of token
        ``query`` (counted among all the step's tokens) to every patch."""
        values = self.values if self.kind == "membership" else self.values[:, :, query]
        return values[..., self.prefix :].reshape(*values.shape[:2], *grid)


@dataclass
class Views:
    """What :func:`look` gathered; :func:`draw` turns it into figures."""

    spec: str
    images: torch.Tensor  # (B, C, H, W) for display, in [0, 1]
    grid: tuple[int, int]  # patch rows, columns
    patch_size: int
    patch: int  # the patch whose attention is shown, row-major in the grid
    layer: int
    steps: list[StepView] = field(default_factory=list)
    pca_site: str = ""
    features: torch.Tensor | None = None  # (B, rows*cols, d) patch features at pca_site, float64
    pca: torch.Tensor | None = None  # (B, rows, cols, 3) colours in [0, 1]
    reconstruction: dict[str, torch.Tensor] | None = None  # masked, output, filled, original: (B, C, H, W) in [0, 1]
    notes: list[str] = field(default_factory=list)


def look(
    model: fx.GraphModule,
    inputs: torch.Tensor,
    *,
    layer: int | None = None,
    patch: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    seed: int = 0,
) -> Views:
    """Run ``model`` (a built image network) on ``inputs`` ``(B, C, H, W)`` and gather the pictures
    of encoder layer ``layer`` (default: the last); ``patch`` is the patch whose attention is shown
    (row-major in the grid; default: the centre one). ``mean``/``std``: the per-channel statistics
    the inputs were standardized with, to show them as they were (without: each image min-max
    scaled). Raises :class:`SpecError` for a spec none of whose steps gives a picture,
    :class:`WorkbenchError` for a layer or patch it does not have."""
    spec = spec_of(model)
    grid, size = patch_grid(model, inputs.shape)
    encoder = [n for n in model.graph.nodes if n.op == "call_module" and n.meta.get("role") == "encoder"]
    kinds = {str(n.target): kind for n in encoder if (kind := kind_of(model.get_submodule(str(n.target))))}
    masks = [name for name, module in model.named_modules() if isinstance(module, Mask)]
    if not kinds and not masks:
        raise SpecError([Problem(_nothing_to_draw(spec), ("encoder",), spec.locate(("encoder",)))])
    layers = sorted({n.meta["layer"] for n in encoder if n.meta.get("layer") is not None})
    chosen = layer if layer is not None else (layers[-1] if layers else None)
    site = feature_site(model, layer)  # refuses a layer the encoder does not have, naming its range
    cells = grid[0] * grid[1]
    patch = (grid[0] // 2) * grid[1] + grid[1] // 2 if patch is None else patch
    if not 0 <= patch < cells:
        raise WorkbenchError(
            f"--patch {patch}: the patch grid is {grid[0]}x{grid[1]}, patches 0..{cells - 1} (row by row)"
        )
    views = Views(spec.name, display(inputs, mean, std), grid, size, patch, chosen)
    chosen_steps = [n for n in encoder if n.meta.get("layer") == chosen and str(n.target) in kinds]
    stacked = _last_stacked(model)  # a class-attention stack's last layer (ToST, CaiT), beside the encoder's
    kinds.update({str(n.target): "attention" for n in stacked})
    if kinds and not chosen_steps:
        others = sorted({n.meta.get("layer") for n in encoder if str(n.target) in kinds} - {None})
        views.notes.append(
            f"encoder layer {chosen} has no step with attention or memberships "
            f"(layers {', '.join(map(str, others))} have)"
        )
    found: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(name: str):
        def hook(module, args, output):
            found[name] = (args[0], output[0] if isinstance(output, tuple) else output)

        return hook

    chosen_steps += stacked
    hooks = {str(n.target): keep(str(n.target)) for n in chosen_steps}
    hooks[site] = keep(site)
    with _evaluating(model), torch.no_grad():
        with _hooked(model, hooks), unmasked(model):
            model(inputs)
        for node in chosen_steps:
            name = str(node.target)
            module, tokens = model.get_submodule(name), found[name][0]
            values = getattr(module, kinds[name])(tokens).double()
            prefix = tokens.shape[1] - cells
            if prefix < 0:
                views.notes.append(
                    f"{name} sees {tokens.shape[1]} tokens, fewer than the {grid[0]}x{grid[1]} "
                    "patch grid: no picture of it"
                )
                continue
            views.steps.append(
                StepView(
                    name, str(node.meta.get("primitive")), node.meta.get("layer", chosen), kinds[name], values, prefix
                )
            )
        tokens = found[site][1]
        if tokens.dim() == 3 and tokens.shape[1] >= cells:
            views.pca_site = site
            views.features = tokens[:, tokens.shape[1] - cells :].double()
            views.pca = pca_rgb(views.features.flatten(0, 1)).reshape(len(inputs), *grid, 3)
        else:
            views.notes.append(f"{site} outputs {tuple(tokens.shape[1:])}, not a token per patch: no PCA picture")
        if masks:
            views.reconstruction = _reconstruct(model, inputs, size, mean, std, seed, views.notes)
    return views


def _last_stacked(model: fx.GraphModule) -> list[fx.Node]:
    """The steps with attention in the last layer of every stack besides the encoder and decoder (ToST's
    class attention: the class token's attention to the patches it summarizes)."""
    found = [
        n
        for n in model.graph.nodes
        if n.op == "call_module"
        and n.meta.get("part") == "layer"
        and n.meta.get("role") not in ("encoder", "decoder")
        and kind_of(model.get_submodule(str(n.target))) == "attention"
    ]
    last = {}
    for node in found:
        last[node.meta["role"]] = max(last.get(node.meta["role"], 0), node.meta.get("layer") or 0)
    return [n for n in found if (n.meta.get("layer") or 0) == last[n.meta["role"]]]


def kind_of(module: nn.Module) -> str | None:
    """``"attention"`` or ``"membership"`` for a module that gives that picture, else None."""
    return next((kind for kind in KINDS if callable(getattr(module, kind, None))), None)


def _nothing_to_draw(spec) -> str:
    steps = dict.fromkeys(
        f"{format_path(path[:-1] + (step.name,))} ({step.primitive})" for role, _, path, step in spec.stages()
    )
    return (
        f"none of the steps of '{spec.name}' publishes a picture: it has {', '.join(steps)}; "
        "pictures come from steps with attention (mssa, mssa_ascent, mhsa, aot), with memberships (tssa), "
        "or a mask step (a masked autoencoder)"
    )


def patch_grid(model: fx.GraphModule, shape: Sequence[int]) -> tuple[tuple[int, int], int]:
    """The patch grid (rows, columns) of images of ``shape`` ``(B, C, H, W)``, and the patch side."""
    spec = spec_of(model)
    try:
        size = patch_size_of(model)
    except ValueError:
        size = None
    if len(shape) != 4 or size is None:
        raise SpecError([Problem(not_images(spec), ("input", "shape"), spec.locate(("input", "shape")))])
    return (shape[-2] // size, shape[-1] // size), size


def not_images(spec) -> str:
    return (
        f"'{spec.name}' takes input of shape {list(spec.input.shape)}, not images cut into patches "
        "(a patch_embed step on [channels, height, width]): show draws pictures of image networks only"
    )


def display(images: torch.Tensor, mean: Sequence[float] | None, std: Sequence[float] | None) -> torch.Tensor:
    """Standardized ``(B, C, H, W)`` images as they were, in [0, 1]: ``x * std + mean`` when the data
    recorded its statistics, else each image min-max scaled."""
    images = images.detach().double().cpu()
    if mean is not None and std is not None:
        view = (1, -1, 1, 1)
        return (
            images * torch.tensor(std, dtype=torch.float64).view(view)
            + torch.tensor(mean, dtype=torch.float64).view(view)
        ).clamp(0, 1)
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    high = images.amax(dim=(1, 2, 3), keepdim=True)
    return (images - low) / (high - low).clamp_min(1e-12)


def pca_rgb(features: torch.Tensor) -> torch.Tensor:
    """The top three principal components of ``features`` ``(N, d)`` as colours ``(N, 3)`` in [0, 1]:
    the features are centred, projected on the first three right singular vectors (each signed so
    that its largest entry is positive), and each component is min-max scaled over the N rows.
    Fewer than three components (N or d below 3, or a rank below 3) leave the rest black."""
    x = features.double()
    x = x - x.mean(0, keepdim=True)
    _, singular, vh = torch.linalg.svd(x, full_matrices=False)
    count = min(3, vh.shape[0])
    basis = vh[:count]
    signs = torch.sign(basis.gather(1, basis.abs().argmax(1, keepdim=True)))
    projected = x @ (basis * signs).T  # (N, count)
    low, high = projected.amin(0), projected.amax(0)
    colours = torch.zeros(len(x), 3, dtype=torch.float64)
    spread = high - low
    useful = (spread > 1e-12 * (1 + high.abs())) & (singular[:count] > 1e-12 * singular[0].clamp_min(1e-300))
    colours[:, :count] = torch.where(useful, (projected - low) / spread.clamp_min(1e-300), torch.zeros_like(projected))
    return colours


def _reconstruct(
    model: fx.GraphModule, inputs: torch.Tensor, size: int, mean, std, seed: int, notes: list[str]
) -> dict[str, torch.Tensor] | None:
    """Masked input, reconstruction, reconstruction with the visible patches, original: ``(B, C, H, W)``
    each, for display; None (with a note) when the output is not pixel patches."""
    with torch.random.fork_rng():
        torch.manual_seed(step_seed(seed, "pictures"))  # the same masks every time
        outputs = model(inputs)
    b, c, h, w = inputs.shape
    grid = (h // size, w // size)
    prediction = outputs.get("output") if isinstance(outputs, dict) else None
    mask = outputs.get("mask") if isinstance(outputs, dict) else None
    if prediction is None or mask is None or tuple(prediction.shape) != (b, grid[0] * grid[1], size * size * c):
        notes.append(
            "the spec has a mask step but its output is not a patch of pixels per token: no reconstruction picture"
        )
        return None
    original = inputs[..., : grid[0] * size, : grid[1] * size].double()
    output = unpatchify(prediction.double(), size, c, grid)
    hidden = mask.double().reshape(b, 1, *grid).repeat_interleave(size, -2).repeat_interleave(size, -1)
    filled = hidden * output + (1 - hidden) * original
    if mean is None or std is None:  # every column on the original's scale
        low = original.amin(dim=(1, 2, 3), keepdim=True)
        high = original.amax(dim=(1, 2, 3), keepdim=True)
        scaled = {
            k: ((v - low) / (high - low).clamp_min(1e-12)).clamp(0, 1)
            for k, v in (("output", output), ("filled", filled), ("original", original))
        }
    else:
        scaled = {k: display(v, mean, std) for k, v in (("output", output), ("filled", filled), ("original", original))}
    masked = scaled["original"] * (1 - hidden) + 0.5 * hidden  # hidden patches grey
    return {
        "masked": masked,
        "output": scaled["output"],
        "filled": scaled["filled"],
        "original": scaled["original"],
        "mask": mask.double(),
    }


def unpatchify(patches: torch.Tensor, size: int, channels: int, grid: tuple[int, int]) -> torch.Tensor:
    """``(B, rows*cols, P*P*C)`` in ``(p1 p2 c)`` order back to ``(B, C, rows*P, cols*P)``: the
    inverse of :func:`crate_compose.modules.embed.patchify`."""
    b = patches.shape[0]
    x = patches.reshape(b, grid[0], grid[1], size, size, channels)  # b h w p1 p2 c
    return x.permute(0, 5, 1, 3, 2, 4).reshape(b, channels, grid[0] * size, grid[1] * size)


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


@contextlib.contextmanager
def _hooked(model: nn.Module, hooks: dict) -> Iterator[None]:
    handles = [model.get_submodule(name).register_forward_hook(hook) for name, hook in hooks.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()

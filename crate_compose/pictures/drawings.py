"""The figures of ``crate-compose show`` (:mod:`crate_compose.pictures.show`), as PNG bytes.

Every figure is a grid of square cells, a row per image: ``CELL`` inches a side at ``DPI`` dots per
inch, under a header of ``HEADER`` inches for the title, so a figure of ``rows x columns`` cells is
:func:`pixels` ``(rows, columns)`` pixels. Maps over the patch grid are upsampled by repeating each
patch's value over its pixels (nearest, as the papers' figures) and alpha-blended over the image.

Importing this module never imports matplotlib: each function imports it when called.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import torch

CELL, DPI, HEADER = 1.5, 100, 0.65  # inches a cell, dots per inch, inches of title
BAR = 0.55  # inches under the title for the colour bar of a figure of maps (one scale for all its maps)
TITLE_POINTS, TITLE_LINES = 7, 5  # the title's font size, and at most this many lines (wrapped to the width)
ALPHA = 0.6  # opacity of a map over its image
MAP_COLOURS = "inferno"


def pixels(rows: int, columns: int, *, bar: bool = False) -> tuple[int, int]:
    """(width, height) in pixels of a figure of ``rows x columns`` cells (``bar``: with a colour bar)."""
    return round(columns * CELL * DPI), round((rows * CELL + HEADER + BAR * bar) * DPI)


def grid_figure(rows: int, columns: int, title: str, *, bar: bool = False):
    # lazily: importing crate_compose never needs matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = pixels(rows, columns, bar=bar)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    top = 1 - (HEADER + BAR * bar) / (height / DPI)
    figure.subplots_adjust(
        left=0.16 / (width / DPI), right=0.99, bottom=0.01, top=top - 0.15 / (height / DPI), wspace=0.06, hspace=0.12
    )
    figure.suptitle(wrap(title, width / DPI), fontsize=TITLE_POINTS, y=0.995, va="top", linespacing=1.1)
    axes = figure.subplots(rows, columns, squeeze=False)
    for row in axes:
        for cell in row:
            cell.set_axis_off()
    return figure, axes


def wrap(title: str, inches: float) -> str:
    """``title``'s lines wrapped to ``inches`` of width, at most ``TITLE_LINES`` lines (the last one
    ending in '...' when more were needed)."""
    columns = max(20, int(inches * 72 / (0.58 * TITLE_POINTS)))  # a character is about 0.58 em wide
    lines = [part for line in title.splitlines() for part in textwrap.wrap(line, columns) or [""]]
    if len(lines) > TITLE_LINES:
        lines = lines[:TITLE_LINES]
        lines[-1] = lines[-1][: columns - 3] + "..."
    return "\n".join(lines)


def png_bytes(figure) -> bytes:
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=DPI)
    return image.getvalue()


def show_image(axes, image: torch.Tensor) -> None:
    """``image`` ``(C, H, W)`` in [0, 1]: grey for one channel, RGB for three."""
    pixels_ = image.permute(1, 2, 0).numpy()
    height, width = pixels_.shape[:2]
    if pixels_.shape[-1] == 1:
        axes.imshow(pixels_[..., 0], cmap="gray", vmin=0, vmax=1, extent=(0, width, height, 0), interpolation="nearest")
    else:
        axes.imshow(pixels_[..., :3], extent=(0, width, height, 0), interpolation="nearest")
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)


def row_labels(axes, labels: list[str] | None) -> None:
    """Each row's label (which test image it is), left of its first cell."""
    for row, text in zip(axes, labels or []):
        row[0].text(-0.03, 0.5, text, transform=row[0].transAxes, rotation=90, ha="right", va="center", fontsize=6)


def show_map(axes, values: torch.Tensor, patch_size: int, *, top: float) -> None:
    """``values`` ``(rows, cols)`` over the patch grid, coloured from 0 to ``top``, blended over the image."""
    rows, cols = values.shape
    axes.imshow(
        values.numpy(),
        cmap=MAP_COLOURS,
        vmin=0,
        vmax=top,
        alpha=ALPHA,
        interpolation="nearest",
        extent=(0, cols * patch_size, rows * patch_size, 0),
    )


def colour_bar(figure, top: float, label: str, mark: float | None) -> None:
    """A horizontal colour bar from 0 to ``top`` under the title, a tick at ``mark`` (uniform attention)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    height = figure.get_figheight()  # under the title: the label, the bar, its ticks, then the column titles
    axes = figure.add_axes((0.25, 1 - (HEADER + 0.25) / height, 0.5, 0.1 / height))
    bar = figure.colorbar(ScalarMappable(Normalize(0, top), MAP_COLOURS), cax=axes, orientation="horizontal")
    bar.ax.tick_params(labelsize=6, length=2, pad=1)
    bar.ax.set_title(label, fontsize=6, pad=2)
    if mark is not None and mark <= top:
        bar.ax.axvline(mark, color="cyan", linewidth=1.2)


def _mark(axes, cell: tuple[int, int], patch_size: int) -> None:
    from matplotlib.patches import Rectangle

    row, col = cell
    axes.add_patch(
        Rectangle(
            (col * patch_size, row * patch_size), patch_size, patch_size, fill=False, edgecolor="cyan", linewidth=1.2
        )
    )


def maps_png(
    images: torch.Tensor,
    maps: torch.Tensor,
    patch_size: int,
    *,
    title: str,
    query: tuple[int, int] | None = None,
    fixed: bool = False,
    labels: list[str] | None = None,
) -> bytes:
    """A row per image: the image, then one map per head over it. ``maps`` ``(B, K, rows, cols)``, every map
    on one scale (a colour bar under the title): from 0 to 1 when ``fixed`` (memberships), else from 0 to the
    largest weight of the figure, with uniform attention (one over the tokens) marked on the bar, so a nearly
    uniform map looks as faint as it is; ``query``: the (row, column) of the querying patch, outlined in every
    cell."""
    count, heads = maps.shape[:2]
    figure, axes = grid_figure(count, heads + 1, title, bar=True)
    top = 1.0 if fixed else max(float(maps.max()), 1e-12)
    for i in range(count):
        show_image(axes[i][0], images[i])
        for k in range(heads):
            show_image(axes[i][k + 1], images[i])
            show_map(axes[i][k + 1], maps[i, k], patch_size, top=top)
        if query is not None:
            for cell in axes[i]:
                _mark(cell, query, patch_size)
    tokens = maps.shape[-2] * maps.shape[-1]
    colour_bar(
        figure,
        top,
        "membership" if fixed else f"attention weight (cyan: uniform, 1/{tokens} patches)",
        None if fixed else 1 / tokens,
    )
    axes[0][0].set_title("image", fontsize=7)
    for k in range(heads):
        axes[0][k + 1].set_title(f"head {k + 1}", fontsize=7)
    row_labels(axes, labels)
    return png_bytes(figure)


def pca_png(
    images: torch.Tensor, colours: torch.Tensor, patch_size: int, *, title: str, labels: list[str] | None = None
) -> bytes:
    """A row per image: the image, the colours ``(B, rows, cols, 3)`` of its patches, and the colours
    blended over the image."""
    figure, axes = grid_figure(len(images), 3, title)
    rows, cols = colours.shape[1:3]
    extent = (0, cols * patch_size, rows * patch_size, 0)
    for i in range(len(images)):
        show_image(axes[i][0], images[i])
        show_image(axes[i][2], images[i])
        axes[i][1].imshow(colours[i].numpy(), interpolation="nearest", extent=extent)
        axes[i][2].imshow(colours[i].numpy(), interpolation="nearest", extent=extent, alpha=ALPHA)
        height, width = images[i].shape[-2:]
        axes[i][1].set_xlim(0, width)
        axes[i][1].set_ylim(height, 0)
    for j, name in enumerate(("image", "PCA 1-3 as RGB", "over the image")):
        axes[0][j].set_title(name, fontsize=7)
    row_labels(axes, labels)
    return png_bytes(figure)


RECONSTRUCTION_COLUMNS = (
    ("masked", "masked input"),
    ("output", "reconstruction"),
    ("filled", "+ visible patches"),
    ("original", "original"),
)


def reconstruction_png(pictures: dict[str, torch.Tensor], *, title: str, labels: list[str] | None = None) -> bytes:
    """A row per image: masked input, reconstruction, reconstruction with the visible patches pasted
    back, original (each ``(B, C, H, W)`` in [0, 1])."""
    count = len(pictures["original"])
    figure, axes = grid_figure(count, len(RECONSTRUCTION_COLUMNS), title)
    for i in range(count):
        for j, (key, _) in enumerate(RECONSTRUCTION_COLUMNS):
            show_image(axes[i][j], pictures[key][i])
    for j, (_, name) in enumerate(RECONSTRUCTION_COLUMNS):
        axes[0][j].set_title(name, fontsize=7)
    row_labels(axes, labels)
    return png_bytes(figure)


def shown(path: str | Path) -> str:
    """``path`` as a figure's title names it: relative to the working folder when it lies inside it, else its last
    two parts (``crate-supervised/final``): a picture never shows the folders of the machine it was made on."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(*path.parts[-2:]))

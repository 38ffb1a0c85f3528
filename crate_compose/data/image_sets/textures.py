"""The generated backgrounds of ``pasted-digits`` and ``shapes``: smooth coloured noise, stripes, checks, or a mix.

A background is drawn from :data:`DRAWS` uniform numbers in [0, 1), named by :data:`WIDTHS` (a caller lays them
out with :func:`.generated.columns`, alone or before its own):

* ``kind``: which of :data:`BACKGROUNDS` (one in four each);
* a texture (``0.*``, and ``1.*`` for a mix's second): smooth noise (a random 2x2 to 5x5 grid of colours,
  resized with linear interpolation), or stripes or checks of random frequency (1.5 to 6 periods across the
  image), orientation, phase, softness (a ``tanh`` edge, from soft to hard) and two colours;
* a mix: two of the textures (``textures``), the first weighted 0.3 to 0.7 (``weight``).

Every colour is a uniform number per channel, so a background is in [0, 1].
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["BACKGROUNDS", "DRAWS", "TEXTURES", "WIDTHS", "backgrounds"]

BACKGROUNDS = ("noise", "stripes", "checks", "mix")
TEXTURES = BACKGROUNDS[:3]  # what a mix mixes
CELLS = (2, 5)  # a noise grid's sides


def _widths() -> list[tuple[str, int]]:
    widths = [("kind", 1), ("weight", 1), ("textures", 2)]
    for part in (0, 1):  # the two textures of a mix (a background that is not a mix uses the first)
        widths += [
            (f"{part}.cells", 1),
            (f"{part}.grid", CELLS[1] ** 2 * 3),
            (f"{part}.angle", 1),
            (f"{part}.periods", 1),
            (f"{part}.phase", 2),
            (f"{part}.softness", 1),
            (f"{part}.colours", 6),
        ]
    return widths


WIDTHS = _widths()  # (name, how many uniform numbers) of everything a background draws, in order
DRAWS = sum(width for _, width in WIDTHS)


def pick(u: np.ndarray, count: int) -> np.ndarray:
    """Whole numbers in [0, count) from uniform numbers."""
    return np.minimum((u * count).astype(np.int64), count - 1)


def _linear(cells: int, size: int) -> np.ndarray:
    """``(size, cells)``: linear interpolation from ``cells`` samples to ``size`` (the end samples on the ends,
    as bilinear resizing with the corners aligned)."""
    place = np.arange(size) * (cells - 1) / (size - 1)
    low = np.minimum(place.astype(np.int64), cells - 2)
    weights = np.zeros((size, cells))
    weights[np.arange(size), low] = 1 - (place - low)
    weights[np.arange(size), low + 1] = place - low
    return weights


def _texture(u: np.ndarray, columns: dict[str, slice], part: int, kinds: np.ndarray, size: int) -> np.ndarray:
    """Texture ``part`` of every image ``(n, 3, size, size)``: smooth noise, stripes or checks (``kinds``
    indexes :data:`TEXTURES`)."""
    column = {name.split(".", 1)[1]: u[:, s] for name, s in columns.items() if name.startswith(f"{part}.")}
    out = np.empty((len(u), 3, size, size))
    cells = CELLS[0] + pick(column["cells"][:, 0], CELLS[1] - CELLS[0] + 1)
    for side in np.unique(cells[kinds == 0]):
        chosen = (kinds == 0) & (cells == side)
        grid = column["grid"][chosen].reshape(-1, 3, CELLS[1], CELLS[1])[..., :side, :side]
        spread = _linear(int(side), size)
        out[chosen] = spread @ grid @ spread.T
    waves = kinds > 0
    if waves.any():
        angle = math.pi * column["angle"][waves, 0, None, None]
        periods = 2 * math.pi * (1.5 + 4.5 * column["periods"][waves, 0, None, None]) / size
        phase = 2 * math.pi * column["phase"][waves][:, :, None, None]
        softness = 0.5 + 3.5 * column["softness"][waves, 0, None, None]
        y, x = np.mgrid[0:size, 0:size]
        wave = np.sin(periods * (x * np.cos(angle) + y * np.sin(angle)) + phase[:, 0])
        checks = kinds[waves] == 2
        wave[checks] *= np.sin(
            periods[checks] * (y * np.cos(angle[checks]) - x * np.sin(angle[checks])) + phase[checks, 1]
        )
        share = (0.5 + 0.5 * np.tanh(softness * wave) / np.tanh(softness))[:, None]
        colours = column["colours"][waves]
        out[waves] = colours[:, :3, None, None] * share + colours[:, 3:, None, None] * (1 - share)
    return out


def backgrounds(u: np.ndarray, columns: dict[str, slice], size: int) -> tuple[np.ndarray, list[str]]:
    """The backgrounds ``(n, 3, size, size)`` in [0, 1] drawn from the images' uniform numbers ``u`` (``(n, _)``,
    the :data:`WIDTHS` named by ``columns``), and each one's kind in words (``"stripes"``, ``"mix of noise and
    checks"``)."""
    kind = pick(u[:, columns["kind"]][:, 0], len(BACKGROUNDS))
    mixed = kind == BACKGROUNDS.index("mix")
    textures = pick(u[:, columns["textures"]], len(TEXTURES))
    first = np.where(mixed, textures[:, 0], np.minimum(kind, len(TEXTURES) - 1))
    weight = np.where(mixed, 0.3 + 0.4 * u[:, columns["weight"]][:, 0], 1.0)[:, None, None, None]
    back = weight * _texture(u, columns, 0, first, size)
    if mixed.any():
        back[mixed] += (1 - weight[mixed]) * _texture(u[mixed], columns, 1, textures[mixed, 1], size)
    kinds = [
        f"mix of {TEXTURES[a]} and {TEXTURES[b]}" if m else TEXTURES[a] for m, a, b in zip(mixed, first, textures[:, 1])
    ]
    return back, kinds

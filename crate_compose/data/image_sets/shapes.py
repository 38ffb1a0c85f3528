"""``shapes``: ten kinds of large filled shapes on backgrounds from a shared pool, with their ground-truth masks.

Made for self-supervision. On ``pasted-digits`` every image has a background of its own and a small digit, so two
random crops of one image share above all their background, and DINO learned the backgrounds. Here two crops
share the object: the shape is large (half the image's side or more, so a local crop of 12 px of a 32 px image
hits it often), and the background is one of a pool of :data:`POOL` drawn once for the whole set (train and test
alike) and picked at random for each image, independently of its class, so it identifies neither the image nor
the class. The object's colour comes from a small shared palette, also independently of the class: only the
shape's geometry tells the class.

Every image is generated from ``split_seed``, its split and its index alone (:mod:`.generated`: image ``i`` of a
split takes the :data:`DRAWS` uniform numbers ``i * DRAWS ..`` of the split's stream, PCG64 seeded with
``[split_seed, 0]`` for train, ``[split_seed, 1]`` for test, laid out as :data:`COLUMNS` says), so the set is the
same on every machine and for every run seed, and one image can be made again on its own (:func:`draw`):

* the pool (:func:`pool`): :data:`POOL` backgrounds of the image's size, background ``b`` drawn from the ``b``-th
  :data:`.textures.DRAWS` numbers of stream ``[split_seed, 2]`` as ``pasted-digits`` draws its backgrounds
  (:mod:`.textures`: smooth coloured noise, stripes, checks, or a mix of two), its contrast about its own mean
  colour then cut to :data:`CONTRAST` (40%), so that the object stands out of it;
* the class: one of :data:`CLASSES` (uniformly), drawn in a box ``[-1, 1]^2`` (:func:`inside`; ``y`` up): a disc,
  a square (of side 1.8), an isosceles triangle (base and height 2, apex up), a ring (radii 0.55 and 1), a
  plus-shaped cross (arms 0.66 wide), a five-pointed star (radii 0.45 and 1, a point to the right), a crescent
  (the unit disc less a disc of radius 0.8 at (0.5, 0), open to the right), an L and a T (bars 0.7 wide) and a
  half disc (radius 1, flat side down);
* the box: a side of :data:`SIDES` (50% to 85%) of the image's, stretched by an aspect ratio of 0.8 to 1.25
  (:data:`ASPECT`, log-uniformly: the width times its square root, the height divided by it), tilted by up to
  :data:`TILT` (20) degrees either way, and centred at a random place where the untilted box lies inside the
  image (a tilted corner may leave it);
* the rendering: each pixel's alpha is the share of its :data:`SUPERSAMPLE` x :data:`SUPERSAMPLE` sub-pixel points
  inside the shape (anti-aliased), and ``pixel = alpha * colour + (1 - alpha) * background``;
* the colour: one of the two :data:`PALETTE` colours (black, white, and the six of full saturation) that contrast
  most with the image's pool background (those whose 10% quantile of distance to the background's pixels is
  largest, ranked on the pool drawn at side 32, so alike at every image size), drawn uniformly, then moved
  towards grey by up to 20% (a brightness jitter);
* the mask: the pixels whose alpha is above 0.5 (none was empty in 40,000 images at each side from 8 to 16; at
  side 8 the fewest was 3 pixels).

Upright shapes, tilted a little, and muted backgrounds are the design's concessions to small networks: with any
turn (a shape's class then independent of its orientation) and backgrounds at full contrast, a 4-layer CRATE
learned the classes only to 0.45 in 1,500 steps (0.62 with the muted backgrounds and larger shapes), against 0.90
upright; docs/workbench.md has the measurements.

RGB (3 channels), ``image_size`` a side (default 32, at least 8), 10,000 train and 2,000 test images by default
(``train_count``, ``test_count``; ``shapes:N`` names the set with ``N`` training images), standardized per
channel with the train split's mean and std. Each split's ``masks`` holds its images' masks, ``(N, H, W)``
bool, as ``pasted-digits``'s do (``crate-compose segment`` scores attention against them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...errors import DataError
from ...memory import resolve_limit
from ..common import check_memory
from ..record import Data, check_size
from . import generated
from .textures import DRAWS as BACKGROUND_DRAWS
from .textures import WIDTHS, backgrounds, pick

__all__ = ["CLASSES", "Shape", "draw", "inside", "load_shapes", "pool"]

NAME = "shapes"
SIZE, SMALLEST = 32, 8  # the default image side, and the smallest one
CLASSES = ("disc", "square", "triangle", "ring", "cross", "star", "crescent", "L", "half disc", "T")
SIDES = (0.50, 0.85)  # the shape's box side as a share of the image's
TILT = 20  # the largest turn of a shape, in degrees either way
CONTRAST = 0.4  # a pool background's contrast about its own mean colour, as a share of the drawn texture's
ASPECT = 1.25  # the largest stretch of the box (and 1 / ASPECT the smallest)
POOL = 64  # backgrounds, shared by every image of both splits
PALETTE = np.array([[0, 0, 0], [1, 1, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]], float)
CHOICES, JITTER = 2, 0.2  # the colour: one of the CHOICES most contrasting, moved up to JITTER of the way to grey
SUPERSAMPLE = 4  # sub-pixel points a side
POOL_STREAM = 2  # the pool's stream: [split_seed, 2] (train and test are 0 and 1)
MAX_COUNT = 1_000_000
CHUNK, CHUNK_BYTES = 256, 2**27  # images made at once: at most 256, their sub-pixel points (SUPERSAMPLE^2 a
# pixel, about 8 float32 numbers each while they are drawn) under 128 MiB
CACHE_FROM = 20_000  # images (train and test) from which a made set is kept in the cache folder
CACHE_VERSION = 1  # in the cached files' names: raised whenever the drawing changes what an image is

COLUMNS = generated.columns(
    [
        ("class", 1),
        ("background", 1),
        ("colour", 1),
        ("jitter", 1),
        ("side", 1),
        ("aspect", 1),
        ("angle", 1),
        ("centre", 2),
    ]
)
DRAWS = max(s.stop for s in COLUMNS.values())  # uniform numbers per image
BACKGROUND_COLUMNS = generated.columns(WIDTHS)


@dataclass(frozen=True)
class Shape:
    """One generated image before standardization: ``image`` ``(3, S, S)`` in [0, 1], its ``alpha`` and ``mask``
    ``(S, S)``, its class (``label``, the name :data:`CLASSES` gives it), the pool background it lies on
    (``background``, its index, and ``kind``, in words), its colour, and its box: ``side`` in pixels, ``aspect``,
    ``angle`` (radians) and ``centre`` (x, y in pixels, from the image's top left corner)."""

    image: np.ndarray
    alpha: np.ndarray
    mask: np.ndarray
    label: int
    name: str
    background: int
    kind: str
    colour: tuple[float, float, float]
    side: float
    aspect: float
    angle: float
    centre: tuple[float, float]


def _star(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Inside the five-pointed star of outer radius 1 and inner radius 0.45, a point on the x axis: each point is
    folded into the sector between that point (angle 0) and the next inner corner (angle pi/5) and tested
    against the edge joining them."""
    sector = math.pi / 5
    turn = np.abs(np.mod(np.arctan2(y, x) + sector, 2 * sector) - sector)
    r = np.hypot(x, y)
    px, py = r * np.cos(turn), r * np.sin(turn)
    ix, iy = 0.45 * math.cos(sector), 0.45 * math.sin(sector)  # the inner corner; the point is (1, 0)
    return (ix - 1) * py - iy * (px - 1) >= 0  # on the centre's side of the edge


def inside(label: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Whether the points ``(x, y)`` of the box ``[-1, 1]^2`` (``y`` up) lie in shape ``label`` of
    :data:`CLASSES`."""
    r2 = x * x + y * y
    box = np.maximum(np.abs(x), np.abs(y)) <= 1
    name = CLASSES[label]
    if name == "disc":
        return r2 <= 1
    if name == "square":
        return np.maximum(np.abs(x), np.abs(y)) <= 0.9
    if name == "triangle":
        return (y >= -1) & (np.abs(x) <= (1 - y) / 2)
    if name == "ring":
        return (r2 <= 1) & (r2 >= 0.55**2)
    if name == "cross":
        return box & ((np.abs(x) <= 0.33) | (np.abs(y) <= 0.33))
    if name == "star":
        return _star(x, y)
    if name == "crescent":
        return (r2 <= 1) & ((x - 0.5) ** 2 + y * y > 0.8**2)
    if name == "L":
        return box & ((x <= -0.3) | (y <= -0.3))
    if name == "half disc":
        return (y >= -0.5) & (x * x + (y + 0.5) ** 2 <= 1)
    return box & ((y >= 0.3) | (np.abs(x) <= 0.35))  # T


def pool(split_seed: int, size: int) -> tuple[np.ndarray, list[str]]:
    """The :data:`POOL` backgrounds ``(POOL, 3, size, size)`` in [0, 1] every image of the set made with
    ``split_seed`` lies on, and each one's kind in words."""
    u = generated.uniforms(split_seed, POOL_STREAM, POOL, BACKGROUND_DRAWS)
    drawn, kinds = backgrounds(u, BACKGROUND_COLUMNS, size)
    mean = drawn.mean((2, 3), keepdims=True)
    return mean + CONTRAST * (drawn - mean), kinds


def _contrasts(backs: np.ndarray) -> np.ndarray:
    """For each background, the palette's indices ``(POOL, len(PALETTE))`` from the most contrasting on: by the
    10% quantile of each colour's distance to the background's pixels (a colour near any large part of the
    background is a poor one)."""
    pixels = backs.reshape(len(backs), 3, -1)
    distance = np.linalg.norm(pixels[:, None] - PALETTE[None, :, :, None], axis=2)  # (POOL, colours, pixels)
    return np.argsort(-np.quantile(distance, 0.1, axis=-1), axis=1, kind="stable")


def _alpha(
    label: np.ndarray, side: np.ndarray, aspect: np.ndarray, angle: np.ndarray, centre: np.ndarray, size: int
) -> np.ndarray:
    """Each shape's alpha ``(n, size, size)``: the share of its pixels' sub-pixel points inside it."""
    n, fine = len(label), size * SUPERSAMPLE
    points = (np.arange(fine, dtype=np.float32) + 0.5) / SUPERSAMPLE  # the sub-pixel points' places in pixels
    centre = centre.astype(np.float32)
    dx = points[None, None, :] - centre[:, 0, None, None]
    dy = centre[:, 1, None, None] - points[None, :, None]  # y up
    cos, sin = (f(angle)[:, None, None].astype(np.float32) for f in (np.cos, np.sin))
    half = (side / 2)[:, None, None].astype(np.float32)
    stretch = np.sqrt(aspect)[:, None, None].astype(np.float32)
    x = (cos * dx + sin * dy) / (half * stretch)  # turned back by the angle, into the box's units
    y = (cos * dy - sin * dx) * stretch / half
    hit = np.empty((n, fine, fine), dtype=bool)
    for k in np.unique(label):
        chosen = label == k
        hit[chosen] = inside(int(k), x[chosen], y[chosen])
    return hit.reshape(n, size, SUPERSAMPLE, size, SUPERSAMPLE).mean((2, 4))


def _make(u: np.ndarray, size: int, backs: np.ndarray, order: np.ndarray):
    """The images ``(n, 3, size, size)`` in [0, 1], their masks ``(n, size, size)`` and what was drawn, from
    their uniform numbers ``(n, DRAWS)``, on the pool ``backs`` whose colours ranked by contrast are ``order``."""
    column = {name: u[:, s] for name, s in COLUMNS.items()}
    label = pick(column["class"][:, 0], len(CLASSES))
    background = pick(column["background"][:, 0], len(backs))
    paint = order[background, pick(column["colour"][:, 0], CHOICES)]
    colour = 0.5 + (PALETTE[paint] - 0.5) * (1 - JITTER * column["jitter"])
    side = size * (SIDES[0] + (SIDES[1] - SIDES[0]) * column["side"][:, 0])
    aspect = ASPECT ** (2 * column["aspect"][:, 0] - 1)
    angle = math.radians(TILT) * (2 * column["angle"][:, 0] - 1)
    centre = side[:, None] / 2 + (size - side[:, None]) * column["centre"]
    alpha = _alpha(label, side, aspect, angle, centre, size)
    image = alpha[:, None] * colour[:, :, None, None] + (1 - alpha[:, None]) * backs[background]
    return (
        image,
        alpha > 0.5,
        dict(
            label=label,
            alpha=alpha,
            background=background,
            colour=colour,
            side=side,
            aspect=aspect,
            angle=angle,
            centre=centre,
        ),
    )


def draw(split_seed: int, split: str, index: int, size: int = SIZE) -> Shape:
    """Image ``index`` of ``split`` (``"train"`` or ``"test"``) of the set made with ``split_seed`` at side
    ``size``, made on its own: the same as the loaded set's (before standardization)."""
    backs, kinds = pool(split_seed, size)
    u = generated.uniforms(split_seed, generated.SPLITS.index(split), 1, DRAWS, index)
    image, mask, drawn = _make(u, size, backs, _contrasts(pool(split_seed, SIZE)[0]))
    one = {k: v[0] for k, v in drawn.items()}
    label, background = int(one["label"]), int(one["background"])
    return Shape(
        image[0],
        one["alpha"],
        mask[0],
        label,
        CLASSES[label],
        background,
        kinds[background],
        tuple(float(c) for c in one["colour"]),
        float(one["side"]),
        float(one["aspect"]),
        float(one["angle"]),
        tuple(float(c) for c in one["centre"]),
    )


def _chunk(size: int) -> int:
    """How many images of side ``size`` are drawn at once (:data:`CHUNK`, :data:`CHUNK_BYTES`)."""
    return max(1, min(CHUNK, CHUNK_BYTES // (size * size * SUPERSAMPLE**2 * 4 * 8)))


def cache_file(split_seed: int, size: int, split: str, count: int):
    """Where a made split is kept (:data:`CACHE_FROM`; :func:`.generated.cache_file`)."""
    return generated.cache_file(NAME, CACHE_VERSION, split_seed, size, split, count)


def load_shapes(
    *,
    image_size: int | None = None,
    split_seed: int = 0,
    train_count: int = 10_000,
    test_count: int = 2_000,
    memory_limit: str | float | None = None,
) -> Data:
    """``train_count`` / ``test_count`` images of large shapes on pooled backgrounds, with their masks (see the
    module docstring); every image is fixed by ``split_seed`` (never the run's seed). A set of :data:`CACHE_FROM`
    images or more is kept once made (:func:`cache_file`) and read back, checked, after."""
    size = SIZE if image_size is None else image_size
    check_size(size, NAME)
    if size < SMALLEST:
        raise DataError(f"{NAME}: image_size must be at least {SMALLEST}; got {size}")
    generated.check_counts(NAME, MAX_COUNT, train_count=train_count, test_count=test_count)
    total = train_count + test_count
    chunk = _chunk(size)
    # alive at once at the peak: every image as float32 and its mask, the pool (four float64 copies while it is
    # drawn: its two textures, their mix and the muted one), and one chunk's images and sub-pixel points
    needed = (
        total * size * size * (3 * 4 + 1)
        + POOL * 3 * size * size * 8 * 4
        + min(chunk, max(train_count, test_count)) * size * size * (3 * 8 * 4 + SUPERSAMPLE**2 * 4 * 8)
    )
    check_memory(
        needed,
        f"{NAME}: {total:,} images of 3x{size}x{size}",
        resolve_limit(memory_limit),
        "give a smaller --image-size",
    )
    backs, order = pool(split_seed, size)[0], _contrasts(pool(split_seed, SIZE)[0])

    def make(split: str, count: int) -> generated.Split:
        stream = generated.SPLITS.index(split)
        return generated.generate(
            NAME,
            split,
            count,
            size,
            lambda start, n: _make(generated.uniforms(split_seed, stream, n, DRAWS, start), size, backs, order),
            chunk=chunk,
        )

    splits = generated.load_splits(
        NAME, CACHE_VERSION, split_seed, size, (train_count, test_count), len(CLASSES), make, CACHE_FROM
    )
    return generated.labeled_data(NAME, splits, size, CLASSES)

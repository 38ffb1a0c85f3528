"""``crate-compose show``: pictures of what an image network does (PNG files)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..settings import MAX_IMAGE_SIZE
from .arguments import (
    IMAGE_SIZE,
    NONNEGATIVE,
    SEED,
    Command,
    formulas_argument,
    normalize_argument,
    number,
    spec_arguments,
)


def add(command: Command) -> None:
    """Add the command show."""
    show = command(
        "show",
        help="pictures of what an image network does: attention maps, TSSA memberships, "
        "PCA of the patch features, masked reconstructions (PNG files)",
    )
    spec_arguments(show, run=True)
    show.add_argument(
        "--weights",
        type=Path,
        metavar="DIR",
        help="trained weights: a run's final/ or a checkpoint folder (without: the untrained network of --seed)",
    )
    show.add_argument(
        "--data",
        default=None,
        metavar="NAME",
        help="image data set whose test images are shown "
        "(digits, photos, folder:PATH; default: a run's own, else digits)",
    )
    show.add_argument(
        "--layer",
        type=NONNEGATIVE,
        default=None,
        metavar="N",
        help="the encoder layer to show, counted from 0 (default: the last)",
    )
    show.add_argument(
        "--images",
        "--image",
        type=number(int, 1, 16, what="a whole number"),
        default=4,
        metavar="N",
        help="how many test images, a row each, 1 to 16 (default: 4)",
    )
    show.add_argument(
        "--patch",
        type=NONNEGATIVE,
        default=None,
        metavar="P",
        help="the patch whose attention is shown, row by row in the patch grid from 0 (default: the centre patch)",
    )
    show.add_argument(
        "--image-size",
        type=IMAGE_SIZE,
        default=None,
        metavar="N",
        help=f"resize images to this side (at most {MAX_IMAGE_SIZE})",
    )
    normalize_argument(show)
    formulas_argument(show)
    show.add_argument(
        "--seed",
        type=SEED,
        default=0,
        metavar="N",
        help="seed of the untrained network and of the reconstruction's masks (default: 0)",
    )
    show.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="folder for the PNG files, never inside a build (default: "
        "RUN/pictures/final or RUN/pictures/step-N beside a run's weights, DIR/../pictures/NAME "
        "beside other weights, else pictures/<spec name>)",
    )


def run_show(args: argparse.Namespace) -> int:
    from ..building import outputs

    if args.out is not None:  # a file, a build: refused before torch loads
        outputs.check_picture_folder(args.out, f"--out {args.out}")
    from ..pictures.show import show

    shown = show(
        args.spec,
        args.data,
        weights=args.weights,
        overrides=args.overrides,
        layer=args.layer,
        images=args.images,
        patch=args.patch,
        out=args.out,
        seed=args.seed,
        image_size=args.image_size,
        normalize=args.normalize,
    )
    for note in shown.notes:
        print(f"note: {note}", file=sys.stderr)
    for path, what in shown.files:
        print(f"wrote {path}: {what}")
    return 0

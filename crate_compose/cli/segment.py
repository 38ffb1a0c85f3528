"""``crate-compose segment``: how well the class token's attention segments images, against ground-truth masks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..settings import MAX_IMAGE_SIZE
from .arguments import (
    COUNT,
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
    """Add the command segment."""
    segment = command(
        "segment",
        help="segmentation from attention: the class token's attention per head, "
        "scored against ground-truth masks (DINO's 60%%-mass masks by Jaccard index, average precision), "
        "trained against untrained (JSON and PNG files)",
    )
    spec_arguments(segment, run=True)
    segment.add_argument(
        "--weights",
        type=Path,
        metavar="DIR",
        help="trained weights: a run's final/ or a checkpoint "
        "folder, or an authors' checkpoint file (without: the untrained network of --seed alone)",
    )
    segment.add_argument(
        "--data",
        default=None,
        metavar="NAME",
        help="a data set with ground-truth masks (default: a run's own, else pasted-digits)",
    )
    segment.add_argument(
        "--layer",
        type=NONNEGATIVE,
        default=None,
        metavar="N",
        help="the encoder layer whose class-token attention is read, counted from 0 (default: the last)",
    )
    segment.add_argument(
        "--samples",
        type=COUNT,
        default=256,
        metavar="N",
        help="how many test images are scored: the first N (default: 256)",
    )
    segment.add_argument(
        "--images",
        type=number(int, 1, 16, what="a whole number"),
        default=4,
        metavar="N",
        help="how many of them are pictured, a row each, 1 to 16 (default: 4)",
    )
    segment.add_argument(
        "--threshold",
        type=number(float, 0, 1, low_open=True),
        default=0.6,
        metavar="T",
        help="the share of a map's attention mass its mask keeps (default: 0.6, as DINO)",
    )
    segment.add_argument(
        "--image-size",
        type=IMAGE_SIZE,
        default=None,
        metavar="N",
        help=f"resize images to this side (at most {MAX_IMAGE_SIZE})",
    )
    normalize_argument(segment)
    formulas_argument(segment)
    segment.add_argument(
        "--seed",
        type=SEED,
        default=None,
        metavar="N",
        help="seed of the untrained network (default: a run's own, else 0)",
    )
    segment.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="folder for segmentation.json and the PNG files, never "
        "inside a build (default: RUN/segmentation/final or RUN/segmentation/step-N beside a run's "
        "weights, DIR/../segmentation/NAME beside other weights, else segmentation/<spec name>)",
    )


def run_segment(args: argparse.Namespace) -> int:
    from ..building import outputs

    if args.out is not None:  # a file, a build: refused before torch loads
        outputs.check_picture_folder(args.out, f"--out {args.out}")
    from ..pictures.segmentation import segment

    done = segment(
        args.spec,
        args.data,
        weights=args.weights,
        overrides=args.overrides,
        layer=args.layer,
        samples=args.samples,
        images=args.images,
        threshold=args.threshold,
        out=args.out,
        seed=args.seed,
        image_size=args.image_size,
        normalize=args.normalize,
    )
    for note in done.notes:
        print(f"note: {note}", file=sys.stderr)
    print(done.table)
    for path, what in done.files:
        print(f"wrote {path}: {what}")
    return 0

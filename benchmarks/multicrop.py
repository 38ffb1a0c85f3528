"""DINO's multi-crop views of a batch (crate_compose.tasks.multicrop): batched against per image.

The batched views (each view of a whole batch in a few tensor operations, parameters per image) against
torchvision's v2 transforms applied one image at a time (RandomResizedCrop, flip, ColorJitter, greyscale,
GaussianBlur, solarize: what DINO's data loader does with PIL), for 2 global + 8 local views of a batch.
Median of --rounds, both in one run::

    python benchmarks/multicrop.py --out
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from machine import publish  # benchmarks/machine.py, beside this script

HERE = Path(__file__).resolve().parent


def per_image(pixels: torch.Tensor, crop) -> list[torch.Tensor]:
    """Every view with torchvision's v2 transforms, one image at a time."""
    from crate_compose.data.batches import transforms_v2
    from crate_compose.tasks.multicrop import GLOBAL_SCALE, LOCAL_SCALE

    v2 = transforms_v2()

    def pipeline(size, scale, blur, solarize=0.0):
        steps = [
            v2.RandomResizedCrop(size, scale=scale, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            v2.RandomGrayscale(p=0.2),
            v2.RandomApply([v2.GaussianBlur(min(13, size - 1 - size % 2 + 1) | 1, (0.1, 2.0))], p=blur),
        ]
        return v2.Compose(steps + ([v2.RandomSolarize(0.5, p=solarize)] if solarize else []))

    views = [
        pipeline(crop.global_size, GLOBAL_SCALE, 1.0),
        pipeline(crop.global_size, GLOBAL_SCALE, 0.1, 0.2),
        *[pipeline(crop.local_size, LOCAL_SCALE, 0.5)] * crop.local_crops,
    ]
    return [torch.stack([view(image) for image in pixels]) for view in views]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", nargs="?", const=str(HERE / "RESULTS.md"), help="append the results as a section")
    args = parser.parse_args()
    from crate_compose.tasks.multicrop import MultiCrop, views

    rows = []
    for shape, crop in (((3, 32, 32), MultiCrop(32, 12, 8)), ((1, 28, 28), MultiCrop(28, 12, 8))):
        pixels = torch.rand(args.batch, *shape, generator=torch.Generator().manual_seed(0))
        times = {"batched": [], "per image (torchvision v2)": []}
        for _ in range(args.rounds):
            for name, fn in (("batched", views), ("per image (torchvision v2)", per_image)):
                began = time.perf_counter()
                fn(pixels, crop)
                times[name].append(time.perf_counter() - began)
        medians = {name: statistics.median(values) for name, values in times.items()}
        rows.append(
            f"| {args.batch} x {tuple(shape)}, 2 x {crop.global_size} + 8 x {crop.local_size} px | "
            f"{medians['batched'] * 1e3:.0f} ms | {medians['per image (torchvision v2)'] * 1e3:.0f} ms | "
            f"{medians['per image (torchvision v2)'] / medians['batched']:.1f}x |"
        )
    text = (
        "## DINO's multi-crop views: batched against per image\n\n"
        f"`benchmarks/multicrop.py`, median of {args.rounds} rounds in one run, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU (2 cores, this project's machine).\n\n"
        "| batch | batched (crate_compose.tasks.multicrop) | per image | ratio |\n| --- | ---: | ---: | ---: |\n"
        + "\n".join(rows)
        + "\n"
    )
    publish(text, args.out)


if __name__ == "__main__":
    main()

"""Images per second the training data pipeline delivers, against what a training step consumes.

    .venv/bin/python benchmarks/loader.py [--quick] [--workers 0,1,2] [--device auto|cpu|cuda] [--out [PATH]]

A folder of ``--images`` (2,000) JPEG (or ``--format png``) images of 256x256 in 10 class folders is
written to a temporary directory: random crops of the two photographs scikit-learn ships (china,
flower), flipped and with their channels permuted at random, so the files are photographs, not
noise. It is read as ``folder:PATH`` at ``--image-size`` (224), as ``train`` reads it.

**The loader**: for each augmentation (``none``: decode and resize; ``crop-flip``: decode, a random
resized crop to 224 and a flip; ``randaugment``: crop-flip and RandAugment) and each worker count,
:func:`crate_compose.data.batches.batches` yields batches of ``--batch-size`` (64) for a fresh
run; the first ``--warm`` batches (worker start-up included) are not counted, the next ``--batches``
are timed. Images/s = images / seconds; the table gives the median over ``--rounds`` runs, and the
first batch's latency (start-up: the workers' start and their first batch).

**The model**: CRATE-Tiny (``zoo/crate-tiny.yaml``, 003 Table 1: d = 384, 6 heads, 12 layers,
16x16 patches, 10 classes here), one training step (forward, cross-entropy, backward, AdamW) on a
batch of the loader, float32 (and bf16 autocast on CUDA); images/s = batch / the median step time
over ``--rounds`` steps after two warm-up steps. The loader keeps the model fed when its images/s
are at least the model's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from machine import cpu_stall_us, publish  # benchmarks/machine.py, beside this script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from crate_compose import tasks  # noqa: E402
from crate_compose.data.batches import batches, transforms_v2  # noqa: E402
from crate_compose.data.sets import load_data  # noqa: E402
from crate_compose.settings import Settings  # noqa: E402

CLASSES = 10
AUGMENTS = ("none", "crop-flip", "randaugment")


def write_images(root: Path, count: int, side: int, suffix: str) -> None:
    """``count`` images of side x side in CLASSES class folders: crops of scikit-learn's photographs."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images  # two (427, 640, 3) uint8 photographs
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        (root / f"c{c}").mkdir(parents=True)
    for i in range(count):
        photo = photos[rng.integers(len(photos))]
        top, left = rng.integers(photo.shape[0] - side + 1), rng.integers(photo.shape[1] - side + 1)
        crop = photo[top : top + side, left : left + side]
        crop = crop[:, ::-1] if rng.integers(2) else crop
        crop = np.ascontiguousarray(crop[..., rng.permutation(3)])
        path = root / f"c{i % CLASSES}" / f"{i:05d}.{suffix}"
        Image.fromarray(crop).save(path, **({"quality": 90} if suffix == "jpg" else {}))


def loader_rate(data, settings: Settings, warm: int, count: int, device: str) -> tuple[float, float, float]:
    """(images/s over ``count`` batches after ``warm``, seconds to the first batch, CPU stall share);
    batches in pinned memory on CUDA, as ``train`` has them."""
    began = time.perf_counter()
    stream = batches(data, settings, 0, device=device)
    with contextlib.closing(stream):
        next(stream)
        first = time.perf_counter() - began
        for _ in range(warm - 1):
            next(stream)
        stall, start = cpu_stall_us(), time.perf_counter()
        images = sum(len(next(stream)[0]) for _ in range(count))
        seconds = time.perf_counter() - start
        waited = (cpu_stall_us() - stall) / 1e6 if stall is not None else 0.0
    return images / seconds, first, waited / seconds


def model_rate(data, batch: tuple[torch.Tensor, torch.Tensor], device: str, precision: str, rounds: int) -> float:
    """Images/s of one CRATE-Tiny training step on ``batch``."""
    from crate_compose.building.builder import compile_spec
    from crate_compose.spec_language import loader

    spec = loader.load("crate-tiny", data.spec_overrides(loader.load("crate-tiny")))  # 10 classes, the image size
    model = compile_spec(spec, seed=0, device=device, memory_limit="none").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = batch[0].to(device), batch[1].to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            outputs = model(x)
        loss = tasks.get("classify").loss(outputs, x, y, model=model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    times = []
    for r in range(rounds + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        if r >= 2:
            times.append(time.perf_counter() - began)
    return len(x) / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 images, 2 rounds, 4 timed batches")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--side", type=int, default=256, help="side of the images written")
    parser.add_argument("--image-size", type=int, default=224, help="side the images are read at")
    parser.add_argument("--format", choices=("jpg", "png"), default="jpg")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", default="0,1,2", help="worker counts, comma-separated")
    parser.add_argument("--augments", default=",".join(AUGMENTS))
    parser.add_argument("--warm", type=int, default=2, help="batches not counted (the first includes start-up)")
    parser.add_argument("--batches", type=int, default=8, help="batches timed per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    parser.add_argument("--out", nargs="?", const=str(HERE / "RESULTS.md"), help="append the results as a section")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.rounds, args.batches = 400, 2, 4
    device = (
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    workers = [int(w) for w in args.workers.split(",")]
    augments = args.augments.split(",")
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        root = Path(tmp) / "images"
        began = time.perf_counter()
        write_images(root, args.images, args.side, args.format)
        size = sum(p.stat().st_size for p in root.rglob(f"*.{args.format}"))
        print(
            f"wrote {args.images} images ({size / 2**20:.1f} MiB) in {time.perf_counter() - began:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        data = load_data(f"folder:{root}", image_size=args.image_size)
        transforms_v2()  # imported once before the timings (workers inherit it)
        steps = args.warm + args.batches
        rows = []
        for augment in augments:
            for count in workers:
                settings = Settings(
                    data=data.name, steps=steps, batch_size=args.batch_size, augment=augment, workers=count
                )
                runs = [loader_rate(data, settings, args.warm, args.batches, device) for _ in range(args.rounds)]
                rate = statistics.median(r[0] for r in runs)
                first = statistics.median(r[1] for r in runs)
                stall = max(r[2] for r in runs)
                rows.append((augment, count, rate, first, stall, [r[0] for r in runs]))
                print(
                    f"{augment}, {count} workers: {rate:.0f} images/s (runs: "
                    f"{', '.join(f'{r[0]:.0f}' for r in runs)}), first batch {first:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
        batch = next(iter(batches(data, Settings(data=data.name, steps=1, batch_size=args.batch_size), 0)))
        precisions = ("fp32", "bf16") if device == "cuda" else ("fp32",)
        model = {p: model_rate(data, batch, device, p, args.rounds) for p in precisions}
        for p, rate in model.items():
            print(f"CRATE-Tiny training step ({device}, {p}): {rate:.0f} images/s", file=sys.stderr, flush=True)
    text = report(rows, model, device, args, time.perf_counter() - wall)
    publish(text, args.out)
    return 0


def report(rows, model: dict[str, float], device: str, args, seconds: float) -> str:
    cores = os.cpu_count()
    gpu = f", {torch.cuda.get_device_name()}" if device == "cuda" else ""
    machine = f"{platform.machine()}, {cores} cores{gpu}, torch {torch.__version__}, Python {platform.python_version()}"
    lines = [
        f"## loader.py: images/s the data pipeline delivers against a training step ({device})",
        "",
        f"`benchmarks/loader.py{' --quick' if args.quick else ''} --workers {args.workers}` "
        f"({datetime.datetime.now():%Y-%m-%d %H:%M}, {machine}, {seconds:.0f} s)",
        "",
        f"{args.images:,} {args.format.upper()} images of {args.side}x{args.side} (crops of scikit-learn's two "
        f"photographs) read as `folder:PATH` at {args.image_size}x{args.image_size}, batch {args.batch_size}. "
        f"Loader: images/s over {args.batches} batches after {args.warm} (median of {args.rounds} fresh runs; "
        "the runs in brackets); first batch: seconds from the start of a run to its first batch (the workers' "
        "start-up). Stall: the largest CPU stall share of the runs (Linux PSI).",
        "",
        "| augment | workers | images/s | runs | first batch s | stall |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
    ]
    for augment, count, rate, first, stall, runs in rows:
        lines.append(
            f"| {augment} | {count} | {rate:.0f} | {', '.join(f'{r:.0f}' for r in runs)} | {first:.2f} | {stall:.0%} |"
        )
    lines += [
        "",
        "CRATE-Tiny (d = 384, 6 heads, 12 layers, 16x16 patches, 10 classes), one training step (forward, "
        f"cross-entropy, backward, AdamW) on a batch of {args.batch_size}, median of {args.rounds} steps after 2: "
        + ", ".join(f"{p} {rate:.0f} images/s" for p, rate in model.items())
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""A CRATE trained with the paper's recipe on a folder of 32x32 images laid out as CIFAR-10 is on disk.

No data set is downloaded: the folder is written from scikit-learn's 8x8 digits, each upsampled to
32x32 RGB PNG, in CIFAR-10's layout (``train/<class>/*.png``, ``test/<class>/*.png``; 1,437 / 360
images, 10 classes). Then::

    crate-compose train crate-tiny --config crate-pretrain --data folder:DIR --image-size 32 \\
        --set sizes.patch_size=4 --steps N --batch-size B --lr ... --workers W [--precision bf16 --compile]

runs with the recipe's Lion, weight decay, label smoothing and crop-and-flip augmentation, and the
figure of its loss, learning rate and test accuracy is drawn from ``metrics.jsonl``.

    python benchmarks/folder_run.py --out runs/folder-run --steps 600 [--device cuda --precision bf16 --compile]

``--formulas both`` trains the same run twice, with the fast paths and with every formula as written
(``train --formulas``, :mod:`crate_compose.modules.paths`), into ``OUT/fast`` and ``OUT/written``: the
same seed, so the same initial weights, batches and augmentation; the figure puts their losses and
test accuracies side by side. ``--patch-size`` and ``--set`` shrink the network (the 2-core CPU run of
benchmarks/RESULTS.md: bf16 at a size it can train in minutes)::

    python benchmarks/folder_run.py --formulas both --precision bf16 --steps 400 --batch-size 64 --lr 4e-4 \
        --patch-size 8 --set sizes.d=192 --set sizes.heads=3 --set sizes.head_dim=64 --set sizes.depth=6 \
        --workers 0 --out /tmp/bf16-formulas --figure docs/figures/bf16-fast-vs-written.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def write_folder(root: Path, size: int = 32) -> tuple[int, int]:
    """Digits as CIFAR-10's layout: train/ and test/ of one folder per class, PNGs of size x size RGB."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_i, test_i = train_test_split(
        np.arange(len(digits.target)), test_size=0.2, random_state=0, stratify=digits.target
    )
    for split, indices in (("train", train_i), ("test", test_i)):
        for i in indices:
            folder = root / split / f"class{digits.target[i]}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = (digits.images[i] * 255 / 16).astype(np.uint8)
            Image.fromarray(pixels).resize((size, size), Image.BILINEAR).convert("RGB").save(folder / f"{i}.png")
    return len(train_i), len(test_i)


def figure(run: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train])
    axes[0].set(title="training loss (label smoothing 0.1)", xlabel="step")
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[1].set(title="learning rate (Lion, warm-up + cosine)", xlabel="step")
    axes[2].plot([r["step"] for r in evals], [r["test_accuracy"] for r in evals], marker="o")
    axes[2].set(title="test accuracy", xlabel="step", ylim=(0, 1))
    fig.suptitle(f"{run.name}: crate-tiny (patch 4) on a 32x32 CIFAR-layout folder, recipe crate-pretrain")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def comparison(runs: dict[str, Path], path: Path, title: str) -> None:
    """The training loss and the test accuracy of each run (by label), side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for label, run in runs.items():
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if r["kind"] == "train"]
        evals = [r for r in rows if r["kind"] == "eval"]
        axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label=label, linewidth=1)
        final = evals[-1]["test_accuracy"] if evals else float("nan")
        axes[1].plot(
            [r["step"] for r in evals],
            [r["test_accuracy"] for r in evals],
            marker="o",
            label=f"{label} (final {final:.3f})",
        )
    axes[0].set(title="training loss (label smoothing 0.1)", xlabel="step")
    axes[1].set(title="test accuracy", xlabel="step", ylim=(0, 1))
    for axis in axes:
        axis.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def comparison_title(args) -> str:
    """What the two runs of ``--formulas both`` are."""
    sizes = "".join(", " + o.removeprefix("sizes.") for o in args.overrides)
    return (
        f"crate-tiny (patch {args.patch_size}{sizes}), recipe crate-pretrain, {args.precision}, batch "
        f"{args.batch_size}, lr {args.lr:g}, seed {args.seed}, on the CIFAR-layout folder of digits:\n"
        "the fast paths against the formulas as written (train --formulas)"
    )


def command(args, out: Path, formulas: str) -> list[str]:
    """The ``crate-compose train`` command line of one run."""
    sets = [arg for override in args.overrides for arg in ("--set", override)]
    return [
        sys.executable,
        "-m",
        "crate_compose.cli",
        "train",
        "crate-tiny",
        "--config",
        "crate-pretrain",
        "--data",
        f"folder:{args.data}",
        "--image-size",
        "32",
        "--set",
        f"sizes.patch_size={args.patch_size}",
        *sets,
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--lr",
        str(args.lr),
        "--warmup",
        str(max(1, args.steps // 20)),
        "--eval-every",
        str(max(1, args.steps // 10)),
        "--log-every",
        str(args.log_every),
        "--workers",
        str(args.workers),
        "--device",
        args.device,
        "--precision",
        args.precision,
        "--formulas",
        formulas,
        "--seed",
        str(args.seed),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--out",
        str(out),
        "--no-progress",
        *(["--compile"] if args.compile else []),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/folder-run"))
    parser.add_argument("--data", type=Path, default=Path("runs/cifar-layout-digits"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=6e-4, help="the recipe's 2.4e-4 is for batch 2,048")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--figure", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="default: at the end")
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="another override of crate-tiny (repeatable), e.g. sizes.depth=6",
    )
    parser.add_argument(
        "--formulas",
        choices=("fast", "written", "both"),
        default="fast",
        help="the fast paths, every formula as written, or both runs into OUT/fast and OUT/written",
    )
    args = parser.parse_args()
    if not (args.data / "train").is_dir():
        print("wrote %d train and %d test images" % write_folder(args.data))
    chosen = ("fast", "written") if args.formulas == "both" else (args.formulas,)
    runs = {f: args.out / f if args.formulas == "both" else args.out for f in chosen}
    for formulas, out in runs.items():
        line = command(args, out, formulas)
        print(" ".join(line[2:]), flush=True)
        done = subprocess.run(line)
        if done.returncode:
            return done.returncode
    if args.formulas != "both":
        figure(args.out, args.figure or args.out / "training.png")
        return 0
    comparison(
        {"fast paths" if f == "fast" else "formulas as written": out for f, out in runs.items()},
        args.figure or args.out / "fast-vs-written.png",
        comparison_title(args),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A CRATE trained with the paper's recipe on a folder of 32x32 images laid out as CIFAR-10 is on disk.

No data set is downloaded: the folder is written from scikit-learn's 8x8 digits, each upsampled to
32x32 RGB PNG, in CIFAR-10's layout (``train/<class>/*.png``, ``test/<class>/*.png``; 1,437 / 360
images, 10 classes). Then::

    crate-compose train crate-tiny --config crate-pretrain --data folder:DIR --image-size 32 \\
        --set sizes.patch_size=4 --steps N --batch-size B --lr ... --workers W [--precision bf16 --compile]

runs with the recipe's Lion, weight decay, label smoothing and crop-and-flip augmentation, and the
figure of its loss, learning rate and test accuracy is drawn from ``metrics.jsonl``.

    python benchmarks/folder_run.py --out runs/folder-run --steps 600 [--device cuda --precision bf16 --compile]
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
    train_i, test_i = train_test_split(np.arange(len(digits.target)), test_size=0.2, random_state=0,
                                       stratify=digits.target)
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
    args = parser.parse_args()
    if not (args.data / "train").is_dir():
        print("wrote %d train and %d test images" % write_folder(args.data))
    command = [sys.executable, "-m", "crate_compose.cli", "train", "crate-tiny", "--config", "crate-pretrain",
               "--data", f"folder:{args.data}", "--image-size", "32", "--set", "sizes.patch_size=4",
               "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
               "--warmup", str(max(1, args.steps // 20)), "--eval-every", str(max(1, args.steps // 10)),
               "--workers", str(args.workers), "--device", args.device, "--precision", args.precision,
               "--seed", str(args.seed), "--checkpoint-every", str(args.checkpoint_every),
               "--out", str(args.out), "--no-progress", *(["--compile"] if args.compile else [])]
    print(" ".join(command[2:]))
    done = subprocess.run(command)
    if done.returncode:
        return done.returncode
    figure(args.out, args.figure or args.out / "training.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

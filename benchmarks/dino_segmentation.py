"""Does attention segment without a mask label? Supervised CRATE and ViT against CRATE-DINO and ViT-DINO.

The segmentation paper (Yu et al. 2023, "Emergence of segmentation with minimalistic white-box transformers")
reports that a supervised CRATE's class-token attention segments objects where a supervised ViT's does not,
and DINO (Caron et al. 2021) that self-distillation makes a ViT's attention segment. This trains the four at
the same sizes (12 layers of width 128, 4 heads, 4x4 patches) for the same steps and batch on
``pasted-digits`` (32x32 RGB, digits pasted on textures, ground-truth masks), then measures each with the
project's own commands: ``linear-probe`` (logistic regression and k-NN of the class token; a DINO run's
teacher) and ``segment`` (Jaccard of DINO's 60%-mass masks, average precision, trained against untrained).

    python benchmarks/dino_segmentation.py train runs/dino-seg --steps 3000 --batch-size 128 [--device cuda]
    python benchmarks/dino_segmentation.py report runs/dino-seg --figures docs/figures

``train`` runs the four one after the other (``--parallel``: at once, for a GPU); ``report`` writes
``OUT/summary.json``, a markdown table on stdout, and with ``--figures`` the bar chart
``dino-segmentation.png`` and each model's pictures ``dino-segmentation-<model>.png``. Each run is measured
at its final weights (a DINO run's teacher), or its latest checkpoint if it did not finish (named in the
summary).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from experiment import answer, grouped_bars, launch, log_of, quietly, save_figure

# name: (preset, task options). Both objectives see the same images for the same steps at the same peak rate,
# warm-up and schedule; DINO's own settings (weight decay 0.04 to 0.4, clipping 3, the teacher at 0.996) come
# from its recipe, the supervised runs shift each image by up to a pixel.
MODELS = {
    "crate-supervised": ("crate-mini", ["--task", "classify", "--augment", "shift"]),
    "vit-supervised": ("vit-mini", ["--task", "classify", "--augment", "shift"]),
    "crate-dino": ("crate-dino-mini", ["--task", "dino", "--config", "crate-dino"]),
    "vit-dino": ("vit-dino-mini", ["--task", "dino", "--config", "crate-dino"]),
}
DATA = "pasted-digits"


def _train_command(name: str, out: Path, args: argparse.Namespace) -> list[str]:
    preset, options = MODELS[name]
    return [
        "train",
        preset,
        *options,
        "--data",
        args.data,
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--lr",
        str(args.lr),
        "--warmup-epochs",
        "10",
        "--seed",
        str(args.seed),
        "--checkpoint-every",
        str(max(1, args.steps // 6)),
        "--log-every",
        "25",
        "--device",
        args.device,
        "--no-progress",
        *(["--precision", args.precision] if args.precision else []),
    ]


def train(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(name, _train_command(name, args.out, args)) for name in MODELS]
    failed = launch(runs, args.out, len(runs) if args.parallel else 1, args.device)
    for name in failed:
        print(f"error: {name} failed: see {log_of(args.out, name)}", file=sys.stderr)
    return 1 if failed else 0


def report(args: argparse.Namespace) -> int:
    summary = {"models": {}}
    for name in MODELS:
        run = args.out / name
        probe = answer(["linear-probe", str(run)])
        segmentation = args.out / "segmentation" / name
        quietly(["segment", str(run), "--samples", str(args.samples), "--images", "6", "--out", str(segmentation)])
        measured = json.loads((segmentation / "segmentation.json").read_text())
        rows = {which: measured["runs"][which] for which in ("trained", "untrained")}
        result = json.loads((run / "result.json").read_text()) if (run / "result.json").is_file() else {}
        record = json.loads((run / "run.json").read_text())
        summary["models"][name] = {
            "preset": MODELS[name][0],
            "data": record["identity"]["data"]["name"],
            "weights": probe["weights"],
            "parameters": result.get("params"),
            "steps": record["steps"],
            "batch_size": record["identity"]["settings"]["batch_size"],
            "test_accuracy": result.get("metrics", {}).get("test_accuracy"),
            "linear_probe_accuracy": probe["test_accuracy"],
            "knn_accuracy": probe["knn_accuracy"],
            **{
                f"{which}_{key}": value
                for which, row in rows.items()
                for key, value in (
                    ("best_head", row["best_head"]["by_jaccard"]["head"]),
                    ("best_head_jaccard", row["best_head"]["by_jaccard"]["jaccard"]),
                    ("mean_map_jaccard", row["mean_map"]["jaccard"]),
                    ("mean_map_average_precision", row["mean_map"]["average_precision"]),
                    ("head_jaccards", [head["jaccard"] for head in row["heads"]]),
                )
            },
        }
        if args.figures:
            args.figures.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(segmentation / "segmentation-trained.png", args.figures / f"dino-segmentation-{name}.png")
    summary["chance_average_precision"] = measured["chance"]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_table(summary))
    if args.figures:
        _bars(summary, args.figures / "dino-segmentation.png")
    return 0


def _table(summary: dict) -> str:
    lines = [
        "| model | test acc. (supervised) | linear probe | k-NN | Jaccard, best head (untrained) | "
        "Jaccard, mean map (untrained) | AP, mean map |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in summary["models"].items():
        accuracy = f"{m['test_accuracy']:.3f}" if m["test_accuracy"] is not None else "-"
        lines.append(
            f"| {name} | {accuracy} | {m['linear_probe_accuracy']:.3f} | {m['knn_accuracy']:.3f} | "
            f"{m['trained_best_head_jaccard']:.3f} (head {m['trained_best_head']}; "
            f"{m['untrained_best_head_jaccard']:.3f}) | {m['trained_mean_map_jaccard']:.3f} "
            f"({m['untrained_mean_map_jaccard']:.3f}) | {m['trained_mean_map_average_precision']:.3f} |"
        )
    return "\n".join(lines)


def _bars(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["models"])
    models = [summary["models"][n] for n in names]
    panels = [
        ("linear probe / k-NN accuracy", [("linear probe", "linear_probe_accuracy"), ("k-NN", "knn_accuracy")]),
        (
            "Jaccard of the 60%-mass masks",
            [
                ("best head", "trained_best_head_jaccard"),
                ("mean map", "trained_mean_map_jaccard"),
                ("untrained, best head", "untrained_best_head_jaccard"),
            ],
        ),
    ]
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for axis, (title, bars) in zip(axes, panels):
        grouped_bars(axis, title, names, models, bars)
    save_figure(figure, f"{models[0]['data']}, {models[0]['steps']} steps of {models[0]['batch_size']}", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train the four models")
    run.add_argument("out", type=Path)
    run.add_argument("--data", default=DATA, help=f"default: {DATA} (pasted-digits:N: N training images)")
    run.add_argument("--steps", type=int, default=3000)
    run.add_argument("--batch-size", type=int, default=128)
    run.add_argument("--lr", type=float, default=5e-4)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--device", default="cpu")
    run.add_argument("--precision", choices=("fp32", "bf16"), default=None)
    run.add_argument("--parallel", action="store_true", help="train the four at once (a GPU)")
    measure = commands.add_parser("report", help="measure the four runs")
    measure.add_argument("out", type=Path)
    measure.add_argument("--samples", type=int, default=1000, help="test images segmented (default: 1000)")
    measure.add_argument("--figures", type=Path, default=None, help="folder for the PNG files")
    args = parser.parse_args(argv)
    return train(args) if args.command == "train" else report(args)


if __name__ == "__main__":
    sys.exit(main())

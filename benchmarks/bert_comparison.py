"""CRATE-BERT against BERT at the same width and depth, on the same tokens for the same steps.

The journal paper trains CRATE as BERT does (masked language modelling) and compares it with BERT. This runs
that comparison at a size a laptop trains: ``crate-bert-mini`` and ``bert-mini`` (4 layers of width 256, 4
heads, context 128) on the Python standard library's source with a WordPiece vocabulary trained on it
(``wordpiece-4096:text``), then, for each, what the pre-training is worth downstream on a labelled text set
made from the same library (``wordpiece-4096:modules``: which of 10 modules a 126-token snippet comes from):

* **fine-tuned**: the classifier preset started from the MLM run's weights (``train --init RUN/final``);
* **from scratch**: the same classifier and steps from random weights;
* **linear probe**: logistic regression on the frozen MLM network's [CLS] token and mean token;

and the white-box probes of each layer on the test text (``probe``: the coding rate R^c after each
compression step and the density of each sparsification step's codes, trained against untrained).

On Shakespeare (``--data wordpiece:shakespeare``, after ``make data``) the downstream set is
``wordpiece:plays`` (which of the 4 held-out plays a passage comes from, plays the pre-training never read),
and ``report`` also fills in held-out lines ("To be, or not to [MASK]: that is the question.").

    python benchmarks/bert_comparison.py train runs/bert --steps 2000 --batch-size 32
    python benchmarks/bert_comparison.py report runs/bert --figure docs/figures/bert-comparison.png

``report`` writes ``OUT/summary.json``, prints a markdown table, and draws the test MLM loss and accuracy
over the steps (beside the unigram model's) and the downstream accuracies.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from experiment import answer, grouped_bars, launch, log_of, quietly, save_figure, train_and_report

MODELS = ("crate-bert", "bert")


DOWNSTREAM = {  # the pre-training corpus: its labelled set (same tokenizer), what it asks, its classes
    "text": ("modules", "which module a snippet is from", 10),
    "shakespeare": ("plays", "which held-out play a passage is from", 4),
}
FILL = {  # held-out lines to fill in, by corpus (Hamlet, Twelfth Night, The Tempest for Shakespeare)
    "text": ["for key, value in self.[MASK]():"],
    "shakespeare": [
        "To be, or not to [MASK]: that is the question.",
        "If music be the food of [MASK], play on.",
        "We are such stuff as [MASK] are made on.",
        "Good night, sweet [MASK].",
    ],
}


def _corpus(data: str) -> str:
    kind, _, corpus = data.partition(":")
    if corpus not in DOWNSTREAM:
        raise SystemExit(
            f"error: --data {data}: the downstream set is made from a shipped corpus "
            f"({', '.join(f'KIND:{c}' for c in DOWNSTREAM)})"
        )
    return corpus


def _labelled(data: str) -> str:
    """The labelled set with the pre-training set's tokenizer: ``wordpiece-4096:text`` ->
    ``wordpiece-4096:modules``, ``wordpiece:shakespeare`` -> ``wordpiece:plays``."""
    return f"{data.partition(':')[0]}:{DOWNSTREAM[_corpus(data)][0]}"


def train(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["--batch-size", str(args.batch_size), "--seed", str(args.seed), "--no-progress"]
    pretraining = [
        (
            name,
            [
                "train",
                f"{name}-mini",
                "--task",
                "mlm",
                "--data",
                args.data,
                "--steps",
                str(args.steps),
                "--lr",
                str(args.lr),
                "--eval-every",
                str(max(1, args.steps // 10)),
                "--log-every",
                "20",
                *common,
            ],
        )
        for name in MODELS
    ]
    if _failed(launch(pretraining, args.out, len(pretraining)), args.out):
        return 1
    downstream = [
        "--task",
        "classify",
        "--data",
        _labelled(args.data),
        "--steps",
        str(args.finetune_steps),
        "--lr",
        str(args.finetune_lr),
        *common,
    ]
    runs = []
    for name in MODELS:
        runs.append(
            (
                f"{name}-finetuned",
                ["train", f"{name}-mini-classify", *downstream, "--init", str(args.out / name / "final")],
            )
        )
        runs.append((f"{name}-scratch", ["train", f"{name}-mini-classify", *downstream]))
    return _failed(launch(runs, args.out, len(runs)), args.out)


def _failed(names: list[str], out: Path) -> int:
    for name in names:
        print(f"error: {name} failed: see {log_of(out, name)}", file=sys.stderr)
    return 1 if names else 0


def _rows(run: Path, kind: str) -> list[dict]:
    return [row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if row["kind"] == kind]


def report(args: argparse.Namespace) -> int:
    import crate_compose as cc

    summary: dict = {"models": {}}
    for name in MODELS:
        run = args.out / name
        result = json.loads((run / "result.json").read_text())
        record = json.loads((run / "run.json").read_text())
        data = record["identity"]["data"]["name"]
        linear = {
            pool: answer(
                [
                    "linear-probe",
                    str(run / "final" / "spec.yaml"),
                    "--weights",
                    str(run / "final"),
                    "--data",
                    _labelled(data),
                    "--pool",
                    pool,
                    "--no-untrained",
                ]
            )
            for pool in ("cls", "mean")
        }
        untrained = {
            pool: answer(
                [
                    "linear-probe",
                    str(run / "final" / "spec.yaml"),
                    "--untrained",
                    "--seed",
                    str(record["identity"]["settings"]["seed"]),
                    "--data",
                    _labelled(data),
                    "--pool",
                    pool,
                ]
            )
            for pool in ("cls", "mean")
        }  # the same probe of the network its seed initializes
        downstream = {
            how: json.loads((args.out / f"{name}-{how}" / "result.json").read_text())["metrics"]
            for how in ("finetuned", "scratch")
        }
        layers = None
        if name == "crate-bert":  # each white-box step's own objective, trained and untrained (BERT has none)
            quietly(["probe", str(run), "--samples", "256"])
            probes = json.loads((run / "probes" / "final" / "probes.json").read_text())
            layers = {
                which: {
                    measure: [row["value"] for row in probes[which] if row["measure"] == measure]
                    for measure in ("coding_rate", "l0_density")
                }
                for which in ("trained", "untrained")
            }
        fills = []
        for line in FILL[_corpus(data)]:
            filled = cc.fill(run, line, top_k=5)
            fills.append(
                {
                    "text": line,
                    "filled": filled.text,
                    "top": [[token, round(p, 3)] for token, p in filled.masks[0].candidates] if filled.masks else [],
                }
            )
        summary["data"], summary["steps"] = data, result["steps"]
        summary["batch_size"] = record["identity"]["settings"]["batch_size"]
        summary["models"][name] = {
            "parameters": result["params"],
            "seconds": result["seconds"],
            **result["metrics"],
            "curve": [
                {k: row[k] for k in ("step", "test_mlm_loss", "test_mlm_accuracy")} for row in _rows(run, "eval")
            ],
            "finetuned_accuracy": downstream["finetuned"]["test_accuracy"],
            "scratch_accuracy": downstream["scratch"]["test_accuracy"],
            "probe_cls_accuracy": linear["cls"]["test_accuracy"],
            "probe_mean_accuracy": linear["mean"]["test_accuracy"],
            "untrained_probe_cls_accuracy": untrained["cls"]["test_accuracy"],
            "untrained_probe_mean_accuracy": untrained["mean"]["test_accuracy"],
            "layers": layers,
            "fill": fills,
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_table(summary))
    for name, m in summary["models"].items():
        for row in m["fill"]:
            top = ", ".join(f"{token} {p:.2f}" for token, p in row["top"])
            print(f"{name}-mini: {row['text']} -> {row['filled']}  ({top})")
    if args.figure:
        _figure(summary, args.figure)
    return 0


def _table(summary: dict) -> str:
    lines = [
        "| model | parameters | test MLM loss | test MLM accuracy | unigram loss / accuracy | fine-tuned | "
        "from scratch | linear probe [CLS] / mean | untrained network's probe [CLS] / mean |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, m in summary["models"].items():
        lines.append(
            f"| {name}-mini | {m['parameters']:,} | {m['test_mlm_loss']:.3f} | {m['test_mlm_accuracy']:.3f} | "
            f"{m['test_unigram_loss']:.3f} / {m['test_unigram_accuracy']:.3f} | {m['finetuned_accuracy']:.3f} | "
            f"{m['scratch_accuracy']:.3f} | {m['probe_cls_accuracy']:.3f} / {m['probe_mean_accuracy']:.3f} | "
            f"{m['untrained_probe_cls_accuracy']:.3f} / {m['untrained_probe_mean_accuracy']:.3f} |"
        )
    classes = DOWNSTREAM[_corpus(summary["data"])][2]
    lines.append(
        f"| chance ({classes} balanced classes) | | | | | {1 / classes:.3f} | {1 / classes:.3f} | "
        f"{1 / classes:.3f} | {1 / classes:.3f} |"
    )
    return "\n".join(lines)


def _figure(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for name, m in summary["models"].items():
        steps = [row["step"] for row in m["curve"]]
        axes[0].plot(steps, [row["test_mlm_loss"] for row in m["curve"]], marker="o", label=f"{name}-mini")
        axes[1].plot(steps, [row["test_mlm_accuracy"] for row in m["curve"]], marker="o", label=f"{name}-mini")
    first = next(iter(summary["models"].values()))
    axes[0].axhline(first["test_unigram_loss"], color="grey", linestyle="--", label="unigram")
    axes[1].axhline(first["test_unigram_accuracy"], color="grey", linestyle="--", label="unigram")
    for axis, title in zip(axes[:2], ("test MLM loss (nats per hidden token)", "test MLM accuracy")):
        axis.set_xlabel("step")
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=8)
    names = list(summary["models"])
    bars = [
        ("fine-tuned", "finetuned_accuracy"),
        ("from scratch", "scratch_accuracy"),
        ("probe [CLS]", "probe_cls_accuracy"),
        ("probe mean", "probe_mean_accuracy"),
        ("untrained probe mean", "untrained_probe_mean_accuracy"),
    ]
    _, question, classes = DOWNSTREAM[_corpus(summary["data"])]
    grouped_bars(
        axes[2],
        f"{question} ({classes} classes)",
        names,
        [summary["models"][n] for n in names],
        bars,
        ticks=[f"{n}-mini" for n in names],
    )
    save_figure(figure, f"{summary['data']}: {summary['steps']} steps of {summary['batch_size']} windows", path)


def _options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--data", default="wordpiece-4096:text")
    run.add_argument("--steps", type=int, default=2000)
    run.add_argument("--batch-size", type=int, default=32)
    run.add_argument("--lr", type=float, default=5e-4)
    run.add_argument("--finetune-steps", type=int, default=500)
    run.add_argument("--finetune-lr", type=float, default=2e-4)
    run.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    return train_and_report(
        __doc__,
        train,
        report,
        _options,
        argv,
        train_help="pre-train both, then fine-tune each and train each from scratch",
    )


if __name__ == "__main__":
    sys.exit(main())

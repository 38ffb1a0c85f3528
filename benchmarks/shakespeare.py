"""The four causal language models on Shakespeare at equal width and depth, beside the n-gram models.

Causal CRATE (``causal-crate-bytes``), crate-lm (``crate-lm-base`` at the same sizes), ToST-LM
(``tost-lm-bytes``) and GPT-2 (``gpt2-bytes``): 4 layers of width 128 with 4 heads, a context of 128, on
``bytes:shakespeare`` (characters, as nanoGPT's ``shakespeare_char``), the same steps, batch and seeds, and
the same learning rate but for crate-lm's (below). ``report`` measures each run on the **whole** held-out split (Hamlet, Twelfth Night, The Tempest,
King John: 7,780 windows; ``train`` itself evaluates the first 1,024 windows), beside the same network
untrained and the unigram and bigram models of the training split (add-one counts) on the same predicted
characters, and samples each from the same prompt (100 characters: prompt and sample fill the context).

    python benchmarks/shakespeare.py train runs/shakespeare --steps 2000 --seeds 0 1 2 --jobs 2
    python benchmarks/shakespeare.py report runs/shakespeare --figure docs/figures/shakespeare-lm.png

``report`` writes ``OUT/summary.json`` and prints markdown tables (mean and spread over the seeds) and the
samples. Needs ``make data``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from experiment import launch, log_of, save_figure, train_and_report

SIZES = ["sizes.context=128", "sizes.d=128", "sizes.heads=4", "sizes.depth=4"]
MODELS = {  # name: (preset, overrides to reach 4 x 128, 4 heads, context 128, its learning rate (None: --lr))
    "causal-crate": ("causal-crate-bytes", [], None),
    # crate-lm replaces the stream by D A (no residual around its sparse code): at 3e-3 it stayed at the unigram
    # model's loss for 450 steps, so it trains at nanoGPT's 6e-4 (its authors' code is nanoGPT's)
    "crate-lm": ("crate-lm-base", SIZES, 6e-4),
    "tost-lm": ("tost-lm-bytes", [], None),
    "gpt2": ("gpt2-bytes", [], None),
}
DATA = "bytes:shakespeare"
PROMPT = "HAMLET.\nTo be, or not to be"


def train(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds:
        for name, (preset, overrides, lr) in MODELS.items():
            sets = [a for o in overrides for a in ("--set", o)]
            runs.append(
                (
                    f"{name}-s{seed}",
                    [
                        "train",
                        preset,
                        *sets,
                        "--task",
                        "lm",
                        "--data",
                        DATA,
                        "--steps",
                        str(args.steps),
                        "--batch-size",
                        str(args.batch_size),
                        "--lr",
                        str(lr or args.lr),
                        "--seed",
                        str(seed),
                        "--eval-every",
                        str(max(1, args.steps // 10)),
                        "--log-every",
                        "50",
                        "--no-progress",
                    ],
                )
            )
    failed = launch(runs, args.out, args.jobs)
    for name in failed:
        print(f"error: {name} failed; its log: {log_of(args.out, name)}", file=sys.stderr)
    return 1 if failed else 0


def _ngrams(data) -> dict:
    """Unigram and bigram models of the training stream (add-one counts, as task ``lm`` reports them), scored on
    exactly the characters the networks predict on the held-out split: the targets of every window, each with
    its true previous byte (a bigram's one byte of context; the networks see up to 127)."""
    from crate_compose.data.text_sets.corpus import bigram_loss, unigram_loss
    from crate_compose.data.text_sets.tokens import Tokenizer

    covered = data.test.tokens[: len(data.test) * data.test.context + 1]  # every window's inputs and targets
    targets = covered[1:]
    chars = int(Tokenizer("bytes").lengths()[1][targets].sum())
    per_token = {
        "unigram": unigram_loss(data.train.tokens, targets, 256),
        "bigram": bigram_loss(data.train.tokens, covered, 256),
    }
    return {name: {"per_token": n, "per_char": n * len(targets) / chars} for name, n in per_token.items()} | {
        "tokens": len(targets),
        "chars": chars,
    }


def _whole(run: Path, untrained: bool) -> dict:
    """``evaluate`` of ``run`` on every held-out window (the task evaluates the first 1,024 while training)."""
    import crate_compose as cc
    from crate_compose.tasks import language_modelling

    language_modelling.EVAL_WINDOWS = 1 << 30
    scores = cc.evaluate(str(run), untrained=untrained)
    return {"per_token": scores["test_loss"], "per_char": scores["test_loss_per_char"]}


def report(args: argparse.Namespace) -> int:
    import crate_compose as cc
    from crate_compose.data.set_registry import NEXT_BYTES
    from crate_compose.data.sets import load_data
    from crate_compose.generation.text import generate_text

    data = load_data(DATA, spec=cc.load_spec("causal-crate-bytes")).for_kinds((NEXT_BYTES,))
    summary: dict = {"data": DATA, "ngrams": _ngrams(data), "models": {}}
    for name in MODELS:
        runs = sorted(args.out.glob(f"{name}-s*/result.json"))
        if not runs:
            continue
        rows = []
        for result_file in runs:
            run = result_file.parent
            result = json.loads(result_file.read_text())
            trained, untrained = _whole(run, False), _whole(run, True)
            curve = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            sample = generate_text(
                str(run / "final" / "spec.yaml"),
                PROMPT,
                weights=run / "final",
                tokens=100,
                temperature=0.8,
                top_k=40,
                seed=0,
            )
            lr = json.loads((run / "run.json").read_text())["identity"]["settings"]["lr"]
            rows.append(
                {
                    "seed": int(run.name.rsplit("-s", 1)[1]),
                    "parameters": result["params"],
                    "lr": lr,
                    "seconds": result["seconds"],
                    "steps": result["steps"],
                    "trained": trained,
                    "untrained": untrained,
                    "sample": sample.text,
                    "curve": [(r["step"], r["test_loss"]) for r in curve if r["kind"] == "eval"],
                }
            )
        summary["models"][name] = rows
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(_tables(summary))
    if args.figure:
        _figure(summary, args.figure)
    return 0


def _mean_sd(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")


def _tables(summary: dict) -> str:
    ngrams = summary["ngrams"]
    lines = [
        f"Held out: {ngrams['tokens']:,} predicted bytes ({ngrams['chars']:,} characters); mean ± sd over seeds.",
        "",
        "| model | parameters | lr | seeds | steps | nats per byte | nats per character | untrained (per char) "
        "| seconds per run |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, rows in summary["models"].items():
        lines.append(
            f"| {name} | {rows[0]['parameters']:,} | {rows[0]['lr']:g} | {len(rows)} | {rows[0]['steps']:,} | "
            f"{_mean_sd([r['trained']['per_token'] for r in rows])} | "
            f"{_mean_sd([r['trained']['per_char'] for r in rows])} | "
            f"{_mean_sd([r['untrained']['per_char'] for r in rows])} | "
            f"{statistics.mean(r['seconds'] for r in rows):.0f} |"
        )
    for name in ("bigram", "unigram"):
        lines.append(
            f"| {name} model (add-one counts) | | | | | {ngrams[name]['per_token']:.3f} | "
            f"{ngrams[name]['per_char']:.3f} | | |"
        )
    for name, rows in summary["models"].items():
        lines += ["", f"{name}, seed {rows[0]['seed']}:", "```", rows[0]["sample"], "```"]
    return "\n".join(lines)


def _figure(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12.5, 3.8))
    for name, rows in summary["models"].items():
        for i, row in enumerate(rows):
            steps, losses = zip(*row["curve"])
            axes[0].plot(
                steps,
                losses,
                color=f"C{list(summary['models']).index(name)}",
                alpha=0.8,
                label=name if i == 0 else None,
            )
    for name, style in (("bigram", "--"), ("unigram", ":")):
        axes[0].axhline(summary["ngrams"][name]["per_token"], color="grey", linestyle=style, label=f"{name} model")
    axes[0].set_xlabel("step")
    axes[0].set_title("held-out loss, first 1,024 windows (nats per byte; lines: whole split)", fontsize=10)
    axes[0].legend(fontsize=8)
    names = list(summary["models"])
    trained = [statistics.mean(r["trained"]["per_char"] for r in summary["models"][n]) for n in names]
    untrained = [statistics.mean(r["untrained"]["per_char"] for r in summary["models"][n]) for n in names]
    at = range(len(names))
    axes[1].bar([x - 0.2 for x in at], trained, width=0.4, label="trained")
    axes[1].bar([x + 0.2 for x in at], untrained, width=0.4, label="untrained", color="lightgrey")
    for name, style in (("bigram", "--"), ("unigram", ":")):
        axes[1].axhline(summary["ngrams"][name]["per_char"], color="grey", linestyle=style, label=f"{name} model")
    axes[1].set_xticks(list(at), names)
    axes[1].set_title("whole held-out split (nats per character)", fontsize=10)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    steps = next(iter(summary["models"].values()))[0]["steps"]
    save_figure(figure, f"{summary['data']}: 4 layers x 128, context 128, {steps} steps of 32 windows", path)


def _options(run: argparse.ArgumentParser) -> None:
    run.add_argument("--steps", type=int, default=2000)
    run.add_argument("--batch-size", type=int, default=32)
    run.add_argument("--lr", type=float, default=3e-3, help="every model's but crate-lm's (6e-4)")
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    run.add_argument("--jobs", type=int, default=2, help="runs at a time")


def main(argv: list[str] | None = None) -> int:
    return train_and_report(__doc__, train, report, _options, argv, train_help="train every model for every seed")


if __name__ == "__main__":
    sys.exit(main())

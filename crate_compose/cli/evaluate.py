"""The commands that score trained weights on a data set, as JSON: evaluate and linear-probe."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import tasks
from ..files import writable, write_atomic
from ..settings import MAX_IMAGE_SIZE
from .arguments import (
    IMAGE_SIZE,
    NONNEGATIVE,
    SEED,
    Command,
    formulas_argument,
    normalize_argument,
    spec_arguments,
    workers_argument,
)


def add(command: Command) -> None:
    """Add the commands evaluate and linear-probe."""
    evaluate = command("evaluate", help="test metrics of trained weights on a data set (top-1, top-5, loss), as JSON")
    spec_arguments(evaluate, run=True)
    evaluate.add_argument(
        "--weights",
        type=Path,
        help="trained weights: a run's final/ or a checkpoint, or an authors' "
        "checkpoint file (needed unless SPEC is a run folder)",
    )
    evaluate.add_argument(
        "--data", default=None, help="data set whose test split is used (default: a run's own, else digits)"
    )
    evaluate.add_argument(
        "--task",
        choices=tasks.names(),
        default=None,
        help="what the weights were trained for (default: the data's own task)",
    )
    evaluate.add_argument(
        "--image-size", type=IMAGE_SIZE, default=None, help=f"resize images to this side (at most {MAX_IMAGE_SIZE})"
    )
    normalize_argument(evaluate)
    workers_argument(evaluate)
    formulas_argument(evaluate)
    evaluate.add_argument(
        "--seed", type=SEED, default=None, help="seed of the evaluation's masks (default: a run's own, else 0)"
    )
    evaluate.add_argument("--out", type=Path, help="also write the JSON to this file")
    evaluate.add_argument(
        "--untrained",
        action="store_true",
        help="score the network as its seed initializes it "
        "(of a run: its spec, data and seed), the baseline beside the trained scores",
    )

    probe_linear = command(
        "linear-probe", help="logistic regression (C in 10^0..10^5) and k-NN on frozen features, as JSON"
    )
    spec_arguments(probe_linear, run=True)
    probe_linear.add_argument(
        "--weights",
        type=Path,
        help="trained weights: a run's final/ or a checkpoint (without: the untrained network, a baseline)",
    )
    probe_linear.add_argument("--data", default=None, help="labelled data set (default: a run's own, else digits)")
    probe_linear.add_argument(
        "--layer",
        type=NONNEGATIVE,
        default=None,
        help="the encoder layer whose tokens are the features (default: the last step)",
    )
    probe_linear.add_argument(
        "--pool",
        choices=("cls", "mean"),
        default="cls",
        help="the class token, or the mean of the tokens (default: cls)",
    )
    probe_linear.add_argument(
        "--image-size", type=IMAGE_SIZE, default=None, help=f"resize images to this side (at most {MAX_IMAGE_SIZE})"
    )
    normalize_argument(probe_linear)
    workers_argument(probe_linear)
    formulas_argument(probe_linear)
    probe_linear.add_argument(
        "--seed",
        type=SEED,
        default=None,
        help="seed of the untrained network and of the validation split (default: a run's, else 0)",
    )
    probe_linear.add_argument("--out", type=Path, help="also write the JSON to this file")
    probe_linear.add_argument(
        "--untrained",
        action="store_true",
        help="the features of the network as its seed initializes it, even of a run (its spec and data): the baseline",
    )
    probe_linear.add_argument(
        "--no-untrained",
        dest="baseline",
        action="store_false",
        help="of trained weights, their probe alone (by default the untrained network's comes "
        "beside it, which takes as long again)",
    )


def run_evaluate(args: argparse.Namespace) -> int:
    if args.out is not None:  # a FIFO, a device, a folder: refused before torch loads, not after the evaluation
        writable(args.out)
    from ..assessment.scoring import evaluate_weights

    return _answer(
        evaluate_weights(
            args.spec,
            args.data,
            args.weights,
            overrides=args.overrides,
            task=args.task,
            image_size=args.image_size,
            seed=args.seed,
            normalize=args.normalize,
            workers=args.workers,
            untrained=args.untrained,
        ),
        args.out,
    )


def run_linear_probe(args: argparse.Namespace) -> int:
    if args.out is not None:  # refused before torch loads, not after the probe
        writable(args.out)
    from ..assessment.scoring import linear_probe_weights

    result = linear_probe_weights(
        args.spec,
        args.data,
        args.weights,
        overrides=args.overrides,
        layer=args.layer,
        pool=args.pool,
        image_size=args.image_size,
        seed=args.seed,
        normalize=args.normalize,
        workers=args.workers,
        untrained=args.untrained,
        baseline=args.baseline,
    )
    if " tie " in result.get("choice", ""):
        print(f"note: {result['choice']}", file=sys.stderr)
    return _answer(result, args.out)


def _answer(result: dict, out: Path | None) -> int:
    text = json.dumps(result, indent=2) + "\n"
    if out is not None:
        write_atomic(out, text)
    print(text, end="")
    return 0

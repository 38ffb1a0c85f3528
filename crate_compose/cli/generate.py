"""``crate-compose generate``: a text prompt continued by a language model (bytes, or its run's vocabulary)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import crate_compose as cc

from .arguments import COUNT, NONNEGATIVE, SEED, Command, device, formulas_argument, number, spec_arguments


def add(command: Command) -> None:
    """Add the command generate."""
    generate = command("generate", help="continue a text prompt with a language model (cached decoding)")
    spec_arguments(generate)
    generate.add_argument(
        "--weights",
        type=Path,
        help="trained weights: a run's final/ or a checkpoint folder (without: the untrained network)",
    )
    generate.add_argument(
        "--prompt",
        required=True,
        help="the text to continue: read in the vocabulary of the --weights' run when it trained on "
        "tokenized text (RUN/tokenizer.json), else its bytes are the tokens (UTF-8, or the bytes as "
        "typed when they are not)",
    )
    generate.add_argument(
        "--tokens",
        type=COUNT,
        default=None,
        help="new tokens (bytes of a byte-level model) to sample (default: as many as the context has room for)",
    )
    generate.add_argument(
        "--temperature",
        type=number(float, 0, what="a number"),
        default=0.8,
        help="sampling temperature; 0: greedy (0.8)",
    )
    generate.add_argument(
        "--top-k", type=NONNEGATIVE, default=40, help="sample among the k most likely (default: 40; 0: all)"
    )
    generate.add_argument("--seed", type=SEED, default=0, help="seed of the draws (and of untrained weights)")
    generate.add_argument(
        "--no-cache",
        dest="cache",
        action="store_false",
        help="recompute the whole context for every token (the reference the cache equals)",
    )
    generate.add_argument("--device", type=device, default="cpu", help="cpu, cuda, ... (default: cpu)")
    formulas_argument(generate)


def run_generate(args: argparse.Namespace) -> int:
    from ..training.run_folder.preflight import check_language_model

    check_language_model(cc.load_spec(args.spec, args.overrides))  # an image spec: refused before torch loads
    from ..generation.text import generate_text

    if args.weights is None:
        print("note: no --weights: sampling from the untrained network", file=sys.stderr)
    result = generate_text(
        args.spec,
        args.prompt,
        weights=args.weights,
        overrides=args.overrides,
        tokens=args.tokens,
        temperature=args.temperature,
        top_k=args.top_k or None,
        seed=args.seed,
        cache=args.cache,
        device=args.device,
    )
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"  # a pipe or terminal that is not UTF-8: '?'
    print(result.text.encode(encoding, "replace").decode(encoding))
    print(
        f"({result.tokens} tokens in {result.seconds:.2f} s, {'cached' if args.cache else 'recomputed'})",
        file=sys.stderr,
    )
    return 0

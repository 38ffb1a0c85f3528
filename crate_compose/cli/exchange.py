"""The commands between a build and the authors' checkpoints: import and export."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import crate_compose as cc

from ..files import BUILDS, writable
from ..interop.catalog import FAMILIES
from .arguments import Command, spec_arguments

FAMILY_NAMES = tuple(FAMILIES)  # the authors' code bases whose checkpoints import and export read


def add(command: Command) -> None:
    """Add the commands import and export."""
    importing = command("import", help="read the authors' released checkpoint into a build folder (spec + safetensors)")
    spec_arguments(importing)
    importing.add_argument(
        "checkpoint",
        type=Path,
        help="the checkpoint: safetensors, or a PyTorch file (read with "
        "torch.load(weights_only=True): a file that needs more is refused, nothing in it runs)",
    )
    importing.add_argument(
        "--from",
        dest="family",
        default=None,
        metavar="FAMILY",
        choices=FAMILY_NAMES,
        help=f"whose code saved it: {', '.join(FAMILY_NAMES)} (default: told by its tensors' names)",
    )
    importing.add_argument(
        "--keep-spec",
        dest="infer_sizes",
        action="store_false",
        help="build the spec as it is "
        "(by default its sizes -- width, depth, heads, patch, image, context, vocabulary, classes -- "
        "come from the arguments the checkpoint records, then from its shapes, and its steps take "
        "the arguments the family's code fixes; --set still wins)",
    )
    importing.add_argument(
        "--infer-sizes", dest="infer_sizes", action="store_const", const=True, help=argparse.SUPPRESS
    )  # the default now; kept for scripts that give it
    importing.set_defaults(infer_sizes=True)
    importing.add_argument(
        "--key",
        default=None,
        metavar="KEY",
        help="the checkpoint's entry that holds the "
        "weights, e.g. model_ema for the average of the weights a DeiT-style script keeps "
        "(default: model, state_dict, ... as found)",
    )
    importing.add_argument("--out", type=Path, help="build folder to write (default: out/<spec name>)")

    exporting = command("export", help="write a build or run's weights in the authors' layout, for their code")
    exporting.add_argument("weights", type=Path, help="a build folder, a run's final/ or a checkpoint folder")
    exporting.add_argument(
        "--to",
        dest="family",
        required=True,
        metavar="FAMILY",
        choices=FAMILY_NAMES,
        help=f"whose code will read it: {', '.join(FAMILY_NAMES)}",
    )
    exporting.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the file: .safetensors, or a PyTorch file "
        "(.pth, .pt) holding the state dict nested as the authors' training script nests it",
    )
    exporting.add_argument(
        "--nest",
        default=None,
        metavar="KEY",
        help="key to nest the state dict under in a "
        "PyTorch file (default: the family's: model, state_dict or none); '' for none",
    )


def run_import(args: argparse.Namespace) -> int:
    if args.out is not None:  # a file, someone else's files: refused before torch loads (exit 1)
        from ..building.outputs import replaceable

        replaceable(Path(args.out).resolve())
    from ..interop.exchange import import_checkpoint

    imported = import_checkpoint(
        args.spec, args.checkpoint, args.family, overrides=args.overrides, infer=args.infer_sizes, key=args.key
    )
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    for skipped in imported.skipped:
        print(f"note: not imported: {skipped}", file=sys.stderr)
    spec = cc.spec_of(imported.module)
    out = args.out or BUILDS / spec.name
    cc.save(imported.module, out, extra=imported.provenance())
    print(cc.summarize(imported.module).table())
    count = len(imported.module.state_dict())
    print(
        f"imported {count} tensors of {args.checkpoint} ({imported.family.name}) into {out}/: spec.yaml, "
        "model.safetensors"
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ..building.outputs import outside_source

    outside_source(args.weights, args.out)  # the source's own weights are never overwritten: before anything is read
    writable(args.out)
    from ..interop.exchange import export_checkpoint, family, write_checkpoint

    tensors = export_checkpoint(cc.load_build(args.weights), args.family)
    nest = family(args.family).nest if args.nest is None else (args.nest or None)
    write_checkpoint(tensors, args.out, nest=nest)
    where = f" under {nest!r}" if nest and args.out.suffix != ".safetensors" else ""
    print(f"wrote {args.out}: {len(tensors)} tensors in {args.family}'s names{where}")
    return 0

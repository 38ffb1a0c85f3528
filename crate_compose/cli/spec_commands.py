"""The commands on a spec alone: build, render, validate, inspect, derive, list and schema."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import crate_compose as cc

from .. import tasks
from ..errors import WorkbenchError
from ..files import BUILDS, write_atomic
from ..settings import DIAGRAM_STEM, DTYPE_NAMES, FORMATS
from .arguments import SEED, Command, device, memory_argument, spec_arguments


def add(command: Command) -> None:
    """Add the commands build, render, validate, inspect, derive, list and schema."""
    build = command("build", help="build a spec; write spec, code, summary and weights to --out")
    spec_arguments(build)
    build.add_argument("--out", type=Path, help="output directory (default: out/<spec name>)")
    build.add_argument("--device", type=device, default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    build.add_argument("--dtype", default="float32", choices=sorted(DTYPE_NAMES), help="parameter dtype")
    build.add_argument("--seed", type=SEED, default=0, help="seed for the initial weights (default: 0)")
    build.add_argument("--render", action="store_true", help="also draw the architecture (diagram.svg in --out)")
    memory_argument(build)
    _diagram_arguments(build)

    render = command("render", help="draw the architecture diagram")
    spec_arguments(render)
    render.add_argument("--out", help="output file, or a directory to write <spec name>.<format> into (default: out/)")
    _diagram_arguments(render)

    validate = command("validate", help="check a spec (schema, primitives, shapes) without building weights")
    spec_arguments(validate)

    inspect = command("inspect", help="a row per step: primitive, output shape, parameters")
    spec_arguments(inspect)
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    derive = command(
        "derive", help="write the spec with its decoder derived explicitly (the inverse of every encoder step)"
    )
    spec_arguments(derive)
    derive.add_argument("--out", type=Path, help="write the derived spec here instead of printing it")

    listing = command("list", help="list registered primitives, tasks, data sets or zoo presets")
    listing.add_argument("what", choices=["primitives", "tasks", "data", "zoo"])
    listing.add_argument(
        "--markdown",
        action="store_true",
        help="list data: print docs/data-sets.md, a table and a section per set, made from their declarations",
    )

    command("schema", help="print the JSON Schema of the spec language")


def _diagram_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", default="svg", choices=FORMATS, help="diagram format (default: svg)")
    parser.add_argument("--expand", action="store_true", help="draw every layer instead of one marked '× L'")
    parser.add_argument("--direction", default="TB", choices=["TB", "LR"], help="top-to-bottom or left-to-right")
    parser.add_argument(
        "--edge-shapes", action=argparse.BooleanOptionalAction, default=True, help="label edges with tensor shapes"
    )


def _draw(model, path: Path, args: argparse.Namespace) -> None:
    written, note = cc.render(
        model, path, format=args.format, expand=args.expand, direction=args.direction, edge_shapes=args.edge_shapes
    )
    print(note or f"wrote {written}")


def _notes(spec) -> None:
    for note in spec.notes():
        print(f"note: {note}", file=sys.stderr)


def run_build(args: argparse.Namespace) -> int:
    from ..building.outputs import replaceable

    spec = cc.load_spec(args.spec, args.overrides)  # its notes are in the summary table
    out = args.out or BUILDS / spec.name
    replaceable(Path(out).resolve())  # a file, someone else's files: refused before torch loads (exit 1)
    model = cc.compile_spec(spec, seed=args.seed, device=args.device, dtype=args.dtype, memory_limit=args.memory_limit)
    summary = cc.summarize(model)
    cc.save(model, out, extra={"seed": str(args.seed), "dtype": args.dtype})
    print(summary.table())
    print(f"wrote {out}/: spec.yaml, code.py, summary.txt, model.safetensors")
    if args.render:
        _draw(model, out / DIAGRAM_STEM, args)
    return 0


def run_render(args: argparse.Namespace) -> int:
    model = cc.build(args.spec, overrides=args.overrides, meta=True)
    given = args.out or f"{BUILDS}{os.sep}"
    out = Path(given)
    if out.is_dir() or given.endswith(os.sep):  # a folder: name the file after the spec
        out = out / cc.spec_of(model).name
    _draw(model, out, args)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    spec = cc.validate(args.spec, args.overrides)
    _notes(spec)
    print(f"{args.spec}: ok ({spec.name})")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    summary = cc.inspect(args.spec, args.overrides)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.table())
    return 0


def run_derive(args: argparse.Namespace) -> int:
    spec = cc.load_spec(args.spec, args.overrides)
    _notes(spec)
    text = cc.dump_spec(cc.derive(spec), references=True)
    header = f"# Derived by `crate-compose derive {args.spec}`: edit freely, then build this file.\n"
    if spec.head:
        dropped = ", ".join(f"{step.name} ({step.primitive})" for step in spec.head)
        header += f"# The head [{dropped}] is left out: the output is the decoder's reconstruction.\n"
    if args.out is None:
        print(header + text, end="")
        return 0
    write_atomic(args.out, header + text)
    print(f"wrote {args.out}" + (" (the head is left out: the output is the reconstruction)" if spec.head else ""))
    return 0


def run_list(args: argparse.Namespace) -> int:
    if args.what == "zoo":
        for name, path in cc.presets().items():
            spec = cc.load_spec(path)
            print(f"{name:<20} {spec.description}")
        return 0
    if args.what == "tasks":
        width = max(len(one.name) for one in tasks.all_tasks())
        for one in tasks.all_tasks():
            direction = "higher" if one.maximize else "lower"
            print(f"{one.name:<{width}}  {one.summary}")
            print(f"{'':<{width}}  trains on {one.trains_on}; ranked by {one.metric} ({direction} is better)")
        return 0
    if args.what == "data":
        if args.markdown:
            from ..data import set_registry as data_registry

            print(data_registry.markdown(), end="")
        else:
            _list_data()
        return 0
    if args.markdown:
        raise WorkbenchError(f"--markdown lists data sets (list data --markdown), not {args.what}")
    rows = [(p.name, p.kind, p.update_for(), p.equation, p.description) for p in cc.all_primitives().values()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for name, kind, update, equation, description in rows:
        print(f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {update:<{widths[2]}}  {equation}")
        print(f"{'':<{widths[0]}}  {description}")
    return 0


def _list_data() -> None:
    """``list data``: a row per registered set (:mod:`crate_compose.data.set_registry`): its pattern, what it provides,
    its train / test size, whether it is on this machine and its source; under it, what it is, how it is split
    and its parameters. Reads the declarations only: no torch, no data."""
    from ..data import set_registry as data_registry

    sets = data_registry.all_sets()
    rows = [HEADER, *((one.pattern, one.provides, one.size, one.availability(), one.source) for one in sets)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row, one in zip(rows, [None, *sets]):
        print("  ".join(f"{cell:<{width}}" for cell, width in zip(row[:4], widths)) + f"  {row[4]}")
        if one is not None:
            said = "; ".join(p for p in (one.summary, one.split and f"split: {one.split}") if p)
            print(f"{'':<{widths[0]}}  {said}")
            if one.parameters:
                print(f"{'':<{widths[0]}}  " + "; ".join(f"{p.name}: {p.words}" for p in one.parameters))


HEADER = ("NAME", "PROVIDES", "TRAIN / TEST", "ON THIS MACHINE", "SOURCE")


def run_schema(args: argparse.Namespace) -> int:
    print(json.dumps(cc.json_schema(), indent=2))
    return 0

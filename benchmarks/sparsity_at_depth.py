"""Do CRATE's codes get sparser with depth at a scale that can tell? (issue 27; paper 003 Figs. 3-4)

On ``crate-digits`` (4 layers, 17 tokens, 1,437 training images of 8x8) the trained network compressed
but its codes got denser with depth. This trains ``crate-mini`` (12 layers, 49 tokens of 4x4 patches)
on Fashion-MNIST (``make data``: 59,954 training images) for several seeds with ``crate-compose ablate``
(one variant: the spec as it is), then measures every seed's every checkpoint and the untrained networks
of the same seeds, and writes::

    OUT/summary.json                      R^c and ||Z||_0/(dN) per layer: trained (per seed, mean, range)
                                          and untrained, at the final step and over training
    docs/figures/sparsity-at-depth.png    the two measures by layer, trained against untrained (bands: seeds)

Run (as long as the machine allows: 1,200 steps of batch 64 take about 25 minutes a seed on 2 idle cores)::

    crate-compose ablate crate-mini --swap encoder.layer.sparsify.primitive=ista --data fashion-mnist \\
        --steps 1200 --batch-size 64 --seeds 3 --checkpoint-every 200 --eval-every 600 --out runs/depth
    python benchmarks/sparsity_at_depth.py runs/depth --figure docs/figures/sparsity-at-depth.png

Seeds whose run is not finished are measured at their latest checkpoint (said in the summary).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MEASURES = ("coding_rate", "l0_density")


def _by_layer(rows: list[dict], measure: str) -> list[float]:
    return [r["value"] for r in rows if r["measure"] == measure]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path, help="the ablation folder (OUT of crate-compose ablate)")
    parser.add_argument("--figure", type=Path, default=None, help="where to write the figure (PNG)")
    parser.add_argument("--samples", type=int, default=256, help="test images probed (default: 256)")
    parser.add_argument(
        "--untrained-seeds",
        type=int,
        default=0,
        metavar="N",
        help="probe the untrained networks of seeds 0..N-1 (default: the trained runs' seeds)",
    )
    args = parser.parse_args(argv)

    from crate_compose import tasks
    from crate_compose.assessment.layer_probes import probe, probes_png
    from crate_compose.assessment.run_probes import load_weights, probe_over_training, run_weights
    from crate_compose.assessment.timelines import spread_rows
    from crate_compose.building.builder import compile_spec
    from crate_compose.files import write_atomic
    from crate_compose.training.preparation import HEADLESS, prepare

    seeds = sorted(p for p in args.grid.glob("*/seed-*") if (p / "run.json").is_file())
    if not seeds:
        print(f"error: {args.grid} holds no runs (*/seed-N/run.json)", file=sys.stderr)
        return 2
    trained, untrained, summary, named = [], [], {"seeds": {}}, ""
    for run in seeds:
        found = run_weights(run)
        spec, data = prepare(found.spec, found.data, (), found.image_size, found.seed, keep=HEADLESS)
        inputs, extra = tasks.probe_inputs(found.task, data, args.samples, found.normalize)
        model = compile_spec(spec, seed=found.seed)
        load_weights(model, found.weights)
        trained.append(probe(model, inputs, **extra))
        untrained.append(probe(compile_spec(spec, seed=found.seed), inputs, **extra))
        _, _, steps = probe_over_training(run, samples=args.samples, notes=lambda note: None)
        summary["seeds"][run.name] = {
            "weights": str(found.weights.relative_to(run)),
            "over_training": {str(step): {m: _by_layer(rows, m) for m in MEASURES} for step, rows in steps.items()},
        }
        print(f"{run}: {found.weights.name}, {len(steps) - 1} checkpoints probed", file=sys.stderr)
        named = f"{spec.name.split('.')[0]} on {found.data}"
    if args.untrained_seeds:  # the untrained network is cheap: more seeds of it than the machine could train
        untrained = [probe(compile_spec(spec, seed=seed), inputs, **extra) for seed in range(args.untrained_seeds)]
    runs = {"trained": spread_rows(trained), "untrained": spread_rows(untrained)}
    for name, rows in runs.items():
        summary[name] = {
            m: {
                "mean": _by_layer(rows, m),
                "low": [r["low"] for r in rows if r["measure"] == m],
                "high": [r["high"] for r in rows if r["measure"] == m],
            }
            for m in MEASURES
        }
    summary["seed_count"], summary["untrained_seed_count"] = len(seeds), len(untrained)
    write_atomic(args.grid / "summary.json", json.dumps(summary, indent=1) + "\n")
    for measure in MEASURES:
        print(f"{measure} by layer (mean over the seeds: {len(seeds)} trained, {len(untrained)} untrained)")
        for name in runs:
            print(f"  {name:9s} " + " ".join(f"{v:7.3f}" for v in summary[name][measure]["mean"]))
    if args.figure is not None:
        title = (
            f"{named}: trained ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}) against untrained "
            f"({len(untrained)} seeds, mean and range)"
        )
        write_atomic(args.figure, probes_png(runs, measures=list(MEASURES), title=title))
        print(f"wrote {args.figure}", file=sys.stderr)
    print(f"wrote {args.grid / 'summary.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

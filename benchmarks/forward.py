"""Forward-pass speed: the built CRATE against the paper's pseudocode, same weights, one process.

    .venv/bin/python benchmarks/forward.py [--preset crate-base] [--batch 8] [--runs 7]

The built model computes ISTA with two matrix products instead of the pseudocode's three and the
attention with F.scaled_dot_product_attention. Both models run interleaved, after a warm-up; the
script prints the median time of each and their ratio (medians of several runs, one process, so
the ratio is meaningful even on a busy machine), and the largest output difference. A built model
returns a dict; its logits are ``model(x)["output"]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from reference.crate_paper import CRATE, load_from_built  # noqa: E402

import crate_compose as cc  # noqa: E402


def reference_for(model) -> CRATE:
    spec = cc.spec_of(model)
    sizes = spec.sizes
    reference = CRATE(
        image_size=sizes["image_size"],
        patch_size=sizes["patch_size"],
        num_classes=sizes["classes"],
        dim=sizes["d"],
        depth=sizes["depth"],
        heads=sizes["heads"],
        dim_head=sizes["head_dim"],
    )
    load_from_built(reference, model.state_dict())
    return reference.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="crate-base")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    model = cc.build(args.preset, seed=0).eval()
    reference = reference_for(model)
    images = torch.randn(args.batch, 3, 224, 224)
    timings: dict[str, list[float]] = {"crate-compose": [], "paper pseudocode": []}
    with torch.inference_mode():
        difference = (model(images)["output"] - reference(images)).abs().max().item()
        for _ in range(args.runs):
            for name, net in (("crate-compose", model), ("paper pseudocode", reference)):
                start = time.perf_counter()
                net(images)
                timings[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(times) for name, times in timings.items()}
    print(f"{args.preset}, batch {args.batch} at 224x224, {torch.get_num_threads()} threads, {args.runs} runs each")
    for name, median in medians.items():
        print(f"  {name:<18} median {median * 1000:8.1f} ms   (min {min(timings[name]) * 1000:.1f} ms)")
    ratio = medians["crate-compose"] / medians["paper pseudocode"]
    print(f"  ratio crate-compose / pseudocode: {ratio:.3f}   max |logit difference| {difference:.2e}")


if __name__ == "__main__":
    main()

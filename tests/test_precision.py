"""Whole networks in float32, bf16 and fp16 follow float64 within the bounds docs/precision.md states.

One small network of each family (CRATE on digits, CRATE-MAE, ToST, a byte-level causal CRATE;
``benchmarks/precision.py``'s ``SMALL``) is built in float64 and compared with its float32 copy, and
with that copy under bf16 and fp16 autocast as ``train --precision`` runs it, with the fast paths and
with the formulas as written: the norm-wise relative error of the output, of the input's gradient and
of every parameter's gradient, and the share of ISTA units whose sign flipped, each the median over 5
inputs (a single flipped ReLU threshold moves a gradient by far more than rounding does, so one
input alone says little). The fast paths may cost at most :data:`FAST_OVER_WRITTEN` times the
rounding error of the formulas as written. A change of one ISTA step's lambda by 0.1 % is caught.
"""

from __future__ import annotations

import re
import sys
from dataclasses import astuple, dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import precision as bench  # noqa: E402  (benchmarks/precision.py)

from crate_compose.modules.sparsify import ISTA  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

DOC = ROOT / "docs" / "precision.md"
INPUTS = 5


@dataclass(frozen=True)
class Bound:
    """Medians over the inputs: relative errors of the output, the input's gradient and the parameters'
    gradients, and the share of ISTA units whose sign flipped."""

    output: float
    input_grad: float
    param_grad: float
    flips: float


BOUNDS = {  # docs/precision.md, "The bounds the tests keep"
    "fp64": Bound(1e-13, 1e-13, 1e-13, 0.0),  # the fast paths in float64
    "fp32": Bound(3e-6, 3e-6, 3e-6, 1e-4),
    "bf16": Bound(3e-2, 0.15, 0.1, 5e-3),
    "fp16": Bound(4e-3, 1.5e-2, 5e-2, 1e-3),
}
FAST_OVER_WRITTEN = 2.0  # the fast paths' median error over the written formulas' (output, parameters' gradients)
# and in bf16 and fp16 for the output: the ISTA step keeps the tokens out of its lowered product (issue 35); when it
# did not, this ratio was 1.8 on crate-digits (4.8 on CRATE-B/16), now 0.8-1.2 on every small network
HALF_OUTPUT_OVER_WRITTEN = 1.5
ROWS = [
    (network, precision, formulas)
    for network in bench.SMALL
    for precision in bench.PRECISIONS
    for formulas in ("fast", "written")
    if not (precision == "fp64" and formulas == "written")
]


@pytest.fixture(scope="module")
def measured(one_thread) -> dict[tuple[str, str, str], bench.Row]:
    """Every row of every small network, measured once."""
    return {
        (name, row.precision, row.formulas): row
        for name, network in bench.SMALL.items()
        for row in bench.measure(network, count=INPUTS)
    }


@pytest.mark.parametrize(("network", "precision", "formulas"), ROWS, ids=["-".join(r) for r in ROWS])
def test_errors_against_float64_are_within_their_bounds(measured, network, precision, formulas):
    row, bound = measured[network, precision, formulas], BOUNDS[precision]
    assert len(row.errors) == INPUTS
    for name in ("output", "input_grad", "param_grad"):
        median = row.median(name)
        if name == "input_grad" and bench.SMALL[network].task == "lm":
            assert median is None  # token ids have no gradient
            continue
        assert median <= getattr(bound, name), f"{name}: median {median:.2e} > {getattr(bound, name):g}"
    units = row.errors[0].units
    flipped = sorted(e.flips for e in row.errors)[INPUTS // 2] / units if units else 0.0
    assert flipped <= bound.flips, f"{flipped:.1e} of {units} ISTA units flipped (bound {bound.flips:g})"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("network", sorted(bench.SMALL))
def test_the_fast_paths_cost_at_most_a_few_times_the_rounding_of_the_formulas(measured, network, precision):
    fast, written = measured[network, precision, "fast"], measured[network, precision, "written"]
    for name in ("output", "param_grad"):
        ratio = fast.median(name) / written.median(name)
        bound = HALF_OUTPUT_OVER_WRITTEN if name == "output" and precision != "fp32" else FAST_OVER_WRITTEN
        assert ratio <= bound, f"{name}: fast {fast.median(name):.2e}, written {written.median(name):.2e}"


def test_the_float32_bound_catches_one_ista_lambda_changed_by_a_thousandth():
    """No bound so loose that a wrong step passes: one ISTA step's lambda 0.1 % off leaves float32 outside."""
    network = bench.SMALL["crate-digits"]
    reference = bench.build_reference(network)
    model = bench.copies(reference, ("fp32",))["fp32"]
    next(m for m in model.modules() if isinstance(m, ISTA)).lambd *= 1.001
    batch = bench.inputs(reference, network, 0)
    exact = bench.run_pass(reference, network, batch, "fp64", "written", 0)
    errors = bench.compare(bench.run_pass(model, network, batch, "fp32", "fast", 0), exact)
    bound = BOUNDS["fp32"]
    assert (
        errors.output > bound.output and errors.input_grad > bound.input_grad and errors.param_grad > bound.param_grad
    )


def test_the_docs_state_these_bounds():
    """docs/precision.md's table of bounds is this file's."""
    text = DOC.read_text(encoding="utf-8").split("## The bounds the tests keep", 1)[-1].split("\n## ", 1)[0]
    for precision, bound in BOUNDS.items():
        row = re.search(rf"^\| {precision} \|(.*)\|\s*$", text, re.M)
        assert row, f"docs/precision.md has no row for {precision} under 'The bounds the tests keep'"
        cells = [c.strip() for c in row.group(1).split("|")]
        assert [float(c) for c in cells[:4]] == list(astuple(bound)), (precision, cells)
    assert f"at most {FAST_OVER_WRITTEN:g} times" in text and f"{HALF_OUTPUT_OVER_WRITTEN:g} times" in text


def test_bf16_on_a_cpu_without_native_bf16_is_said_before_the_run():
    import torch

    from crate_compose.settings import Settings
    from crate_compose.training.optimizers import bf16_note

    cpu, avx2 = torch.device("cpu"), {"avx2", "fma", "sse4_2"}
    said = bf16_note(Settings(precision="bf16"), cpu, flags=avx2)
    assert said.startswith("--precision bf16 on a CPU without native bf16 (no AVX-512 BF16, no AMX)")
    assert "float32 (--precision fp32) is the faster choice here" in said
    assert bf16_note(Settings(precision="bf16"), cpu, flags=avx2 | {"avx512_bf16"}) is None
    assert bf16_note(Settings(precision="bf16"), cpu, flags=avx2 | {"amx_bf16"}) is None
    assert bf16_note(Settings(precision="fp32"), cpu, flags=avx2) is None
    assert bf16_note(Settings(precision="bf16"), torch.device("meta"), flags=avx2) is None

"""The resource guard: memory estimated from shapes before anything is allocated.

A spec states its sizes, so what a build or a training run will hold is known before a single
weight exists, from the primitives' footprints (:func:`crate_compose.building.footprints.walk`) or a
meta placement (:func:`crate_compose.building.placement.place`), neither of which allocates:

* a **build** holds its parameters and buffers: ``P * bytes(dtype)``;
* a **training run** holds, per process, float32 copies of the parameters: the weights, their
  gradients and the optimizer's moments (AdamW two, Lion and SGD with momentum one), and an EMA
  when one is kept (``4 * P * 4`` bytes with AdamW), plus the activations of one batch: every tensor
  the forward pass creates (views and in-place results excluded), measured per sample on the meta
  device and scaled by the batch each process takes; on the CPU also the input batches the
  DataLoader's workers prepare ahead (``workers * 2``, and the one in use). It is an estimate:
  autograd keeps most of these, not all.

An estimate over the limit fails before allocating, with the estimate and the limit. The limit
is, in order: the ``memory_limit`` argument (``--memory-limit`` on the command line), the
``CRATE_COMPOSE_MEMORY_LIMIT`` environment variable, or what the device has: 90% of the memory
the system reports available (``MemAvailable``), or of the free memory of a CUDA device. Sizes
read ``8GB``, ``512MiB``, ``2e9`` or ``none`` (no limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import Problem, SpecError
from ..memory import ENVIRONMENT, human, resolve_limit
from ..spec_language.spec import Spec

if TYPE_CHECKING:
    from .plan import PlannedStep

ADAMW_COPIES = 4  # weights, gradients and AdamW's two moments, all float32


class ResourceError(SpecError):
    """A build or a run whose memory estimate is over the limit (the CLI exits with status 2)."""


@dataclass(frozen=True)
class Estimate:
    """What a network holds: parameters and buffers (counted once when tied), and the bytes of
    every tensor one sample's forward pass creates."""

    parameters: int
    buffers_bytes: int
    activation_bytes_per_sample: int
    largest: tuple[str, int, tuple] = ("", 0, ())  # the step with the most parameters: place, count, spec path

    def build_bytes(self, element_size: int) -> float:
        return float(self.parameters) * element_size + self.buffers_bytes


def estimate(spec: Spec, *, activations: bool = True, steps: list[PlannedStep] | None = None) -> Estimate:
    """Count ``spec``'s parameters (from the footprints when they settle every step and
    ``activations`` are not asked for, else placed on the meta device) and one sample's activations
    (placed on the meta device): no memory either way. Parameters are counted as ``inspect`` counts
    them (:func:`crate_compose.building.summary.summarize_march`: a tied weight once). ``steps``: the plan of
    ``spec`` with its decoder explicit, when the caller made it already."""
    from .derivation import explicit
    from .footprints import walk
    from .summary import summarize_march

    spec = explicit(spec)
    records = None if activations else walk(spec, steps)
    if records is None:
        from .placement import META_BATCH, place

        records = list(place(spec, meta=True, steps=steps))
        per_sample = sum(record.activation_bytes // META_BATCH for record in records)
    else:
        per_sample = 0
    summary = summarize_march(spec, records)
    buffers = sum(b.numel() * b.element_size() for r in records if r.module is not None for b in r.module.buffers())
    largest = ("", 0, ())
    for record, row in zip(records, summary.steps):
        if row.params > largest[1]:
            largest = (record.target, row.params, record.path)
    return Estimate(summary.params_total, buffers, per_sample, largest)


def check(
    spec: Spec, weights: float, activations: float, what: str, limit: tuple[float | None, str], found: Estimate
) -> None:
    """Raise :class:`ResourceError` when ``weights + activations`` bytes exceed the limit, located at
    the step holding the most parameters (at the spec's input when activations dominate)."""
    bound, source = limit
    needed = weights + activations
    if bound is None or needed <= bound:
        return
    place, count, path = found.largest
    parts = (
        f"{human(weights)} of weights and optimizer state, {human(activations)} of activations"
        if activations
        else f"{found.parameters:,} parameters"
    )
    message = f"{what} needs about {human(needed)} ({parts}), over the memory limit of {human(bound)} ({source})"
    if count and weights >= activations:
        message += f"; the largest step is {place} with {count:,} parameters"
        where = path
    else:
        where = ("input",)
    hint = f"make the spec smaller, or set the limit with --memory-limit or {ENVIRONMENT} (e.g. 64GB, or none)"
    hint = "; ".join(filter(None, [spec.sizes_given_elsewhere(where, scope=()), hint]))
    raise ResourceError([Problem(message, where, spec.locate(where), hint)])


def check_build(
    spec: Spec,
    element_size: int,
    device: str = "cpu",
    memory_limit: str | float | None = None,
    steps: list[PlannedStep] | None = None,
) -> None:
    """Refuse a build whose parameters would not fit (nothing is estimated when there is no limit);
    ``steps``: the plan of ``spec`` (decoder explicit), when the caller made it already."""
    limit = resolve_limit(memory_limit, device)
    if limit[0] is None:
        return
    found = estimate(spec, activations=False, steps=steps)
    check(spec, found.build_bytes(element_size), 0, f"building {spec.name}", limit, found)


def check_training(
    spec: Spec,
    batch: int,
    device: str = "cpu",
    memory_limit: str | float | None = None,
    *,
    copies: int = ADAMW_COPIES,
    batches: int = 0,
) -> None:
    """Refuse a training run whose weights, optimizer state and activations would not fit: ``copies``
    float32 copies of the parameters (weights, gradients, the optimizer's moments, an EMA), the
    activations of one batch, and ``batches`` batches of float32 inputs held besides (those the
    DataLoader's workers prepare ahead, in the same memory when training on the CPU)."""
    limit = resolve_limit(memory_limit, device)
    if limit[0] is None:
        return
    found = estimate(spec)
    weights = float(found.parameters) * 4 * copies + found.buffers_bytes
    activations = float(batch) * found.activation_bytes_per_sample
    inputs = float(batches) * batch * 4 * _elements(spec.input.shape)
    what = f"training {spec.name} with a batch of {batch:,} per process"
    if batches:
        what += (
            f", {batches} input batch{'es' * (batches != 1)} held ({human(inputs)}: the one in use and those "
            "the workers prepare ahead)"
        )
    check(spec, weights, activations + inputs, what, limit, found)


def _elements(shape) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count

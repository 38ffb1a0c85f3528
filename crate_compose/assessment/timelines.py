"""Probes over training time and over seeds, as figures: how each step's own objective evolves.

:func:`timeline_png` draws probe rows taken at several training steps (``probe RUN --checkpoints all``):
for every measure, the value after each step against its layer, one line per checkpoint coloured by
its training step (the untrained network is step 0), and the same values against the training step,
one line per layer. :func:`spread_rows` summarizes the rows of several seeds (an ablation's) into one
row per step and measure with the mean, the standard deviation and the range, which
:func:`crate_compose.assessment.layer_probes.probes_png` draws as a band.
"""

from __future__ import annotations

import io
import math
import statistics
from typing import Sequence

from .layer_probes import ARROWS, MEASURE_LABELS


def spread_rows(seeds: Sequence[Sequence[dict]]) -> list[dict]:
    """One row per (module, measure) of the first seed's rows, its ``value`` the mean over the seeds that have
    it, with ``spread`` (the standard deviation; 0.0 for one seed), ``low`` and ``high`` (the range) and
    ``values`` (per seed, in order). A value that is None (not measurable) is left out of the mean."""
    out = []
    for row in seeds[0]:
        key = (row["module"], row["measure"])
        values = [r["value"] for rows in seeds for r in rows if (r["module"], r["measure"]) == key]
        known = [v for v in values if v is not None and math.isfinite(v)]
        summary = dict(row, value=statistics.fmean(known) if known else None, values=values, seeds=len(known))
        summary.update(
            spread=statistics.stdev(known) if len(known) > 1 else 0.0,
            low=min(known) if known else None,
            high=max(known) if known else None,
        )
        out.append(summary)
    return out


def _by_layer(rows: Sequence[dict], measure: str) -> tuple[list[int], list[float]]:
    """The layers (1-based; the order in the network where a step has no layer) and values of ``measure``."""
    chosen = [r for r in rows if r["measure"] == measure]
    layers = [r["layer"] for r in chosen]
    xs = (
        [layer + 1 for layer in layers]
        if None not in layers and len(set(layers)) == len(layers)
        else list(range(1, len(chosen) + 1))
    )
    return xs, [math.nan if r["value"] is None else r["value"] for r in chosen]


def timeline_png(steps: dict[int, Sequence[dict]], *, title: str | None = None) -> bytes:
    """``steps``: ``{training step: probe rows}`` (step 0: untrained). Two panels per measure: the value by
    layer, a line per checkpoint coloured by its step (with a colour bar), and the value by training step,
    a line per layer."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not steps:
        raise ValueError("timeline_png: no checkpoints to draw")
    order = list(steps)
    measures = list(dict.fromkeys(r["measure"] for rows in steps.values() for r in rows if r["measure"] != "snr"))
    if not measures:
        raise ValueError("timeline_png: the rows hold no measure")
    figure = Figure(figsize=(10.0, 3.6 * len(measures)), layout="constrained")
    FigureCanvasAgg(figure)
    shade = ScalarMappable(Normalize(min(order), max(order) or 1), colormaps["viridis"])
    for index, measure in enumerate(measures):
        label = MEASURE_LABELS.get(measure, measure)
        directions = {r["direction"] for rows in steps.values() for r in rows if r["measure"] == measure}
        claim = " ".join(ARROWS[d] for d in sorted(d for d in directions if d in ARROWS))
        by_layer = figure.add_subplot(len(measures), 2, 2 * index + 1)
        layers: dict[int, list[tuple[int, float]]] = {}
        for step, rows in steps.items():
            xs, ys = _by_layer(rows, measure)
            by_layer.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, color=shade.to_rgba(step))
            for x, y in zip(xs, ys):
                layers.setdefault(x, []).append((step, y))
        by_layer.set_title(label, fontsize="medium")
        by_layer.set_xlabel("layer ℓ")
        by_layer.set_ylabel(f"{measure} (steps claim {claim})" if claim else measure)
        by_layer.xaxis.set_major_locator(MaxNLocator(integer=True))
        by_layer.grid(True, alpha=0.3)
        figure.colorbar(shade, ax=by_layer, label="step (0: untrained)")
        by_step = figure.add_subplot(len(measures), 2, 2 * index + 2)
        depth = max(layers) if layers else 1
        for layer, points in sorted(layers.items()):
            by_step.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker=".",
                linewidth=1.2,
                color=colormaps["plasma"](0.85 * (layer - 1) / max(depth - 1, 1)),
                label=f"layer {layer}",
            )
        by_step.set_title(f"{measure} by training step, one line per layer", fontsize="medium")
        by_step.set_xlabel("training step (0: untrained)")
        by_step.set_ylabel(measure)  # beside the colour bar of the panel to its left, which says what colour means
        by_step.grid(True, alpha=0.3)
        by_step.legend(fontsize="x-small", ncol=2 if depth > 6 else 1)
    if title:
        figure.suptitle(title)
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    return image.getvalue()

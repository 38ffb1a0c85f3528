"""White-box probes: measure, layer by layer, the objective each optimization step claims to move.

Every primitive that is a step on a named objective declares a *measure* (``measure=`` of
:func:`crate_compose.registry.primitive`): one or more :class:`~crate_compose.modules.measures.Measure` s,
each a function ``(module, inputs, output) -> Reading`` and the direction the step claims to move
its objective (the measures and the objectives they evaluate are in
:mod:`crate_compose.modules.measures`, and importable from here). :func:`probe` runs a built model
once with forward hooks and returns one row per step, layer and measure; :func:`save_probes`,
:func:`write_probes` and :func:`plot_probes` write the rows and draw them in the style of 003 Fig. 3-4.

Importing this module never imports matplotlib: :func:`plot_probes` imports it when called.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from .. import registry
from ..files import write_atomic, write_together
from ..modules.measures import (
    Measure,
    Reading,
    coding_rate,
    coding_rate_measure,
    heads_of,
    lasso,
    lasso_measure,
    snr,
    sparsity,
    sparsity_measures,
    subspace_residual,
    tokens_of,
    variational_rate,
)

__all__ = [
    "Measure",
    "Reading",
    "coding_rate",
    "coding_rate_measure",
    "heads_of",
    "lasso",
    "lasso_measure",
    "plot_probes",
    "probe",
    "probes_json",
    "probes_png",
    "save_probes",
    "snr",
    "sparsity",
    "sparsity_measures",
    "subspace_residual",
    "variational_rate",
    "write_probes",
]


# --------------------------------------------------------------------------------------- probing a model


def probe(
    model: nn.Module,
    inputs: torch.Tensor | tuple[torch.Tensor, ...],
    *,
    labels: torch.Tensor | None = None,
    subspaces: torch.Tensor | None = None,
    normalize: bool = True,
    eps: float | None = None,
) -> list[dict[str, Any]]:
    """Run ``model`` once (no gradients, eval mode) and measure every step that has a measure.

    Returns one row per step, layer and measure, in the order the steps run::

        {"module": "encoder.layer_3.compress", "role": "encoder", "layer": 3, "step": "compress",
         "primitive": "mssa", "measure": "coding_rate", "value": 41.2, "before": 44.0, "direction": "down"}

    ``value`` is the objective on the step's output, ``before`` on its starting point (``None`` when
    it has none), ``direction`` the way the step claims to move it.

    With ``subspaces`` (the true ``U``, ``(d, K*p)``, orthonormal) and per-token ``labels``
    (``(n,)`` or ``(B, n)``; synthetic data, book eq. 5.3.1), also the SNR of every subspace
    (:func:`snr`) on the model input (``module "input"``) and after every step whose token output has
    that shape: rows with ``measure "snr"``, ``values`` (one per subspace) and ``value`` (their mean).

    ``normalize``/``eps``: the form of the coding rate (see :func:`coding_rate`; ``eps`` default:
    0.01 normalized, the step's own precision otherwise). The model is put in eval mode for the
    run (masks and BatchNorm deterministic) and restored after.
    """
    if (labels is None) != (subspaces is None):
        raise ValueError("probe: give both subspaces and labels (for the SNR), or neither")
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    graph = getattr(model, "graph", None)
    if graph is None:
        raise TypeError("probe takes a model built by crate_compose (a torch.fx.GraphModule)")
    rows: list[dict[str, Any]] = []
    heads = None if subspaces is None else _snr_heads(subspaces, labels)

    def snr_row(tokens, info) -> None:
        tokens = tokens_of(tokens)
        if (
            isinstance(tokens, torch.Tensor)
            and tokens.is_floating_point()
            and tokens.dim() == 3
            and tokens.shape[-1] == subspaces.shape[0]
            and tokens.shape[1] == torch.as_tensor(labels).shape[-1]
        ):
            values = snr(tokens, subspaces, labels, heads)
            finite = [v for v in values if not math.isnan(v)]
            rows.append(
                {
                    **info,
                    "measure": "snr",
                    "value": sum(finite) / len(finite) if finite else math.nan,
                    "values": values,
                    "before": None,
                    "direction": "up",
                }
            )

    def hook_for(info: dict, measures: tuple[Measure, ...]):
        def hook(module, args, output):
            for measure in measures:
                reading = measure(module, args, output, normalize=normalize, eps=eps)
                if reading is not None:
                    rows.append(
                        {
                            **info,
                            "measure": measure.name,
                            "value": reading.value,
                            "before": reading.before,
                            "direction": measure.direction,
                        }
                    )
            if subspaces is not None:
                snr_row(output, info)

        return hook

    handles = []
    for node in graph.nodes:
        if node.op != "call_module" or node.meta.get("primitive") is None:
            continue
        registered = registry.get(node.meta["primitive"])
        measures = registered.measures if registered is not None else ()
        if not measures and subspaces is None:
            continue
        info = {key: node.meta.get(key) for key in ("role", "layer", "step", "primitive")}
        info = {"module": str(node.target), **info}
        handles.append(model.get_submodule(str(node.target)).register_forward_hook(hook_for(info, measures)))
    training = model.training
    try:
        model.eval()
        if subspaces is not None:
            snr_row(inputs[0], {"module": "input", "role": "input", "layer": None, "step": None, "primitive": None})
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(training)
    return rows


def _snr_heads(subspaces: torch.Tensor, labels: torch.Tensor) -> int:
    """K from the labels' range; it must divide the columns of ``U``."""
    k = int(torch.as_tensor(labels).max()) + 1
    if subspaces.dim() != 2 or subspaces.shape[1] % k:
        raise ValueError(
            f"subspaces of shape {tuple(subspaces.shape)} do not split into {k} groups (labels 0..{k - 1})"
        )
    return k


# --------------------------------------------------------------------------------------- saving and plotting


def save_probes(rows: Sequence[dict] | dict[str, Sequence[dict]], path: str | Path) -> Path:
    """Write probe rows (or ``{run: rows}``) as JSON, atomically (temporary file, then rename)."""
    write_atomic(path, probes_json(rows))
    return Path(path)


def write_probes(runs: dict[str, Sequence[dict]], folder: str | Path, *, title: str | None = None) -> tuple[Path, Path]:
    """Write ``folder/probes.json`` (:func:`save_probes`) and ``folder/probes.png`` (:func:`plot_probes`)
    as a pair: both new or neither (:func:`crate_compose.files.write_together`). The figure is drawn
    before anything is written; a full disk names the file and leaves an earlier pair as it was."""
    folder = Path(folder)
    table, figure = folder / "probes.json", folder / "probes.png"
    write_together({table: probes_json(runs), figure: probes_png(runs, title=title)})
    return table, figure


def probes_json(rows: Sequence[dict] | dict[str, Sequence[dict]]) -> str:
    """Probe rows (or ``{run: rows}``) as JSON text, NaN written as null."""

    def clean(value):  # JSON has no NaN: write null
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(rows if isinstance(rows, dict) else list(rows)), indent=1)


ARROWS = {"down": "↓", "up": "↑"}  # which way a measure improves, as the tables and figures mark it


def plot_probes(
    runs: dict[str, Sequence[dict]],
    path: str | Path,
    *,
    measures: Iterable[str] | None = None,
    title: str | None = None,
) -> Path:
    """Plot probe rows in the style of 003 Fig. 3-4 and write a PNG atomically; returns ``path``."""
    write_atomic(path, probes_png(runs, measures=measures, title=title))
    return Path(path)


def probes_png(
    runs: dict[str, Sequence[dict]],
    *,
    measures: Iterable[str] | None = None,
    title: str | None = None,
) -> bytes:
    """The figure of :func:`plot_probes` as PNG bytes.

    ``runs``: ``{"trained": rows, "untrained": rows, ...}`` (rows from :func:`probe`). One panel per
    measure (default: every measure present, in order; e.g. ``["coding_rate", "l0_density"]`` for
    Fig. 3), the value after each step against its layer index (1-based; steps outside layers, and
    SNR rows, against their order in the network), one line with markers per run (and per role,
    when both an encoder and a decoder have the measure). The y label names the measure and the way
    the steps claim to move it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazily: importing crate_compose never needs it
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not runs:
        raise ValueError("plot_probes: no runs to plot")
    order: list[str] = []
    for rows in runs.values():
        for row in rows:
            if row["measure"] not in order:
                order.append(row["measure"])
    names = list(measures) if measures is not None else order
    missing = [m for m in names if m not in order]
    if missing or not names:
        raise ValueError(f"plot_probes: no rows for measure(s) {missing or names}; measures present: {order}")

    columns = min(3, len(names))
    lines = math.ceil(len(names) / columns)
    figure = Figure(figsize=(4.6 * columns, 3.6 * lines), layout="constrained")
    FigureCanvasAgg(figure)
    for index, name in enumerate(names):
        axes = figure.add_subplot(lines, columns, index + 1)
        directions, label, by_layer = set(), name, True
        for number, (run, rows) in enumerate(runs.items()):
            selected = [r for r in rows if r["measure"] == name]
            if not selected:  # said, not silently left out: the run has no step with this measure
                axes.plot([], [], " ", label=f"{run}: no step measures this")
            roles = list(dict.fromkeys(r["role"] for r in selected))
            for shade, role in enumerate(roles):
                group = [r for r in selected if r["role"] == role]
                directions.update(r["direction"] for r in group)
                layers = [r["layer"] for r in group]
                use_layers = None not in layers and len(set(layers)) == len(layers)
                by_layer &= use_layers
                xs = [layer + 1 for layer in layers] if use_layers else list(range(1, len(group) + 1))
                ys = [math.nan if r["value"] is None else r["value"] for r in group]
                legend = run if len(roles) == 1 else f"{run} ({role})"
                seeds = max((r.get("seeds", 1) for r in group), default=1)
                if seeds > 1:  # rows of several seeds (timelines.spread_rows): the mean, and their range as a band
                    legend += f" (mean of {seeds} seeds; band: range)"
                    axes.fill_between(
                        xs,
                        [math.nan if r["low"] is None else r["low"] for r in group],
                        [math.nan if r["high"] is None else r["high"] for r in group],
                        color=f"C{number % 10}",
                        alpha=0.18,
                        linewidth=0,
                    )
                axes.plot(
                    xs,
                    ys,
                    marker="o",
                    markersize=4,
                    linewidth=1.5,
                    label=legend,  # one color per run
                    color=f"C{number % 10}",
                    linestyle=("-", "--", ":", "-.")[shade % 4],
                )
            label = MEASURE_LABELS.get(name, name)
        claim = " ".join(f"{ARROWS[d]}" for d in sorted(directions))
        axes.set_title(label)
        axes.set_xlabel("layer ℓ" if by_layer else "step (network order)")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        axes.set_ylabel(f"{name} (steps claim {claim})" if claim else name)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=120)
    return image.getvalue()


MEASURE_LABELS = {
    "coding_rate": "compression R^c(Z | U) after each compression step",
    "sparsity": "fraction of zeros after each sparsification step",
    "l0_density": "‖Z‖₀ / (d·N) after each sparsification step",
    "lasso": "LASSO objective of each sparsification step",
    "variational_rate": "R^var_c(Z, Π | U) after each TSSA step",
    "subspace_residual": "distance to the nearest subspace",
    "snr": "SNR (mean over subspaces)",
}

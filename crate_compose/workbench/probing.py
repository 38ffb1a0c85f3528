"""Probing trained networks (``crate-compose probe``); ablation grids are :mod:`crate_compose.workbench.ablation`.

``probe_run`` measures every step's own objective layer by layer (:mod:`crate_compose.workbench.probes`) on
a trained build and on the same spec untrained (same seed), and draws both on one figure, as
paper 003 Figs. 3-4 do.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import torch

from ..building.artifacts import SPEC_FILE, WEIGHTS_FILE, first_mismatch, read_weights
from ..building.builder import compile_spec, spec_of
from ..building.plan import tied
from ..errors import WorkbenchError
from ..files import writable
from .data import Data
from .locks import hold
from .probes import probe, write_probes
from .train import prepare

PROBE_SAMPLES = 256


def _probe_inputs(data: Data, samples: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The first ``samples`` test inputs, and the true subspaces and labels for synthetic tokens."""
    count = min(samples, len(data.test))
    items = [data.test[i] for i in range(count)]
    inputs = torch.stack([x for x, _ in items])
    extra: dict[str, Any] = {}
    if data.subspaces is not None:
        extra = {"subspaces": data.subspaces, "labels": torch.stack([torch.as_tensor(y) for _, y in items])}
    return inputs, extra


def probe_run(
    spec_ref,
    data_name: str,
    *,
    weights: str | Path | None = None,
    overrides: Iterable[str] = (),
    out: str | Path | None = None,
    seed: int = 0,
    samples: int = PROBE_SAMPLES,
    image_size: int | None = None,
) -> tuple[Path, Path, dict[str, list[dict]]]:
    """Probe ``spec_ref`` (its input size set from the data) untrained, and trained with ``weights``
    (a run's ``final/`` or a checkpoint) when given; write probes.json and probes.png into ``out``
    (default: :func:`probe_folder`), both new or neither (:func:`crate_compose.workbench.probes.write_probes`),
    holding the folder's lock (:func:`crate_compose.workbench.locks.hold`: another writer exits 3)."""
    spec, data = prepare(spec_ref, data_name, overrides, image_size, seed)
    folder = probe_folder(weights, spec.name, out)  # refused before anything is measured
    inputs, extra = _probe_inputs(data, samples)
    runs: dict[str, list[dict]] = {}
    if weights is not None:
        trained = compile_spec(spec, seed=seed)
        load_weights(trained, Path(weights))
        runs["trained"] = probe(trained, inputs, **extra)
    runs["untrained"] = probe(compile_spec(spec, seed=seed), inputs, **extra)
    title = f"{spec.name} on {data_name}: " + (" vs ".join(runs))
    with hold(folder, "write probes into"):
        table, figure = write_probes(runs, folder, title=title)
    return table, figure, runs


CHECKPOINT = re.compile(r"step-\d+")  # RUN/checkpoints/step-NNNNNN


def probe_folder(weights: str | Path | None, spec_name: str, out: str | Path | None = None) -> Path:
    """Where ``probe`` writes: ``out`` when given; for a run's weights, ``RUN/final`` or a checkpoint
    ``RUN/checkpoints/step-N``, the run's ``RUN/probes/final`` or ``RUN/probes/step-N`` (never inside
    the build: ``train --resume`` takes ``final/`` only when it holds a build and nothing else); for
    other weights, or none, ``probes/<spec name>``. Refused: a folder inside a build (a folder holding
    model.safetensors and spec.yaml), a file where the folder goes (:class:`WorkbenchError`), and a
    probes.json or probes.png that is not a regular file (``OSError``, as every output)."""
    named = Path(weights or "")
    named = named.resolve() if weights is not None and named.name in ("", "..") else named
    if out is not None:
        folder = Path(out)
    elif weights is not None and named.name == "final":
        folder = named.parent / "probes" / "final"
    elif weights is not None and named.parent.name == "checkpoints" and CHECKPOINT.fullmatch(named.name):
        folder = named.parent.parent / "probes" / named.name
    else:
        folder = Path("probes") / spec_name
    where = f"--out {folder}" if out is not None else str(folder)
    resolved = folder.resolve()
    for place in (resolved, *resolved.parents):
        if (place / WEIGHTS_FILE).is_file() and (place / SPEC_FILE).is_file():
            raise WorkbenchError(f"{where} is inside the build {place}: probes are never written into a build "
                                 "(train --resume would refuse its final/); choose a folder outside it")
    if folder.exists() and not folder.is_dir():
        raise WorkbenchError(f"{where} exists and is not a folder: give a folder for probes.json and probes.png")
    for name in ("probes.json", "probes.png"):
        writable(folder / name)
    return folder


def load_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load ``folder/model.safetensors`` into ``model``; a mismatch names the first differing tensor."""
    path = folder / "model.safetensors"
    if not path.is_file():
        raise WorkbenchError(f"--weights {folder}: no model.safetensors there (give a run's final/ or a checkpoint)")
    try:
        tensors = read_weights(path, tied(spec_of(model)))
    except ValueError as error:
        raise WorkbenchError(f"--weights {folder}: {error}") from None
    mismatch = first_mismatch(model.state_dict(), tensors)
    if mismatch:
        raise WorkbenchError(f"--weights {folder} do not fit the spec: {mismatch}")
    broken = next((name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if broken:  # a diverged run: every measure would be NaN, and the probes' logdet cannot be taken
        raise WorkbenchError(f"--weights {folder}: {broken} holds NaN or infinite values (a diverged run?)")
    model.load_state_dict(tensors)


def probe_table(runs: dict[str, list[dict]]) -> str:
    """The probe rows as aligned text: one line per step and measure, one column per run."""
    names = list(runs)
    keys: list[tuple] = []
    values: dict[tuple, dict[str, float]] = {}
    for name, rows in runs.items():
        for row in rows:
            key = (row["module"], row["measure"])
            if key not in values:
                keys.append(key)
                values[key] = {}
            values[key][name] = row["value"]
    width = max([len(m) for m, _ in keys] + [6])
    lines = [f"{'step':<{width}}  {'measure':<16}" + "".join(f"  {n:>12}" for n in names)]
    for key in keys:
        cells = "".join(f"  {values[key].get(n, float('nan')):>12.4f}" for n in names)
        lines.append(f"{key[0]:<{width}}  {key[1]:<16}{cells}")
    return "\n".join(lines)


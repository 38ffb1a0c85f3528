"""What a run writes as it goes: a row per logged step and per evaluation (``metrics.jsonl``, ``metrics.csv``,
TensorBoard's scalars), and the result of the whole run (``result.json``)."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import tasks
from ..files import naming, write_atomic
from .run_folder import eventlog


@dataclass
class Result:
    """What a run reports: the run folder, the last losses and the evaluation."""

    run: str
    steps: int
    train_loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    params: int = 0
    seconds: float = 0.0
    trainable: int = 0  # the parameters that trained (fewer than params under --freeze encoder)
    already_finished: bool = False  # resumed with the steps it had finished: nothing was trained or written

    def to_dict(self) -> dict[str, Any]:
        """What result.json holds."""
        return {k: v for k, v in asdict(self).items() if k != "already_finished"}


class Metrics:
    """Rows appended to metrics.jsonl and metrics.csv; a resumed run first keeps only the rows its
    checkpoint was written after (``keep``, counted in the checkpoint's state)."""

    TESTS = tasks.columns()  # every registered task's test metrics: one header for every run
    FIELDS = (
        "step",
        "kind",
        "loss",
        "lr",
        "seconds",
        *TESTS,
        *(f"ema_{name}" for name in TESTS),  # --ema: both
        *tasks.logged(),
    )  # what a task's session measures at each step (DINO: the teacher's entropy)

    def __init__(self, run: Path, keep: int, enabled: bool, board: eventlog.Board | None = None) -> None:
        self.enabled = enabled
        self.board = board  # logging: RUN/tensorboard's scalars of each row (None: --logger none)
        self.jsonl, self.csv = run / "metrics.jsonl", run / "metrics.csv"
        self.count = keep
        if not enabled:
            return
        rows = rows_of(self.jsonl.read_text())[:keep] if keep and self.jsonl.exists() else []
        write_atomic(self.jsonl, "".join(json.dumps(row) + "\n" for row in rows))
        table = io.StringIO()
        writer = csv.DictWriter(table, self.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.csv, table.getvalue())

    def add(self, row: dict[str, Any]) -> None:
        self.count += 1
        if not self.enabled:
            return
        with naming(self.jsonl), open(self.jsonl, "a") as handle:
            handle.write(json.dumps(finite(row), allow_nan=False) + "\n")
        with naming(self.csv), open(self.csv, "a", newline="") as handle:
            csv.DictWriter(handle, self.FIELDS).writerow(row)
        if self.board is not None:
            self.board.add(row)


def rows_of(text: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl; a last line cut short by a killed run (rows are appended) is dropped."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_metrics(run: Path) -> str:
    path = run / "metrics.jsonl"
    return path.read_text(errors="replace") if path.is_file() else ""


def said(evaluation: dict[str, Any], task: tasks.Task | None = None) -> str:
    """An evaluation as the progress lines and ``train``'s summary say it: ``test_accuracy 0.9700, test_loss
    0.1000``. For a task whose evaluations read the weights' average (``task.weights`` is ``final-ema``: DINO's
    teacher), each measure of the weights is the student's and its ``ema_`` twin the teacher's:
    ``student test_knn_accuracy 0.6100, teacher 0.6300``. Only the words change: the keys of metrics.jsonl
    and result.json stay ``test_knn_accuracy`` and ``ema_test_knn_accuracy``."""
    numbers = {k: v for k, v in evaluation.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if task is None or task.weights != "final-ema":
        return ", ".join(f"{k} {v:.4f}" for k, v in numbers.items())
    parts = []
    for name, value in numbers.items():
        if name.startswith("ema_") and name[len("ema_") :] in numbers:
            continue  # said beside the student's
        teacher = numbers.get(f"ema_{name}")
        parts.append(f"student {name} {value:.4f}" + (f", teacher {teacher:.4f}" if teacher is not None else ""))
    return ", ".join(parts)


def finite(value: Any) -> Any:
    """JSON has no NaN: a value that is not finite is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value

"""TensorBoard event files of a run and of its probes (``--logger tensorboard``, the default when the
``tensorboard`` package imports; ``--logger none`` writes metrics.jsonl and metrics.csv only).

``RUN/tensorboard/`` holds what metrics.jsonl holds, as TensorBoard scalars written by the
``tensorboard`` package's writer (through :class:`torch.utils.tensorboard.SummaryWriter`):

* every number of a row of kind ``K`` as the scalar ``K/NAME`` at the row's step: ``train/loss``,
  ``train/lr``, ``eval/test_accuracy``, ``eval/test_loss``, ``eval/test_masked_mse``, ... (the row's
  ``seconds`` is left out: each point carries its own wall time);
* for each train row, the throughput over the interval since the previous train row (or since the
  process started or resumed): ``throughput/steps_per_second`` and ``throughput/examples_per_second``
  (global examples: steps times the batch size), wall-clock time, evaluations and checkpoints
  in the interval included.

**Exact resume.** TensorBoard's writer never appends to a file: each process starts a new one. So a
run that starts or resumes from the checkpoint of step ``S`` (:class:`Board`) reads the earlier files
(as TensorBoard does: in order, a purge dropping what came at or after its step), copies the points
at steps up to ``S`` into its new file with their own wall times, after a purge at step 0
(``SessionLog.START``: TensorBoard's Python loader drops everything read before it, so a TensorBoard
already showing the earlier files drops their later points), and removes the earlier files once the
new one holds their points. The folder then holds one file with each step once, for TensorBoard's
Python loader and for its Rust data server alike (which ignores purges), just as metrics.jsonl keeps
only the rows written before the checkpoint. Points are flushed to disk as each row is added; a
folder that cannot take them, from the start (read-only) or during the run (a full disk), stops the
logging with one note, and the run goes on with metrics.jsonl (:class:`Board`).

Probes (:func:`write_probe_curves`): ``probe`` writes the curves of ``probes.png`` beside it, one
scalar per measure and run (``probes/coding_rate/trained``, ``probes/l0_density/untrained``; with
``/encoder`` or ``/decoder`` added when both have the measure), the layer (from 1, as in the figure)
as the step; a new probe into the same folder replaces the earlier file.

Importing this module imports neither torch nor tensorboard; they are imported when used.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ...errors import WorkbenchError
from ...files import naming
from ...settings import LOGGERS

FOLDER = "tensorboard"  # RUN/tensorboard/
INFIX = "tfevents"  # what TensorBoard looks for in a file's name (events.out.tfevents.<time>.<host>.<pid>.<n>)
THROUGHPUT = ("throughput/steps_per_second", "throughput/examples_per_second")
LEFT_OUT = ("step", "kind", "seconds")  # the fields of a metrics row that are not scalars of their own

__all__ = [
    "FOLDER",
    "Board",
    "available",
    "choose",
    "event_files",
    "open_board",
    "probe_curves",
    "read_scalars",
    "write_probe_curves",
]


def available() -> bool:
    """Whether TensorBoard's writer imports (the ``tensorboard`` package is installed)."""
    try:
        import torch.utils.tensorboard  # noqa: F401  (needs the tensorboard package, nothing else)
    except ImportError:
        return False
    return True


def choose(
    logger: str | None, notes: Callable[[str], None] | None = None, error: type[WorkbenchError] = WorkbenchError
) -> str:
    """The logger to use, ``"tensorboard"`` or ``"none"``: ``logger`` as given; ``None`` (not given):
    tensorboard when it imports, else none, with a note. ``--logger tensorboard`` without the package
    raises ``error``."""
    if logger is not None and logger not in LOGGERS:
        raise error(f"--logger {logger}: expected one of: {', '.join(LOGGERS)}")
    if logger == "none":
        return "none"
    if available():
        return "tensorboard"
    if logger == "tensorboard":
        raise error(
            "--logger tensorboard: the tensorboard package is not installed (pip install tensorboard); "
            "or pass --logger none to write metrics.jsonl and metrics.csv only"
        )
    if notes is not None:
        notes(
            "tensorboard is not installed, so no TensorBoard event files are written, only metrics.jsonl and "
            "metrics.csv (pip install tensorboard to have them; --logger none leaves this note out)"
        )
    return "none"


def event_files(folder: Path) -> list[Path]:
    """The event files directly in ``folder``, in the order TensorBoard reads them."""
    if not Path(folder).is_dir():
        return []
    found = [p for p in Path(folder).iterdir() if INFIX in p.name and p.is_file() and not p.name.startswith(".")]
    return sorted(found, key=lambda p: (_first_wall_time(p), p.name))


class Board:
    """The scalars of one run in ``folder`` (``RUN/tensorboard``), kept up to step ``upto`` (the
    checkpoint the run starts from; 0 for a new run) and continued from there (module docstring).
    ``batch_size``: the global batch, for the examples per second.

    TensorBoard's writer writes from a thread of its own. When the folder stops taking its writes
    during the run (a full disk, a folder made read-only), the logging stops with one note to
    ``notes`` (default: printed on stderr) naming the folder and the reason, and the run goes on with
    metrics.jsonl and metrics.csv: no traceback from the writer's thread, no run lost to its logs. So
    does a folder that cannot be written when the board opens (a read-only folder, a file in its place):
    its earlier event files are left as they were."""

    def __init__(
        self, folder: str | Path, *, upto: int, batch_size: int, notes: Callable[[str], None] | None = None
    ) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(folder)
        self.batch_size = batch_size
        self.notes = notes or (lambda note: print(f"note: {note}", file=sys.stderr))
        self.stopped: str | None = None  # why the logging stopped
        self.previous = (upto, 0.0)  # the last train row's step and seconds (counted from this process's start)
        self.writer: Any = None
        self.guard: _Guard | None = None
        self.path = self.folder
        earlier = event_files(self.folder)
        kept = [point for point in _points(earlier) if point[1] <= upto]
        try:
            with naming(self.folder), _quiet_writer_threads():  # its first write, before the guard: raised here
                self.writer = SummaryWriter(str(self.folder), purge_step=0, max_queue=100)
            self.guard = _guard(self.writer)  # the writer thread's failures kept, never raised in the thread
            self.path = next((p for p in event_files(self.folder) if p not in earlier), self.folder)
            with naming(self.path):
                for wall_time, step, tag, value in kept:
                    self.writer.add_scalar(tag, value, step, walltime=wall_time)
                self.writer.flush()
                self._raise_failure()
        except Exception as error:  # noqa: BLE001 (the writer's, or its thread's, whatever it is)
            self._stop(error)  # the earlier files stay as they were
            return
        for path in earlier:  # their points are in the new file now
            path.unlink(missing_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        """The scalars of one metrics row (and, for a train row, the throughput), flushed to disk; once the
        folder stopped taking them, nothing."""
        step, kind = row.get("step"), row.get("kind")
        if self.stopped or not isinstance(step, int) or not isinstance(kind, str):
            return
        try:
            with naming(self.path):
                for name, value in row.items():
                    if name not in LEFT_OUT and _number(value):
                        self.writer.add_scalar(f"{kind}/{name}", float(value), step)
                if kind == "train" and _number(row.get("seconds")):
                    last_step, last_seconds = self.previous
                    elapsed, steps = float(row["seconds"]) - last_seconds, step - last_step
                    if steps > 0 and elapsed > 0:
                        self.writer.add_scalar(THROUGHPUT[0], steps / elapsed, step)
                        self.writer.add_scalar(THROUGHPUT[1], steps * self.batch_size / elapsed, step)
                    self.previous = (step, float(row["seconds"]))
                self.writer.flush()
                self._raise_failure()
        except Exception as error:  # noqa: BLE001 (the writer's, or its thread's, whatever it is)
            self._stop(error)

    def close(self) -> None:
        """Write what is pending and close the file; a failure stops the logging with its note."""
        if self.stopped:
            return
        try:
            with naming(self.path):
                self.writer.close()
                self._raise_failure()
        except Exception as error:  # noqa: BLE001
            self._stop(error)

    def _raise_failure(self) -> None:
        if self.guard is not None and self.guard.error is not None:
            raise self.guard.error

    def _stop(self, error: BaseException) -> None:
        """Stop the logging for the rest of the run, with one note."""
        self.stopped = _reason(error)
        if self.guard is not None:
            self.guard.error = self.guard.error or error  # the thread drops what is still queued
        if self.writer is not None:
            with contextlib.suppress(Exception), _quiet_writer_threads():
                self.writer.close()
        self.notes(
            f"TensorBoard logging stopped: {self.folder} cannot be written ({self.stopped}); the run goes on, "
            "its metrics in metrics.jsonl and metrics.csv"
        )

    def __enter__(self) -> "Board":
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        self.close()


class _Guard:
    """Stands for the record writer of TensorBoard's writer thread: a failed write, flush or close is kept
    (``error``) instead of raised in the thread, which would print a traceback there and stop; after one,
    nothing more is written."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.error: BaseException | None = None

    def _do(self, action: str, *args: Any) -> None:
        if self.error is not None:
            return
        try:
            getattr(self.inner, action)(*args)
        except Exception as error:  # noqa: BLE001 (an OSError, or whatever the file object raises)
            self.error = error

    def write(self, data: bytes) -> None:
        self._do("write", data)

    def flush(self) -> None:
        self._do("flush")

    def close(self) -> None:  # the file is closed even after a failure (a failure here is kept as well)
        try:
            self.inner.close()
        except Exception as error:  # noqa: BLE001
            self.error = self.error or error


@contextlib.contextmanager
def _quiet_writer_threads():
    """While entered, an exception that ends one of TensorBoard's writer threads is not printed by the thread
    (``threading.excepthook``): the thread keeps it (its ``exception``), and the writer raises it in the
    calling thread at its next flush or close, where :class:`Board` makes it one note. Other threads' are
    printed as before. On leaving, the writer threads that failed are waited for (they end at once), so that
    none prints after the hook is restored."""
    import threading

    before = threading.excepthook

    def hook(args: Any) -> None:
        if not _writer_thread(args.thread) or getattr(args.thread, "exception", None) is not args.exc_value:
            before(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        for thread in threading.enumerate():
            if (
                thread is not threading.current_thread()
                and _writer_thread(thread)
                and getattr(thread, "exception", None) is not None
            ):
                thread.join(timeout=5.0)
        threading.excepthook = before


def _writer_thread(thread: Any) -> bool:
    """Whether ``thread`` is a TensorBoard event writer's (which keeps the exception that ends it)."""
    return type(thread).__module__.startswith("tensorboard.") and hasattr(thread, "exception")


def _guard(writer: Any) -> _Guard | None:
    """Put a :class:`_Guard` between ``writer``'s (a ``SummaryWriter``'s) writer thread and its file; None
    where this tensorboard keeps them otherwise (its thread's failure is then found at the next flush)."""
    events = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    queue = getattr(events, "_async_writer", None)
    worker = getattr(queue, "_worker", None)
    inner = getattr(worker, "_record_writer", None)
    if inner is None or getattr(queue, "_writer", None) is not inner:
        return None
    guard = _Guard(inner)
    worker._record_writer = queue._writer = guard
    return guard


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"[Errno {error.errno}] {error.strerror}" if error.errno else error.strerror
    return f"{type(error).__name__}: {error}".splitlines()[0]


def open_board(
    run: str | Path, logger: str | None, upto: int, batch_size: int, notes: Callable[[str], None] | None = None
) -> Board | None:
    """The :class:`Board` of the run folder ``run`` (``RUN/tensorboard``) when ``logger`` is (or,
    not given, picks) tensorboard, kept up to step ``upto``; None for none, which leaves an earlier
    ``RUN/tensorboard`` as it is (with a note: its points after ``upto`` predate this resume)."""
    folder = Path(run) / FOLDER
    if choose(logger, notes) == "tensorboard":
        return Board(folder, upto=upto, batch_size=batch_size, notes=notes)
    if notes is not None and event_files(folder):
        notes(
            f"--logger none: {folder} is left as it was (its points after step {upto:,} predate this resume; "
            "a resume with --logger tensorboard rewrites it)"
        )
    return None


def probe_curves(runs: dict[str, Sequence[dict]]) -> dict[str, list[tuple[int, float]]]:
    """The curves of the probe figure as ``{tag: [(step, value), ...]}``: per run and measure (and
    role, when more than one has the measure), the value after each step against its layer (from
    1), or against its place in the network when the layers do not number the steps (SNR rows)."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for run, rows in runs.items():
        for measure in dict.fromkeys(r["measure"] for r in rows):
            selected = [r for r in rows if r["measure"] == measure]
            roles = list(dict.fromkeys(r["role"] for r in selected))
            for role in roles:
                group = [r for r in selected if r["role"] == role]
                layers = [r["layer"] for r in group]
                by_layer = None not in layers and len(set(layers)) == len(layers)
                steps = [layer + 1 for layer in layers] if by_layer else list(range(1, len(group) + 1))
                tag = f"probes/{measure}/{run}" + (f"/{role}" if len(roles) > 1 else "")
                curves[tag] = [
                    (step, math.nan if r["value"] is None else float(r["value"])) for step, r in zip(steps, group)
                ]
    return curves


def write_probe_curves(folder: str | Path, runs: dict[str, Sequence[dict]]) -> Path:
    """Write :func:`probe_curves` into a new event file in ``folder`` (beside probes.json) and remove
    the earlier ones there once it is written; returns the new file."""
    from torch.utils.tensorboard import SummaryWriter

    folder = Path(folder)
    earlier = event_files(folder)
    with naming(folder):
        writer = SummaryWriter(str(folder), purge_step=0)
    guard = _guard(writer)  # a failed write is raised here, not printed by the writer's thread
    path = next((p for p in event_files(folder) if p not in earlier), folder)
    try:
        with naming(path):
            try:
                for tag, points in probe_curves(runs).items():
                    for step, value in points:
                        writer.add_scalar(tag, value, step)
            finally:
                writer.close()
            if guard is not None and guard.error is not None:
                raise guard.error
    except BaseException:
        if path != folder:
            path.unlink(missing_ok=True)  # never half a file: the earlier one stays
        raise
    for old in earlier:
        old.unlink(missing_ok=True)
    return path


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars the event files in ``folder`` hold, as TensorBoard reads them (purges applied):
    ``{tag: [(step, value), ...]}`` in the order written."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for _, step, tag, value in _points(event_files(Path(folder))):
        scalars.setdefault(tag, []).append((step, value))
    return scalars


# ------------------------------------------------------------------------------------------- reading


def _events(path: Path) -> Iterable[Any]:
    """The events of one file; a last record cut short by a killed writer ends it."""
    from tensorboard.backend.event_processing.event_file_loader import (
        LegacyEventFileLoader,
    )

    try:
        yield from LegacyEventFileLoader(str(path)).Load()
    except Exception:  # a damaged file: what was read before the damage stands  # noqa: BLE001
        return


def _first_wall_time(path: Path) -> float:
    for event in _events(path):
        return event.wall_time
    return math.inf


def _points(files: Iterable[Path]) -> list[tuple[float, int, str, float]]:
    """``(wall time, step, tag, value)`` of every scalar in ``files`` read in order, as TensorBoard's
    loader keeps them: a purge (``SessionLog.START`` at step ``p``) drops the points read before it at
    steps ``>= p``, and a point written again at the same tag and step replaces the earlier one.
    Sorted by step (stably), so that each tag's points rise."""
    from tensorboard.compat.proto.event_pb2 import SessionLog

    found: dict[tuple[str, int], tuple[float, int, str, float]] = {}
    for path in files:
        for event in _events(path):
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                found = {key: point for key, point in found.items() if point[1] < event.step}
            elif event.HasField("summary"):
                for value in event.summary.value:
                    if value.WhichOneof("value") == "simple_value":
                        key = (value.tag, event.step)
                        found.pop(key, None)
                        found[key] = (event.wall_time, event.step, value.tag, value.simple_value)
    return sorted(found.values(), key=lambda point: point[1])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

"""A run's identity: what defines a training run, recorded in ``RUN/run.json`` and checked on resume.

A run is defined by what it learns from and how: the resolved spec (its text, hashed), the task,
the data set (its name and a fingerprint of its contents), the settings that shape the trajectory
(batch, learning rate, weight decay, warm-up, seed, image size, gradient clipping, augmentation,
label smoothing), the package version, and for a fine-tuning run the build it starts from (``init``:
the folder's resolved path and the SHA-256 of its weights file) and what it freezes (``freeze``;
see :mod:`crate_compose.training.finetune`; a run from fresh weights has neither key, so its hash is
the one it always had). Their SHA-256 over canonical JSON is the run's hash.
``--resume`` refuses any difference, naming the field with both values.

Two things may change on resume without making another run:

* ``steps`` may grow once a run is finished (it continues; the cosine schedule then decays to the
  new end from the checkpoint on; the warm-up stays the one the run started with), never shrink;
* the cadence (``eval_every``, ``log_every``, ``checkpoint_every``) changes what is logged and
  saved, not the weights; every change is kept in the record's ``history``.

The logger (``logger``, ``--logger``: TensorBoard event files or none) is no part of the identity at
all (:data:`OUTPUTS`): it says where the metrics are written besides metrics.jsonl, so a run may be
resumed with another one (:mod:`crate_compose.training.run_folder.eventlog`). Nor are the DataLoader's worker
processes (``workers``, ``--workers``; :data:`MACHINERY`): the batches are the same with any number
of them (:mod:`crate_compose.data.batches`), so a run may be resumed with another count.

``run.json``::

    {"format": 1, "hash": "...", "identity": {...}, "steps": 1000,
     "cadence": {"eval_every": 0, "log_every": 10, "checkpoint_every": 0},
     "history": [{"command": "...", "from_step": 0, "steps": 1000, "world": 1, "device": "cpu", "at": "..."}]}

Torch-free; the data fingerprint (:func:`fingerprint`) imports torch when it is called.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...errors import WorkbenchError
from ...files import write_atomic
from ...settings import OPTIONS, Settings

RUN_FILE = "run.json"
TOKENIZER_FILE = "tokenizer.json"  # a text run's vocabulary (its ids' meaning) in Hugging Face's format, for fill
TOKENIZER_RECORD = (
    "tokenizer.record.json"  # and fine-tuning; its record beside it (crate_compose.data.text_sets.tokens)
)
FORMAT = 1
# what each setting is to a run, from its declaration (crate_compose.options.Option.role)
CADENCE = tuple(name for name, one in OPTIONS.items() if one.role == "cadence")  # what is logged and saved
EXTENDABLE = tuple(name for name, one in OPTIONS.items() if one.role == "length")  # may grow once finished
MACHINERY = tuple(name for name, one in OPTIONS.items() if one.role == "machinery")  # how fast, never what
OUTPUTS = tuple(name for name, one in OPTIONS.items() if one.role == "output")  # where the metrics also go
# settings added after runs were first recorded: at their default they are left out of a run's identity,
# so a run recorded before them resumes (its run.json has no such key) and means the same run
LATER = {name: one.default for name, one in OPTIONS.items() if one.later}


def learned(settings: Settings, leave: tuple[str, ...] = ()) -> dict[str, Any]:
    """The settings that shape what a run learns (not its cadence, steps, machinery or outputs, nor
    ``leave``), a later setting at its default left out (:data:`LATER`), and the task's own options as given
    (those at their default are left out when the run is described: :func:`..description.describe`)."""
    general = {
        k: v
        for k, v in asdict(settings).items()
        if k in OPTIONS and OPTIONS[k].role == "learned" and k not in leave and not (k in LATER and v == LATER[k])
    }
    return {**general, **settings.options}


STARTS = ("init", "freeze")  # a fine-tuning run's own keys of its identity (absent otherwise)
MAX_RECORD_BYTES = 4_000_000  # a record is a few kB; its history grows by one line per resume
# What a run folder may hold: its own files, the lock, temporary siblings ('.NAME.*')
OWN = frozenset(
    {
        RUN_FILE,
        ".lock",
        "spec.yaml",
        "metrics.jsonl",
        "metrics.csv",
        "result.json",
        "checkpoints",
        "final",
        "final-ema",
        "probes",
        "superseded",
        "recipe.yaml",
        "tensorboard",
        TOKENIZER_FILE,
        TOKENIZER_RECORD,
        "launch",
    }
)  # launch/: a launcher's record of how the run was started (crate_compose.launch.jobs)


class RunMismatch(WorkbenchError):
    """``--resume`` with something that would make another run; the message lists every difference."""


class RunRecordError(WorkbenchError):
    """A ``run.json`` that cannot be trusted (not JSON, edited, of another format)."""


def warmup_of(settings: Settings) -> int:
    """The warm-up steps a run uses: ``settings.warmup``, or 5% of the steps (at least 1)."""
    return settings.warmup if settings.warmup is not None else max(1, settings.steps // 20)


def identity(
    spec_text: str,
    spec_name: str,
    settings: Settings,
    data_print: str,
    version: str,
    start: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What defines a run (see the module docstring); ``settings.warmup`` must be resolved; ``start``:
    a fine-tuning run's ``init`` and ``freeze`` (:func:`crate_compose.training.finetune.start_identity`)."""
    trajectory = learned(settings, ("task", "data"))
    return {
        "spec": {"name": spec_name, "sha256": hashlib.sha256(spec_text.encode()).hexdigest()},
        "task": settings.task,
        "data": {"name": settings.data, "fingerprint": data_print},
        "settings": trajectory,
        "version": version,
        **{k: v for k, v in (start or {}).items() if k in STARTS},
    }


def digest(value: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Record:
    """The content of ``run.json``."""

    identity: dict[str, Any]
    steps: int
    cadence: dict[str, int]
    history: list[dict[str, Any]] = field(default_factory=list)
    hash: str = ""
    format: int = FORMAT

    def __post_init__(self) -> None:
        self.hash = self.hash or digest(self.identity)

    def settings(self) -> dict[str, Any]:
        """The run's settings as :class:`Settings` fields (for options not given on resume)."""
        return {
            "task": self.identity["task"],
            "data": self.identity["data"]["name"],
            "steps": self.steps,
            **self.identity["settings"],
            **self.cadence,
        }

    def start(self) -> tuple[str | None, str]:
        """The build the run started from (its recorded path, or None) and what it freezes."""
        init = self.identity.get("init")
        return (init.get("path") if isinstance(init, dict) else None), self.identity.get("freeze", "none")


def new_record(identity_: dict[str, Any], settings: Settings) -> Record:
    return Record(identity_, settings.steps, {k: getattr(settings, k) for k in CADENCE})


def note_start(record: Record, from_step: int, world: int, device: str) -> None:
    """Append this invocation to the record's history."""
    record.history.append(
        {
            "command": shlex.join(sys.argv),
            "from_step": from_step,
            "steps": record.steps,
            **record.cadence,
            "world": world,
            "device": device,
            "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    )


def write(run: Path, record: Record) -> None:
    write_atomic(run / RUN_FILE, json.dumps(asdict(record), indent=2) + "\n")


def read(run: Path) -> Record | None:
    """The record of ``run``, or None when there is none; :class:`RunRecordError` when it cannot be trusted."""
    path = run / RUN_FILE
    if not path.exists():
        return None
    where = f"{path}"
    try:
        if not path.is_file():
            raise RunRecordError(f"{where} is not a regular file")
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise RunRecordError(f"{where} is {path.stat().st_size:,} bytes; a run record is a few kB")
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise RunRecordError(f"{where} cannot be read ({reason})") from None
    try:
        record = Record(**content)
        problem = _record_problem(record)
    except TypeError as error:
        problem = f"not a run record ({error})"
    if problem:
        raise RunRecordError(
            f"{where}: {problem}; the run cannot be checked, so it is not resumed "
            "(restore the file, or start a new run with another --out)"
        )
    return record


def _record_problem(record: Record) -> str:
    if record.format != FORMAT:
        return f"format {record.format!r}, this crate-compose reads format {FORMAT}"
    if not isinstance(record.identity, dict) or not isinstance(record.cadence, dict):
        return "identity and cadence must be mappings"
    if not isinstance(record.steps, int) or isinstance(record.steps, bool) or record.steps < 1:
        return f"steps is {record.steps!r}, not a positive whole number"
    if record.hash != digest(record.identity):
        return "its identity does not match its hash (the file was edited)"
    keys = {"spec", "task", "data", "settings", "version"}
    if not keys <= set(record.identity) <= keys | set(STARTS) or not isinstance(record.identity.get("settings"), dict):
        return f"its identity must have exactly the keys {sorted(keys)} (and {' or '.join(STARTS)} when fine-tuned)"
    init = record.identity.get("init", {"path": "", "sha256": ""})
    if not (isinstance(init, dict) and all(isinstance(init.get(k), str) for k in ("path", "sha256"))) or not isinstance(
        record.identity.get("freeze", "none"), str
    ):
        return "its init must give a path and a sha256, and its freeze a name"
    if set(record.cadence) != set(CADENCE) or not all(_whole(v) for v in record.cadence.values()):
        return f"cadence must give whole numbers >= 0 for {', '.join(CADENCE)}"
    return ""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _with_later(identity: dict[str, Any]) -> dict[str, Any]:
    """An identity with the later settings it leaves out at their defaults written in (for messages)."""
    from ... import tasks

    settings = identity.get("settings")
    later = {**LATER, **{name: one.default for name, one in tasks.task_options().items()}}  # a task option too
    return {**identity, "settings": {**later, **settings}} if isinstance(settings, dict) else identity


def differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, recorded value, value now)`` for every field of two identities that differs."""
    a, b = _flat(_with_later(recorded)), _flat(_with_later(now))
    return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def spec_difference(recorded_text: str, now_text: str, shown: int = 3) -> str:
    """The lines where two resolved specs differ (``name:`` left out when anything else differs):
    ``line 23: 'primitive: ista' in the run, 'primitive: ista_soft' now``."""
    old, new = recorded_text.splitlines(), now_text.splitlines()
    changes = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        for k in range(max(i2 - i1, j2 - j1) if tag != "equal" else 0):
            before = old[i1 + k].strip() if i1 + k < i2 else "(nothing)"
            after = new[j1 + k].strip() if j1 + k < j2 else "(nothing)"
            changes.append((i1 + k + 1, before, after))
    said = ("name:", "description:")  # the variant's name and description repeat what the other lines say
    named = [
        c for c in changes if not (c[1].startswith(said) or c[2].startswith(said)) and _short(c[1]) != _short(c[2])
    ] or changes  # a line that reads the same when shortened says nothing
    if not named:
        return "the texts are equal"
    more = f", and {len(named) - shown} more" if len(named) > shown else ""
    return "; ".join(f"line {line}: {_short(a)!r} in the run, {_short(b)!r} now" for line, a, b in named[:shown]) + more


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def mismatch_message(run: Path, changes: list[tuple[str, Any, Any]], spec_detail: str) -> str:
    """One message for every difference between a run and what ``--resume`` was given."""
    parts = []
    said_init = False
    for key, old, new in changes:
        if key == "spec.name" and any(k == "spec.sha256" for k, _, _ in changes):
            continue  # the name is a line of the spec: said with the rest
        if key.startswith("init."):
            if not said_init:
                parts.append(_init_difference(changes))
                said_init = True
        elif key == "freeze":
            parts.append(f"--freeze: {old or 'none'} in the run, {new or 'none'} now")
        elif key == "spec.sha256":
            parts.append(f"the spec differs ({spec_detail})")
        elif key == "data.fingerprint":
            parts.append("the data's contents differ from what the run trained on")
        else:
            parts.append(f"{key}: {_show(old)} in the run, {_show(new)} now")
    again = (
        (
            f" (to continue the run, give the spec and --set it was started with, or its own spec: train "
            f"{run / 'spec.yaml'} --out {run} --resume)"
        )
        if any(k == "spec.sha256" for k, _, _ in changes)
        else ""
    )
    return (
        f"--resume: {run} is another run: "
        + "; ".join(parts)
        + f". A resumed run must be the same run{again}; to train this one, start a new run with another --out"
    )


def _init_difference(changes: list[tuple[str, Any, Any]]) -> str:
    """The build a fine-tuning run started from against the one given now, in one phrase."""
    old = {key: a for key, a, _ in changes if key.startswith("init.")}
    new = {key: b for key, _, b in changes if key.startswith("init.")}
    path_then, path_now = old.get("init.path"), new.get("init.path")
    if "init.path" in old and (path_then is None or path_now is None or path_then != path_now):
        weights = " (and its weights differ)" if path_then and path_now and "init.sha256" in old else ""
        return f"--init: {path_then or 'none'} in the run, {path_now or 'none'} now{weights}"
    sha_then, sha_now = old.get("init.sha256"), new.get("init.sha256")
    return (
        f"--init: the weights of the build the run started from have changed since (model.safetensors: "
        f"sha256 {str(sha_then)[:12]}... in the run, {str(sha_now)[:12]}... now)"
    )


def _show(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    return json.dumps(value) if not isinstance(value, str) else value


def foreign_entries(run: Path) -> list[str]:
    """Entries of ``run`` that no run writes (a user's own files)."""
    if not run.is_dir():
        return []
    return sorted(e.name for e in run.iterdir() if e.name not in OWN and not _temporary(e.name))


def _temporary(name: str) -> bool:
    """A sibling a writer stages under (``.final.x1y2``, ``.metrics.jsonl.x1y2.partial``)."""
    return any(name.startswith(f".{own}.") for own in OWN)

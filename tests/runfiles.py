"""What the run tests compare: a folder's files by hash, a run's training losses."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from crate_compose.training.run_folder import locks


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` except the lock (its holder is rewritten by each writer)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != locks.LOCK_FILE
    }


def train_losses(run: Path) -> dict[int, float]:
    """The training loss of each step of a run, from its metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "train"}

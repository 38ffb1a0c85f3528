"""Writing files so that a reader never sees half of one: a temporary sibling, then a rename.

Used by every output of the tool (build folders, diagrams, derived specs, metrics, probe tables and
figures, ablation results). Files get the permissions an ordinary file gets under the umask (a
temporary file is created private).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def publish(path: Path, mode: int) -> None:
    """Give ``path`` the permissions an ordinary file or directory gets under the umask."""
    mask = os.umask(0)
    os.umask(mask)
    path.chmod(mode & ~mask)


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` (text or bytes) to ``path`` through a temporary sibling: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with open(handle, "wb" if isinstance(content, bytes) else "w") as file:
            file.write(content)
        publish(Path(staging), 0o666)  # mkstemp makes it private
        Path(staging).replace(path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise

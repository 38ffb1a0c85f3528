"""One writer per folder: an advisory lock that the operating system releases on any exit.

``train``, ``ablate`` and ``probe`` hold ``FOLDER/.lock`` (``fcntl.flock``, exclusive, never
blocking) while they write into a folder. A second writer is refused at once with a message
naming the holder (its process id, host, command and start time, which the holder writes into
the lock file). The kernel drops the lock when the holder's file is closed, so a writer killed
with SIGKILL, or a machine that lost power, leaves no stale lock: the ``.lock`` file itself may
stay and is harmless.

Torch-free; only the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from ..errors import WorkbenchError

LOCK_FILE = ".lock"


class FolderBusy(WorkbenchError):
    """Another process is writing into the folder (the CLI exits with status 3)."""

    exit_status = 3


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": shlex.join(sys.argv),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _describe(path: Path) -> str:
    try:
        holder = json.loads(path.read_text(errors="replace") or "{}")
    except (OSError, ValueError):
        holder = {}
    if not isinstance(holder, dict) or "pid" not in holder:
        return "another process"
    command = str(holder.get("command", ""))
    command = command if len(command) <= 120 else command[:117] + "..."
    return (f"process {holder.get('pid')} on {holder.get('host', '?')} ({command}, since {holder.get('since', '?')})")


@contextlib.contextmanager
def hold(folder: str | Path, what: str = "write into") -> Iterator[Path]:
    """Hold ``folder``'s lock (creating the folder) for the ``with`` block; raise :class:`FolderBusy`
    naming the other process when it is held. Yields the folder."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise WorkbenchError(f"{folder} exists and is not a folder: give a folder to {what}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise WorkbenchError(f"{path} is a symbolic link: refusing to lock through it") from None
        raise
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusy(f"{folder} is in use by {_describe(path)}: wait for it to finish or stop it, "
                             f"or choose another folder") from None
        with contextlib.suppress(OSError):  # who holds it, for the message a second writer gets
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, json.dumps(_holder()).encode(), 0)
        yield folder
    finally:
        os.close(descriptor)  # releases the lock

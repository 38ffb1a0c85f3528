"""One writer per folder: an advisory lock that the operating system releases on any exit.

``train``, ``ablate`` and ``probe`` hold ``FOLDER/.lock`` (``fcntl.flock``, exclusive, never
blocking) while they write into a folder. A second writer is refused at once with a message
naming the holder (its process id, host, command and start time, and its SLURM job, which the holder
writes into the lock file). The kernel drops the lock when the holder's file is closed, so a writer
killed with SIGKILL leaves no stale lock: the ``.lock`` file itself may stay and is harmless. On a
shared filesystem a lock can outlive its holder (a node that died, a server that has not noticed
yet); a lock whose holder is known to be gone is *stale*, named and taken over (:func:`stale`): its
process no longer exists on this host, or it is an earlier run of this very SLURM job (requeued: the
same job id, a lower restart count), or SLURM no longer runs its job. A live holder still wins. A command that fails (a full disk, a refusal) while its folder holds nothing
but the lock removes what taking the lock created: the lock file, the folder, its new parents.

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

from ...errors import OutputError, WorkbenchError

LOCK_FILE = ".lock"


class FolderBusy(WorkbenchError):
    """Another process is writing into the folder (the CLI exits with status 3)."""

    exit_status = 3


def _holder() -> dict:
    from ..world import slurm_job

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join(sys.argv),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        **slurm_job(),
    }


def _recorded(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text(errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def stale(holder: dict) -> str | None:
    """Why the lock ``holder`` recorded is known to be held by nobody alive, or None (a live holder, or one
    that cannot be told from here)."""
    from ..world import alive, slurm_job

    pid, host = holder.get("pid"), holder.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and pid > 0 and not alive(pid):
        return f"its process {pid} on {host} is gone"
    job, mine = holder.get("job"), slurm_job()
    if not isinstance(job, str):
        return None
    if mine.get("job") == job and isinstance(holder.get("restart"), int) and mine["restart"] > holder["restart"]:
        return (
            f"it is SLURM job {job} before its requeue (restart {holder['restart']}; this is restart {mine['restart']})"
        )
    if mine.get("job") != job and not _slurm_runs(job):
        return f"SLURM no longer runs its job {job}"
    return None


def _slurm_runs(job: str) -> bool:
    """Whether SLURM still runs (or holds) ``job``; True when it cannot be asked (no squeue, no answer)."""
    import shutil
    import subprocess

    if shutil.which("squeue") is None:
        return True
    try:
        found = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if found.returncode != 0:
        return "Invalid job id" not in found.stderr  # an id SLURM forgot: long gone
    return bool(found.stdout.strip()) and found.stdout.split()[0] not in (
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
    )


def _describe(holder: dict) -> str:
    if "pid" not in holder:
        return "another process"
    command = str(holder.get("command", ""))
    command = command if len(command) <= 120 else command[:117] + "..."
    job = f", SLURM job {holder['job']}" if holder.get("job") else ""
    return (
        f"process {holder.get('pid')} on {holder.get('host', '?')} ({command}, since {holder.get('since', '?')}{job})"
    )


@contextlib.contextmanager
def hold(folder: str | Path, what: str = "write into") -> Iterator[Path]:
    """Hold ``folder``'s lock (creating the folder) for the ``with`` block; raise :class:`FolderBusy`
    naming the other process when it is held. Yields the folder.

    When the block fails (a full disk, a refusal, Ctrl-C) and the folder holds nothing but the lock,
    what this call created goes again: the lock file, and the folder and the parents it made. A folder
    that existed before, or that holds anything else, is left as it is."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder} exists and is not a folder: give a folder to {what}")
    made = _make(folder)
    path = folder / LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    created = False
    try:
        try:
            descriptor = os.open(path, flags | os.O_EXCL, 0o644)
            created = True
        except FileExistsError:
            descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        _undo(folder, made, created)
        if error.errno == errno.ELOOP:
            raise WorkbenchError(f"{path} is a symbolic link: refusing to lock through it") from None
        raise
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            descriptor = _take_over(folder, path, descriptor, flags)
        with contextlib.suppress(OSError):  # who holds it, for the message a second writer gets
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, json.dumps(_holder()).encode(), 0)
        try:
            yield folder
        except BaseException:
            _undo(folder, made, created)  # still locked: nobody else writes there meanwhile
            raise
    finally:
        os.close(descriptor)  # releases the lock


def _take_over(folder: Path, path: Path, descriptor: int, flags: int) -> int:
    """The lock of a holder known to be gone (:func:`stale`), taken over: its file replaced by a new one, locked
    here (the old holder, were it alive after all, holds a file nobody opens again); FolderBusy otherwise."""
    holder = _recorded(path)
    reason = stale(holder)
    if reason is None:
        raise FolderBusy(
            f"{folder} is in use by {_describe(holder)}: wait for it to finish or stop it, or choose another folder"
        )
    print(f"note: {folder}'s lock was held by {_describe(holder)}, and {reason}: taking it over", file=sys.stderr)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    try:
        taken = os.open(path, flags | os.O_EXCL, 0o644)
    except FileExistsError:  # another successor was first
        raise FolderBusy(
            f"{folder} is in use by {_describe(_recorded(path))}: wait for it to finish or stop it, "
            "or choose another folder"
        ) from None
    try:
        fcntl.flock(taken, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(taken)
        raise FolderBusy(
            f"{folder} is in use by {_describe(_recorded(path))}: wait for it to finish or stop it, "
            "or choose another folder"
        ) from None
    os.close(descriptor)
    return taken


def _make(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the ones this call made, deepest first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing  # made here, or by another process at the same moment: removed only when empty


def _undo(folder: Path, made: list[Path], created: bool) -> None:
    """After a failure: the lock file this call created, when the folder holds nothing else, and then the
    folders it made, each only while it is empty (``rmdir``: never a file, never a folder in use)."""
    try:
        alone = [entry.name for entry in folder.iterdir()] == [LOCK_FILE]
    except OSError:  # gone already (a run removed its folder), or unreadable
        alone = False
    if created and alone:
        with contextlib.suppress(OSError):
            (folder / LOCK_FILE).unlink()
    for place in made:
        try:
            place.rmdir()
        except FileNotFoundError:  # removed already (train removes a run folder it made)
            continue
        except OSError:  # not empty: someone else's files, a run that started; and so are the folders above
            break

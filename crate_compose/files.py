"""Writing files so that a reader never sees half of one: a temporary sibling, then a rename.

Used by every output of the tool (build folders, checkpoints, diagrams, derived specs, metrics,
probe tables and figures, ablation results). A file is written under a temporary name beside its
destination, flushed to disk, then renamed over it; a folder (a build, a checkpoint) is filled
under a temporary name and then exchanged with the old one in one step (``renameat2`` with
``RENAME_EXCHANGE`` on Linux; elsewhere two renames). A writer killed at any moment leaves the
old output or the new one, never a mix, plus at worst a temporary ``.NAME.*`` sibling.

A destination that exists and is not a regular file (a device such as ``/dev/full``, a FIFO, a
socket) is refused rather than replaced. Files get the permissions an ordinary file gets under
the umask (a temporary file is created private).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def publish(path: Path, mode: int) -> None:
    """Give ``path`` the permissions an ordinary file or directory gets under the umask."""
    mask = os.umask(0)
    os.umask(mask)
    path.chmod(mode & ~mask)


def writable(path: Path, *, folder: bool = False) -> None:
    """Raise ``OSError`` when ``path`` exists as something other than what will replace it
    (a regular file, or a folder when ``folder``): an output never replaces a device or a FIFO."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return
    if (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        return
    kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
    raise OSError(f"{path} is {kind}: give the path of a {'folder' if folder else 'file'} to write")


@contextlib.contextmanager
def staged(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write (by any writer: safetensors, Graphviz,
    matplotlib); on success it is flushed and renamed to ``path``, on failure removed."""
    path = Path(path)
    writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".partial", dir=path.parent)
    os.close(handle)
    staging = Path(name)
    try:
        yield staging
        _flush(staging)
        publish(staging, 0o666)  # mkstemp makes it private
        staging.replace(path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` (text or bytes) to ``path`` through a temporary sibling: never a half-written file."""
    with staged(path) as staging:
        staging.write_bytes(content if isinstance(content, bytes) else content.encode())


def save_tensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` as safetensors at ``path`` through a temporary sibling. safetensors reports a
    failed write as its own error type; it is raised as the ``OSError`` it is (ENOSPC for a full disk,
    EROFS for a read-only one), naming ``path``."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    path = Path(path)
    with staged(path) as staging:
        try:
            save_file(tensors, staging, metadata=metadata)
        except SafetensorError as error:
            raise _os_error(str(error), path) from None


def _os_error(message: str, path: Path) -> OSError:
    """The OSError a library's message describes (``... Os { code: 28, ... }``), naming ``path``."""
    import errno
    import re

    found = re.search(r"code: (\d+)", message)
    number = int(found.group(1)) if found else (errno.ENOSPC if "No space left" in message else errno.EIO)
    return OSError(number, os.strerror(number), str(path))


def _flush(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def replace_folder(staging: Path, folder: Path) -> None:
    """Put the filled folder ``staging`` at ``folder``, exchanging it with an old one in one step."""
    for entry in staging.iterdir():
        if entry.is_file():
            _flush(entry)
    if not folder.exists():
        staging.rename(folder)
        return
    writable(folder, folder=True)
    if not _exchange(staging, folder):  # no renameat2: move the old one aside, then the new one in
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name[:100]}.", suffix=".old", dir=folder.parent))
        aside.rmdir()
        folder.rename(aside)
        staging.rename(folder)
        staging = aside
    shutil.rmtree(staging, ignore_errors=True)  # now the old contents


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    libc = _libc()
    if libc is None or not hasattr(libc, "renameat2"):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    error = ctypes.get_errno()
    if error in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this file system cannot exchange
        return False
    raise OSError(error, os.strerror(error), str(b))

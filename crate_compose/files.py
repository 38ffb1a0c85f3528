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

A write that fails (a full disk, ENOSPC; a read-only folder, EROFS; EACCES) raises an ``OSError``
that names the output, not the temporary name (:func:`naming`; safetensors' own error type is
turned into the ``OSError`` it reports), after removing the temporary file or folder: the old
output is left as it was.

Every input file a command reads whole (a tarball, a data cache, a run's ``tokenizer.json``, a hub's
``config.json``) is read by :func:`read_input` or :func:`read_json`: a regular file (never a FIFO, a
device or a folder, refused before it is opened), at most a given size, JSON nested at most a given
depth; a file that fails a check raises the caller's error class (a ``WorkbenchError``: exit status 2)
with a message naming what the file is and its path.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import DataError, WorkbenchError

# the default output folders, each under the working directory and named after the spec: a run's (train),
# an ablation's (ablate) and a build's (build, import, fetch)
RUNS, ABLATIONS, BUILDS = Path("runs"), Path("ablations"), Path("out")
KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


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
    if stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode):
        return
    kind = KINDS.get(stat.S_IFMT(mode), "not a regular file")
    raise OSError(f"{path} is {kind}: give the path of a {'folder' if folder else 'file'} to write")


@contextlib.contextmanager
def staged(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write (by any writer: safetensors, Graphviz,
    matplotlib); on success it is flushed and renamed to ``path``, on failure removed. An ``OSError``
    on the way (a full disk, a read-only folder) names ``path`` (:func:`naming`)."""
    path = Path(path)
    staging = _temporary(path)
    try:
        with naming(path, staging):
            yield staging
            _ready(staging)
            staging.replace(path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _temporary(path: Path) -> Path:
    """A new, empty temporary sibling of ``path`` (which must be writable); an error names ``path``."""
    writable(path)
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".partial", dir=path.parent)
    os.close(handle)
    return Path(name)


def _ready(staging: Path) -> None:
    """A written temporary file flushed to disk, with the permissions of an ordinary file."""
    _flush(staging)
    publish(staging, 0o666)  # mkstemp makes it private


@contextlib.contextmanager
def staged_folder(folder: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill in place of ``folder`` (a build, a checkpoint); on
    success its files get the permissions ordinary files get and it replaces ``folder`` in one step
    (:func:`replace_folder`), on failure it is removed. An ``OSError`` names the file it met at its
    place in ``folder`` (``[Errno 28] No space left on device: 'out/x/model.safetensors'``), not at
    the temporary name, so write the files by :func:`write_atomic` or :func:`save_tensors`, which name
    the file they write."""
    folder = Path(folder)
    with naming(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name[:100]}.", suffix=".partial", dir=folder.parent))
    try:
        with naming(folder, staging):
            yield staging
            publish(staging, 0o777)  # mkdtemp (and safetensors) make private files
            for entry in staging.iterdir():
                publish(entry, 0o666)
            replace_folder(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def naming(path: str | Path, staging: str | Path | None = None) -> Iterator[None]:
    """Raise an ``OSError`` of the block as one that names what was being written: its errno and
    reason, and ``path`` instead of no name (``write`` gives none) or a temporary one. With
    ``staging`` (a temporary file or folder that stands for ``path``), a name inside it is given at its
    place in ``path``; without, every name is ``path``. safetensors' report of a failed write
    (``SafetensorError: ... No space left on device (os error 28)``) becomes the ``OSError`` it is.
    An ``OSError`` without an errno (a message of ours, :func:`writable`) is left as it is."""
    try:
        yield
    except OSError as error:
        if error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, _named(error.filename, Path(path), staging)) from None
    except Exception as error:
        number = _errno_of(str(error)) if _is_safetensors_error(error) else None
        if number is None:
            raise
        raise OSError(number, os.strerror(number), _named(None, Path(path), staging)) from None


def _named(filename: str | bytes | None, path: Path, staging: str | Path | None) -> str:
    """The name an error reports: ``filename`` with the ``staging`` prefix put back to ``path``."""
    if staging is None or filename is None:
        return str(path)
    filename, staging = os.fsdecode(filename), str(staging)
    if filename == staging or filename.startswith(staging + os.sep):
        return str(path) + filename[len(staging) :]
    return filename


def _is_safetensors_error(error: BaseException) -> bool:
    module = sys.modules.get("safetensors")  # not loaded: the error cannot be one of its
    kind = getattr(module, "SafetensorError", None)
    return kind is not None and isinstance(error, kind)


def _errno_of(message: str) -> int | None:
    """The errno a library's message reports (``(os error 28)``, ``Os { code: 28, ... }``, or the
    reason's words), or None when it reports no failed system call."""
    found = re.search(r"\(os error (\d+)\)|code: (\d+)", message)
    if found:
        return int(found.group(1) or found.group(2))
    words = {
        "No space left": errno.ENOSPC,
        "Read-only file system": errno.EROFS,
        "Permission denied": errno.EACCES,
        "Disk quota exceeded": errno.EDQUOT,
    }
    return next(
        (number for text, number in words.items() if text in message), errno.EIO if "I/O error" in message else None
    )


def write_atomic(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` (text or bytes) to ``path`` through a temporary sibling: never a half-written file."""
    write_together({Path(path): content})


def write_together(contents: dict[Path, str | bytes]) -> list[Path]:
    """Write several files (``{path: text or bytes}``) so that either all of them are new or none is
    (a table and its figure): each is written to a temporary sibling and flushed, and only when all
    are written are they renamed into place, which needs no disk space. A failure before that (a full
    disk) names the file it met (:func:`naming`), removes every temporary file and leaves every old
    file as it was. Returns the paths."""
    paths = [Path(path) for path in contents]
    stagings: list[Path] = []
    try:
        for path, content in zip(paths, contents.values()):
            stagings.append(_temporary(path))
            with naming(path, stagings[-1]):
                stagings[-1].write_bytes(content if isinstance(content, bytes) else content.encode())
                _ready(stagings[-1])
        for path, staging in zip(paths, stagings):
            with naming(path, staging):
                staging.replace(path)
    except BaseException:
        for staging in stagings:
            staging.unlink(missing_ok=True)
        raise
    return paths


def save_tensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` as safetensors at ``path`` through a temporary sibling. safetensors reports a
    failed write as its own error type; it is raised as the ``OSError`` it is (ENOSPC for a full disk,
    EROFS for a read-only one), naming ``path`` (:func:`naming`)."""
    from safetensors.torch import save_file

    with staged(path) as staging:
        save_file(tensors, staging, metadata=metadata)


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
        try:
            staging.rename(folder)
        except BaseException:
            aside.rename(folder)  # the old one back: an earlier output stays intact
            raise
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


def sha256_of(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks (a checkpoint may be gigabytes)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- reading an input file

MAX_JSON_DEPTH = 64  # nesting of a JSON input file (a tokenizer's is 5 deep, a hub's config.json 3 or 4)


def read_input(path: str | Path, *, limit: int, what: str, error: type[WorkbenchError] = DataError) -> bytes:
    """The bytes of the input file ``path``, read by one guarded way: a regular file (a FIFO, a device, a
    folder or a link to nothing is refused before it is opened, so nothing blocks or reads forever) of at
    most ``limit`` bytes (refused from its size, and read no further than ``limit`` bytes whatever it says).
    A file that fails is raised as ``error`` (a :class:`WorkbenchError`), its message
    ``WHAT PATH: PROBLEM``, ``what`` saying what the file is (``the run's tokenizer``)."""
    path = Path(path)
    where = f"{what} {path}"
    try:
        found = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise error(f"{where}: a link to nothing ({os.readlink(path)})") from None
        raise error(f"{where}: no such file") from None
    except OSError as failure:
        raise error(f"{where}: cannot be read ({failure.strerror or failure})") from None
    _check_input(found, where, limit, error)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        handle = os.open(path, flags)
    except OSError as failure:
        raise error(f"{where}: cannot be read ({failure.strerror or failure})") from None
    try:
        _check_input(os.fstat(handle), where, limit, error)  # the file opened is the one checked
        blocks, count = [], 0
        while count <= limit:
            block = os.read(handle, min(1 << 20, limit + 1 - count))
            if not block:
                break
            blocks.append(block)
            count += len(block)
    except OSError as failure:
        raise error(f"{where}: cannot be read ({failure.strerror or failure})") from None
    finally:
        os.close(handle)
    if count > limit:  # a file that says it is smaller than it is (/proc)
        raise error(f"{where}: more than the {limit:,} bytes it may hold")
    return b"".join(blocks)


def _check_input(found: os.stat_result, where: str, limit: int, error: type[WorkbenchError]) -> None:
    if not stat.S_ISREG(found.st_mode):
        kind = KINDS.get(stat.S_IFMT(found.st_mode), "not a regular file")
        raise error(f"{where}: {kind}, not a file")
    if found.st_size > limit:
        raise error(f"{where}: {found.st_size:,} bytes, more than the {limit:,} it may hold")


def read_json(
    path: str | Path, *, limit: int, what: str, depth: int = MAX_JSON_DEPTH, error: type[WorkbenchError] = DataError
) -> Any:
    """The JSON value of the input file ``path`` (:func:`read_input`), which must be UTF-8 and nested at most
    ``depth`` arrays or objects deep (a deeper file, which would exhaust the decoder's recursion, is
    refused). Every refusal is raised as ``error``, naming ``what`` and ``path``."""
    data = read_input(path, limit=limit, what=what, error=error)
    where = f"{what} {path}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as failure:
        raise error(f"{where}: not UTF-8 (byte 0x{data[failure.start]:02x} at offset {failure.start:,})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{where}: nested too deeply to read (more than {depth} levels)") from None
    except ValueError as failure:
        raise error(f"{where}: not JSON ({failure})") from None
    if json_depth(value) > depth:
        raise error(f"{where}: nested {json_depth(value)} levels deep, more than {depth}")
    return value


def json_depth(value: Any) -> int:
    """How many arrays or objects deep ``value`` nests (0 for a number or a string), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest

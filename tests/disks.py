"""A small disk for tests of full and read-only disks: a real tmpfs where mounting is permitted,
else the failures injected where the operating system would report them (tests/test_full_disk.py,
tests/runtime/harness.py)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path


class Disk:
    """A folder on a small disk that can be filled up (``leave``) and made read-only (``read_only``):
    a real tmpfs, or (``real`` false) failures injected where the operating system would report them:
    ``write_bytes``, safetensors' ``save_file``, ``os.open``, temporary files and ``shutil.disk_usage``."""

    def __init__(self, folder: Path, monkeypatch, real: bool) -> None:
        self.folder, self.monkeypatch, self.real = folder, monkeypatch, real
        self.room: float = float("inf")
        self.frozen = False
        if not real:
            self._inject()

    def leave(self, room: int) -> None:
        """Fill the disk up to ``room`` free bytes."""
        if self.real:
            vfs = os.statvfs(self.folder)
            free = vfs.f_bavail * vfs.f_frsize
            with open(self.folder / "filler", "wb") as handle:
                try:
                    handle.write(b"\0" * max(0, free - room))
                except OSError:
                    pass
        else:
            self.room = room

    def read_only(self) -> None:
        if self.real:
            subprocess.run(["mount", "-o", "remount,ro", str(self.folder)], check=True, capture_output=True)
        else:
            self.frozen = True

    def temporary_files(self) -> list[str]:
        """What a writer left behind: hidden names other than a folder's lock."""
        return [str(p) for p in self.folder.rglob(".*") if p.name != ".lock"]

    def _inside(self, path) -> bool:
        return Path(os.path.abspath(os.fsdecode(path))).is_relative_to(self.folder)

    def _inject(self) -> None:
        import tempfile

        import safetensors.torch
        from safetensors import SafetensorError

        disk = self
        write_bytes, save_file = Path.write_bytes, safetensors.torch.save_file
        mkstemp, mkdtemp, real_open, disk_usage = tempfile.mkstemp, tempfile.mkdtemp, os.open, shutil.disk_usage

        def full(self, data):  # as write(2) reports it: no file name
            if disk._inside(self):
                if disk.frozen or len(data) > disk.room:
                    number = errno.EROFS if disk.frozen else errno.ENOSPC
                    raise OSError(number, os.strerror(number))
                disk.room -= len(data)
            return write_bytes(self, data)

        def tensors(tensors, path, *args, **kwargs):  # as safetensors reports it
            if disk._inside(path):
                size = sum(t.numel() * t.element_size() for t in tensors.values())
                if size > disk.room:
                    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
                disk.room -= size
            return save_file(tensors, path, *args, **kwargs)

        def usage(path):  # what statvfs would say of a disk with ``room`` bytes left
            found = disk_usage(path)
            if disk._inside(path) and disk.room != float("inf"):
                free = max(0, int(disk.room))
                return type(found)(found.total, found.total - free, free)
            return found

        def frozen(make):
            def create(*args, dir=None, **kwargs):
                if disk.frozen and dir is not None and disk._inside(dir):
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, ".tmp-name"))
                return make(*args, dir=dir, **kwargs)

            return create

        def opening(path, flags, *args, **kwargs):
            if disk.frozen and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and disk._inside(path):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))
            return real_open(path, flags, *args, **kwargs)

        self.monkeypatch.setattr(Path, "write_bytes", full)
        self.monkeypatch.setattr(safetensors.torch, "save_file", tensors)
        self.monkeypatch.setattr(tempfile, "mkstemp", frozen(mkstemp))
        self.monkeypatch.setattr(tempfile, "mkdtemp", frozen(mkdtemp))
        self.monkeypatch.setattr(os, "open", opening)
        self.monkeypatch.setattr(shutil, "disk_usage", usage)

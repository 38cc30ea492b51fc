"""A Python package index stand-in for tests, so the real ``pip`` (``pulumi install`` in a workspace
pod, or ``pip install`` on the host) installs a Python program's requirements with no index on the
network, as in an air-gapped cluster: :class:`Index` (a WSGI app) serves PEP 503's "simple"
repository API (HTML pages) for wheels it is given (:meth:`Index.add_wheel`, :meth:`Index.add_wheels`,
a folder ``pip download`` filled) or made by the test (:func:`make_wheel`), and 404 for anything else,
as PyPI does, so a missing requirement is pip's own "No matching distribution found for X".
:func:`serve_index` serves it at the URL pip takes as ``PIP_INDEX_URL``."""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import html
import io
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from pko.devtools.gitserver import serve_wsgi

__all__ = ["Index", "make_wheel", "normalize", "serve_index", "wheel_name"]

_HTML = "text/html; charset=utf-8"
_REASONS = {200: "OK", 301: "Moved Permanently", 404: "Not Found"}
# A wheel's file name: {dist}-{version}(-{build})?-{python}-{abi}-{platform}.whl (the wheel spec).
_WHEEL_FILE = re.compile(r"(?P<dist>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl")
# 1980-01-01, the earliest time a zip entry holds: what make_wheel stamps, so its wheels reproduce.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def normalize(name: str) -> str:
    """A project name as PEP 503 normalises it (``Foo_Bar.baz`` -> ``foo-bar-baz``): its URL's part."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(name: str) -> str:
    """A project name as a wheel's file name spells it (``Foo-Bar.baz`` -> ``foo_bar_baz``)."""
    return normalize(name).replace("-", "_")


@dataclass(frozen=True)
class _Wheel:
    project: str  # normalised
    filename: str
    sha256: str  # hex, the link's ``#sha256=`` fragment, which pip checks the download against
    path: Path


def _page(title: str, links: Iterable[tuple[str, str]]) -> bytes:
    """A PEP 503 HTML page: one anchor per (href, text)."""
    anchors = "".join(f'<a href="{html.escape(href)}">{html.escape(text)}</a><br/>\n' for href, text in links)
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.0">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f"{anchors}</body>\n</html>\n"
    ).encode()


class Index:
    """The index as a WSGI app: ``projects`` maps normalised name -> file name -> wheel; ``requests``
    logs each request as (method, path, status), so a test can assert what pip asked for."""

    def __init__(self) -> None:
        self.projects: dict[str, dict[str, _Wheel]] = {}
        self.requests: list[tuple[str, str, int]] = []

    def add_wheel(self, path: Path) -> str:
        """Serve the wheel file ``path`` (read when pip downloads it) under the project its name
        names: that project's normalised name. ValueError if ``path`` is not named as a wheel, or
        if another file of the same name is served already."""
        match = _WHEEL_FILE.fullmatch(path.name)
        if match is None:
            raise ValueError(f"{path}: not a wheel's file name ({{dist}}-{{version}}-{{tags}}.whl)")
        wheel = _Wheel(
            normalize(match["dist"]), path.name, hashlib.sha256(path.read_bytes()).hexdigest(), path
        )
        known = self.projects.setdefault(wheel.project, {}).get(wheel.filename)
        if known is not None and known.sha256 != wheel.sha256:
            raise ValueError(f"{wheel.filename}: two files ({known.path}, {path})")
        self.projects[wheel.project].setdefault(wheel.filename, wheel)
        return wheel.project

    def add_wheels(self, folder: Path) -> list[str]:
        """Serve every ``*.whl`` of ``folder`` (:meth:`add_wheel`): their projects, sorted."""
        return sorted({self.add_wheel(path) for path in sorted(folder.glob("*.whl"))})

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO") or "/")
        status, headers, body = self._answer(method, path)
        self.requests.append((method, path, status))
        headers.append(("Content-Length", str(len(body))))
        start_response(f"{status} {_REASONS[status]}", headers)
        return [body]

    def _answer(self, method: str, path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        not_found = (404, [("Content-Type", "text/plain")], b"404 Not Found\n")
        parts = path.split("/")[1:]  # "/simple/x/" -> ["simple", "x", ""]
        if method != "GET" or not parts or any(p in (".", "..") for p in parts):
            return not_found
        if parts[0] == "simple" and len(parts) == 1:
            return self._redirect("/simple/")
        if parts[0] == "simple" and parts[1:] == [""]:
            projects = [(f"{quote(p)}/", p) for p in sorted(self.projects)]
            return 200, [("Content-Type", _HTML)], _page("Simple index", projects)
        if parts[0] == "simple" and len(parts) in (2, 3) and parts[1] and parts[2:] in ([], [""]):
            project = normalize(parts[1])
            if parts[1] != project or len(parts) == 2:
                return self._redirect(f"/simple/{quote(project)}/")  # PyPI's own answer, known or not
            wheels = self.projects.get(project)
            if not wheels:
                return not_found
            links = [
                (f"../../files/{quote(w.filename)}#sha256={w.sha256}", w.filename)
                for w in sorted(wheels.values(), key=lambda w: w.filename)
            ]
            return 200, [("Content-Type", _HTML)], _page(f"Links for {project}", links)
        if parts[0] == "files" and len(parts) == 2:
            wheel = next((ws[parts[1]] for ws in self.projects.values() if parts[1] in ws), None)
            if wheel is not None:
                return 200, [("Content-Type", "application/octet-stream")], wheel.path.read_bytes()
        return not_found

    @staticmethod
    def _redirect(location: str) -> tuple[int, list[tuple[str, str]], bytes]:
        return 301, [("Location", location), ("Content-Type", "text/plain")], b""


@contextlib.contextmanager
def serve_index(index: Index, host: str = "127.0.0.1") -> Iterator[str]:
    """``index`` served on a free port of ``host``: its URL (ending ``/simple/``, for ``PIP_INDEX_URL``)."""
    with serve_wsgi(index, host) as base:
        yield base + "/simple/"


def _record_hash(data: bytes) -> str:
    """A RECORD line's hash: ``sha256=`` and the digest, urlsafe base64 without its ``=`` padding."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    requires: Iterable[str] = (),
) -> Path:
    """A pure-Python wheel as a build backend makes it, so a test needs no build tool: ``files``
    (path in site-packages -> content) plus ``{dist}-{version}.dist-info`` (METADATA naming ``name``,
    ``version`` and each of ``requires`` as a Requires-Dist, WHEEL, RECORD with each file's hash and
    size), written to ``folder`` as ``{dist}-{version}-py3-none-any.whl``: its path. Byte-for-byte
    reproducible."""
    if re.search(r"[-\s]", version):
        raise ValueError(f"{version!r}: a wheel's version holds no '-' or space")
    dist = wheel_name(name)
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel = "Wheel-Version: 1.0\nGenerator: pko-test-pypiindex\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    contents = {
        path: content.encode() if isinstance(content, str) else content
        for path, content in sorted(files.items())
    }
    contents |= {f"{info}/METADATA": metadata.encode(), f"{info}/WHEEL": wheel.encode()}
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    writer.writerows((path, _record_hash(data), len(data)) for path, data in contents.items())
    writer.writerow((f"{info}/RECORD", "", ""))
    contents[f"{info}/RECORD"] = record.getvalue().encode()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in contents.items():  # the dist-info last, RECORD at the very end, as the spec asks
            entry = zipfile.ZipInfo(path, date_time=_ZIP_EPOCH)
            entry.external_attr, entry.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return target

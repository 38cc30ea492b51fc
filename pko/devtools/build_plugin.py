"""Build the kubectl plugin as ONE file, ``kubectl-pko``, that runs on any CPython >= 3.11 with none
of pko's dependencies installed: ``python hack/build_plugin.py OUT_DIR`` prints the file's path;
hack/release.py calls :func:`build_plugin`.

The approach, and why:

* **The plugin talks to the apiserver with the standard library** (``pko.kubectl.apiserver``:
  ``http.client`` + ``ssl``; ``pko.kubectl.credentials``: CA, client certificates, tokens, exec
  credential plugins, in-cluster), not with kubernetes-asyncio and aiohttp as the operator does.
  A zipapp cannot load C extensions, and aiohttp's stack (aiohttp, multidict, yarl, frozenlist,
  propcache) ships them; its pure-python fallbacks, kubernetes-asyncio's generated client (tens of
  MB of models the plugin never uses) and their own dependencies would make a large file to pin and
  audit, slow to start, for a CLI that makes a handful of sequential requests.
* **The one dependency bundled is PyYAML's pure-python part** (``yaml/*.py``; kubeconfigs are
  YAML and ``-o yaml`` writes it; PyYAML falls back to it without its C extension). It is pinned
  in ``hack/kubectl-pko.lock``: the version and the sha256 of every file bundled. The build takes
  the files from the PyYAML installed beside it (the venv's: no network, so the tests can build)
  and refuses any whose hash differs; ``--lock`` rewrites the lock from the installed PyYAML after
  checking each file against the wheel's own RECORD (the deliberate way to move the pin).
* **Only the pko modules the plugin imports**: every module of ``pko.kubectl`` and, following
  their imports (all of them, also those inside functions; not those under ``TYPE_CHECKING``),
  the other pko modules they reach (``pko.version``, ``pko.machinery.conditions``,
  ``pko.controllers.stack.approval``). Any other import must be of the standard library or the
  bundled PyYAML, or the build fails: nothing the plugin needs is left out silently. Each package
  is an empty ``__init__.py`` in the file: a package's own ``__init__`` wires the package for the
  operator (``pko.controllers``' imports the manager, and with it aiohttp), which the plugin never
  needs; the plugin imports modules, never a package's names.
* **Reproducible**: the same inputs give the same bytes: entries sorted, every timestamp
  1980-01-01, fixed permissions, deflate at level 9, sources only (no bytecode: it would tie the
  file to one Python version). The zip library's output is as stable as the machine's zlib.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import importlib.metadata
import io
import json
import stat
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = [
    "FILE_NAME",
    "LOCK",
    "BuildError",
    "build_plugin",
    "bundle_entries",
    "plugin_modules",
    "vendored_files",
    "write_lock",
]

REPO: Final = Path(__file__).resolve().parents[2]
LOCK: Final = REPO / "hack" / "kubectl-pko.lock"
FILE_NAME: Final = "kubectl-pko"
ENTRY_PACKAGE: Final = "pko.kubectl"
VENDORED: Final = {"yaml": "PyYAML"}
"""Top-level packages bundled from a distribution (the lock pins it), by distribution name."""
SHEBANG: Final = b"#!/usr/bin/env python3\n"
EPOCH: Final = (1980, 1, 1, 0, 0, 0)
MAIN: Final = b'''"""kubectl-pko: pko's kubectl plugin as one file (built by hack/build_plugin.py)."""
import sys

if sys.version_info < (3, 11):
    sys.exit("kubectl-pko needs Python 3.11 or newer")
from pko.kubectl.__main__ import main

sys.exit(main())
'''


class BuildError(Exception):
    """The file cannot be built as pinned (an import outside the bundle, a file off its hash)."""


def _package_dirs(repo: Path) -> dict[str, Path]:
    """pyproject.toml's ``package-dir`` (``pko.api`` lives in ``api/``): where each package's source is."""
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    mapping = pyproject["tool"]["setuptools"].get("package-dir") or {}
    return {str(name): repo / str(path) for name, path in mapping.items()}


def _source(module: str, dirs: Mapping[str, Path]) -> Path | None:
    """The source file of pko module ``module`` (a package's ``__init__.py``), None when it is none."""
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        base = dirs.get(".".join(parts[:cut]))
        if base is None:
            continue
        path = base.joinpath(*parts[cut:])
        for candidate in (path.with_suffix(".py") if parts[cut:] else None, path / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate
        return None
    return None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module name an import in ``tree`` may load (``from a import b``: ``a`` and ``a.b``),
    those under ``if TYPE_CHECKING:`` left out."""
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        stack.extend(ast.iter_child_nodes(node))
    return found


def plugin_modules(repo: Path = REPO) -> dict[str, Path]:
    """The pko modules the plugin needs (name -> source): ``pko.kubectl``'s and those their imports
    reach. Raises :class:`BuildError` for an import that is neither pko's, the standard library's
    nor a bundled package's."""
    dirs = _package_dirs(repo)
    roots = sorted(p for p in (repo / "pko" / "kubectl").glob("*.py") if p.name != "__init__.py")
    pending = [f"{ENTRY_PACKAGE}.{p.stem}" for p in roots]
    modules: dict[str, Path] = {}
    outside: dict[str, set[str]] = {}
    while pending:
        module = pending.pop()
        if module in modules:
            continue
        path = _source(module, dirs)
        if path is None:
            raise BuildError(f"{module}: no source under {repo}")
        if path.name != "__init__.py":
            modules[module] = path
        tree = ast.parse(path.read_bytes(), str(path))
        for name in _imported(tree, module, path.name == "__init__.py"):
            top = name.split(".")[0]
            if top == "pko":
                found = _source(name, dirs)  # None: a name imported from a module, not a module
                if found is not None and found.name != "__init__.py" and name not in modules:
                    pending.append(name)
            elif top not in sys.stdlib_module_names and top not in VENDORED:
                outside.setdefault(top, set()).add(module)
    if outside:
        said = "; ".join(f"{top} (by {', '.join(sorted(by))})" for top, by in sorted(outside.items()))
        raise BuildError(f"the plugin imports what the one file does not bundle: {said}")
    return dict(sorted(modules.items()))


def _packages(modules: Iterable[str]) -> list[str]:
    """Every package above ``modules`` (``pko``, ``pko.kubectl``, ...)."""
    found = {".".join(m.split(".")[:i]) for m in modules for i in range(1, len(m.split(".")))}
    return sorted(found)


def _lock(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise BuildError(f"{path}: not a JSON object")
    return data


def _installed(dist_name: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"{dist_name} is not installed beside the build (pip install it)") from None


def vendored_files(lock_path: Path = LOCK) -> dict[str, bytes]:
    """The bundled distributions' files (path in the zip -> bytes), each checked against the lock."""
    lock = _lock(lock_path)
    files: dict[str, bytes] = {}
    for top, dist_name in sorted(VENDORED.items()):
        pin = lock.get(dist_name)
        if not isinstance(pin, dict):
            raise BuildError(f"{LOCK} pins no {dist_name}: run hack/build_plugin.py --lock")
        dist = _installed(dist_name)
        if dist.version != pin["version"]:
            raise BuildError(
                f"{dist_name} {dist.version} is installed, the lock pins {pin['version']}: "
                f"pip install {dist_name}=={pin['version']} (or move the pin: hack/build_plugin.py --lock)"
            )
        for name, digest in sorted(pin["files"].items()):
            source = Path(str(dist.locate_file(pin["sources"][name])))
            data = source.read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                raise BuildError(f"{source}: its sha256 is not the one {LOCK.name} pins for {name}")
            files[name] = data
        if not any(n.startswith(f"{top}/") for n in files):
            raise BuildError(f"{LOCK}: {dist_name} bundles nothing of {top}/")
    return files


def _record_digest(data: bytes) -> str:
    """A wheel RECORD's hash of ``data`` (``sha256=`` urlsafe base64, unpadded)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_lock() -> dict[str, Any]:
    """Pin the installed bundled distributions: their pure-python files of each top-level package
    and license files, each checked against the distribution's RECORD, into :data:`LOCK`."""
    lock: dict[str, Any] = {
        "_comment": "kubectl-pko's bundled files (hack/build_plugin.py); regenerate: "
        "python hack/build_plugin.py --lock"
    }
    for top, dist_name in sorted(VENDORED.items()):
        dist = _installed(dist_name)
        pinned: dict[str, str] = {}
        sources: dict[str, str] = {}
        for entry in dist.files or []:
            path = entry.as_posix()
            is_code = path.startswith(f"{top}/") and path.endswith(".py") and path.count("/") == 1
            is_license = ".dist-info/" in path and "/licenses/" in path
            if not (is_code or is_license):
                continue
            data = Path(str(dist.locate_file(entry))).read_bytes()
            if entry.hash is None or _record_digest(data) != f"{entry.hash.mode}={entry.hash.value}":
                raise BuildError(f"{dist_name}: {path} differs from its RECORD")
            name = path if is_code else f"LICENSES/{dist_name}/{path.rsplit('/licenses/', 1)[1]}"
            pinned[name] = hashlib.sha256(data).hexdigest()
            sources[name] = path
        lock[dist_name] = {"version": dist.version, "files": pinned, "sources": sources}
    LOCK.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return lock


def bundle_entries(repo: Path = REPO) -> dict[str, bytes]:
    """Every file of the zip (path -> bytes), from the checkout ``repo``."""
    modules = plugin_modules(repo)
    entries: dict[str, bytes] = {"__main__.py": MAIN, "LICENSES/pko/LICENSE": (repo / "LICENSE").read_bytes()}
    for package in _packages(modules):
        entries[package.replace(".", "/") + "/__init__.py"] = b""
    for module, path in modules.items():
        entries[module.replace(".", "/") + ".py"] = path.read_bytes()
    entries.update(vendored_files(repo / LOCK.relative_to(REPO)))
    return dict(sorted(entries.items()))


def build_plugin(out_dir: Path, repo: Path = REPO) -> Path:
    """Write ``out_dir/kubectl-pko`` (executable), built from the checkout ``repo`` (default: this
    one; a release passes its clean worktree), and return its path."""
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in bundle_entries(repo).items():
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.create_system = 3  # Unix, whatever builds it
            archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / FILE_NAME
    target.write_bytes(buffer.getvalue())
    target.chmod(0o755)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build kubectl-pko as one file (a zipapp).")
    parser.add_argument("out_dir", nargs="?", type=Path, help="where to write kubectl-pko")
    parser.add_argument("--lock", action="store_true", help=f"rewrite {LOCK.name} from the installed PyYAML")
    args = parser.parse_args(argv)
    try:
        if args.lock:
            write_lock()
            print(LOCK)
        if args.out_dir is not None:
            print(build_plugin(args.out_dir))
        elif not args.lock:
            parser.error("OUT_DIR is required")
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

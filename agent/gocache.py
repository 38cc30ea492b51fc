"""A bound on the Go build and module caches a workspace keeps between pods.

The operator points ``GOCACHE`` and ``GOMODCACHE`` at the workspace pod's ``cache`` volume
(pko/controllers/workspace/podspec.py), which a claim can keep across pods, so only the first pod of
a Go program compiles the Pulumi Go SDK. Nothing else would bound that volume: Go trims build-cache
entries unused for five days (at most once a day, as the ``go`` command runs), but never the module
cache, and each new SDK or provider version adds to both. So at start, before it serves, the agent of
a Go program clears them when they hold more than :func:`cache_limit`: the build cache first (rebuilt
from the modules, no network), then the module cache if it alone is still over (downloaded again).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import structlog

__all__ = ["CACHE_VARIABLES", "GO_CACHE_MAX_BYTES", "bound_go_caches", "cache_limit", "dir_bytes", "to_clear"]

log = structlog.get_logger("pko.agent.gocache")

GO_CACHE_MAX_BYTES: Final = 3 * 1024**3
"""At most this much in the Go caches together: a Go program on the Pulumi SDK and a provider's SDK
holds about 1 GB (measured: module cache 500 MB, build cache 515 MB), three versions of it fit."""
FILESYSTEM_SHARE: Final = 0.8
"""And at most this share of the volume they are on, so a small claim fills before no build."""
CACHE_VARIABLES: Final = ("GOCACHE", "GOMODCACHE")
"""In the order they are cleared."""


def cache_limit(filesystem_bytes: int | None, max_bytes: int = GO_CACHE_MAX_BYTES) -> int:
    """The bound: ``max_bytes``, or less on a volume smaller than it (its ``FILESYSTEM_SHARE``)."""
    if not filesystem_bytes:
        return max_bytes
    return min(max_bytes, int(filesystem_bytes * FILESYSTEM_SHARE))


def to_clear(sizes: Mapping[str, int], limit: int) -> list[str]:
    """The caches (``CACHE_VARIABLES`` names) to clear so the rest fit in ``limit``, build cache first."""
    total = sum(sizes.values())
    cleared: list[str] = []
    for name in CACHE_VARIABLES:
        if total <= limit:
            break
        if sizes.get(name):
            cleared.append(name)
            total -= sizes[name]
    return cleared


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist); links are not followed."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _writable_then_retry(func: Callable[..., Any], path: str, _exc: Any) -> None:
    """The module cache is read-only (files 0444, directories 0555): make the parent writable, retry."""
    parent = os.path.dirname(path)
    os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
    func(path)


def _empty(path: Path) -> None:
    """Remove what ``path`` holds, keeping the directory (it may be a volume's root)."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, onerror=_writable_then_retry)
        else:
            child.unlink(missing_ok=True)


def bound_go_caches(env: Mapping[str, str], max_bytes: int = GO_CACHE_MAX_BYTES) -> list[str]:
    """Clear the Go caches ``env`` names (``GOCACHE``, ``GOMODCACHE``) when together over the bound;
    the names of those cleared."""
    dirs = {name: Path(env[name]) for name in CACHE_VARIABLES if env.get(name)}
    existing = {name: path for name, path in dirs.items() if path.is_dir()}
    if not existing:
        return []
    sizes = {name: dir_bytes(path) for name, path in existing.items()}
    volume = os.statvfs(next(iter(existing.values())))
    limit = cache_limit(volume.f_blocks * volume.f_frsize, max_bytes)
    cleared = to_clear(sizes, limit)
    for name in cleared:
        _empty(existing[name])
    log.info("go caches", sizes=sizes, limit=limit, cleared=cleared)
    return cleared

"""The hash-pinned locks (requirements.lock, requirements-build.lock; written by hack/lock.sh), read.

One reader for the tests (test/test_lock.py) and for hack/build-agent.sh, which refuses to bundle the
agent from a Python whose packages are not the locked ones (the offline agent image is built from
.venv, the registry one from the locks: both must carry the same packages).

    python hack/locks.py check-installed   exit 1, naming each package, when this Python's installed
                                           version of a locked package is not the locked one
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The locks .venv and the agent are installed from (the workspace image's, requirements-workspace.lock,
# is installed in that image only).
LOCKS = (REPO / "requirements.lock", REPO / "requirements-build.lock")
# No environment marker: the locks are resolved for one platform (hack/lock.sh), so none is expected.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*\\?$")
_HASH = re.compile(r"--hash=(\w+):([0-9a-f]+)")


@dataclass(frozen=True)
class Pin:
    """One lock entry: a distribution at one version, and the hashes pip accepts for its files."""

    name: str  # normalized (PEP 503)
    version: str
    hashes: tuple[str, ...]  # "sha256:<hex>"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, Pin]:
    """The entries of a pip requirements file in pip-compile's layout (continuation lines of hashes)."""
    pins: dict[str, Pin] = {}
    entry: list[str] = []
    for raw in [*path.read_text().splitlines(), ""]:
        line = raw.split("#", 1)[0].rstrip()
        if entry and (not line or not line[0].isspace()):
            pin = _parse(entry, path)
            if pin.name in pins:
                raise ValueError(f"{path.name}: {pin.name} is pinned twice")
            pins[pin.name] = pin
            entry = []
        if line.strip():
            entry.append(line.strip())
    return pins


def _parse(entry: list[str], path: Path) -> Pin:
    match = _PIN.match(entry[0])
    if not match:
        raise ValueError(f"{path.name}: not an exact pin without a marker: {entry[0]!r}")
    hashes = tuple(f"{algo}:{digest}" for line in entry[1:] for algo, digest in _HASH.findall(line))
    if len(hashes) != len(entry) - 1:
        raise ValueError(f"{path.name}: {entry[0]!r} has lines that are not --hash options: {entry[1:]}")
    return Pin(normalize(match[1]), match[2], hashes)


def installed_mismatches(locks: tuple[Path, ...] = LOCKS) -> list[str]:
    """Each locked package whose installed version (in this Python) is not the locked one."""
    found: list[str] = []
    for lock in locks:
        for pin in read_lock(lock).values():
            try:
                have = metadata.version(pin.name)
            except metadata.PackageNotFoundError:
                have = "not installed"
            if have != pin.version:
                found.append(f"{pin.name}: {have}, {lock.name} pins {pin.version}")
    return found


def main(argv: list[str]) -> int:
    if argv != ["check-installed"]:
        print(__doc__, file=sys.stderr)
        return 2
    wrong = installed_mismatches()
    for line in wrong:
        print(f"locks: {line}", file=sys.stderr)
    if wrong:
        print(f"locks: {sys.prefix} does not hold the locked packages: run hack/venv.sh", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The pinned versions (hack/versions.env) and the cache their builds share, for the Python side of hack/
and the tests, read by the same rules the build scripts (hack/build-*.sh, hack/gomod.sh) apply.

Standard library only (it runs before the project's virtualenv exists).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

VERSIONS_ENV = Path(__file__).resolve().parents[2] / "hack" / "versions.env"
# What bash's `. hack/versions.env` reads as the same NAME=value: no quotes, expansions, spaces or comments.
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([^\s\"'`$\\;#]*)")


def versions(path: Path = VERSIONS_ENV) -> dict[str, str]:
    """Every NAME=value of hack/versions.env. A line bash might read otherwise (quoting, ``$``, a
    trailing comment, ``export``) is refused rather than guessed at."""
    out: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _ASSIGNMENT.fullmatch(line)
        if match is None:
            raise ValueError(f"{path}:{number}: not a plain NAME=value line: {raw!r}")
        out[match[1]] = match[2]
    return out


def cache_dir() -> Path:
    """The pko cache: ``${PKO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pko}``, the rule of
    hack/build-kubernetes.sh, hack/build-pulumi.sh and hack/gomod.sh (an empty variable counts as unset,
    as with ``:-``)."""
    explicit = os.environ.get("PKO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pko"

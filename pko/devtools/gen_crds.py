#!/usr/bin/env python3
"""Write config/crd/bases/<group>_<plural>.yaml (and config/crd/kustomization.yaml) from the pko.api models.

Usage:
    hack/gen_crds.py            # (re)write the files
    hack/gen_crds.py --check    # exit 1 and list the files that differ from what the models generate

The generator itself is ``pko.api.crdgen``; this script only compares and writes files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pko.api import crdgen

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "config" / "crd"
BASES = CRD_DIR / "bases"


def expected_files() -> dict[Path, str]:
    """Every generated file, by absolute path."""
    files = {BASES / name: text for name, text in crdgen.render_all().items()}
    files[CRD_DIR / "kustomization.yaml"] = crdgen.KUSTOMIZATION
    return files


def stale_files(expected: dict[Path, str]) -> list[Path]:
    """Files that are missing, differ, or are generated-looking leftovers in bases/."""
    stale = [path for path, text in expected.items() if not path.exists() or path.read_text() != text]
    if BASES.is_dir():
        stale += [p for p in sorted(BASES.glob("*.yaml")) if p not in expected]
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if the committed files are out of date")
    args = parser.parse_args(argv)

    expected = expected_files()
    stale = stale_files(expected)
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO_ROOT)} (run hack/gen_crds.py)", file=sys.stderr)
        return 1 if stale else 0
    BASES.mkdir(parents=True, exist_ok=True)
    for path in stale:
        if path in expected:
            path.write_text(expected[path])
            print(f"wrote {path.relative_to(REPO_ROOT)}")
        else:
            path.unlink()
            print(f"removed {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

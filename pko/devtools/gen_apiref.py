#!/usr/bin/env python3
"""Write docs/reference/api.md (from the pko.api models), docs/reference/conditions.md (from the
operator's code: condition and Event reasons, annotations, labels, metrics) and the settings tables of
docs/operator.md and docs/retries.md (from the declared settings, pko.settings; the rest of those
pages is prose).

Usage:
    hack/gen_apiref.py            # (re)write the pages
    hack/gen_apiref.py --check    # exit 1 and list the pages that differ from what the code generates

The pages are written by apiref_api.py, apiref_tables.py and apiref_settings.py (what
each reads is in its docstring); this script only compares and writes files. test/test_apiref.py runs
the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pko.devtools import apiref_api, apiref_settings, apiref_tables

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE = REPO_ROOT / "docs" / "reference"
API_PAGE = REFERENCE / "api.md"
CONDITIONS_PAGE = REFERENCE / "conditions.md"
SETTINGS_PAGE = REPO_ROOT / "docs" / "operator.md"  # its settings table
RETRIES_PAGE = REPO_ROOT / "docs" / "retries.md"  # its table of the settings a Stack may override


def expected_files() -> dict[Path, str]:
    """Every generated page, by absolute path."""
    return {
        API_PAGE: apiref_api.render(),
        CONDITIONS_PAGE: apiref_tables.render(),
        SETTINGS_PAGE: apiref_settings.render_page(SETTINGS_PAGE.read_text()),
        RETRIES_PAGE: apiref_settings.render_retries_page(RETRIES_PAGE.read_text()),
    }


def stale_files(expected: dict[Path, str]) -> list[Path]:
    """Pages that are missing or differ from what the code generates."""
    return [path for path, text in expected.items() if not path.exists() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if the committed pages are out of date")
    args = parser.parse_args(argv)

    expected = expected_files()
    stale = stale_files(expected)
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO_ROOT)} (run hack/gen_apiref.py)", file=sys.stderr)
        return 1 if stale else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What each ``hack/<tool>.py`` entry point runs: the module ``pko.devtools.<tool>`` as ``__main__``, so
``python3 hack/localnode.py up`` is ``python3 -m pko.devtools.localnode up`` from any directory.

``pko`` is loaded from this checkout by its location, whatever is installed: the node and cluster tools
run with the machine's python3 before the project's virtualenv exists (standard library only, and
``pko/__init__.py`` imports nothing), and ``hack/release.py`` in a worktree of a release commit must
release that tree, not the checkout the virtualenv's editable install points at. ``pko.api`` and
``pko.agent`` (folders ``api/`` and ``agent/``) still come from the virtualenv's install.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

PKO = Path(__file__).resolve().parents[1] / "pko"


def run(module: str) -> None:
    """Run ``module`` (``pko.devtools.<tool>``) as the program, with this script's arguments."""
    spec = importlib.util.spec_from_file_location(
        "pko", PKO / "__init__.py", submodule_search_locations=[str(PKO)]
    )
    assert spec is not None and spec.loader is not None
    sys.modules["pko"] = package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    runpy.run_module(module, run_name="__main__", alter_sys=True)

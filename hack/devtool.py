"""What each ``hack/<tool>.py`` entry point runs: the module ``pko.devtools.<tool>`` as ``__main__``, so
``python3 hack/localnode.py up`` is ``python3 -m pko.devtools.localnode up`` from any directory.

The node and cluster tools run with the machine's python3 before the project's virtualenv exists
(standard library only), where ``pko`` is not installed: then the package is loaded from this checkout
by its location, which is all ``import pko.devtools.<tool>`` needs (``pko/__init__.py`` imports
nothing). In the virtualenv the editable install provides it and this file loads nothing.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

PKO = Path(__file__).resolve().parents[1] / "pko"


def run(module: str) -> None:
    """Run ``module`` (``pko.devtools.<tool>``) as the program, with this script's arguments."""
    if importlib.util.find_spec("pko") is None:
        spec = importlib.util.spec_from_file_location(
            "pko", PKO / "__init__.py", submodule_search_locations=[str(PKO)]
        )
        assert spec is not None and spec.loader is not None
        sys.modules["pko"] = package = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(package)
    runpy.run_module(module, run_name="__main__", alter_sys=True)

"""The operator's reconcilers, and the one place that declares them on a manager.

``pko.__main__`` calls :func:`register` once, before the manager runs. Each reconciler module
(``stack.py``, ``workspace.py``, ``update.py``, ``program.py``) adds its controller here with
``manager.controller(name, reconciler).for_(...).owns(...)...``; worker counts come from the
manager's options (``--max-concurrent-reconciles-*``), keyed by the Go operator's controller names.
"""

from __future__ import annotations

from pko.machinery.manager import Manager

__all__ = ["CONTROLLER_NAMES", "register"]

# Controller names, as the Go operator names them (they label metrics and logs).
CONTROLLER_NAMES: tuple[str, ...] = (
    "stack-controller",
    "workspace-controller",
    "update-controller",
    "program-controller",
)


def register(manager: Manager) -> None:
    """Declare every reconciler on ``manager``. None exists yet: they arrive with their own issue."""
    del manager

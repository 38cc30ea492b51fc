"""The operator's reconcilers, and the one place that declares them on a manager.

``pko.__main__`` calls :func:`register` once, before the manager runs. Each reconciler module
(``stack.py``, ``workspace.py``, ``update.py``, ``program.py``) adds its controller here with
``manager.controller(name, reconciler).for_(...).owns(...)...``; worker counts come from the
manager's options (``--max-concurrent-reconciles-*``), keyed by the Go operator's controller names.
"""

from __future__ import annotations

from pko.controllers.options import ControllerOptions
from pko.machinery.controller import CONTROLLER_NAMES  # the one list; defined with DEFAULT_WORKERS
from pko.machinery.manager import Manager

__all__ = ["CONTROLLER_NAMES", "register"]


def register(manager: Manager, options: ControllerOptions | None = None) -> None:
    """Declare every reconciler on ``manager``."""
    from pko.controllers import program, stack, update, workspace
    from pko.tokens import TokenSource

    opts = options if options is not None else ControllerOptions()
    # One token cache for the operator's identity, shared by every controller that calls agents.
    tokens = TokenSource(
        manager.api,
        opts.operator_namespace,
        opts.operator_service_account,
        request_timeout=manager.options.kube_api_timeout,
    )
    workspace.setup(manager, opts, tokens)
    update.setup(manager, opts, tokens=tokens)
    program.setup(manager, opts)
    stack.setup(manager, opts)

"""The operator's four reconcilers, a folder each, and the one place that declares them on a manager.

Each folder holds one controller: its reconciler (``reconciler.py``: reads from the caches, asks a
pure planner what to do, carries the plan out at one edge), its pure decisions and status, and
what wakes it. One line per module:

* ``stack/``: a Stack kept deployed from its source.

  * ``reconciler``: observes (caches, then Secrets, the branch head and the outputs Secret),
    and carries the plan out in one place (``_act``), the only writer of Stack status; and its
    wiring (``setup``).
  * ``plan``: ``decide(Observed) -> Plan``, the whole reconcile as a pure function: the writes in
    order, the status (a stall is planned, not raised), the plan after the Workspace is applied,
    and ``refused``, the plan after a write's expected failure.
  * ``backend``: whether a ``file://`` backend's state is lost with the workspace pod.
  * ``status``: the Stack status rules and ``plan_sync`` (run an operation or not, and when to
    look again).
  * ``sources``: a Stack's source resolved to a revision (git, Flux, Program), and git credentials
    read from Secrets.
  * ``branchpoll``: the branch-poll schedule (``next_poll``) and the shared, cached branch lookup.
  * ``retry``: which failures are transient, the failure budget and the backoff.
  * ``workspaceobject`` / ``updateobject``: the Workspace and Update a Stack owns (pure builders).
  * ``watches``: what wakes the reconciler (predicates, index and map functions) and the gauges.

* ``workspace/``: a Workspace run as a StatefulSet + Service with the agent in its pod.

  * ``reconciler``: reads, and carries the plan out in one place (``_act``): applies the
    workloads, initializes the agent, reports ``Ready``.
  * ``plan``: what one reconcile writes, in order, and the status and ``Result`` that follow
    (pure), including what an expected failure of a write leads to.
  * ``workloads``: the StatefulSet, Service and pod built from the spec, and the pod diagnosis.
  * ``networkpolicy``: a small controller of its own (``--workspace-network-policy``): each
    Workspace's NetworkPolicy, admitting only the operator's pods to the agent's port.

* ``update/``: one Pulumi operation run through the workspace agent.

  * ``reconciler``: reads, and carries the plan out in one place (``_act``): starts the operation,
    records its result, cleans up; and its wiring (``setup``).
  * ``plan``: what one reconcile decided (pure): the writes in order, the plan after the agent's
    answer, and the rest after an expected failure (``refused``).
  * ``status``: the Update status and outputs Secret as pure functions of the agent's answers.
  * ``watch``: the background tasks that follow running operations' event streams.

* ``program/``: a Program served as a tarball.

  * ``reconciler``: records the artifact in ``status``.
  * ``artifact``: the Program checked, rendered to ``Pulumi.yaml`` and packed.
  * ``server``: the HTTP server the workspace pods fetch artifacts from.

Shared by all four: ``options`` (the operator's settings), ``retrysettings`` (the operator-wide
retry settings of Stacks, a dataclass of defaults), ``resources`` (resource types, labels,
annotations, field managers), ``strategicmerge`` (a user's template over a built object).

One constructor convention: ``XReconciler(manager, options=None, *, <keyword-only collaborators>)``
takes its informers and clients from the manager, and ``setup(manager, options=None, **kwargs)``
builds it and declares its controller. :func:`register` is called once by ``pko.__main__`` before
the manager runs; each ``setup`` declares its controller with
``manager.controller(name, reconciler).for_(...).owns(...)``; worker counts come from the manager's
options (``--max-concurrent-reconciles-*``), keyed by the Go operator's controller names.
"""

from __future__ import annotations

from pko.controllers.options import ControllerOptions
from pko.machinery.controller import CONTROLLER_NAMES  # the one list; defined with DEFAULT_WORKERS
from pko.machinery.manager import Manager

__all__ = ["CONTROLLER_NAMES", "register"]


def register(manager: Manager, options: ControllerOptions | None = None) -> None:
    """Declare every reconciler on ``manager``."""
    from pko.controllers import fleetmetrics, fluxevents
    from pko.controllers.program import reconciler as program
    from pko.controllers.stack import reconciler as stack
    from pko.controllers.update import reconciler as update
    from pko.controllers.workspace import networkpolicy
    from pko.controllers.workspace import reconciler as workspace

    opts = options if options is not None else ControllerOptions()
    # One token cache for the operator's identity, shared by every controller that calls agents.
    tokens = opts.operator_tokens(manager)
    workspace.setup(manager, opts, tokens=tokens)
    if opts.workspace_network_policy:
        networkpolicy.setup(manager, opts)
    update.setup(manager, opts, tokens=tokens)
    program.setup(manager, opts)
    stack.setup(manager, opts)
    fleetmetrics.setup(manager)
    fluxevents.setup(manager, opts.events_address)

"""The vocabulary of a Stack reconcile: what it read (:class:`Observed`), the writes and reads a
decision plans (:data:`Write`, in a :class:`Plan`), and how a write failed (:class:`Failure`).

Pure data: the reconciler carries the writes out (``StackReconciler._carry_out``, the only code
that writes); :mod:`pko.controllers.stack.plan` decides them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pko.api.stack import PolicyPack, Stack
from pko.api.validation import FieldError
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.secretaccess import SecretAccess
from pko.controllers.stack.refresh import RefreshWait
from pko.controllers.stack.templates import Templates
from pko.controllers.stack.updateobject import Run
from pko.controllers.stack.waits import SOURCE_UNAVAILABLE_REQUEUE, WAITS, Awaited, Wait
from pko.controllers.stack.workspaceobject import PackRevision, ResolvedSource
from pko.machinery.controller import Result
from pko.machinery.events import Emit, Log
from pko.machinery.resource import Obj
from pko.machinery.store import clone

__all__ = [
    "SOURCE_UNAVAILABLE_REQUEUE",
    "AddFinalizer",
    "ApplyWorkspace",
    "CancelUpdate",
    "CreateUpdate",
    "DeleteWorkspace",
    "Emit",
    "Failure",
    "Log",
    "Next",
    "Observed",
    "OutputsWritten",
    "Plan",
    "PruneHistory",
    "ReadSource",
    "ReleaseUpdate",
    "RemoveFinalizer",
    "RequestReconcile",
    "Resolved",
    "Settings",
    "Unresolved",
    "UpdateOutputs",
    "Write",
    "WriteOutputs",
    "WriteStatus",
    "after",
    "annotation",
    "sooner",
    "write_status",
]


@dataclass(frozen=True, slots=True)
class WriteStatus:
    """Apply the Stack's status (the fields this controller owns; skipped when unchanged), then
    release ``recorded``, the Update whose result it now holds."""

    status: Obj
    recorded: Obj | None = None


@dataclass(frozen=True, slots=True)
class AddFinalizer:
    """Add the Stack's finalizer (before anything is created for it)."""


@dataclass(frozen=True, slots=True)
class RemoveFinalizer:
    """Release the Stack: its deletion goes on (its Workspace and Updates are garbage collected)."""


@dataclass(frozen=True, slots=True)
class ApplyWorkspace:
    """Server-side apply the Stack's Workspace (stamped with its digest; skipped when unchanged)."""

    body: Obj


@dataclass(frozen=True, slots=True)
class CreateUpdate:
    """Create the Update that runs one operation (``status.currentUpdate`` already names it)."""

    body: Obj


@dataclass(frozen=True, slots=True)
class CancelUpdate:
    """Delete the running Update ``name`` (``uid``): the Update reconciler cancels its operation
    (the Stack's finalizer keeps the Update until the Stack has recorded how it ended)."""

    name: str
    uid: str | None


@dataclass(frozen=True, slots=True)
class DeleteWorkspace:
    """Delete the Stack's Workspace (reclaim policy ``Delete``), with a ``WorkspaceDeleted`` Event."""


@dataclass(frozen=True, slots=True)
class ReleaseUpdate:
    """Drop the Stack's finalizer from a recorded Update."""

    update: Obj | None


@dataclass(frozen=True, slots=True)
class PruneHistory:
    """Delete completed Updates beyond the history limit, never those named in ``keep``."""

    keep: frozenset[str]


@dataclass(frozen=True, slots=True)
class RequestReconcile:
    """Ask another Stack (a prerequisite) to run again: its reconciliation-request annotation."""

    stack: str
    request: str


@dataclass(frozen=True, slots=True)
class WriteOutputs:
    """Create (``existing`` False) or update in place the Secret or ConfigMap ``spec.outputs`` names
    (``body``: with the resourceVersion read, so a change since then is refused, not overwritten).
    Answer: :class:`OutputsWritten`; ``then`` decides again with it."""

    body: Obj
    existing: bool


@dataclass(frozen=True, slots=True)
class ReadSource:
    """Read the Stack's source at its current revision (its Secrets, a branch head, a Flux object's
    or Program's artifact), and the commits of ``packs``, the policy packs from git it runs (their
    branch heads): a read only some decisions need. Answer: :class:`Resolved` or
    :class:`Unresolved`; ``then`` decides again with it."""

    stack: Stack
    packs: tuple[PolicyPack, ...] = ()


Write = (
    WriteStatus
    | ReadSource
    | Log
    | AddFinalizer
    | RemoveFinalizer
    | Emit
    | ApplyWorkspace
    | CreateUpdate
    | CancelUpdate
    | DeleteWorkspace
    | ReleaseUpdate
    | PruneHistory
    | RequestReconcile
    | WriteOutputs
)


@dataclass(slots=True)
class Plan:
    """Writes in order, the ``Result``, the status they leave (a stall found while carrying them out
    is marked on it), and ``then``: what to plan from the last write's answer (the Workspace as
    applied; the source, read)."""

    writes: list[Write]
    result: Result
    status: Obj = field(default_factory=dict)
    then: Callable[[Any], Plan] | None = None


def write_status(status: Obj, recorded: Obj | None = None) -> WriteStatus:
    """A status write of ``status`` as it is now (later decisions may change the dict)."""
    return WriteStatus(clone(status), recorded)


def annotation(obj: Obj, name: str) -> str:
    """The Stack's annotation ``name`` ("" when absent)."""
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(name) or "")


def after(requeue: float | None) -> Result:
    """Look again after ``requeue`` seconds; None or 0: when something changes."""
    return Result.requeue_after(requeue) if requeue else Result.done()


def sooner(requeue: float | None, waiting: RefreshWait | float | None) -> float | None:
    """``requeue``, or sooner when something else is due then: a refresh request's retry (a Stack
    waiting for something else, an approval or a prerequisite, still runs it on time), a drift check."""
    other = waiting.after if isinstance(waiting, RefreshWait) else waiting
    if other is None:
        return requeue
    return min(requeue, other) if requeue is not None else other


# --- what a reconcile reads ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolved:
    """The source at a revision (``source`` None: the workspace template brings the program);
    ``served``: its artifact is the one its server serves now (:func:`artifact_served`); ``packs``:
    the policy packs from git at their commits."""

    source: ResolvedSource | None
    commit: str
    served: bool = False
    packs: tuple[PackRevision, ...] = ()


@dataclass(frozen=True, slots=True)
class Unresolved:
    """The source could not be had: ``reason`` and ``message`` are a Stalled reason and message;
    ``awaits``: what the Stack waits for, whose row of the waits table
    (:mod:`~pko.controllers.stack.waits`, :attr:`Settings.waits`) says when it looks again."""

    reason: str
    message: str
    awaits: Awaited = Awaited.SPEC


@dataclass(frozen=True, slots=True)
class UpdateOutputs:
    """An Update's outputs, as its outputs Secret holds them: each (sanitised) key's JSON value,
    and the keys of the secret ones."""

    update: str
    values: Mapping[str, bytes]
    secret: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class OutputsWritten:
    """How this reconcile's :class:`WriteOutputs` went: ``failure`` None when the object was written."""

    failure: Failure | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    """What one Stack reconcile read: the Stack (``obj``, from the cache), the Update its
    ``status.currentUpdate`` names (None when that is gone, or none is named), the outputs of that
    Update when it completed (None: it has none, or its Secret is gone), the Stack's Workspace and
    the Stacks it names as prerequisites (the cache), the WorkspaceTemplates its Workspace is built
    with (the cache), its source (None until a decision asks for it: :class:`ReadSource`), and the
    time (``now`` to the second for status times, ``created`` precise, naming an Update).
    For ``spec.outputs``: the outputs of the Update the object should hold now (None: none to
    write), the object of that name as read (None: absent, or not read), and how writing it went
    in this reconcile (None: not written yet). ``parsed``: ``obj`` as
    :func:`~pko.api.validation.parse_stack` answered for it when the reader parsed it already
    (once per reconcile; a decision made again after a read keeps it); None: the decision parses
    ``obj`` itself."""

    obj: Obj
    now: datetime
    created: datetime
    settings: Settings
    current_update: Obj | None = None
    outputs: Obj | None = None
    workspace: Obj | None = None
    prerequisites: Mapping[str, Obj | None] = field(default_factory=dict)
    source: Resolved | Unresolved | None = None
    templates: Templates = field(default_factory=Templates)
    update_outputs: UpdateOutputs | None = None
    outputs_object: Obj | None = None
    outputs_written: OutputsWritten | None = None
    parsed: tuple[Stack | None, list[FieldError]] | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The operator's settings a decision uses: the retry rules, the default workspace image by
    security profile, whether git credentials may go over plain HTTP, the waits table (when a
    waiting Stack looks again: :mod:`~pko.controllers.stack.waits`) and who the operator is with
    the role to bind, for a refused write of a Secret or ConfigMap (``access``)."""

    retry: RetrySettings
    workspace_image: Callable[[str | None], str]
    owned_status: tuple[str, ...] = ()
    allow_insecure_git_credentials: bool = False
    waits: Mapping[Awaited, Wait] = field(default_factory=lambda: WAITS)
    access: SecretAccess = field(default_factory=SecretAccess)

    def requeue(self, awaited: Awaited) -> float | None:
        """When a Stack waiting for ``awaited`` looks again without an event (None: only an event
        wakes it: a watch covers the wait)."""
        return self.waits[awaited].requeue


@dataclass(frozen=True, slots=True)
class Failure:
    """A write that failed: the API's HTTP ``status`` and its ``message`` (the response body)."""

    status: int | None
    message: str


@dataclass(frozen=True, slots=True)
class Next:
    """What runs next and where: ``run`` the Update, ``commit`` the revision it runs at, ``source``
    the source a new Workspace is built from (None: the template brings the program), ``kept`` the
    Workspace a destroy runs in as it is (None: one is applied), ``note`` the warning a destroy
    from the saved project gives, ``waiting`` a refresh request waiting for its retry, ``packs`` the
    policy packs from git the new Workspace fetches."""

    run: Run
    commit: str
    source: ResolvedSource | None = None
    kept: Obj | None = None
    note: str | None = None
    waiting: RefreshWait | None = None
    packs: tuple[PackRevision, ...] = ()

"""What one Stack reconcile decides: the writes to make, in order, and when to look again (pure).

The reconciler reads (:class:`~pko.controllers.stack.steps.Observed`: the caches, and the reads
no cache holds that every decision needs: the Update in flight when the cache lacks it, its
outputs Secret), asks :func:`decide` what to do, and carries out the
:class:`~pko.controllers.stack.steps.Plan` in one place (``StackReconciler._act``), the only code
that writes. A read only some decisions need (the source with its Secrets and branch head) is
asked for as data (:class:`~pko.controllers.stack.steps.ReadSource`): the reconciler reads, and
:func:`decide` runs again with the answer. A Stack that cannot be processed as written is a
planned ``Stalled`` status, not an exception.

:func:`decide` checks the Stack itself (finalizer, spec, warnings), then goes through the steps,
each its own module: absorb the Update in flight (:mod:`~pko.controllers.stack.absorb`), choose
the next run (:mod:`~pko.controllers.stack.nextrun`), ensure its Workspace and Update
(:mod:`~pko.controllers.stack.ensure`); what differs by the kind of Update is one table
(:mod:`~pko.controllers.stack.kinds`). Where the rest depends on what a write returned (the
Workspace as applied decides whether an Update starts), a plan ends with ``then``: the pure
function that plans the rest from it. When a write fails in a way the reconcile expects (a
namespace being deleted, an Update that could not be created), the reconciler describes the
failure as a :class:`~pko.controllers.stack.steps.Failure` and :func:`refused` plans the rest.

Nothing here does I/O: each function is a function of what was read and the time.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Final

from pko.api.stack import Stack
from pko.api.validation import deprecation_warnings, format_errors, parse_stack
from pko.controllers.resources import STACK_FINALIZER
from pko.controllers.stack.absorb import Absorbed, absorb, cancel_requested
from pko.controllers.stack.backend import EPHEMERAL_BACKEND_REASON, ephemeral_backend
from pko.controllers.stack.ensure import ensure, roll_for_templates
from pko.controllers.stack.guidance import release_command, stack_ref
from pko.controllers.stack.insecuretransport import mark_insecure_transport, refusal
from pko.controllers.stack.nextrun import next_run
from pko.controllers.stack.outputs import publish, recheck
from pko.controllers.stack.results import pending_operation_events
from pko.controllers.stack.status import mark_ephemeral_backend, mark_stalled, reconcile_request
from pko.controllers.stack.steps import (
    SOURCE_UNAVAILABLE_REQUEUE,
    AddFinalizer,
    ApplyWorkspace,
    CancelUpdate,
    CreateUpdate,
    DeleteWorkspace,
    Emit,
    Failure,
    Log,
    Observed,
    OutputsWritten,
    Plan,
    PruneHistory,
    ReadSource,
    ReleaseUpdate,
    RemoveFinalizer,
    RequestReconcile,
    Resolved,
    Settings,
    Unresolved,
    Write,
    WriteOutputs,
    WriteStatus,
    after,
    write_status,
)
from pko.controllers.stack.waits import Awaited
from pko.machinery.controller import Result
from pko.machinery.objects import has_finalizer
from pko.machinery.resource import Obj

__all__ = [
    "DEPRECATED_FIELD_REASON",
    "SOURCE_UNAVAILABLE_REQUEUE",
    "AddFinalizer",
    "ApplyWorkspace",
    "CancelUpdate",
    "CreateUpdate",
    "DeleteWorkspace",
    "Emit",
    "Failure",
    "Log",
    "Observed",
    "Plan",
    "PruneHistory",
    "ReadSource",
    "ReleaseUpdate",
    "RemoveFinalizer",
    "RequestReconcile",
    "Resolved",
    "Settings",
    "Unresolved",
    "Write",
    "WriteOutputs",
    "WriteStatus",
    "decide",
    "pending_operation_events",
    "refused",
    "terminating_message",
]

DEPRECATED_FIELD_REASON: Final = "DeprecatedField"  # a pko Event: upstream only documents the deprecations


def decide(observed: Observed) -> Plan:
    """The whole reconcile of one Stack, from what was read (the Go operator's
    ``StackReconciler.Reconcile``; see the reconciler's module docstring)."""
    obj = observed.obj
    meta = obj.get("metadata") or {}
    deleting = bool(meta.get("deletionTimestamp"))
    if deleting and not has_finalizer(obj, STACK_FINALIZER):
        return Plan([], Result.done())
    writes: list[Write] = []
    if not deleting and not has_finalizer(obj, STACK_FINALIZER):
        writes.append(AddFinalizer())
    now = observed.now
    generation = int(meta.get("generation") or 0)
    owned = observed.settings.owned_status
    status: Obj = {k: v for k, v in (obj.get("status") or {}).items() if k in owned}
    status["observedGeneration"] = generation
    status["observedReconcileRequest"] = reconcile_request(obj)
    stack, errors = observed.parsed if observed.parsed is not None else parse_stack(obj)
    if stack is None or errors:
        if deleting and not (obj.get("status") or {}).get("lastUpdate"):
            return Plan([*writes, RemoveFinalizer()], Result.done(), status)
        message = format_errors(errors)
        mark_stalled(status, "SpecInvalid", message, generation, now)
        writes += [Emit("Warning", "StackConfigInvalid", message), write_status(status)]
        return Plan(writes, Result.done(), status)
    ephemeral = ephemeral_backend(stack)
    mark_ephemeral_backend(status, ephemeral, generation, now)
    # once per change of the condition, not per reconcile
    writes += mark_insecure_transport(
        status, stack, observed.settings.allow_insecure_git_credentials, generation, now
    )
    if int((obj.get("status") or {}).get("observedGeneration") or 0) != generation:
        # Once per generation (the recorder folds repeats of a retried reconcile into one Event).
        writes += [Emit("Warning", DEPRECATED_FIELD_REASON, w) for w in deprecation_warnings(stack.spec)]
        if ephemeral is not None and not deleting:
            writes.append(Emit("Warning", EPHEMERAL_BACKEND_REASON, ephemeral))
    return _decide_stack(observed, stack, status, writes)


def _decide_stack(observed: Observed, stack: Stack, status: Obj, writes: list[Write]) -> Plan:
    """A valid Stack: 0. a cancel request, 1. absorb the Update in flight, 2-3. the next run,
    4-6. ensure its Workspace and Update. A step may end the reconcile (a plan), or ask for the
    source first."""
    generation = int((observed.obj.get("metadata") or {}).get("generation") or 0)
    cancelling = cancel_requested(observed, status, generation, writes)
    if cancelling is not None:
        return _after(writes, cancelling)
    absorbed = absorb(observed, stack, status)
    if not isinstance(absorbed, Absorbed):
        return _after(writes, absorbed) if isinstance(absorbed, Plan) else read_source(observed, absorbed)
    published = publish(observed, stack, status)
    if isinstance(published, WriteOutputs):
        return write_outputs(observed, published)
    writes = [*writes, *absorbed.writes, *published]
    nxt = next_run(observed, stack, status, writes, absorbed.recorded)
    if isinstance(nxt, Plan):
        return recheck(roll_for_templates(observed, stack, nxt))
    if isinstance(nxt, ReadSource):
        return read_source(observed, nxt)
    return recheck(ensure(observed, stack, status, writes, absorbed.recorded, nxt))


def _after(writes: list[Write], plan: Plan) -> Plan:
    """``plan`` after the ``writes`` planned before it."""
    return Plan([*writes, *plan.writes], plan.result, plan.status, plan.then)


def read_source(observed: Observed, read: ReadSource) -> Plan:
    """Read the source first, then decide again with it: only the decisions that use it ask (not
    an invalid Stack, an Update in flight whose Workspace cannot name an unserved artifact, a
    deletion without a destroy, a destroy in the Workspace as it is). Nothing is written before
    the read: deciding again plans every write. A source whose credentials would go over plain
    HTTP is not read unless the operator allows it (:mod:`~pko.controllers.stack.insecuretransport`):
    decided at once as unavailable, nothing read or sent."""
    refused_source = refusal(read.stack, observed.settings.allow_insecure_git_credentials)
    if refused_source is not None:
        return decide(replace(observed, source=refused_source))
    return Plan([read], Result.done(), then=lambda got: decide(replace(observed, source=got)))


def write_outputs(observed: Observed, write: WriteOutputs) -> Plan:
    """Write the ``spec.outputs`` object first, then decide again with how it went (as
    :func:`read_source`: nothing else is written before it, so a failure that propagates leaves
    the Update unrecorded, and the next reconcile writes it again)."""
    return Plan([write], Result.done(), then=lambda got: decide(replace(observed, outputs_written=got)))


def refused(observed: Observed, plan: Plan, write: Write, failure: Failure) -> Plan | None:
    """The rest of the reconcile after ``write`` of ``plan`` failed; None when the failure is not
    one this write expects (it propagates: the controller retries with backoff)."""
    obj = observed.obj
    if isinstance(write, WriteOutputs):
        return decide(replace(observed, outputs_written=OutputsWritten(failure)))
    status = copy.deepcopy(plan.status)
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    if isinstance(write, ApplyWorkspace):
        deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
        if deleting and _namespace_terminating(failure.message):
            message = terminating_message(obj, status)
            mark_stalled(status, "NamespaceTerminating", message, generation, observed.now)
            requeue = observed.settings.requeue(Awaited.NAMESPACE)  # Namespaces are not watched
            return Plan([write_status(status)], after(requeue), status)
        return None
    if isinstance(write, CreateUpdate) and failure.status != 409:
        # Not created: ``currentUpdate`` must not name it (the next reconcile starts one), and the
        # next reconcile comes with the rate limiter's backoff. (409: it exists, so it is ours.)
        status.pop("currentUpdate", None)
        meta = obj.get("metadata") or {}
        fields = {"stack": f"{meta.get('namespace')}/{meta.get('name')}", "status": failure.status}
        said = Log(
            "the Update could not be created; retried with backoff", {**fields, "error": failure.message}
        )
        return Plan([said, write_status(status)], Result.requeue(), status)
    return None


def _namespace_terminating(body: str) -> bool:
    return "NamespaceTerminating" in body or "being terminated" in body


def terminating_message(obj: Obj, status: Obj) -> str:
    """Why a destroy cannot run in a namespace being deleted, and how to release the Stack."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    detail = (status.get("lastUpdate") or {}).get("permalink") or "the Pulumi backend"
    return (
        f'namespace "{namespace}" is terminating, so a workspace cannot be created to run destroy; cloud '
        f"resources will NOT be deleted and must be cleaned up manually (see {detail}). The finalizer is "
        "retained to avoid silently orphaning resources. Once the resources are handled, release the Stack "
        f"with: {release_command(stack_ref(obj))}"
    )

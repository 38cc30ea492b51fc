"""Steps 2 and 3 of a Stack reconcile: the revision to run at, then the next run, or why none
starts (pure).

The source is pinned to a revision (a destroy runs in the Workspace that holds the stack whenever
there is one, or from the saved ``projectInfo`` when the source is gone). Then what runs: a
refresh on request, an operation the spec calls for once it is out of date (Go's ``isSynced``)
through the approval gate for an up, a remediation of drift, a due drift check; or nothing, and
the Stack reports its result and waits (for the next resync, poll, retry or approval).
"""

from __future__ import annotations

from pko.api.stack import DriftDetectionSpec, Stack
from pko.controllers.resources import APPROVED_PLAN_ANNOTATION
from pko.controllers.stack.approval import (
    PLAN_INPUTS_ANNOTATION,
    Apply,
    Preview,
    gate,
    mark_awaiting_approval,
    plan_inputs,
)
from pko.controllers.stack.drift import clear_drift, drift_due_in, remediation_due
from pko.controllers.stack.ensure import mark_workspace_stalled, saved_project, workspace_for_destroy
from pko.controllers.stack.guidance import destroy_from_project_message, stack_ref
from pko.controllers.stack.kinds import APPLY, DRIFT, PLAN, spec_kind
from pko.controllers.stack.policypacks import git_packs, packs_digest
from pko.controllers.stack.refresh import RefreshWait, requested_refresh, retrying_message
from pko.controllers.stack.status import mark_ready, mark_result, mark_stalled, mark_suspended, plan_sync
from pko.controllers.stack.steps import (
    DeleteWorkspace,
    Emit,
    Next,
    Observed,
    Plan,
    PruneHistory,
    ReadSource,
    ReleaseUpdate,
    RemoveFinalizer,
    Resolved,
    Unresolved,
    Write,
    after,
    annotation,
    sooner,
    write_status,
)
from pko.controllers.stack.updateobject import Run
from pko.controllers.stack.workspaceobject import PackRevision, ResolvedSource
from pko.machinery.conditions import get_condition
from pko.machinery.controller import Result
from pko.machinery.resource import Obj

__all__ = ["gated_run", "next_run", "plan_synced", "remediation_up"]


def next_run(
    observed: Observed, stack: Stack, status: Obj, writes: list[Write], recorded: Obj | None
) -> Next | Plan | ReadSource:
    """What runs next (``writes``: those planned so far; ``recorded``: the Update whose result the
    status now holds), or the plan that ends the reconcile without a run, or the source read the
    decision needs first."""
    obj, now = observed.obj, observed.now
    meta = obj.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    deleting = bool(meta.get("deletionTimestamp"))
    spec = stack.spec

    # nothing to destroy: release the Stack (its Workspace and Updates go with it)
    if deleting and (not spec.destroy_on_finalize or spec.preview):
        mark_ready(status, generation, now)
        return Plan([*writes, write_status(status, recorded), RemoveFinalizer()], Result.done(), status)

    # 2. the source, pinned to a revision; a destroy runs in the workspace pod that holds the
    # stack whenever there is one (never changed for the destroy's sake: a pod replaced loses
    # state kept on its own disk)
    kept = workspace_for_destroy(observed.workspace) if deleting else None
    source: ResolvedSource | None = None
    note: str | None = None
    packs: tuple[PackRevision, ...] = ()
    if kept is not None:
        commit = str((status.get("lastUpdate") or {}).get("lastAttemptedCommit") or "")
    else:
        got = observed.source
        if got is None:
            return ReadSource(stack, git_packs(observed.templates.enforced, stack))
        if isinstance(got, Unresolved):
            saved = saved_project(stack, status) if deleting else None
            if saved is None:
                mark_stalled(status, got.reason, got.message, generation, now)
                requeue = observed.settings.requeue(got.awaits)  # None: its watch wakes the Stack
                return Plan([*writes, write_status(status, recorded)], after(requeue), status)
            source, commit, note = saved, "", destroy_from_project_message(got.message, saved)
        else:
            source, commit, packs = got.source, got.commit, got.packs

    # 3. run, or report and wait
    chosen = _choose(observed, stack, status, writes, recorded, commit)
    if isinstance(chosen, Plan):
        return chosen
    run, waiting = chosen
    return Next(run, commit, source, kept, note, waiting, packs)


def _choose(
    observed: Observed, stack: Stack, status: Obj, writes: list[Write], recorded: Obj | None, commit: str
) -> tuple[Run, RefreshWait | None] | Plan:
    """The run at ``commit`` and the refresh request waiting for its retry (nothing refreshes
    before then, a drift check neither); or the plan that reports and waits."""
    obj, now = observed.obj, observed.now
    meta = obj.get("metadata") or {}
    generation = int(meta.get("generation") or 0)
    deleting = bool(meta.get("deletionTimestamp"))
    spec = stack.spec
    retry = observed.settings.retry
    from_git = git_packs(observed.templates.enforced, stack)
    polls_branch = bool(spec.project_repo and spec.branch) or any(p.git and p.git.branch for p in from_git)
    got = observed.source
    commits = {p.name: p.commit for p in got.packs} if isinstance(got, Resolved) else {}
    digest = packs_digest(observed.templates.enforced, commits)
    decision = plan_sync(
        obj, spec, status, commit, now, retry, polls_branch=polls_branch, packs_digest=digest
    )
    mark_suspended(status, spec.suspend and not deleting, generation, now)
    drift_spec = spec.drift_detection if not spec.preview else None
    if drift_spec is None and (status.get("drift") or get_condition(status.get("conditions"), "Drifted")):
        clear_drift(status)
    active = not deleting and not spec.suspend
    requested = requested_refresh(obj, spec, status, retry, now) if active else None
    run = requested if isinstance(requested, Run) else None
    waiting = requested if isinstance(requested, RefreshWait) else None
    remediate = active and run is None and remediation_due(drift_spec, status)
    if decision.synced:
        retrying = retrying_message(waiting) if waiting is not None else None
        mark_result(status, spec, retry, generation, now, stack=stack_ref(obj), retrying=retrying)
        if (status.get("lastUpdate") or {}).get("state") != "succeeded":
            # a retry waiting on a Workspace only a person can help (its node lost) says so meanwhile
            mark_workspace_stalled(status, observed.workspace, generation, now)
        mark_suspended(status, spec.suspend and not deleting, generation, now)
    # nothing asked for and nothing out of date: at most a drift check that is due
    idle = run is None and decision.synced and not remediate
    due = drift_due_in(drift_spec, status, now) if idle and active and waiting is None else None
    if idle and due == 0:
        run = Run(DRIFT, "Drift check")
    gated: Run | str | None = None
    if run is None and not idle and not (spec.suspend and not deleting):
        message = "Drift detected: remediating" if decision.synced else decision.message
        refresh = remediation_up(drift_spec, status)
        gated = gated_run(obj, stack, status, commit, message, refresh=refresh, deleting=deleting)
    if _plan_spent(stack, status, deleting=deleting, idle=idle, gated=gated):
        status.pop("plan", None)
    if isinstance(gated, Run):
        run = gated
    if run is not None:
        return run, waiting
    if idle:
        requeue = sooner(sooner(decision.requeue_after, due), waiting)
        plan = plan_synced(stack, status, requeue, recorded, deleting=deleting)
        return Plan([*writes, *plan.writes], plan.result, status)
    if isinstance(gated, str):
        mark_awaiting_approval(status, gated, generation, now)
        if _plan_recorded(writes, status.get("plan") or {}):
            writes = [*writes, Emit("Normal", "AwaitingApproval", gated)]
        wait = float(spec.resync_frequency()) if polls_branch else None
        return Plan([*writes, write_status(status, recorded)], after(sooner(wait, waiting)), status)
    return Plan([*writes, write_status(status, recorded)], Result.done(), status)  # suspended


def _plan_spent(stack: Stack, status: Obj, *, deleting: bool, idle: bool, gated: Run | str | None) -> bool:
    """Whether a recorded plan is moot: approval switched off (it waits for nothing), nothing to
    apply, or the gate previews a new one."""
    if not status.get("plan"):
        return False
    approval = stack.spec.approval
    switched_off = not deleting and (approval is None or approval.mode == "Never")
    return switched_off or idle or (isinstance(gated, Run) and gated.kind is PLAN)


def _plan_recorded(writes: list[Write], plan: Obj) -> bool:
    """Whether this reconcile recorded ``plan`` (its Event goes out once, with the plan)."""
    return bool(plan) and any(isinstance(w, Emit) and w.reason == "PlanRecorded" for w in writes)


def remediation_up(drift_spec: DriftDetectionSpec | None, status: Obj) -> bool:
    """Whether ups refresh first to put drift right (``remediate`` and drift found)."""
    remediate = drift_spec is not None and drift_spec.remediate
    return remediate and bool((status.get("drift") or {}).get("detected"))


def gated_run(
    obj: Obj, stack: Stack, status: Obj, commit: str, message: str, *, refresh: bool, deleting: bool
) -> Run | str:
    """The Update an operation that is due runs as, through the approval gate for a kind that has
    one (an up): a plan preview, or the approved up; a str is why it waits for approval (the
    condition's message)."""
    kind = spec_kind(preview=stack.spec.preview, deleting=deleting)
    mode = stack.spec.approval.mode if stack.spec.approval is not None else "Never"
    effective_refresh = stack.spec.refresh or refresh
    if not kind.gated or mode == "Never":
        return Run(kind, message, refresh=True if refresh and kind.up_options else None)
    meta = obj.get("metadata") or {}
    inputs = plan_inputs(obj.get("spec") or {}, commit, refresh=effective_refresh)
    chosen = gate(
        mode,
        status.get("plan"),
        annotation(obj, APPROVED_PLAN_ANNOTATION),
        inputs,
        str(meta.get("name") or ""),
        str(meta.get("namespace") or ""),
    )
    if isinstance(chosen, Preview):
        annotations = {PLAN_INPUTS_ANNOTATION: inputs}
        return Run(PLAN, chosen.message, refresh=effective_refresh, annotations=annotations)
    if isinstance(chosen, Apply):
        return Run(APPLY, chosen.message, refresh=effective_refresh, plan=chosen.plan)
    return chosen.message


def plan_synced(
    stack: Stack, status: Obj, requeue: float | None, recorded: Obj | None, *, deleting: bool
) -> Plan:
    """Nothing to run: report, release a destroyed Stack, reclaim the Workspace, prune history."""
    last = status.get("lastUpdate") or {}
    if deleting:
        if last.get("state") != "succeeded":
            # A failed destroy keeps the finalizer: the stack's resources would be orphaned.
            return Plan([write_status(status, recorded)], after(requeue), status)
        return Plan([write_status(status, recorded), RemoveFinalizer()], Result.done(), status)
    writes: list[Write] = []
    if last.get("state") == "succeeded" and stack.spec.workspace_reclaim_policy == "Delete":
        writes += [ReleaseUpdate(recorded), DeleteWorkspace()]
        recorded = None
    keep = {
        (status.get("currentUpdate") or {}).get("name"),
        last.get("name"),
        (status.get("lastRefresh") or {}).get("name"),
    }
    writes += [write_status(status, recorded), PruneHistory(frozenset(str(k) for k in keep if k))]
    return Plan(writes, after(requeue), status)

"""Steps 4 to 6 of a Stack reconcile: ensure what the next Update runs in, then the Update (pure).

Prerequisites first (a kind that needs them waits until each is satisfied, asking a stale one to
run again), then the Workspace (applied, or kept as it is for a destroy), and once it is ready one
Update (``status.currentUpdate`` names it first: never two). The Workspace as applied is what the
Update is created in, so that part is the plan's ``then``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from pko.api.meta import parse_go_duration
from pko.api.stack import Stack
from pko.api.stackterms import POLICY_PACK_OVERRIDDEN
from pko.controllers.stack.policypacks import Enforced, merge_policy_packs, packs_digest
from pko.controllers.stack.status import (
    MSG_UPDATE,
    MSG_WORKSPACE,
    mark_reconciling,
    mark_stalled,
    reconcile_request,
    requirement_error,
)
from pko.controllers.stack.steps import (
    ApplyWorkspace,
    CreateUpdate,
    DeleteWorkspace,
    Emit,
    Log,
    Next,
    Observed,
    Plan,
    RemoveFinalizer,
    RequestReconcile,
    Resolved,
    Write,
    after,
    sooner,
    write_status,
)
from pko.controllers.stack.switch import stale_artifact
from pko.controllers.stack.templates import REASON_TEMPLATE_NOT_FOUND, TEMPLATES_ANNOTATION, Templates
from pko.controllers.stack.updateobject import Run, build_update
from pko.controllers.stack.waits import Awaited
from pko.controllers.stack.watches import workspace_ready, workspace_stalled
from pko.controllers.stack.workspaceobject import (
    PackRevision,
    ProjectInfoRevision,
    ResolvedSource,
    build_workspace,
    pack_commits,
)
from pko.machinery.conditions import get_condition
from pko.machinery.controller import Result
from pko.machinery.resource import Obj
from pko.machinery.writes import stamp

__all__ = [
    "ensure",
    "mark_workspace_stalled",
    "plan_update",
    "prerequisites_unmet",
    "roll_for_templates",
    "saved_project",
    "unservable_workspace",
    "workspace_body",
    "workspace_for_destroy",
]


def ensure(
    observed: Observed,
    stack: Stack,
    status: Obj,
    writes: list[Write],
    recorded: Obj | None,
    nxt: Next,
) -> Plan:
    """Prerequisites (not for a kind that needs none: a missing prerequisite must not block a
    deletion, and a refresh or drift check changes nothing the program deploys), then the
    Workspace, then (once it is ready) the Update ``nxt.run``."""
    obj, now, run = observed.obj, observed.now, nxt.run
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
    writes = list(writes)
    if run.kind.prerequisites:
        unmet, requests = prerequisites_unmet(obj, stack, observed.prerequisites, now)
        writes += requests
        if unmet is not None:
            mark_reconciling(status, "PrerequisiteNotSatisfied", unmet, generation, now)
            requeue = observed.settings.requeue(Awaited.PREREQUISITE)  # None: its watch wakes the Stack
            return Plan(
                [*writes, write_status(status, recorded)], after(sooner(requeue, nxt.waiting)), status
            )

    def then(workspace: Obj) -> Plan:
        return plan_update(
            obj,
            stack,
            status,
            workspace,
            run=run,
            commit=nxt.commit,
            now=now,
            created=observed.created,
            deleting=deleting,
            enforced=observed.templates.enforced,
        )

    if not run.kind.quiet:
        mark_reconciling(status, "StackProcessing", nxt.note or MSG_WORKSPACE, generation, now)
    if nxt.note is not None:
        writes.append(Emit("Warning", "DestroyFromProjectInfo", nxt.note))
    if nxt.kept is not None:
        writes.append(write_status(status, recorded))
        plan = then(nxt.kept)
        return Plan([*writes, *plan.writes], plan.result, status)
    if observed.templates.missing is not None:
        # Waits, not Stalled: the template may come in the same sync; its creation wakes the Stack.
        mark_reconciling(status, REASON_TEMPLATE_NOT_FOUND, observed.templates.missing, generation, now)
        return Plan([*writes, write_status(status, recorded)], after(observed.templates.requeue), status)
    try:
        body = workspace_body(
            stack,
            nxt.source,
            observed.settings.workspace_image,
            deleting=deleting,
            templates=observed.templates,
            packs=nxt.packs,
        )
    except ValueError as exc:
        mark_stalled(status, "SpecInvalid", str(exc), generation, now)
        return Plan([*writes, write_status(status, recorded)], Result.done(), status)
    writes += [write_status(status, recorded), ApplyWorkspace(body)]
    return Plan(writes, Result.done(), status, then)


def mark_workspace_stalled(status: Obj, workspace: Obj | None, generation: int, now: datetime) -> bool:
    """Mark the Stack Stalled for its Workspace's Stalled condition (a pod on a lost node, a Pulumi
    too old for the spec): only a person can help, and the Stack is where they look. False when the
    Workspace is not Stalled."""
    stalled = get_condition(((workspace or {}).get("status") or {}).get("conditions"), "Stalled")
    if workspace_ready(workspace) or stalled is None or stalled.get("status") != "True":
        return False
    ws_reason = str(stalled.get("reason") or "")
    reason = "PulumiVersionTooLow" if ws_reason == "IncompatibleConfiguration" else "WorkspaceFailed"
    mark_stalled(status, reason, f"{ws_reason}: {stalled.get('message', '')}", generation, now)
    return True


def plan_update(
    obj: Obj,
    stack: Stack,
    status: Obj,
    workspace: Obj,
    *,
    run: Run,
    commit: str,
    now: datetime,
    created: datetime,
    deleting: bool,
    enforced: Sequence[Enforced] = (),
) -> Plan:
    """The Workspace is applied: start the Update ``run`` describes once it is ready, or report why
    it cannot be. ``created`` names the Update (milliseconds: two Updates of one Stack may start in
    a second). A quiet kind (a drift check) leaves the conditions alone. ``enforced``: the policy
    packs the WorkspaceTemplates enforce; their digest goes with the Update into the status."""
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    if not workspace_ready(workspace):
        if not mark_workspace_stalled(status, workspace, generation, now):
            return Plan([], Result.done(), status)  # its next status change wakes us
        if deleting and not status.get("lastUpdate"):
            return Plan([RemoveFinalizer()], Result.done(), status)  # never ran: nothing to destroy
        return Plan([write_status(status)], Result.done(), status)
    update = build_update(stack, workspace, run.type, run.message, now=created, run=run, enforced=enforced)
    status["currentUpdate"] = {
        "generation": generation,
        "reconcileRequest": reconcile_request(obj),
        "name": update["metadata"]["name"],
        "commit": commit,
    }
    if run.kind.recorded_as:
        status["currentUpdate"]["kind"] = run.kind.recorded_as
    packs = merge_policy_packs(enforced, stack.spec.policy_packs)
    runs_packs = run.type in ("preview", "up")
    digest = packs_digest(enforced, pack_commits(workspace))
    if runs_packs and digest:
        status["currentUpdate"]["policyPacksDigest"] = digest
    if run.kind.quiet:
        fields = {"stack": (obj.get("metadata") or {}).get("name"), "update": update["metadata"]["name"]}
        said: Write = Log("drift check started", fields)
    else:
        mark_reconciling(status, "StackProcessing", MSG_UPDATE, generation, now)
        said = Emit("Normal", "StackUpdateDetected", run.message)
    writes: list[Write] = [write_status(status), said, CreateUpdate(update)]
    if runs_packs and packs.overridden and not run.kind.quiet:
        enforced_by = ", ".join(f"{name} ({packs.sources[name]})" for name in packs.overridden)
        message = (
            f"spec.policyPacks names packs a WorkspaceTemplate enforces; the template's run: {enforced_by}"
        )
        writes.append(Emit("Warning", POLICY_PACK_OVERRIDDEN, message))
    return Plan(writes, Result.done(), status)


def unservable_workspace(observed: Observed, stack: Stack) -> list[Write]:
    """The Workspace rewritten under the Update in flight when it names an artifact digest nobody
    serves and the source's served one is known (:mod:`pko.controllers.stack.switch`); else nothing."""
    got = observed.source
    if not isinstance(got, Resolved) or not stale_artifact(observed.workspace, got.source, served=got.served):
        return []
    deleting = bool((observed.obj.get("metadata") or {}).get("deletionTimestamp"))
    if observed.templates.missing is not None:
        return []  # the Stack's own reconcile reports it once the Update ends
    try:
        body = workspace_body(
            stack,
            got.source,
            observed.settings.workspace_image,
            deleting=deleting,
            templates=observed.templates,
            packs=got.packs,
        )
    except ValueError:
        return []  # the Stack's own reconcile reports it once the Update ends
    flux = ((observed.workspace or {}).get("spec") or {}).get("flux") or {}
    fields = {
        "stack": (observed.obj.get("metadata") or {}).get("name"),
        "stale": flux.get("digest"),
        "served": got.commit,
    }
    said = Log(
        "workspace names an artifact digest that is not served; rewritten under the running update", fields
    )
    return [said, ApplyWorkspace(body)]


def _revision(spec: Obj) -> tuple[object, ...]:
    """What a Workspace spec runs: its source at a revision (not fields the apiserver may default)."""
    git, flux = spec.get("git") or {}, spec.get("flux") or {}
    project = spec.get("projectInfo") or {}
    return (
        git.get("url"),
        git.get("ref"),
        git.get("dir"),
        flux.get("url"),
        flux.get("digest"),
        project.get("name"),
        tuple(sorted(pack_commits({"spec": spec}).items())),
    )


def roll_for_templates(observed: Observed, stack: Stack, plan: Plan) -> Plan:
    """``plan`` (the Stack has nothing to run, or waits) and, when the WorkspaceTemplates the
    Workspace was built with changed (its digest annotation is not the one built now), the
    Workspace re-applied at the revision it already runs: a template changed once rolls each
    Workspace that uses it once. Not under an Update in flight, nor for a Workspace being deleted
    or reclaimed, nor when the source moved on (the next run applies the new revision)."""
    workspace, templates, got = observed.workspace, observed.templates, observed.source
    if (
        workspace is None
        or (workspace.get("metadata") or {}).get("deletionTimestamp")
        or (observed.obj.get("metadata") or {}).get("deletionTimestamp")
        or templates.missing is not None
        or not isinstance(got, Resolved)
        or plan.then is not None
        or plan.status.get("currentUpdate")
        or any(isinstance(w, (ApplyWorkspace, DeleteWorkspace, RemoveFinalizer)) for w in plan.writes)
    ):
        return plan
    annotations = (workspace.get("metadata") or {}).get("annotations") or {}
    if str(annotations.get(TEMPLATES_ANNOTATION) or "") == templates.digest:
        return plan
    try:
        body = workspace_body(
            stack,
            got.source,
            observed.settings.workspace_image,
            deleting=False,
            templates=templates,
            packs=got.packs,
        )
    except ValueError:
        return plan  # a run reports it
    if _revision(body["spec"]) != _revision(workspace.get("spec") or {}):
        return plan
    said = Emit(
        "Normal", "WorkspaceTemplateChanged", "Workspace templates changed: the Workspace is re-applied"
    )
    return Plan([*plan.writes, said, ApplyWorkspace(body)], plan.result, plan.status)


def workspace_for_destroy(workspace: Obj | None) -> Obj | None:
    """The Workspace a destroy runs in as it is: the one that exists, unless it is Stalled (its pod
    cannot serve; rebuilt from the source, or from ``projectInfo`` when the source is gone) or going
    away. Not Ready yet: the destroy waits for it (its status change wakes the Stack)."""
    if workspace is None or (workspace.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if workspace_stalled(workspace) and not workspace_ready(workspace):
        return None
    return workspace


def prerequisites_unmet(
    obj: Obj, stack: Stack, others: Mapping[str, Obj | None], now: datetime
) -> tuple[str | None, list[Write]]:
    """None when every prerequisite (``others``: the Stacks by name, None when missing) is
    satisfied, else the message (Go's wording); and the prerequisites to ask to run again."""
    failed: list[str] = []
    message: str | None = None
    requests: list[Write] = []
    for prereq in stack.spec.prerequisites or []:
        other = others.get(prereq.name)
        if other is None:
            failed.append(prereq.name)
            missing = f'stacks.pulumi.com "{prereq.name}" not found'
            message = f'unable to fetch prerequisite "{prereq.name}": {missing}'
            continue
        within_text = prereq.requirement.succeeded_within_duration if prereq.requirement else None
        within: timedelta | None = parse_go_duration(within_text) if within_text else None
        error = requirement_error(other, within, now)
        if error is None:
            continue
        failed.append(prereq.name)
        message = f'prerequisite not satisfied for "{prereq.name}": {error.message}'
        if error.touch and reconcile_request(other) != error.touch:
            requests.append(RequestReconcile(prereq.name, error.touch))
    if len(failed) > 1:
        message = f"multiple prerequisites were not satisfied {', '.join(failed)}"
    return message, requests


def workspace_body(
    stack: Stack,
    source: ResolvedSource | None,
    workspace_image: Callable[[str | None], str],
    *,
    deleting: bool,
    templates: Templates,
    packs: Sequence[PackRevision] = (),
) -> Obj:
    """The Workspace to apply (``templates`` merged under the Stack's own, their digest noted, the
    policy packs from git ``packs`` fetched), stamped with its digest; ValueError for a reference the
    Go operator refuses."""
    body = build_workspace(stack, source, deleting=deleting, templates=templates.layers, packs=packs)
    if templates.digest:
        body["metadata"].setdefault("annotations", {})[TEMPLATES_ANNOTATION] = templates.digest
    spec = body["spec"]
    if not spec.get("image"):
        # Named on the Workspace (as upstream's workspaces show it): `kubectl get workspace`
        # then says which image runs, and a new operator default rolls the pod visibly.
        spec["image"] = workspace_image(spec.get("securityProfile"))
    return stamp(body)


def saved_project(stack: Stack, status: Obj) -> ProjectInfoRevision | None:
    """The project a destroy can run from when the source is gone: ``status.projectInfo`` (Go v2.8),
    a minimal Pulumi.yaml in a new workspace pod. None when there is none, or when the destroy
    must run the program (``runProgram``), which a bare project cannot."""
    info = status.get("projectInfo") or {}
    if stack.spec.run_program or not info.get("name"):
        return None
    return ProjectInfoRevision(str(info["name"]), str(info.get("runtime") or ""))

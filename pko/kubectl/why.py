"""``kubectl pko why`` (pure): the reason a Stack is not Ready, in one paragraph, and what to do.

The paragraph is built from what the operator already records: the Stack's deciding condition
(:func:`pko.kubectl.stackview.readiness`), ``lastFailure``, ``nextRetryTime``, ``currentUpdate``,
the Workspace's ``Ready`` condition and the last (or running) Update's ``Progressing``/``Failed``
condition and message; ``status.plan`` while a plan awaits approval, and ``status.drift``. Each
part is one sentence; the last one starts ``Fix:`` and gives the command to run when there is one.
The texts of the hints follow docs/stacks.md's tables of reasons (Status and conditions, Failures and
retries, Workspaces and Updates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pko.api.stackterms import POLICY_PACK_FAILED, POLICY_VIOLATION
from pko.kubectl.approval import approved_digest, plan_of, summary_text
from pko.kubectl.stackview import (
    AWAITING_APPROVAL,
    conditions,
    deleting,
    readiness,
    status_of,
    suspended,
    time_since,
    time_until,
)
from pko.machinery.conditions import get_condition

__all__ = ["Explanation", "explain"]

_MESSAGE_LINES: Final = 3
"""How many last lines of an error a paragraph quotes (``kubectl pko logs`` shows the rest)."""


@dataclass(frozen=True, slots=True)
class Explanation:
    ready: bool
    text: str


@dataclass(frozen=True, slots=True)
class _Names:
    name: str
    namespace: str

    @property
    def flags(self) -> str:
        return f"{self.name} -n {self.namespace}"

    def retry(self) -> str:
        return f"kubectl pko retry {self.flags}"

    def logs(self) -> str:
        return f"kubectl pko logs {self.flags}"

    def status(self) -> str:
        return f"kubectl pko status {self.flags}"


def _drift_sentence(stack: Mapping[str, Any], names: _Names, now: datetime) -> str:
    """What the last drift check found ("" when it found nothing)."""
    drift = status_of(stack).get("drift") or {}
    if not drift.get("detected"):
        return ""
    count = len(drift.get("resources") or [])
    found = f"{count} resource{'s differ' if count != 1 else ' differs'}" if count else "resources differ"
    ago = time_since(drift.get("lastCheckTime"), now)
    checked = f"checked {ago} ago; " if ago else ""
    return f"Drift: {found} from the stack's state ({checked}{names.status()} lists them)."


def _awaiting_sentence(stack: Mapping[str, Any], names: _Names, now: datetime) -> tuple[str, str]:
    """(the plan waiting, the fix) for a Stack AwaitingApproval."""
    plan = plan_of(stack)
    approve = f"kubectl pko approve {names.flags}"
    if plan is None:
        return (
            "AwaitingApproval.",
            f"wait for the plan to be recorded, then review it ({names.status()}) and {approve}",
        )
    ago = time_since(plan.time, now)
    recorded = f", recorded {ago} ago" if ago else ""
    said = (
        f"AwaitingApproval: plan {plan.digest} (preview Update {plan.update}{recorded}) has "
        f"{summary_text(plan.summary)}."
    )
    approved = approved_digest(stack)
    if approved and approved != plan.digest:
        said += f" The approved digest {approved} is another plan's."
    return said, f"review the plan ({names.status()}; {names.logs()} --update {plan.update}), then {approve}"


def _tail(text: Any, lines: int = _MESSAGE_LINES) -> str:
    """The last lines of a message, joined into one line."""
    kept = [" ".join(line.split()) for line in str(text or "").splitlines() if line.strip()]
    return " / ".join(kept[-lines:])


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?" else text + "."


def _failure_fix(failure: Mapping[str, Any], names: _Names) -> str:
    """What to do about ``status.lastFailure``, by its reason (the rerun is the caller's to add)."""
    reason = str(failure.get("reason") or "")
    if failure.get("transient"):
        owner = f"the stack is locked by {failure['lockOwner']}; " if failure.get("lockOwner") else ""
        return f"nothing: {owner}a transient failure is retried by itself (or {names.retry()} to retry now)"
    logs = f"({names.logs()} shows the engine output)"
    pending = ", ".join(failure.get("pendingOperations") or []) or "lastFailure.pendingOperations"
    hints = {
        "ProgramError": f"fix the program {logs}",
        "ResourceOperationFailed": f"fix the cause of the failed resource operation {logs}",
        "ConfigInvalid": "fix the stack configuration (spec.config, configRef, secretsRef, environment)",
        "InstallFailed": f"fix the program's dependencies (the install step failed {logs})",
        "AuthFailed": "check the backend credentials (e.g. PULUMI_ACCESS_TOKEN in spec.envRefs) and the "
        "secrets provider",
        "PendingOperations": f"resolve the pending operations ({pending}), e.g. pulumi refresh "
        "--clear-pending-creates in the workspace pod",
        "StackNotFound": "put the stack back in its backend",
        POLICY_VIOLATION: "change the program (or the pack's config in spec.policyPacks) so that the "
        "mandatory policy the message names passes",
        POLICY_PACK_FAILED: f"fix the policy pack the message names (its dependencies or its code) {logs}",
    }
    return hints.get(reason, f"find the cause in {names.logs()}")


def _rerun(fix: str, failure: Mapping[str, Any], names: _Names, *, stalled: bool) -> str:
    """A deterministic failure's fix, then how to run again."""
    if failure.get("transient"):
        return fix
    if stalled:
        return f"{fix}, then {names.retry()} (a new spec or source revision also starts over)"
    return f"{fix}, then {names.retry()} to run again now (else it is retried as scheduled)"


_WORKSPACE_FIXES: Final = {
    "Unauthenticated": "bind the ClusterRole system:auth-delegator to the workspace's ServiceAccount "
    "(spec.serviceAccountName; docs/stacks.md: Before the first Stack)",
    "PermissionDenied": "bind the ClusterRole system:auth-delegator to the workspace's ServiceAccount "
    "(spec.serviceAccountName; docs/stacks.md: Before the first Stack)",
    "ImagePullFailed": "fix the image name or its pull secret (spec.workspaceTemplate)",
    "InitContainerFailed": "fix the source or its git credentials",
    "ContainerConfigError": "create the Secret or ConfigMap the pod's env refers to (spec.envRefs)",
    "Unschedulable": "make room for the workspace pod (its resources, node selectors, taints)",
    "SpecInvalid": "fix the field the message names (spec.workspaceTemplate or the source)",
    "PodCreationFailed": "fix what the apiserver refuses (spec.workspaceTemplate, the ServiceAccount)",
    "InstallationFailed": "fix the program's dependencies (the workspace's install step failed)",
    "InitializationFailed": "fix the stack's configuration or backend settings",
    "IncompatibleConfiguration": "use a Pulumi image with CLI 3.202.0 or later, or only string config",
}
_WAITING_WORKSPACE: Final = frozenset(
    {"WaitingForReplicas", "RollingUpdate", "Installing", "Initializing", "ConnectionFailed"}
)


def _workspace_sentence(workspace: Mapping[str, Any] | None, name: str) -> tuple[str, str]:
    """(what the Workspace says, the fix for it): ("", "") when it is Ready."""
    if workspace is None:
        return f"Workspace {name} does not exist (yet).", ""
    ready = get_condition(conditions(workspace), "Ready")
    if ready is not None and ready.get("status") == "True":
        return "", ""
    if ready is None:
        return f"Workspace {name} has no Ready condition yet.", ""
    reason = str(ready.get("reason") or "")
    said = f"Workspace {name} is not Ready: {reason}: {_tail(ready.get('message'))}"
    if reason in _WAITING_WORKSPACE:
        return _sentence(said), ""
    return _sentence(said), _WORKSPACE_FIXES.get(reason, "fix what the Workspace reports")


def _update_sentence(update: Mapping[str, Any] | None, name: str, label: str, now: datetime) -> str:
    """What an Update says: running since, waiting for its Workspace, or how it failed."""
    if update is None:
        return f"The {label} Update {name} no longer exists." if name else ""
    conds = conditions(update)
    spec_type = str((update.get("spec") or {}).get("type") or "")
    upd_status = status_of(update)
    failed = get_condition(conds, "Failed")
    if failed is not None and failed.get("status") == "True":
        message = _tail(upd_status.get("message") or failed.get("message"))
        return _sentence(f"The {label} {spec_type} (Update {name}) failed: {failed.get('reason')}: {message}")
    progressing = get_condition(conds, "Progressing")
    if progressing is not None and progressing.get("status") == "True":
        since = time_since(upd_status.get("startTime"), now)
        return f"The {spec_type} Update {name} is running" + (f" (for {since})." if since else ".")
    if progressing is not None:
        return _sentence(
            f"The {spec_type} Update {name} has not started: {progressing.get('reason')}: "
            f"{_tail(progressing.get('message'))}"
        )
    return f"The {spec_type} Update {name} has not been picked up by the operator yet."


def explain(
    stack: Mapping[str, Any],
    *,
    workspace: Mapping[str, Any] | None,
    last_update: Mapping[str, Any] | None,
    current_update: Mapping[str, Any] | None,
    now: datetime,
) -> Explanation:
    """One paragraph: the deciding condition, what the Updates and the Workspace say, when it is
    retried, and ``Fix: ...``."""
    meta = stack.get("metadata") or {}
    names = _Names(str(meta.get("name", "")), str(meta.get("namespace", "")))
    status = status_of(stack)
    state = readiness(stack)
    last = status.get("lastUpdate") or {}
    failure = status.get("lastFailure") or {}
    parts: list[str] = []
    fix = ""
    if state.ready:
        ago = time_since(last.get("lastResyncTime"), now)
        ran = f" The last {last.get('type', 'update')} (Update {last.get('name')}) succeeded"
        ran += f" {ago} ago." if ago else "."
        text = f"Ready: {state.reason}: {_sentence(state.message)}" + (ran if last.get("name") else "")
        if suspended(stack):
            text += " spec.suspend is set: no new operation starts until it is cleared."
        drift = _drift_sentence(stack, names, now)
        return Explanation(True, f"{text} {drift}" if drift else text)

    parts.append(_sentence(f"{state.state}: {state.reason}: {state.message}".replace(": : ", ": ")))
    if deleting(stack):
        destroy = (stack.get("spec") or {}).get("destroyOnFinalize")
        parts.append(
            "The Stack is being deleted" + ("; its destroy must succeed before it goes." if destroy else ".")
        )
    current = status.get("currentUpdate") or {}
    workspace_name = str(((current_update or {}).get("spec") or {}).get("workspaceName") or names.name)
    ws_said, ws_fix = _workspace_sentence(workspace, workspace_name)

    if state.state == "Pending":
        fix = (
            "check that the operator is running and watches this namespace (its Deployment and log, "
            "in namespace pulumi-kubernetes-operator by default)"
        )
    elif state.state == AWAITING_APPROVAL:
        said, fix = _awaiting_sentence(stack, names, now)
        parts[0] = said  # instead of the condition's message, which says the same less exactly
    elif state.state == "Suspended":
        fix = f"""kubectl patch stack {names.flags} --type=merge -p '{{"spec":{{"suspend":false}}}}'"""
    elif state.state == "Reconciling" and state.reason == "PrerequisiteNotSatisfied":
        prereqs = [str(p.get("name")) for p in (stack.get("spec") or {}).get("prerequisites") or []]
        fix = "get the prerequisites Ready first: " + "; ".join(
            f"kubectl pko why {p} -n {names.namespace}" for p in prereqs
        )
    else:
        if current.get("name"):
            parts.append(_update_sentence(current_update, str(current["name"]), "current", now))
        if ws_said and (
            state.reason in ("WorkspaceFailed", "PulumiVersionTooLow")
            or (state.state == "Reconciling" and state.reason == "StackProcessing")
        ):
            parts.append(ws_said)
            fix = ws_fix
        if last.get("state") == "failed":
            parts.append(_update_sentence(last_update, str(last.get("name") or ""), "last", now))
            if failure:
                times = int(last.get("failures") or 0) + 1
                kind = "transient" if failure.get("transient") else "deterministic"
                parts.append(
                    f"Classified {failure.get('reason')} ({kind})"
                    + (f", {times} failures in a row." if times > 1 else ".")
                )
        if status.get("nextRetryTime"):
            when = status["nextRetryTime"]
            parts.append(f"Retried at {when} ({time_until(when, now)}).")
        if not fix:
            fix = _stalled_fix(state.reason, failure, names) if state.state == "Stalled" else ""
        if not fix and failure and last.get("state") == "failed":
            fix = _rerun(_failure_fix(failure, names), failure, names, stalled=state.state == "Stalled")
        if not fix and state.state == "Reconciling":
            fix = f"nothing: wait for the operation ({names.logs()} shows its engine output)"
    parts.append(_drift_sentence(stack, names, now))
    if fix:
        parts.append(_sentence(f"Fix: {fix}"))
    return Explanation(False, " ".join(p for p in parts if p))


def _stalled_fix(reason: str, failure: Mapping[str, Any], names: _Names) -> str:
    """What to do about a Stalled reason (docs/stacks.md's table)."""
    if reason == "SpecInvalid":
        return (
            f"correct what the message names (kubectl edit stack {names.flags}); for a missing Secret "
            f"or key, create it, then {names.retry()}"
        )
    if reason == "SourceUnavailable":
        return (
            "make the source resolvable (the branch, the Flux object or the Program, and its "
            "credentials); the operator looks again every 30 s"
        )
    if reason == "UpdateFailed":
        base = _failure_fix(failure, names) if failure else f"find the cause in {names.logs()}"
        return _rerun(base, failure, names, stalled=True)
    if reason in ("NamespaceTerminating", "StackNotFound"):
        return "as the message says"
    if reason == "WorkspaceFailed":
        return f"fix what the Workspace reports, then {names.retry()}"
    if reason == "PulumiVersionTooLow":
        return "use a workspace image with Pulumi CLI 3.202.0 or later, or only string config values"
    return ""

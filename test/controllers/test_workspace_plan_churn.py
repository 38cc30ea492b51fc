"""The Workspace reconcile's cuts of what a starting pod costs (issue 44), as pure decisions: the
status hold that coalesces progress messages."""

from __future__ import annotations

from typing import Any

from pko.controllers.workspace.plan import Finding, desired_status
from pko.controllers.workspace.status import PROGRESS_REASONS, STATUS_HOLD, held_for
from pko.machinery.resource import Obj

from .test_workspace_plan import workspace

WAITING = "Waiting for the workspace pod to be available"
INIT = 'Waiting for init container "fetch" to complete'


def status_of(finding: Finding, ws: Obj | None = None, **kw: Any) -> Obj:
    return desired_status(ws or workspace(), finding, **kw)


# --- the status hold ----------------------------------------------------------------------------


def test_a_progress_message_replacing_another_waits_for_the_hold() -> None:
    current = status_of(Finding("WaitingForReplicas", WAITING))
    new = status_of(Finding("WaitingForReplicas", INIT))
    assert held_for(current, new, 1.5) == STATUS_HOLD - 1.5
    assert held_for(current, new, STATUS_HOLD) == 0.0
    # The first status this process writes (e.g. after a restart) is never held.
    assert held_for(current, new, None) == 0.0
    # RollingUpdate and WaitingForReplicas are both the pod's progress: a new Workspace says the
    # first at once and the second once the hold ends.
    rolling = status_of(Finding("RollingUpdate", "Waiting for the statefulset to be updated"))
    assert held_for(rolling, current, 0.1) == STATUS_HOLD - 0.1
    assert PROGRESS_REASONS == {"RollingUpdate", "WaitingForReplicas"}


def test_every_other_reason_and_every_other_change_is_written_at_once() -> None:
    current = status_of(Finding("WaitingForReplicas", WAITING))
    for finding in (
        Finding("Installing", "Installing packages and plugins required by the program"),
        Finding("ConnectionFailed", "connection refused"),
        Finding("ImagePullFailed", 'container "pulumi": cannot pull image'),
        Finding("InitContainerFailed", "exit code 1", stalled=True),
        Finding("NodeLost", "The workspace pod is on node n, which no longer exists"),
        Finding("Succeeded", "", ready=True),
    ):
        assert held_for(current, status_of(finding), 0.1) == 0.0, finding
    # From a ready or failing status a progress one is news: a rollout starts, the node came back.
    for before in (Finding("Succeeded", "", ready=True), Finding("NodeLost", "lost", stalled=True)):
        rolling = status_of(Finding("RollingUpdate", "Waiting for the statefulset to be updated"))
        assert held_for(status_of(before), rolling, 0.1) == 0.0, before
    # A new generation observed (the Stack waits for it), another version: the same message or not.
    newer = workspace()
    newer["metadata"]["generation"] = 3
    assert held_for(current, status_of(Finding("WaitingForReplicas", INIT), newer), 0.1) == 0.0
    versioned = status_of(Finding("WaitingForReplicas", INIT), version="3.200.0")
    assert held_for(current, versioned, 0.1) == 0.0


def writes_of(timeline: list[tuple[float, Finding]]) -> list[tuple[float, str, str]]:
    """The status writes of a pod's start: a reconcile at each moment of ``timeline`` concludes
    its finding; a held one looks again when the hold ends (the last finding then stands)."""
    ws = workspace()
    written_at: float | None = None
    writes: list[tuple[float, str, str]] = []
    moments = sorted(timeline)
    requeues: list[float] = []
    while moments or requeues:
        if requeues and (not moments or requeues[0] < moments[0][0]):
            now = requeues.pop(0)
            finding = max((m for m in timeline if m[0] <= now), key=lambda m: m[0])[1]
        else:
            now, finding = moments.pop(0)
        status = desired_status(ws, finding)
        if status == ws.get("status"):
            continue
        hold = held_for(ws.get("status") or {}, status, now - written_at if written_at is not None else None)
        if hold > 0:
            requeues = sorted({*requeues, now + hold})
            continue
        ws["status"], written_at = status, now
        writes.append((now, finding.reason, finding.message))
    return writes


def test_a_pod_starting_as_in_the_deploy_benchmark_writes_six_statuses_not_eight() -> None:
    """stacks/app-0002 of the 20-Stack run before the cut: RollingUpdate, four WaitingForReplicas
    messages between 0.5 and 9.3 s, then Installing, Initializing, Succeeded: eight writes."""
    timeline = [
        (0.0, Finding("RollingUpdate", "Waiting for the statefulset to be updated")),
        (0.5, Finding("WaitingForReplicas", WAITING)),
        (0.9, Finding("WaitingForReplicas", INIT)),
        (2.5, Finding("WaitingForReplicas", WAITING)),
        (9.3, Finding("WaitingForReplicas", "Waiting for the workspace pod's IP")),
        (14.7, Finding("Installing", "Installing packages and plugins required by the program")),
        (17.5, Finding("Initializing", "Initializing and selecting a Pulumi stack")),
        (24.8, Finding("Succeeded", "", ready=True)),
    ]
    assert [(t, reason) for t, reason, _ in writes_of(timeline)] == [
        (0.0, "RollingUpdate"),
        (5.0, "WaitingForReplicas"),  # the hold's end: the message the pod then had
        (10.0, "WaitingForReplicas"),
        (14.7, "Installing"),
        (17.5, "Initializing"),
        (24.8, "Succeeded"),
    ]
    # A pod that waits long on one thing says it, at most a hold late; Ready is never held.
    fast = [timeline[0], timeline[2], (1.0, Finding("Succeeded", "", ready=True))]
    assert [w[1] for w in writes_of(fast)] == ["RollingUpdate", "Succeeded"]

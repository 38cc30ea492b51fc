"""The Workspace reconcile's cuts of what a starting pod costs (issue 44), as pure decisions: the
status hold that coalesces progress messages, the Node left unread while the pod starts, and a pod
dry run's answer reused for the same StatefulSet."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pko.controllers.workspace import plan as wp
from pko.controllers.workspace.plan import Finding, PodCheck, decide, desired_status
from pko.controllers.workspace.status import PROGRESS_REASONS, STATUS_HOLD, held_for
from pko.controllers.workspace.workloads import NODE_CHECK_GRACE, node_check_after
from pko.machinery.controller import Result
from pko.machinery.resource import Obj

from .test_workspace_plan import NOW, kinds, lost_node, observed, run, waiting_pod, workspace

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


# --- the Node of a starting pod ------------------------------------------------------------------


def starting_pod(age: float, *, reason: str | None = "ContainersNotReady") -> Obj:
    """A pod its kubelet is starting, ``age`` seconds after its creation (at NOW)."""
    pod = waiting_pod()
    pod["metadata"]["creationTimestamp"] = (NOW - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = pod["status"]["conditions"][0]
    if reason is None:
        pod["status"]["conditions"].remove(ready)
    else:
        ready["reason"] = reason
    return pod


def test_a_starting_pods_node_is_read_only_once_the_grace_is_over() -> None:
    for pod in (starting_pod(10.0), starting_pod(10.0, reason=None)):
        plan = decide(observed(pod=pod, now=NOW))
        assert plan.writes == [] and plan.then is None
        assert plan.finding == Finding("WaitingForReplicas", WAITING)
        assert plan.result == Result.requeue_after(NODE_CHECK_GRACE - 10.0)
    late = decide(observed(pod=starting_pod(NODE_CHECK_GRACE + 1), now=NOW))
    assert late.writes == [wp.CheckNode("node-7")]
    _, plan = run(late, lost_node())
    assert plan.finding is not None and plan.finding.reason == "NodeLost"


def test_a_lost_node_is_read_at_once_whatever_the_pods_age() -> None:
    """The node lifecycle controller marks a lost node's pods not ready without a reason; an
    evicted or replaced pod is terminating: neither waits for the grace."""
    marked = starting_pod(2.0)
    del marked["status"]["conditions"][0]["reason"]
    terminating = starting_pod(2.0)
    terminating["metadata"]["deletionTimestamp"] = "2026-11-28T11:59:59Z"
    for pod in (marked, terminating):
        first = decide(observed(pod=pod, now=NOW))
        assert first.writes == [wp.CheckNode("node-7")]
        _, plan = run(first, lost_node())
        assert plan.finding is not None and (plan.finding.reason, plan.finding.stalled) == ("NodeLost", True)
    assert node_check_after(starting_pod(2.0), None) == 0.0  # no clock: no grace
    assert node_check_after(starting_pod(2.0), NOW) == NODE_CHECK_GRACE - 2.0


# --- the pod dry run ----------------------------------------------------------------------------


def test_a_dry_runs_answer_stands_for_the_same_statefulset_a_while() -> None:
    obs = observed(pod=None, since_apply=30.0)
    digest = wp.digest_of(obs.desired_statefulset)
    assert digest  # the desired StatefulSet is stamped
    accepted = decide(observed(pod=None, since_apply=30.0, pod_check=PodCheck(digest, 20.0)))
    assert accepted.writes == [] and accepted.then is None
    assert accepted.finding == Finding("WaitingForReplicas", WAITING)
    refusal = (403, 'pods "x" is forbidden: serviceaccount "nope" not found')
    refused = decide(observed(pod=None, since_apply=30.0, pod_check=PodCheck(digest, 20.0, refusal)))
    assert refused.writes == [] and refused.finding == Finding("PodCreationFailed", refusal[1])
    assert refused.result == Result.requeue_after(wp.REQUEUE_WAITING)
    # Asked again once the answer is as old as the backstop, or for another template.
    for check in (PodCheck(digest, wp.POD_CHECK_REUSE), PodCheck("other", 1.0)):
        plan = decide(observed(pod=None, since_apply=30.0, pod_check=check))
        assert kinds(plan.writes) == ["CheckPod"], check
    # The dry run before an apply is always made: it decides whether to apply at all.
    first = decide(observed(apply_statefulset=True, pod_check=PodCheck(digest, 1.0)))
    assert kinds(first.writes) == ["CheckPod"]

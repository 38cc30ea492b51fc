"""The Workspace reconcile's decisions as pure functions: what it writes, in order, and the status
and Result that follow (no cluster; the reconciler tests run the same decisions against one)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from pko.controllers.options import ControllerOptions
from pko.controllers.workspace import plan as wp
from pko.controllers.workspace.plan import Failure, Finding, Observed, Plan, decide, desired_status, refused
from pko.controllers.workspace.workloads import (
    AGENT_API,
    ANNOTATION_AGENT_API,
    ANNOTATION_INITIALIZED,
    ANNOTATION_STACKS_HASH,
    NODE_LOST_GRACE,
    REVISION_LABEL,
    NodeReading,
    desired_service,
    desired_statefulset,
    parse_spec,
    stacks_hash,
)
from pko.machinery.controller import Result

from . import builders

Obj = dict[str, Any]
OPTIONS = ControllerOptions(agent_image="example/agent:v1")
ADDRESS = "my-stack-workspace.ns1:50051"


def workspace(spec: Obj | None = None, **status: Any) -> Obj:
    two_stacks = {"stacks": [{"name": "dev"}, {"name": "prod"}]}
    return builders.workspace(spec if spec is not None else two_stacks, generation=2, status=status)


def settled_sts(desired: Obj, revision: str = "rev-1") -> Obj:
    sts = copy.deepcopy(desired)
    sts["metadata"]["generation"] = 3
    sts["metadata"]["ownerReferences"] = [{"uid": "uid-1", "controller": True, "kind": "Workspace"}]
    sts["status"] = {"observedGeneration": 3, "updateRevision": revision}
    return sts


def ready_pod(revision: str = "rev-1", **annotations: str) -> Obj:
    return {
        "metadata": {
            "name": "my-stack-workspace-0",
            "namespace": "ns1",
            "uid": "pod-uid",
            "labels": {REVISION_LABEL: revision},
            "annotations": annotations,
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.9",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "pulumi", "ready": True, "state": {"running": {}}}],
        },
    }


def observed(ws: Obj | None = None, **fields: Any) -> Observed:
    ws = ws or workspace()
    spec = parse_spec(ws)
    desired_svc, desired_sts = desired_service(ws, spec), desired_statefulset(ws, spec, OPTIONS)
    defaults: dict[str, Any] = {
        "spec": spec,
        "statefulset": settled_sts(desired_sts),
        "pod": ready_pod(),
        "desired_service": desired_svc,
        "desired_statefulset": desired_sts,
        "address": ADDRESS,
        "stacks_hash": stacks_hash(ws["spec"]),
    }
    return Observed(ws, **{**defaults, **fields})


def initialized_pod(ws: Obj) -> Obj:
    """A pod the reconciler initialized with ``ws``'s stacks."""
    return ready_pod(**{ANNOTATION_INITIALIZED: "true", ANNOTATION_STACKS_HASH: stacks_hash(ws["spec"])})


def run(plan: Plan, *answers: Any) -> tuple[list[wp.Write], Plan]:
    """Follow ``then`` with the given answers, as the reconciler's act would; all the writes."""
    writes = list(plan.writes)
    for answer in answers:
        assert plan.then is not None, "the plan ended before its answers ran out"
        plan = plan.then(answer)
        writes += plan.writes
    assert plan.then is None, "the plan waits for another answer"
    return writes, plan


def kinds(writes: list[wp.Write]) -> list[str]:
    return [type(w).__name__ for w in writes]


def test_a_settled_initialized_workspace_writes_nothing_and_is_ready() -> None:
    ws = workspace(pulumiVersion="3.200.0")
    writes, plan = run(decide(observed(ws, pod=initialized_pod(ws))))
    assert writes == []
    assert plan.finding == Finding("Succeeded", "", ready=True)
    assert (plan.address, plan.version, plan.result) == (ADDRESS, "3.200.0", Result.done())


def test_changed_stacks_reach_the_live_agent_without_install_or_a_new_pod() -> None:
    """A config change: the pod initialized with the old ``stacks`` keeps running (its revision
    does not cover them); its agent gets every stack again, settings file reset, and the pod is
    marked with the new hash."""
    old = workspace(
        {"stacks": [{"name": "dev", "config": [{"key": "a", "value": "1"}]}]}, pulumiVersion="3.274.1"
    )
    new = workspace(
        {"stacks": [{"name": "dev", "config": [{"key": "b", "value": "2"}]}]}, pulumiVersion="3.274.1"
    )
    assert desired_statefulset(old, parse_spec(old), OPTIONS) == desired_statefulset(
        new, parse_spec(new), OPTIONS
    )
    obs = observed(new, pod=initialized_pod(old))
    first = decide(obs)
    assert first.writes == [wp.AskVersion(ADDRESS)]
    writes, plan = run(first, "3.274.1")
    assert kinds(writes) == ["AskVersion", "WriteStatus", "InitStack", "AnnotateInitialized", "Emit"]
    init = next(w for w in writes if isinstance(w, wp.InitStack))
    assert [item.key for item in init.stack.config] == ["b"]
    mark = next(w for w in writes if isinstance(w, wp.AnnotateInitialized))
    assert mark.stacks_hash == stacks_hash(new["spec"]) != stacks_hash(old["spec"])
    assert writes[-1] == wp.Emit(
        "Normal",
        "Reinitialized",
        "Applied the changed stack settings to workspace pod 'my-stack-workspace-0'",
    )
    assert plan.finding == Finding("Succeeded", "", ready=True)
    # A pod initialized by an operator that kept no hash gets its stacks again too.
    legacy = ready_pod(**{ANNOTATION_INITIALIZED: "true"})
    writes, _ = run(decide(observed(new, pod=legacy)), "3.274.1")
    assert "Install" not in kinds(writes) and "InitStack" in kinds(writes)


def test_a_live_agent_busy_with_an_operation_is_asked_again_later() -> None:
    ws = workspace({"stacks": [{"name": "dev"}]})
    _, initializing = run(decide(observed(ws, pod=ready_pod(**{ANNOTATION_INITIALIZED: "true"}))), "3.274.1")
    init = next(w for w in initializing.writes if isinstance(w, wp.InitStack))
    busy = Failure(
        "agent", "cannot select stack while operation 'u1' is in progress", code="FAILED_PRECONDITION"
    )
    plan = refused(initializing, init, busy)
    assert plan is not None and plan.finding is not None
    assert (plan.finding.reason, plan.finding.stalled) == ("Initializing", False)
    assert "operation 'u1' is in progress" in plan.finding.message
    assert plan.result == Result.requeue_after(wp.REQUEUE_BUSY)


def test_deleting_and_invalid_specs_decide_before_any_object() -> None:
    ws = workspace()
    ws["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    plan = decide(Observed(ws))
    assert plan.writes == [] and plan.keep_stalled and plan.finding is not None
    assert plan.finding.reason == "Deleting"
    plan = decide(Observed(workspace(), invalid="a path key cannot take a structured value"))
    assert plan.finding == Finding(
        "SpecInvalid", "invalid spec: a path key cannot take a structured value", stalled=True
    )
    assert plan.result == Result.done()


def test_a_new_statefulset_is_dry_run_then_applied_then_waited_for() -> None:
    obs = observed(statefulset=None, pod=None, apply_service=True, apply_statefulset=True)
    first = decide(obs)
    assert kinds(first.writes) == ["ApplyService", "CheckPod"]
    applied = copy.deepcopy(obs.desired_statefulset)
    applied["metadata"]["generation"] = 1
    writes, plan = run(first, None, applied)
    assert kinds(writes) == ["ApplyService", "CheckPod", "ApplyStatefulSet"]
    assert plan.finding is not None and plan.finding.reason == "RollingUpdate"
    # Just applied: the pod gets POD_CREATION_GRACE before a dry run asks why it is missing.
    assert plan.result == Result.requeue_after(wp.POD_CREATION_GRACE)


def test_a_pod_the_apiserver_refuses_is_spec_invalid_before_the_apply() -> None:
    plan = decide(observed(apply_statefulset=True))
    writes, plan = run(plan, (422, 'Pod "x" is invalid: volumeMounts[0].name: Not found'))
    assert kinds(writes) == ["CheckPod"]
    assert plan.finding == Finding(
        "SpecInvalid", 'Pod "x" is invalid: volumeMounts[0].name: Not found', stalled=True
    )
    assert plan.finding.stalled and plan.result == Result.done()
    # A 403 (admission, e.g. a missing ServiceAccount) does not stop the apply.
    obs = observed(apply_statefulset=True, pod=None)
    writes, _ = run(decide(obs), (403, "forbidden"), obs.desired_statefulset)
    assert kinds(writes) == ["CheckPod", "ApplyStatefulSet"]


def test_a_missing_pod_after_the_grace_is_explained_by_a_dry_run() -> None:
    obs = observed(pod=None, since_apply=30.0)
    writes, plan = run(decide(obs), (403, 'pods "x" is forbidden: serviceaccount "nope" not found'))
    assert kinds(writes) == ["CheckPod"]
    assert plan.finding == Finding(
        "PodCreationFailed", 'pods "x" is forbidden: serviceaccount "nope" not found'
    )
    assert plan.result == Result.requeue_after(wp.REQUEUE_WAITING)
    _, plan = run(decide(obs), None)
    assert plan.finding is not None and plan.finding.reason == "WaitingForReplicas"
    # Within the grace no dry run: the pod's creation wakes the reconcile.
    plan = decide(observed(pod=None, since_apply=1.0))
    assert plan.writes == [] and plan.result == Result.requeue_after(4.0)


def test_immutable_changes_and_a_previous_owner_wait_for_the_old_statefulset() -> None:
    obs = observed()
    sts = copy.deepcopy(obs.statefulset)
    assert sts is not None
    sts["spec"]["serviceName"] = "old"
    writes, plan = run(decide(observed(statefulset=sts, apply_statefulset=True)))
    assert writes == [
        wp.DeleteStatefulSet(sts, ("serviceName",)),
        wp.Emit("Warning", "Migrated", "Replaced the workspace statefulset"),
    ]
    assert plan.finding == Finding("RollingUpdate", "Replacing the statefulset to change serviceName")
    assert plan.result == Result.requeue_after(wp.REQUEUE_MIGRATION)
    other = copy.deepcopy(obs.statefulset)
    assert other is not None
    other["metadata"]["ownerReferences"][0]["uid"] = "uid-0"
    writes, plan = run(decide(observed(statefulset=other, apply_statefulset=True)))
    assert writes == [] and plan.finding is not None
    assert "of a previous Workspace to go" in plan.finding.message


def test_a_new_pod_template_waits_for_the_running_update_then_rolls() -> None:
    """An upgrade of pko changes the agent's image under a live Stack: the pod that runs an operation
    is not replaced under it (nor the StatefulSet deleted for an immutable change), and no other Update
    may start meanwhile (not Ready); once none runs, the apply goes ahead as before."""
    ours = ready_pod(**{ANNOTATION_AGENT_API: AGENT_API})
    upgraded = desired_statefulset(
        workspace(), parse_spec(workspace()), ControllerOptions(agent_image="x/agent:v2")
    )
    assert upgraded["spec"]["template"]["metadata"]["annotations"][ANNOTATION_AGENT_API] == AGENT_API
    held = decide(
        observed(desired_statefulset=upgraded, apply_statefulset=True, pod=ours, running_updates=("u-1",))
    )
    assert held.writes == [] and held.then is None
    assert held.finding == Finding(
        wp.REASON_UPDATE_RUNNING,
        "Waiting for the running Update u-1 to finish before replacing the workspace pod",
    )
    assert desired_status(workspace(), held.finding)["conditions"][0]["status"] == "False"
    sts = copy.deepcopy(observed().statefulset)
    assert sts is not None
    sts["spec"]["serviceName"] = "old"
    migrating = decide(
        observed(statefulset=sts, apply_statefulset=True, pod=ours, running_updates=("u-1", "u-2"))
    )
    assert migrating.writes == [] and migrating.finding is not None
    assert "Update u-1, u-2 to finish" in migrating.finding.message
    # Nothing to apply: a running Update changes nothing (the settled case writes nothing, Ready).
    ws = workspace(pulumiVersion="3.200.0")
    settled_pod = initialized_pod(ws)
    settled_pod["metadata"]["annotations"][ANNOTATION_AGENT_API] = AGENT_API
    writes, settled = run(decide(observed(ws, pod=settled_pod, running_updates=("u-1",))))
    assert writes == [] and settled.finding == Finding("Succeeded", "", ready=True)
    # None running: dry run, then the apply.
    rolling = decide(observed(desired_statefulset=upgraded, apply_statefulset=True, pod=ours))
    assert kinds(rolling.writes) == ["CheckPod"] and rolling.then is not None
    assert kinds(rolling.then(None).writes) == ["ApplyStatefulSet"]


def test_a_pod_of_the_go_operator_rolls_at_once_though_its_update_runs() -> None:
    """Switching from the Go operator: its agent cannot be followed (its Update ends OperationLost), so
    its pod, which lacks pko's agent-API annotation, is replaced at once rather than held while the Go
    agent's operation runs on unobserved."""
    upgraded = desired_statefulset(
        workspace(), parse_spec(workspace()), ControllerOptions(agent_image="x/agent:v2")
    )
    go_pod = ready_pod()
    rolling = decide(
        observed(desired_statefulset=upgraded, apply_statefulset=True, pod=go_pod, running_updates=("u-1",))
    )
    assert kinds(rolling.writes) == ["CheckPod"] and rolling.then is not None
    assert kinds(rolling.then(None).writes) == ["ApplyStatefulSet"]


def test_the_rollout_waits_for_the_statefulset_controller_and_the_new_pod() -> None:
    obs = observed()
    behind = copy.deepcopy(obs.statefulset)
    assert behind is not None
    behind["status"]["observedGeneration"] = 2
    plan = decide(observed(statefulset=behind))
    assert plan.finding == Finding("RollingUpdate", "Waiting for the statefulset to be updated")
    plan = decide(observed(pod=ready_pod(revision="rev-0")))
    assert plan.finding is not None and plan.finding.reason == "RollingUpdate"
    assert decide(observed(address=None)).finding == Finding(
        "WaitingForReplicas", "Waiting for the workspace pod's IP"
    )


def test_a_diagnosed_pod_is_reported_and_stalls_only_when_the_user_must_act() -> None:
    pod = ready_pod()
    pod["status"]["phase"] = "Failed"
    pod["status"]["message"] = "evicted"
    plan = decide(observed(pod=pod))
    assert plan.finding is not None and plan.finding.reason == "PodFailed"
    assert plan.result == Result.requeue_after(wp.REQUEUE_WAITING)


def test_initialization_installs_then_initializes_each_stack_then_marks_the_pod() -> None:
    obs = observed()
    first = decide(obs)
    assert first.writes == [wp.AskVersion(ADDRESS)]
    writes, plan = run(first, "3.274.1")
    assert kinds(writes) == [
        "AskVersion",
        "WriteStatus",
        "Install",
        "WriteStatus",
        "InitStack",
        "InitStack",
        "AnnotateInitialized",
        "Emit",
    ]
    progress = [w.finding.reason for w in writes if isinstance(w, wp.WriteStatus)]
    assert progress == ["Installing", "Initializing"]
    assert [w.stack.name for w in writes if isinstance(w, wp.InitStack)] == ["dev", "prod"]
    assert plan.finding == Finding("Succeeded", "", ready=True)
    assert (plan.address, plan.version, plan.result) == (ADDRESS, "3.274.1", Result.done())


def test_json_config_on_an_old_cli_is_incompatible() -> None:
    ws = workspace({"stacks": [{"name": "dev", "config": [{"key": "k", "value": {"a": 1}}]}]})
    writes, plan = run(decide(observed(ws)), "3.150.0")
    assert kinds(writes) == ["AskVersion", "Emit"]
    assert plan.finding is not None and plan.finding.reason == "IncompatibleConfiguration"
    assert plan.finding.stalled and plan.version == "3.150.0"


def test_failures_of_the_agent_map_to_the_go_operators_reasons() -> None:
    _, installing = run(decide(observed()), "3.274.1")
    install, init = wp.Install(), next(w for w in installing.writes if isinstance(w, wp.InitStack))
    failed = refused(
        installing, install, Failure("agent", "plugin not found", code="UNKNOWN", reason="Unknown")
    )
    assert failed is not None
    assert failed.writes == [wp.Emit("Warning", "InstallationFailure", "plugin not found")]
    assert failed.finding == Finding("InstallationFailed", "plugin not found", stalled=True)
    assert failed.version == "3.274.1"
    failed = refused(installing, init, Failure("value", "path=true is incompatible"))
    assert failed is not None and failed.finding is not None
    assert failed.finding.reason == "InitializationFailed"
    assert failed.writes == [
        wp.Emit(
            "Warning",
            "StackInitializationFailure",
            "Failed to initialize stack 'dev': path=true is incompatible",
        )
    ]
    # A token that cannot be minted mid-install is the connection's failure, not the program's.
    failed = refused(installing, install, Failure("token", "denied", reason="TokenRequestFailed"))
    assert failed is not None and failed.finding == Finding("TokenRequestFailed", "denied")

    asking = decide(observed())
    ask = asking.writes[0]
    unavailable = refused(
        asking, ask, Failure("agent", "connection refused", code="UNAVAILABLE", transient=True)
    )
    assert unavailable is not None and unavailable.finding == Finding(
        "ConnectionFailed", "connection refused"
    )
    assert unavailable.result == Result.requeue_after(wp.REQUEUE_CONNECTION)
    assert unavailable.writes == [wp.Emit("Warning", "ConnectionFailure", "connection refused")]
    denied = refused(asking, ask, Failure("agent", "no", code="UNAUTHENTICATED", reason="Unauthenticated"))
    assert denied is not None and denied.finding == Finding("Unauthenticated", "no")
    assert denied.result == Result.requeue_after(wp.REQUEUE_REFUSED)
    timeout = refused(asking, ask, Failure("timeout", "timed out waiting for the workspace agent"))
    assert timeout is not None and timeout.finding is not None
    assert timeout.finding.reason == "ConnectionFailed"
    assert refused(asking, ask, Failure("value", "bug")) is None  # not ours: it propagates


def test_refused_writes_of_the_api() -> None:
    obs = observed()
    assert obs.statefulset is not None
    apply = wp.ApplyStatefulSet(obs.desired_statefulset, obs.statefulset)
    base = Plan([apply])
    immutable = (
        "StatefulSet.apps is invalid: spec: Forbidden: updates to statefulset spec for fields other than"
    )
    migrate = refused(base, apply, Failure("api", immutable, status=422))
    assert migrate is not None and kinds(migrate.writes) == ["DeleteStatefulSet", "Emit"]
    invalid = refused(base, apply, Failure("api", "spec.template: Invalid value", status=422))
    assert invalid is not None and invalid.finding == Finding(
        "SpecInvalid", "spec.template: Invalid value", stalled=True
    )
    assert refused(base, apply, Failure("api", "etcd timeout", status=500)) is None
    service = wp.ApplyService(obs.desired_service)
    assert refused(base, service, Failure("api", "conflict", status=409)) is None
    mark = wp.AnnotateInitialized(ready_pod(), "3.274.1")
    replaced = refused(base, mark, Failure("api", "uid mismatch", status=409))
    assert replaced is not None and replaced.result == Result.requeue()
    assert replaced.finding == Finding("WaitingForReplicas", "The workspace pod was replaced")


def test_desired_status_keeps_stalled_only_while_deleting() -> None:
    stalled = Finding("SpecInvalid", "bad", stalled=True)
    ws = workspace(conditions=[], pulumiVersion="3.1.0")
    ws["status"] = desired_status(ws, stalled)
    types = [c["type"] for c in ws["status"]["conditions"]]
    assert types == ["Ready", "Stalled"] and ws["status"]["pulumiVersion"] == "3.1.0"
    kept = desired_status(ws, Finding("Deleting", "going"), keep_stalled=True)
    assert [c["type"] for c in kept["conditions"]] == ["Ready", "Stalled"]
    cleared = desired_status(ws, Finding("Succeeded", "", ready=True), address=ADDRESS, version="3.2.0")
    assert [c["type"] for c in cleared["conditions"]] == ["Ready"]
    assert (cleared["address"], cleared["pulumiVersion"], cleared["observedGeneration"]) == (
        ADDRESS,
        "3.2.0",
        2,
    )


def test_a_stack_it_may_not_create_missing_from_the_backend_leaves_the_workspace_ready() -> None:
    """A stack declared ``create: false`` (a destroy's Workspace, ``useLocalStackOnly``) that the
    backend lacks: a Warning, the other stacks initialized, the pod serving; the Update for that
    stack then ends StackNotFound, saying where it looked (issue 30)."""
    ws = workspace({"stacks": [{"name": "dev", "create": False}, {"name": "prod", "create": True}]})
    _, initializing = run(decide(observed(ws)), "3.274.1")
    dev = next(w for w in initializing.writes if isinstance(w, wp.InitStack))
    missing = Failure("agent", "stack 'dev' not found in backend file:///state", code="NOT_FOUND")
    rest = refused(initializing, dev, missing)
    assert rest is not None
    assert kinds(rest.writes) == ["Emit", "InitStack", "AnnotateInitialized", "Emit"]
    warning = rest.writes[0]
    assert isinstance(warning, wp.Emit) and (warning.type, warning.reason) == ("Warning", "StackNotFound")
    assert "file:///state" in warning.message
    assert [w.stack.name for w in rest.writes if isinstance(w, wp.InitStack)] == ["prod"]
    assert rest.finding == Finding("Succeeded", "", ready=True)
    assert (rest.address, rest.version) == (ADDRESS, "3.274.1")
    # A stack it may create that is still missing is a failure of the initialization.
    prod = next(w for w in rest.writes if isinstance(w, wp.InitStack))
    failed = refused(rest, prod, Failure("agent", "stack not found", code="NOT_FOUND"))
    assert failed is not None and failed.finding is not None
    assert failed.finding.reason == "InitializationFailed" and failed.finding.stalled


# --- a lost node (issue 28) ---------------------------------------------------------------------

NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)
OUT_OF_SERVICE = "kubectl taint nodes node-7 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def waiting_pod(node: str | None = "node-7", **meta: Any) -> Obj:
    """The workspace pod as the node lifecycle controller leaves it on a lost node: Ready=False."""
    pod = ready_pod()
    pod["metadata"].update(meta)
    pod["status"]["conditions"][0]["status"] = "False"
    if node is not None:
        pod["spec"] = {"nodeName": node}
    return pod


def lost_node(status: str = "Unknown", since: float = 120.0, taints: tuple[str, ...] = ()) -> NodeReading:
    changed = (NOW - timedelta(seconds=since)).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": status,
        "reason": "NodeStatusUnknown" if status == "Unknown" else "KubeletNotReady",
        "message": "Kubelet stopped posting node status." if status == "Unknown" else "PLEG is not healthy",
        "lastTransitionTime": changed,
    }
    return NodeReading(NOW, ready=ready, taints=frozenset(taints))


def test_a_pod_waiting_on_a_lost_node_stalls_after_the_grace_naming_the_node_and_the_way_out() -> None:
    first = decide(observed(pod=waiting_pod()))
    assert first.writes == [wp.CheckNode("node-7")]
    writes, plan = run(first, lost_node(since=120.0))
    assert kinds(writes) == ["CheckNode"]
    assert plan.finding is not None and plan.finding.stalled
    assert plan.finding.reason == "NodeLost"
    message = plan.finding.message
    assert message.startswith(
        "The workspace pod ns1/my-stack-workspace-0 is on node node-7, which has not been ready since "
        "2026-11-28T11:58:00Z (Kubelet stopped posting node status.). Kubernetes will not start the pod "
        "elsewhere while the node may still run it. If node-7 is gone for good, mark it out of service: "
    ), message
    assert OUT_OF_SERVICE in message and "(or delete the Node)" in message
    # No Node watch: looked at again now and then, though the pod's events normally wake it.
    assert plan.result == Result.requeue_after(wp.REQUEUE_WAITING)
    # The message does not move with the clock: a later look writes no new status.
    later = NodeReading(NOW + timedelta(minutes=5), ready=lost_node().ready)
    assert run(first, later)[1].finding == plan.finding


def test_within_the_grace_a_lost_node_is_said_but_not_stalled_and_looked_at_when_it_ends() -> None:
    _, plan = run(decide(observed(pod=waiting_pod())), lost_node(since=20.0))
    assert plan.finding is not None and plan.finding.reason == "NodeLost" and not plan.finding.stalled
    assert plan.result == Result.requeue_after(NODE_LOST_GRACE - 20.0)


def test_a_not_ready_node_is_node_not_ready_with_the_kubelets_words() -> None:
    _, plan = run(decide(observed(pod=waiting_pod())), lost_node("False", since=600.0))
    assert plan.finding is not None and plan.finding.stalled
    assert plan.finding.reason == "NodeNotReady"
    assert "(PLEG is not healthy)" in plan.finding.message and OUT_OF_SERVICE in plan.finding.message


def test_a_terminating_pod_on_a_lost_node_and_one_a_rollout_replaces_ask_the_node_too() -> None:
    """The eviction after the unreachable toleration, and a rollout's delete, are never confirmed
    by a lost node: both wait on it."""
    terminating = waiting_pod(deletionTimestamp="2026-11-28T11:55:00Z")
    _, plan = run(decide(observed(pod=terminating)), lost_node())
    assert plan.finding is not None and (plan.finding.reason, plan.finding.stalled) == ("NodeLost", True)
    old = waiting_pod()
    old["metadata"]["labels"][REVISION_LABEL] = "rev-0"
    first = decide(observed(pod=old))
    assert first.writes == [wp.CheckNode("node-7")]
    assert run(first, lost_node())[1].finding == plan.finding
    # On a healthy node the rollout is what it says.
    healthy = NodeReading(NOW, ready={"type": "Ready", "status": "True"})
    assert run(first, healthy)[1].finding == Finding(
        "RollingUpdate", "Waiting for the statefulset to be updated"
    )


def test_a_deleted_node_and_one_marked_out_of_service_wait_for_the_pod_gc() -> None:
    _, plan = run(decide(observed(pod=waiting_pod())), NodeReading(NOW, exists=False))
    assert plan.finding == Finding(
        "NodeLost",
        "The workspace pod ns1/my-stack-workspace-0 is on node node-7, which no longer exists: "
        "waiting for Kubernetes to delete the pod",
    )
    marked = lost_node(taints=("node.kubernetes.io/unreachable", "node.kubernetes.io/out-of-service"))
    _, plan = run(decide(observed(pod=waiting_pod())), marked)
    assert plan.finding is not None and not plan.finding.stalled
    assert plan.finding.message.endswith(
        "which is marked out of service: waiting for Kubernetes to delete the pod"
    )


def test_a_node_that_is_ready_or_cannot_be_read_leaves_todays_message() -> None:
    today = Finding("WaitingForReplicas", "Waiting for the workspace pod to be available")
    first = decide(observed(pod=waiting_pod()))
    for answer in (None, NodeReading(NOW, ready={"type": "Ready", "status": "True"}), NodeReading(NOW)):
        _, plan = run(first, answer)  # None: a 403 (no get nodes grant) or the API unreachable
        assert plan.finding == today and plan.result == Result.requeue_after(wp.REQUEUE_WAITING)


def test_the_node_is_not_read_for_a_ready_pod_an_unbound_one_or_one_the_user_must_fix() -> None:
    ws = workspace(pulumiVersion="3.200.0")
    ready = initialized_pod(ws)
    ready["spec"] = {"nodeName": "node-7"}
    assert decide(observed(ws, pod=ready)).writes == []
    assert decide(observed(pod=waiting_pod(node=None))).writes == []
    failed = waiting_pod()
    failed["status"]["phase"] = "Failed"
    plan = decide(observed(pod=failed))
    assert plan.writes == [] and plan.finding is not None and plan.finding.reason == "PodFailed"


def test_the_workspace_recovers_from_a_lost_node_and_stalled_goes() -> None:
    ws = workspace(conditions=[], pulumiVersion="3.200.0")
    _, plan = run(decide(observed(ws, pod=waiting_pod())), lost_node())
    assert plan.finding is not None
    ws["status"] = desired_status(ws, plan.finding)
    assert {c["type"]: c["reason"] for c in ws["status"]["conditions"]} == {
        "Ready": "NodeLost",
        "Stalled": "NodeLost",
    }
    back = initialized_pod(ws)
    back["spec"] = {"nodeName": "node-7"}
    plan = decide(observed(ws, pod=back))
    assert plan.finding == Finding("Succeeded", "", ready=True)
    assert [c["type"] for c in desired_status(ws, plan.finding)["conditions"]] == ["Ready"]

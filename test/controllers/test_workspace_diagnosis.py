"""Why a Workspace's pod is not ready (pure: no cluster): the pod's own statuses, then its node's
Ready condition and taints (issue 28)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pko.controllers.workspace.workloads import (
    NODE_LOST_GRACE,
    OUT_OF_SERVICE_TAINT,
    NodeReading,
    diagnose_node,
    diagnose_pod,
)

from .builders import Obj

# --- pod diagnosis ----------------------------------------------------------------------------


def pod(status: Obj, **meta: Any) -> Obj:
    return {"metadata": {"name": "my-stack-workspace-0", **meta}, "status": status}


def test_ready_pod_has_no_problem() -> None:
    assert (
        diagnose_pod(pod({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})) is None
    )


def test_image_pull_failure_names_container_and_image() -> None:
    status = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "pulumi",
                "image": "nope:1",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
            }
        ],
    }
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "ImagePullFailed" and not found.stalled
    assert 'container "pulumi"' in found.message and '"nope:1"' in found.message


def test_init_image_pull_failure() -> None:
    status = {
        "initContainerStatuses": [
            {"name": "bootstrap", "image": "bad/agent", "state": {"waiting": {"reason": "InvalidImageName"}}}
        ]
    }
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "ImagePullFailed" and "init container" in found.message


def failing_init(restarts: int, logs: str) -> Obj:
    return {
        "initContainerStatuses": [
            {"name": "bootstrap", "state": {"terminated": {"exitCode": 0}}},
            {
                "name": "fetch",
                "restartCount": restarts,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": logs}},
            },
        ]
    }


def test_init_failure_carries_the_last_log_lines_and_stalls_after_repeats() -> None:
    logs = "\n".join(f"line {i}" for i in range(100)) + "\nrevision deadbeef not found in https://h/r.git\n"
    found = diagnose_pod(pod(failing_init(1, logs)))
    assert found is not None and found.reason == "InitContainerFailed" and not found.stalled
    assert 'init container "fetch" failed (exit code 1' in found.message
    assert found.message.endswith("revision deadbeef not found in https://h/r.git")
    assert "line 0\n" not in found.message
    stalled = diagnose_pod(pod(failing_init(3, logs)))
    assert stalled is not None and stalled.stalled


def test_running_init_container_is_waiting() -> None:
    status = {"initContainerStatuses": [{"name": "bootstrap", "state": {"running": {}}}]}
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "WaitingForReplicas" and "bootstrap" in found.message


def test_unschedulable() -> None:
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available",
            }
        ],
    }
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "Unschedulable" and "0/1 nodes" in found.message


def test_crash_loop_and_config_error() -> None:
    crash = {
        "containerStatuses": [
            {
                "name": "pulumi",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 2, "message": "agent: bad flag"}},
            }
        ]
    }
    found = diagnose_pod(pod(crash))
    assert found is not None and found.reason == "CrashLoopBackOff" and "bad flag" in found.message
    config = {
        "containerStatuses": [
            {
                "name": "pulumi",
                "state": {
                    "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "x" not found'}
                },
            }
        ]
    }
    found = diagnose_pod(pod(config))
    assert found is not None and found.reason == "ContainerConfigError" and 'secret "x"' in found.message


def test_terminating_and_not_ready_pods_wait() -> None:
    found = diagnose_pod(pod({}, deletionTimestamp="2024-01-01T00:00:00Z"))
    assert found is not None and found.reason == "WaitingForReplicas" and "terminating" in found.message
    found = diagnose_pod(pod({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}))
    assert found is not None and found.reason == "WaitingForReplicas"


# --- reading the pod's node (issue 28) ----------------------------------------------------------

NODE_NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def node(ready: str, changed: str = "2026-11-28T11:58:00Z", taints: list[str] | None = None) -> Obj:
    """A Node as the API returns it: the node lifecycle controller's Ready condition and taints."""
    return {
        "metadata": {"name": "node-7"},
        "spec": {"taints": [{"key": k, "effect": "NoExecute"} for k in taints or []]},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "Unknown"},
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastTransitionTime": changed,
                },
            ]
        },
    }


def bound_pod() -> Obj:
    return {
        "metadata": {"name": "my-stack-workspace-0", "namespace": "ns1"},
        "spec": {"nodeName": "node-7"},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }


def test_a_node_reading_keeps_only_its_ready_condition_and_taint_keys() -> None:
    reading = NodeReading.of(node("Unknown", taints=["node.kubernetes.io/unreachable"]), NODE_NOW)
    assert reading.exists and reading.now == NODE_NOW
    assert reading.ready is not None and reading.ready["status"] == "Unknown"
    assert reading.taints == frozenset({"node.kubernetes.io/unreachable"})
    assert NodeReading.of(None, NODE_NOW) == NodeReading(NODE_NOW, exists=False)
    assert NodeReading.of({"metadata": {"name": "bare"}}, NODE_NOW) == NodeReading(NODE_NOW)


def test_diagnose_node_by_the_nodes_ready_condition_and_the_grace() -> None:
    pod = bound_pod()
    lost = diagnose_node(pod, NodeReading.of(node("Unknown"), NODE_NOW))
    assert lost is not None and (lost.reason, lost.stalled, lost.recheck_after) == ("NodeLost", True, None)
    assert "since 2026-11-28T11:58:00Z (Kubelet stopped posting node status.)" in lost.message
    assert (
        "kubectl taint nodes node-7 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in lost.message
    )
    early = diagnose_node(pod, NodeReading.of(node("Unknown"), NODE_NOW - timedelta(seconds=90)))
    assert early is not None and not early.stalled
    assert early.recheck_after == NODE_LOST_GRACE - 30.0
    assert early.message == lost.message
    not_ready = diagnose_node(pod, NodeReading.of(node("False"), NODE_NOW))
    assert not_ready is not None and (not_ready.reason, not_ready.stalled) == ("NodeNotReady", True)
    assert diagnose_node(pod, NodeReading.of(node("True"), NODE_NOW)) is None
    # No time on the condition: nothing to wait for.
    untimed = diagnose_node(pod, NodeReading.of(node("Unknown", changed=""), NODE_NOW))
    assert untimed is not None and untimed.stalled and "since an unknown time" in untimed.message
    gone = diagnose_node(pod, NodeReading.of(None, NODE_NOW))
    assert gone is not None and (gone.reason, gone.stalled) == ("NodeLost", False)
    assert "which no longer exists" in gone.message
    fenced = diagnose_node(pod, NodeReading.of(node("Unknown", taints=[OUT_OF_SERVICE_TAINT]), NODE_NOW))
    assert fenced is not None and not fenced.stalled and "marked out of service" in fenced.message

"""The faults: each a function of the cell's name that causes one (a kill, an eviction, a restart of a
node component, a network cut, a full disk, a deleted Secret, a lost node), the table of them, and
what each changes that shows from outside (:func:`snapshot`, :data:`EFFECT`)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from pko.devtools.chaos.cells import SPARE, passphrase
from pko.devtools.chaos.kube import (
    NAMESPACE,
    OPERATIONS,
    OPERATOR,
    OPERATOR_NS,
    TRANSIENT,
    VOLUMES,
    apply,
    condition,
    get,
    items,
    kubectl,
)
from pko.devtools.localnode.images import _ctr
from pko.devtools.localnode.node import IMAGES, sh
from pko.devtools.localnode.node2 import node_add, node_lose, node_remove
from pko.devtools.localnode.processes import restart
from pko.devtools.waiting import until


def _container_pid(pod: dict[str, Any], container: str) -> int:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s["name"] == container and s.get("containerID", "").startswith("containerd://"):
            cid = s["containerID"].split("//", 1)[1]
            for line in _ctr("tasks", "ls").splitlines()[1:]:
                parts = line.split()
                if parts and parts[0] == cid:
                    return int(parts[1])
    raise RuntimeError(f"no running container {container} in pod {pod['metadata']['name']}")


def operator_pods() -> list[dict[str, Any]]:
    pods = items("pods", "-l", "control-plane=controller-manager", namespace=OPERATOR_NS)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def leader_pod() -> dict[str, Any]:
    leases = items("leases", namespace=OPERATOR_NS)
    holders = [(le.get("spec") or {}).get("holderIdentity") or "" for le in leases]
    for pod in operator_pods():
        if any(h.startswith(pod["metadata"]["name"]) for h in holders):
            return pod
    raise RuntimeError(f"no operator pod holds a lease ({holders})")


def workspace_pod(name: str) -> dict[str, Any]:
    pod = get("pod", f"{name}-workspace-0")
    if pod is None:
        raise RuntimeError(f"no workspace pod for {name}")
    return pod


@contextmanager
def cut_off(source_ip: str, dest_ip: str) -> Iterator[None]:
    rules = [["-s", source_ip, "-d", dest_ip, "-j", "DROP"], ["-s", dest_ip, "-d", source_ip, "-j", "DROP"]]
    for r in rules:
        sh("iptables", "-w", "-I", "FORWARD", "1", *r)
    try:
        yield
    finally:
        for r in rules:
            sh("iptables", "-w", "-D", "FORWARD", *r, check=False)


def _restart(component: str, sig: signal.Signals = signal.SIGTERM, down_for: float = 0.0) -> None:
    restart(component, sig, down_for)


def fault_operator_kill9(name: str) -> None:
    os.kill(_container_pid(leader_pod(), "manager"), signal.SIGKILL)


def fault_operator_rollout(name: str) -> None:
    kubectl("-n", OPERATOR_NS, "rollout", "restart", f"deployment/{OPERATOR}")


LEASE_SECONDS = 60  # the operator's lease duration (pko.defaults.LEASE_DURATION, the Go operator's)


def fault_leader_lost(name: str) -> None:
    """The leader stops (SIGSTOP) for longer than its lease, the second replica takes over, then the
    old leader runs again: it must notice it lost the lease and act on nothing."""
    pid = _container_pid(leader_pod(), "manager")
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(LEASE_SECONDS + 25)
    finally:
        os.kill(pid, signal.SIGCONT)


def fault_workspace_kill9(name: str) -> None:
    os.kill(_container_pid(workspace_pod(name), "pulumi"), signal.SIGKILL)


def fault_workspace_evict(name: str) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": f"{name}-workspace-0", "namespace": NAMESPACE},
    }
    kubectl(
        "create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}-workspace-0/eviction", "-f", "-",
        stdin=json.dumps(body),
    )  # fmt: skip


def fault_kubelet_restart(name: str) -> None:
    _restart("kubelet", down_for=10)


def fault_containerd_restart(name: str) -> None:
    _restart("containerd", down_for=5)


def fault_apiserver_restart(name: str) -> None:
    _restart("kube-apiserver", down_for=10)


def fault_etcd_restart(name: str) -> None:
    _restart("etcd", signal.SIGKILL, down_for=10)


def fault_network_cut(name: str) -> None:
    """The operator cannot reach the workspace pod (nor it the operator) for 30 s."""
    ws_ip = workspace_pod(name)["status"]["podIP"]
    op_ips = [p["status"]["podIP"] for p in operator_pods() if (p.get("status") or {}).get("podIP")]
    with ExitStack() as cuts:
        for ip in op_ips:
            cuts.enter_context(cut_off(ip, ws_ip))
        time.sleep(30)


def fault_disk_full(name: str) -> None:
    """The workspace fills its disk past its ephemeral-storage limit (512Mi in this cell); returns once
    the kubelet evicted the pod (its eviction manager measures volumes every 10 s or so, so that may
    take a while: the cell's steps are longer, :data:`SLOW_EFFECT`)."""
    uid = workspace_pod(name)["metadata"]["uid"]
    kubectl(
        "-n", NAMESPACE, "exec", f"{name}-workspace-0", "-c", "pulumi", "--",
        "sh", "-c", "dd if=/dev/zero of=/share/fill bs=1M count=700 2>/dev/null || true",
        check=False, timeout=180,
    )  # fmt: skip

    def evicted() -> bool:
        pod = get("pod", f"{name}-workspace-0")
        status = (pod or {}).get("status") or {}
        return pod is None or pod["metadata"]["uid"] != uid or status.get("reason") == "Evicted"

    until("the kubelet's eviction", evicted, within=180, interval=1.0, transient=TRANSIENT)


# Faults whose effect comes a while after they are done (the kubelet's eviction of a full disk): the
# cells' steps are this many times longer, so the effect still lands mid-operation, and nothing
# counts as recovered before the effect.
SLOW_EFFECT = {"disk-full": 3}


def fault_secret_deleted(name: str) -> None:
    """The passphrase Secret the Stack's envRefs name is deleted, and put back 30 s later (as a user
    who notices would)."""
    kubectl("-n", NAMESPACE, "delete", "secret", f"{name}-passphrase")
    time.sleep(30)
    apply(passphrase(name))


def fault_node_lost(name: str) -> None:
    """The second node's machine dies for good (``localnode.py node-lose``): its kubelet, containerd
    and every container of it killed, its link down; the API objects stay."""
    node_lose()


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def _reports_node_loss(name: str) -> bool:
    """The Stack is Stalled and names the lost node: what a person must decide, said where they look."""
    c = condition(get("stack", name), "Stalled")
    return c.get("status") == "True" and SPARE.name in str(c.get("message") or "")


@contextmanager
def spare_node() -> Iterator[None]:
    """The second node for a round, with the images a workspace pod runs, removed after it."""
    node_add([IMAGES / f"{i}.oci.tar" for i in ("pko-agent", "pko-workspace")])
    try:
        yield
    finally:
        node_remove()


def fault_cause_fixed(name: str) -> None:
    """Not a fault but its end: the broken dependency the program failed on is fixed outside the
    Stack (as a quota raised or a network back), after the Stack failed and backed off to its cap."""
    (VOLUMES / name / "witness" / "fixed").touch()


FAULTS: dict[str, Callable[[str], None]] = {
    "operator-kill9": fault_operator_kill9,
    "operator-rollout": fault_operator_rollout,
    "leader-lost": fault_leader_lost,
    "workspace-kill9": fault_workspace_kill9,
    "workspace-evict": fault_workspace_evict,
    "kubelet-restart": fault_kubelet_restart,
    "containerd-restart": fault_containerd_restart,
    "apiserver-restart": fault_apiserver_restart,
    "etcd-restart": fault_etcd_restart,
    "network-cut": fault_network_cut,
    "disk-full": fault_disk_full,
    "secret-deleted": fault_secret_deleted,
    "cause-fixed": fault_cause_fixed,
    "node-lost": fault_node_lost,
}
# The cells where a fault has no meaning (the fix of a failing first up is the only cause-fixed cell).
NOT_APPLICABLE = {("cause-fixed", o) for o in OPERATIONS if o != "up"}
NOT_RUN: dict[str, str] = {}  # faults listed but not run, and why
# The cells .ci/run runs: the faults users report most (#1293, #1308), one per component kind, and
# the cells that found a bug.
REDUCED = [
    ("operator-kill9", "up-change", "s3"),
    ("workspace-kill9", "up", "file"),
    ("workspace-evict", "destroy", "s3"),
    ("etcd-restart", "up", "file"),
    ("leader-lost", "up", "s3"),
    ("cause-fixed", "up", "file"),
    ("workspace-kill9", "refresh", "s3"),  # a dropped refresh request (fixed)
    ("node-lost", "up-change", "s3"),  # NodeLost said, then recovered on the other node
]


def restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def snapshot(name: str) -> dict[str, Any]:
    """What a fault changes that shows from outside: the workspace pod (uid, restarts), the operator
    pods (names, restarts), the Lease's holder."""
    pod = get("pod", f"{name}-workspace-0") or {}
    leases = items("leases", namespace=OPERATOR_NS)
    return {
        "workspace": ((pod.get("metadata") or {}).get("uid"), restarts(pod)),
        "operator": sorted((p["metadata"]["name"], restarts(p)) for p in operator_pods()),
        "leader": sorted((le.get("spec") or {}).get("holderIdentity") or "" for le in leases),
    }


# What must differ between the snapshots before and after a fault for it to have taken effect (the
# node's components and the network cut show no trace in the API: their effect is the recovery).
EFFECT: dict[str, str] = {
    "operator-kill9": "operator",
    "operator-rollout": "operator",
    "leader-lost": "leader",
    "workspace-kill9": "workspace",
    "workspace-evict": "workspace",
    "disk-full": "workspace",
}


# The faults that are one event for the whole cluster; the others are done to every cell's workspace.
CLUSTER_FAULTS = {
    "operator-kill9",
    "operator-rollout",
    "leader-lost",
    "kubelet-restart",
    "containerd-restart",
    "apiserver-restart",
    "etcd-restart",
    "node-lost",
}

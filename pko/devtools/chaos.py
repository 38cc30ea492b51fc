#!/usr/bin/env python3
"""The fault matrix: every fault we can cause on the local node, during every Stack operation, on both
state backends, each cell judged from outside (kubectl, the state backend's own files, and a witness
log the program's commands write).

    python3 hack/chaos.py                       # the full matrix (a node with pko: hack/up.sh first)
    python3 hack/chaos.py --reduced             # the cells .ci/run runs (through e2e/test_chaos.py)
    python3 hack/chaos.py --faults workspace-kill9,etcd-restart --operations up --backends s3

Each cell starts from a clean Stack (names of its own, in namespace ``chaos``) whose program is three
``command:local:Command`` resources in a chain, each sleeping ``--step-seconds`` before it appends a
line to ``/witness/log`` (a volume of its own, on the node's disk): so the fault lands mid-operation,
and what the engine really ran is counted after the fact, whatever the pods and the state say.

The cells of one fault run as a round, at once (``--serial``: one at a time): every operation on both
backends is brought in flight, each on its own Stack, then the fault lands once (the operator, the
node's components) or on every cell's workspace at the same moment (a kill, an eviction, a cut). A
cell whose operation was not in flight when the fault came fails: the fault must land mid-operation.

A cell passes when, within ``--bound`` seconds of the fault:
* the Stack is Ready for the intended change (or, for ``destroy``, gone);
* exactly one successful Update of the intended type ran for the change (a failed attempt followed by
  a retry is fine; two successes are not);
* every command of the change ran once (the witness log), or, where the engine cannot know whether a
  command it started finished (a pending operation), pko reported it on the Stack;
* the state holds no pending operation and no lock, and its resources are the program's (none after
  ``destroy``).

``node-lost`` runs on a second node (``localnode.py node-add``, removed after the round) that the
cells' workspace pods prefer and tolerate; the node's machine then dies for good. Kubernetes never
replaces a StatefulSet pod its node may still run, so the Stack must first be Stalled naming the node;
with S3 the harness then puts the out-of-service taint on it, as the message says and a person would,
and the cell is judged as above; a file state on the lost node's volume cannot come back, so there the
Stack must say so and no command may have run twice.

One more cell proves the retry settings (``spec.retryPolicy``, issue 28): ``cause-fixed`` makes the
first up fail (a program error on a missing file) until the Stack has backed off to its 30 s cap, then
fixes the cause outside the Stack; the fix must be picked up within the cap plus the up itself.

``--load N`` runs the load cell instead: N Stacks updating at once, a probe Stack changed meanwhile (its
Update must start within seconds: no worker is held by a running update), the operator killed -9 in
the middle, and every one of the N + 1 judged as a cell.

Output: a table fault x operation x backend (outcome, seconds from the fault to recovery), also written
as JSON (``--json``, default ``.bench-logs/chaos.json``). Standard library only, with the node's kubectl;
needs root (it signals the node's processes and writes iptables rules, as ``localnode.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pko.devtools import localnode

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "chaos"
OPERATOR_NS = "pulumi-kubernetes-operator"
OPERATOR = "controller-manager"
VOLUMES = localnode.STATE / "volumes" / "chaos"
S3_ENDPOINT = "seaweedfs.default.svc.cluster.local:8333"
BUCKET = "pulumi-state"
FILER = "http://127.0.0.1:8888"
STEPS = ("step1", "step2", "step3")
OPERATIONS = ("up", "up-change", "refresh", "destroy")
BACKENDS = ("file", "s3")


# --- kubectl ------------------------------------------------------------------------------------------


def kubectl(*args: str, check: bool = True, stdin: str | None = None, timeout: float = 120) -> str:
    env = {**os.environ, "KUBECONFIG": str(localnode.STATE / "kubeconfig")}
    proc = subprocess.run(
        [str(localnode.bin_dir() / "kubectl"), *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def get(kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
    """The object, or None when it does not exist. An apiserver that does not answer raises
    (RuntimeError): it is not an answer, and a destroy judged by "gone" must not pass on it."""
    out = kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def items(kind: str, *selector: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects (raises, as ``get`` does, when the apiserver does not answer)."""
    out = kubectl("get", kind, "-n", namespace, *selector, "-o", "json")
    return list(json.loads(out)["items"])


def patch(kind: str, name: str, body: dict[str, Any], check: bool = True) -> None:
    kubectl("-n", NAMESPACE, "patch", kind, name, "--type=merge", "-p", json.dumps(body), check=check)


def apply(manifest: dict[str, Any] | str) -> None:
    body = manifest if isinstance(manifest, str) else json.dumps(manifest)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=body)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def until(what: str, probe: Callable[[], Any], within: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            value = None  # the apiserver restarting: ask again
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {within:.0f}s")


# --- the cell's objects -------------------------------------------------------------------------------


# The cause-fixed cell's broken dependency: the first command fails until this file exists.
FIXED = "/witness/fixed"


def program(name: str, step_seconds: int, guarded: bool = False) -> dict[str, Any]:
    """Three commands in a chain; each sleeps, then appends what it did (and for which generation of
    the config) to the witness log. ``create`` runs again on a change (no ``update`` command).
    ``guarded``: the first fails (a program error) until :data:`FIXED` exists."""
    resources: dict[str, Any] = {}
    previous = None
    for step in STEPS:
        guard = (
            f"test -f {FIXED} || {{ echo {FIXED} is missing >&2; exit 1; }}; "
            if guarded and not previous
            else ""
        )
        resources[step] = {
            "type": "command:local:Command",
            "properties": {
                "create": f"{guard}sleep {step_seconds}; "
                f"echo create {step} ${{gen}} >> /witness/log; echo {step}",
                "delete": f"sleep {step_seconds}; echo delete {step} >> /witness/log",
            },
            **({"options": {"dependsOn": [f"${{{previous}}}"]}} if previous else {}),
        }
        previous = step
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "program": {
            "configuration": {"gen": {"type": "String", "default": "1"}},
            "resources": resources,
            # A secret in the state: every later operation must decrypt it, also in a replaced pod
            # (whose stack settings file, with the passphrase's salt, starts afresh).
            "outputs": {"gen": "${gen}", "sealed": {"fn::secret": "sealed-${gen}"}},
        },
    }


def volume(name: str, purpose: str, node: str | None = None) -> list[dict[str, Any]]:
    """A PersistentVolume on the node's disk bound to the cell's claim from the start (the node's
    static volumes are too few for a whole matrix), so the judge reads it from this machine. ``node``:
    the volume is that node's local disk (its pods can run nowhere else), as a node-local state is."""
    path = VOLUMES / name / purpose
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    claim = f"{name}-{purpose}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{NAMESPACE}-{claim}", "labels": {"pko.chaos/cell": name}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "chaos",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": claim},
                **({"nodeAffinity": _on(node)} if node else {}),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "chaos",
                "volumeName": f"{NAMESPACE}-{claim}",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


def _on(node: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
    return {"required": {"nodeSelectorTerms": [term]}}


# The node-lost cells' workspace pods prefer the second node (``localnode.py node-add``), whose taint
# they tolerate: it is the node they lose; a pod that replaces them goes to the node left.
SPARE = localnode.NODE2
SPARE_PLACEMENT = {
    "tolerations": [{"key": k, "operator": "Equal", "value": v, "effect": e} for k, v, e in SPARE.taints],
    "affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [SPARE.name]}
                        ]
                    },
                }
            ]
        }
    },
}


# The cause-fixed cell's retry settings: deterministic waits 5 s, 15 s, then the 30 s cap.
RETRY_CAP = 30
RETRIES = {
    "retryPolicy": {"deterministic": {"baseSeconds": 5, "factor": 3}},
    "retryMaxBackoffDurationSeconds": RETRY_CAP,
    "maxUpdateFailures": 100,
}


def stack(
    name: str,
    backend: str,
    gen: str,
    ephemeral_limit: str | None = None,
    retries: bool = False,
    spare: bool = False,
    cpu: str | None = None,
) -> dict[str, Any]:
    env: dict[str, Any] = {
        "PULUMI_CONFIG_PASSPHRASE": {
            "type": "Secret",
            "secret": {"name": f"{name}-passphrase", "key": "PULUMI_CONFIG_PASSPHRASE"},
        }
    }
    mounts = [{"name": "witness", "mountPath": "/witness"}]
    volumes = [{"name": "witness", "persistentVolumeClaim": {"claimName": f"{name}-witness"}}]
    if backend == "file":
        url = "file:///state"
        mounts.append({"name": "state", "mountPath": "/state"})
        volumes.append({"name": "state", "persistentVolumeClaim": {"claimName": f"{name}-state"}})
    else:
        url = f"s3://{BUCKET}?endpoint={S3_ENDPOINT}&disableSSL=true&s3ForcePathStyle=true"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env[key] = {"type": "Secret", "secret": {"name": "chaos-s3", "key": key}}
    container: dict[str, Any] = {"name": "pulumi", "volumeMounts": mounts}
    if ephemeral_limit:
        container["resources"] = {
            "requests": {"ephemeral-storage": "256Mi"},
            "limits": {"ephemeral-storage": ephemeral_limit},
        }
    if cpu:
        container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": "pulumi",
            "stack": "dev",
            "programRef": {"name": name},
            "backend": url,
            "destroyOnFinalize": True,
            "config": {"gen": gen},
            "envRefs": env,
            **(RETRIES if retries else {}),
            "workspaceTemplate": {
                "spec": {
                    "podTemplate": {
                        "spec": {
                            "containers": [container],
                            "volumes": volumes,
                            **(SPARE_PLACEMENT if spare else {}),
                        }
                    }
                }
            },
        },
    }


def passphrase(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-passphrase", "namespace": NAMESPACE},
        "stringData": {"PULUMI_CONFIG_PASSPHRASE": f"chaos-{name}"},
    }


def prepare_namespace() -> None:
    """Namespace ``chaos`` (Pod Security restricted, as users run workspaces) and its ``pulumi``
    ServiceAccount, which the workspace agents authenticate callers with (as config/quickstart's)."""
    apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                },
            },
        }
    )
    apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "pulumi", "namespace": NAMESPACE}}
    )
    apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{NAMESPACE}:pulumi:system:auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "pulumi", "namespace": NAMESPACE}],
        }
    )
    apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "chaos"},
            "provisioner": "kubernetes.io/no-provisioner",
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        }
    )


def prepare_s3() -> None:
    """The sample's SeaweedFS (config/samples/s3) in ``default``, and its keys copied into ``chaos``."""
    s3 = REPO / "config" / "samples" / "s3"
    for f in ("secret.yaml", "seaweedfs.yaml"):
        kubectl("apply", "--server-side", "-n", "default", "-f", str(s3 / f))
    kubectl("-n", "default", "rollout", "status", "deployment/seaweedfs", "--timeout=300s", timeout=320)
    keys = (get("secret", "seaweedfs-s3", "default") or {}).get("data") or {}
    apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "chaos-s3", "namespace": NAMESPACE},
            "data": {k: keys[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")},
        }
    )


def teardown() -> None:
    """Everything ``prepare_*`` made (the cells clean up after themselves)."""
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", check=False, timeout=300)
    kubectl("delete", "clusterrolebinding", f"{NAMESPACE}:pulumi:system:auth-delegator", "--ignore-not-found")
    kubectl("delete", "storageclass", "chaos", "--ignore-not-found")
    s3 = REPO / "config" / "samples" / "s3"
    for f in ("seaweedfs.yaml", "secret.yaml"):
        kubectl("delete", "-n", "default", "-f", str(s3 / f), "--ignore-not-found", check=False, timeout=300)


# --- what the judge reads -----------------------------------------------------------------------------


def witness(name: str) -> list[str]:
    try:
        return (VOLUMES / name / "witness" / "log").read_text().splitlines()
    except OSError:
        return []


def _filer(path: str) -> str:
    return kubectl(
        "-n", "default", "exec", "deployment/seaweedfs", "-c", "seaweedfs", "--",
        "wget", "-q", "-O", "-", "--header", "Accept: application/json", FILER + path,
        check=False,
    )  # fmt: skip


def backend_state(name: str, backend: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The stack's checkpoint (None: no stack in the backend) and the locks held on it."""
    stacks, locks = f".pulumi/stacks/{name}/dev.json", f".pulumi/locks/{name}/dev"
    if backend == "file":
        root = VOLUMES / name / "state"
        checkpoint = root / stacks
        held = sorted(p.name for p in (root / locks).glob("*")) if (root / locks).is_dir() else []
        return (json.loads(checkpoint.read_text()) if checkpoint.exists() else None), held
    text = _filer(f"/buckets/{BUCKET}/{stacks}")
    listing = _filer(f"/buckets/{BUCKET}/{locks}/")
    try:
        entries = json.loads(listing).get("Entries") or [] if listing.strip() else []
    except ValueError:
        entries = []
    try:
        state = json.loads(text) if text.strip() else None
    except ValueError:
        state = None
    return state, sorted(e["FullPath"].rsplit("/", 1)[-1] for e in entries)


@dataclass
class UpdateLog:
    """Every Update seen in the namespace while a cell ran, from a watch (a poll can miss an Update
    that completes and is garbage collected with its deleted Stack within a second)."""

    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _proc: subprocess.Popen[str] | None = None

    def watch(self) -> None:
        """``kubectl get --watch`` (restarted when the apiserver drops it), its JSON objects decoded
        as they stream."""
        decoder = json.JSONDecoder()
        while not self._stop.is_set():
            env = {**os.environ, "KUBECONFIG": str(localnode.STATE / "kubeconfig")}
            command = [
                str(localnode.bin_dir() / "kubectl"),
                "get",
                "updates",
                "-n",
                NAMESPACE,
                "--watch",
                "-o",
                "json",
            ]
            self._proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
            )
            assert self._proc.stdout is not None
            buffer = ""
            for line in self._proc.stdout:
                buffer += line
                try:
                    obj, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    continue
                buffer = buffer.lstrip()[end:]
                for u in obj.get("items") or [obj]:
                    if u.get("kind") == "Update":
                        self.seen[u["metadata"]["name"]] = u
            self._proc.wait()
            self._stop.wait(1.0)

    @contextmanager
    def running(self) -> Iterator[UpdateLog]:
        thread = threading.Thread(target=self.watch, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            if self._proc is not None:
                self._proc.terminate()
            thread.join(10)

    def catch_up(self) -> None:
        """Add what a list shows now: a watch restarted while the apiserver was away can miss
        Updates (seen after an apiserver restart: a second up the watch never showed)."""
        for u in items("updates"):
            self.seen.setdefault(u["metadata"]["name"], u)
            if condition(u, "Complete").get("status") == "True":
                self.seen[u["metadata"]["name"]] = u

    def of(self, stack: str, type_: str, since: str = "") -> list[dict[str, Any]]:
        return [
            u
            for u in self.seen.values()
            if (u["metadata"].get("labels") or {}).get("pulumi.com/stack-name") == stack
            and (u.get("spec") or {}).get("type") == type_
            and u["metadata"]["creationTimestamp"] >= since
        ]

    def succeeded(self, stack: str, type_: str, since: str) -> list[str]:
        return sorted(
            u["metadata"]["name"]
            for u in self.of(stack, type_, since)
            if condition(u, "Complete").get("status") == "True"
            and condition(u, "Failed").get("status") != "True"
        )


# --- faults -------------------------------------------------------------------------------------------


def _container_pid(pod: dict[str, Any], container: str) -> int:
    for s in (pod.get("status") or {}).get("containerStatuses") or []:
        if s["name"] == container and s.get("containerID", "").startswith("containerd://"):
            cid = s["containerID"].split("//", 1)[1]
            for line in localnode._ctr("tasks", "ls").splitlines()[1:]:
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
        localnode.sh("iptables", "-w", "-I", "FORWARD", "1", *r)
    try:
        yield
    finally:
        for r in rules:
            localnode.sh("iptables", "-w", "-D", "FORWARD", *r, check=False)


def _restart(component: str, sig: signal.Signals = signal.SIGTERM, down_for: float = 0.0) -> None:
    localnode.restart(component, sig, down_for)


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

    until("the kubelet's eviction", evicted, 180)


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
    localnode.node_lose()


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def _reports_node_loss(name: str) -> bool:
    """The Stack is Stalled and names the lost node: what a person must decide, said where they look."""
    c = condition(get("stack", name), "Stalled")
    return c.get("status") == "True" and SPARE.name in str(c.get("message") or "")


@contextmanager
def spare_node() -> Iterator[None]:
    """The second node for a round, with the images a workspace pod runs, removed after it."""
    localnode.node_add([localnode.IMAGES / f"{i}.oci.tar" for i in ("pko-agent", "pko-workspace")])
    try:
        yield
    finally:
        localnode.node_remove()


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


# --- one cell -----------------------------------------------------------------------------------------


@dataclass
class Cell:
    fault: str
    operation: str
    backend: str
    outcome: str = "not run"  # pass | FAIL | not run
    recovery_seconds: float | None = None
    reported_seconds: float | None = None  # node-lost: until the Stack said what a person must do
    detail: str = ""
    problems: list[str] = field(default_factory=list)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _ready_for(name: str, generation: int, refresh_token: str | None = None) -> bool:
    s = get("stack", name)
    if s is None:
        return False
    c = condition(s, "Ready")
    status = s.get("status") or {}
    last = status.get("lastUpdate") or {}
    if refresh_token is not None and status.get("observedRefreshRequest") != refresh_token:
        return False
    return (
        c.get("status") == "True"
        and last.get("state") == "succeeded"
        and int(last.get("generation") or 0) >= generation
        and int(s["metadata"]["generation"]) == generation
    )


def _first_line(name: str, line: str) -> Callable[[], bool]:
    return lambda: line in witness(name)


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


def cell_name(cell: Cell, run_id: str) -> str:
    short = {"up-change": "chg", "refresh": "rfs", "destroy": "del"}.get(cell.operation, cell.operation)
    return f"{cell.fault.replace('-', '')[:14]}-{short}-{cell.backend}-{run_id}"


# --- one round: every cell of one fault ---------------------------------------------------------------


@dataclass
class Trial:
    """One cell's Stack in a round: what it runs, and what the judge expects of it."""

    cell: Cell
    name: str
    expected_type: str = "up"
    gen: str = "1"
    token: str | None = None
    started: str = ""
    before: dict[str, Any] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return self.cell.operation


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


def each(
    what: str,
    trials: list[Trial],
    probe: Callable[[Trial], bool],
    within: float,
    interval: float = 1.0,
    since: float | None = None,
    strict: bool = True,
) -> dict[str, float]:
    """Polls ``probe`` on every trial until it has held for each: the seconds each took (from
    ``since``, a ``time.monotonic()``, else from the call), by name. Past ``within``: TimeoutError
    naming the ones missing, or (not ``strict``) the ones that got there."""
    t0, done = since if since is not None else time.monotonic(), {}
    deadline = time.monotonic() + within
    while True:
        for t in trials:
            if t.name in done:
                continue
            try:
                if probe(t):
                    done[t.name] = round(time.monotonic() - t0, 1)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
                pass  # the apiserver restarting, an object not there yet: ask again
        if len(done) == len(trials):
            return done
        if time.monotonic() > deadline:
            if not strict:
                return done
            missing = [t.name for t in trials if t.name not in done]
            raise TimeoutError(f"{what}: not within {within:.0f}s for {', '.join(missing)}")
        time.sleep(interval)


def _in_flight(t: Trial, log: UpdateLog) -> bool:
    """The cell's operation has started and not ended: the fault lands in the middle of it."""
    lines = witness(t.name)
    if t.op in ("up", "up-change"):
        return f"create step1 {t.gen}" in lines and f"create step3 {t.gen}" not in lines
    if t.op == "destroy":
        return "delete step3" in lines and "delete step1" not in lines
    return any(condition(u, "Complete").get("status") != "True" for u in log.of(t.name, "refresh", t.started))


def _at_once(fault: Callable[[str], None], names: list[str]) -> None:
    """The fault done to every cell's workspace at the same moment (some take seconds: a 30 s cut)."""
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            fault(name)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def run_round(round_: list[Cell], step_seconds: int, bound: float, run_id: str) -> list[Cell]:
    """Every cell of one fault at once, each on a clean Stack of its own. Their operations are brought
    in flight together (first ups, the slowest to start, go first; a refresh, which takes seconds,
    last), then the fault lands: once, for the faults of the whole cluster, or on every cell's
    workspace at the same moment for the others. Each cell is then judged alone."""
    fault = round_[0].fault
    fixing, lost = fault == "cause-fixed", fault == "node-lost"
    trials = [Trial(c, cell_name(c, run_id)) for c in round_]
    for t in trials:
        # node-lost: a file state is on the lost node's disk (its pod can run nowhere else); the
        # witness stays readable, as an observer outside the cluster would be.
        state = volume(t.name, "state", SPARE.name if lost else None) if t.cell.backend == "file" else []
        for obj in volume(t.name, "witness") + state:
            apply(obj)
        apply(passphrase(t.name))
        if not fixing:
            (VOLUMES / t.name / "witness" / "fixed").touch()
        apply(program(t.name, step_seconds * SLOW_EFFECT.get(fault, 1), guarded=fixing))

    def deploy(t: Trial) -> None:
        t.started = _now()
        disk = "512Mi" if fault == "disk-full" else None
        apply(stack(t.name, t.cell.backend, "1", disk, retries=fixing, spare=lost))

    ups = [t for t in trials if t.op == "up"]
    later = [t for t in trials if t.op in ("up-change", "destroy")]
    refreshes = [t for t in trials if t.op == "refresh"]
    log = UpdateLog()
    with log.running():
        for t in later + refreshes:
            deploy(t)
        each("first up Ready", later + refreshes, lambda t: _ready_for(t.name, 1), bound, 2)
        for t in ups:
            deploy(t)
        each("up started", ups, lambda t: bool(log.of(t.name, "up", t.started)), bound, 0.5)
        for t in later:
            t.started = _now()
            if t.op == "up-change":
                t.gen = "2"
                patch("stack", t.name, {"spec": {"config": {"gen": "2"}}})
            else:
                t.expected_type = "destroy"
                kubectl("-n", NAMESPACE, "delete", "stack", t.name, "--wait=false")
        if fixing:
            # Failed and backed off to the cap: the 3rd retry waits the full 30 s.
            def failed(t: Trial) -> bool:
                failures = [u for u in log.of(t.name, "up") if condition(u, "Failed").get("status") == "True"]
                return len(failures) >= 3

            each("three failed ups", trials, failed, bound, 2)
        else:
            marker = {"up": "create step1 {}", "up-change": "create step1 {}", "destroy": "delete step3"}
            each(
                "mid operation",
                ups + later,
                lambda t: marker[t.op].format(t.gen) in witness(t.name),
                bound,
                0.5,
            )
        for t in trials:  # before the refreshes start: they take seconds
            t.before = snapshot(t.name)
        for t in refreshes:
            t.started, t.expected_type, t.token = _now(), "refresh", f"chaos-{time.time_ns()}"
            annotation = f"pulumi.com/refresh-request={t.token}"
            kubectl("-n", NAMESPACE, "annotate", "--overwrite", "stack", t.name, annotation)
        each("refresh running", refreshes, lambda t: bool(log.of(t.name, "refresh", t.started)), bound, 0.2)
        for t in trials:
            if not fixing and not _in_flight(t, log):
                t.cell.problems.append("the operation was not in flight when the fault came")
            where = (get("pod", f"{t.name}-workspace-0") or {}).get("spec", {}).get("nodeName")
            if lost and where != SPARE.name:
                t.cell.problems.append(f"the workspace pod ran on {where}, not on {SPARE.name}")
        # The fault runs beside the watch for recovery: some last (a leader frozen 85 s, a 30 s cut),
        # and what recovers meanwhile (a standby taking over) counts from the fault's start.
        t0, struck = time.monotonic(), []

        def strike() -> None:
            try:
                if fault in CLUSTER_FAULTS:
                    FAULTS[fault](trials[0].name)
                else:
                    _at_once(FAULTS[fault], [t.name for t in trials])
            except Exception as e:
                struck.append(e)

        striking = threading.Thread(target=strike)
        striking.start()

        def recovered(t: Trial) -> bool:
            if fault in SLOW_EFFECT and striking.is_alive():
                return False  # the fault has not taken effect yet
            if t.op == "destroy":
                return get("stack", t.name) is None
            generation = int((get("stack", t.name) or {})["metadata"]["generation"])
            return _ready_for(t.name, generation, t.token)

        recovering = trials
        if lost:
            # Kubernetes never replaces a pod its node may still run: the Stack must say what a person
            # decides (the node is gone: out of service). With the state on that node, nothing can
            # recover: the cell ends there; with S3, the person acts and the Stack must recover.
            reported = each(
                "node loss reported",
                trials,
                lambda t: _reports_node_loss(t.name),
                bound,
                2,
                since=t0,
                strict=False,
            )
            for t in trials:
                t.cell.reported_seconds = reported.get(t.name)
                if t.cell.reported_seconds is None:
                    said = condition(get("stack", t.name), "Stalled").get("message")
                    t.cell.problems.append(f"the Stack never said {SPARE.name} was lost (Stalled: {said})")
            recovering = [t for t in trials if t.cell.backend != "file"]
            if recovering:
                kubectl("taint", "nodes", SPARE.name, OUT_OF_SERVICE, "--overwrite")
        left = max(0.0, bound - (time.monotonic() - t0))
        times = each("recovered", recovering, recovered, left, 2, since=t0, strict=False)
        striking.join()
        if struck:
            raise struck[0]
        time.sleep(2)  # the poller's last look
        log.catch_up()
        limit = RETRY_CAP + 3 * step_seconds + 20  # the cap, the up itself, the pod's start
        for t in recovering:
            t.cell.recovery_seconds = times.get(t.name)
            if t.cell.recovery_seconds is None:
                t.cell.problems.append(f"not recovered within {bound:.0f}s of the fault")
                for c in ((get("stack", t.name) or {}).get("status") or {}).get("conditions") or []:
                    said = f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:300]}"
                    t.cell.problems.append(said)
            elif fixing and t.cell.recovery_seconds > limit:
                t.cell.problems.append(
                    f"the fix was picked up after {t.cell.recovery_seconds} s (bound {limit} s)"
                )
            effect = EFFECT.get(fault)
            if effect and t.op != "destroy" and snapshot(t.name)[effect] == t.before[effect]:
                t.cell.problems.append(
                    f"the fault did not take effect ({effect} unchanged: {t.before[effect]})"
                )
    for t in trials:
        stranded = t not in recovering
        judge(t.cell, t.name, log, t.started, t.expected_type, t.gen, stranded=stranded)
        t.cell.outcome = "pass" if not t.cell.problems else "FAIL"
        t.cell.detail = "; ".join(t.cell.problems)
        if lost and not t.cell.problems:
            t.cell.detail = f"Stalled naming {SPARE.name} after {t.cell.reported_seconds} s" + (
                "; the state was on that node: no recovery (nothing ran twice)"
                if stranded
                else "; out-of-service taint put on then, recovered on the other node"
            )
    return round_


def judge(
    cell: Cell, name: str, log: UpdateLog, since: str, expected_type: str, gen: str, stranded: bool = False
) -> None:
    """The cell's verdict (see the module's docstring). ``stranded``: the state went with a lost node,
    so only one rule holds: nothing ran twice."""
    if stranded:
        lines = witness(name)
        for line in set(lines):
            if lines.count(line) > 1:
                cell.problems.append(f"{line!r} ran {lines.count(line)} times")
        return
    ok = log.succeeded(name, expected_type, since)
    if len(ok) != 1:
        cell.problems.append(f"{len(ok)} successful {expected_type} Updates ({', '.join(ok) or 'none'})")
    lines = witness(name)
    if cell.operation in ("up", "up-change"):
        for step in STEPS:
            n = lines.count(f"create {step} {gen}")
            if n != 1:
                cell.problems.append(f"{step} created {n} times for gen {gen}")
    elif cell.operation == "destroy":
        for step in STEPS:
            n = lines.count(f"delete {step}")
            if n != 1:
                cell.problems.append(f"{step} deleted {n} times")
    elif any(line.startswith("delete") for line in lines) or len(lines) != len(STEPS):
        cell.problems.append(f"the refresh ran commands: {lines}")
    state, locks = backend_state(name, cell.backend)
    if locks:
        cell.problems.append(f"locks left in the state: {locks}")
    latest = ((state or {}).get("checkpoint") or {}).get("latest") or {}
    pending = [p.get("resource", {}).get("urn") for p in latest.get("pending_operations") or []]
    if pending:
        cell.problems.append(f"pending operations left: {pending}")
    commands = sorted(
        r["urn"].rsplit("::", 1)[-1]
        for r in latest.get("resources") or []
        if r["type"] == "command:local:Command"
    )
    want = [] if cell.operation == "destroy" else sorted(STEPS)
    if state is None and cell.operation != "destroy":
        cell.problems.append("no checkpoint in the backend")
    elif commands != want:
        cell.problems.append(f"resources in the state {commands}, the program has {want}")


@dataclass
class Load:
    """The load cell: ``stacks`` Stacks updating at once (each ``3 x step_seconds``), a probe Stack
    changed meanwhile (how long until its Update starts: no worker may be held by a running update),
    and the operator killed (-9) in the middle; then every one of them judged as a cell is."""

    stacks: int
    backend: str
    probe_start_seconds: float | None = None
    recovery_seconds: float | None = None
    cells: list[Cell] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return "pass" if self.cells and all(c.outcome == "pass" for c in self.cells) else "FAIL"


# The load cell's workspace pods ask for this much CPU (the default, 100m, as the Go operator's, fits
# about 17 pods on the node's 2 cores): their commands sleep; the engines share what the node has.
LOAD_CPU = "20m"


def run_load(load: Load, step_seconds: int, bound: float, run_id: str) -> Load:
    probe, names = f"probe-{run_id}", [f"load{i}-{run_id}" for i in range(load.stacks)]
    for name in [probe, *names]:
        for obj in volume(name, "witness") + (volume(name, "state") if load.backend == "file" else []):
            apply(obj)
        apply(passphrase(name))
    apply(program(probe, 1))
    log = UpdateLog()
    with log.running():
        apply(stack(probe, load.backend, "1"))
        until("probe Ready", lambda: _ready_for(probe, 1), bound)
        started = _now()
        for name in names:
            apply(program(name, step_seconds))
            apply(stack(name, load.backend, "1", cpu=LOAD_CPU))
        until(
            f"{load.stacks} updates running",
            lambda: all("create step1 1" in witness(n) for n in names),
            bound,
            2,
        )
        t_change = time.monotonic()
        patch("stack", probe, {"spec": {"config": {"gen": "2"}}})
        until("probe's Update created", lambda: log.of(probe, "up", started), 120, 0.2)
        load.probe_start_seconds = round(time.monotonic() - t_change, 1)
        fault_operator_kill9(probe)
        t0 = time.monotonic()
        everyone = [(probe, "2"), *((n, "1") for n in names)]
        try:
            until(
                "all Ready",
                lambda: all(_ready_for(n, 2 if n == probe else 1) for n, _ in everyone),
                bound,
                5,
            )
            load.recovery_seconds = round(time.monotonic() - t0, 1)
        except TimeoutError as e:
            load.cells.append(Cell("operator-kill9", "load", load.backend, "FAIL", detail=str(e)))
        time.sleep(2)
    for name, gen in everyone:
        cell = Cell("operator-kill9", "up-change" if name == probe else "up", load.backend)
        judge(cell, name, log, started, "up", gen)
        cell.outcome = "pass" if not cell.problems else "FAIL"
        cell.detail = f"{name}: " + "; ".join(cell.problems) if cell.problems else ""
        load.cells.append(cell)
    return load


def cleanup(name: str) -> None:
    """The cell's objects go without a destroy (the commands touched nothing but the witness)."""
    if get("stack", name) is not None:
        patch("stack", name, {"spec": {"destroyOnFinalize": False}}, check=False)
        kubectl("-n", NAMESPACE, "delete", "stack", name, "--wait=false", check=False)
        try:
            until("stack deleted", lambda: get("stack", name) is None, 300)
        except TimeoutError:
            patch("stack", name, {"metadata": {"finalizers": None}}, check=False)
    kubectl("-n", NAMESPACE, "delete", "program", name, "--ignore-not-found", "--wait=false", check=False)
    kubectl("-n", NAMESPACE, "delete", "secret", f"{name}-passphrase", "--ignore-not-found", check=False)
    try:
        until("workspace pod gone", lambda: get("pod", f"{name}-workspace-0") is None, 120)
    except TimeoutError:
        pass  # the claims below wait for it (kubernetes.io/pvc-protection)
    claims = (f"{name}-witness", f"{name}-state")
    kubectl("-n", NAMESPACE, "delete", "pvc", *claims, "--ignore-not-found", "--wait=false", check=False)
    kubectl("delete", "pv", "-l", f"pko.chaos/cell={name}", "--ignore-not-found", check=False)
    shutil.rmtree(VOLUMES / name, ignore_errors=True)


def healthy_control_plane(within: float = 180) -> None:
    """Before a cell: every component up, the operator Deployment available (a fault may leave a
    restart still settling)."""
    until("apiserver", lambda: kubectl("get", "--raw", "/readyz", check=False).strip() == "ok", within)
    rollout = ("rollout", "status", f"deployment/{OPERATOR}", f"--timeout={int(within)}s")
    kubectl("-n", OPERATOR_NS, *rollout, timeout=within + 20)


@contextmanager
def replicas(n: int) -> Iterator[None]:
    """The operator with ``n`` replicas (leader election picks one), back to what it was after."""
    before = int((get("deployment", OPERATOR, OPERATOR_NS) or {}).get("spec", {}).get("replicas") or 1)
    kubectl("-n", OPERATOR_NS, "scale", f"deployment/{OPERATOR}", f"--replicas={n}")
    healthy_control_plane()
    try:
        yield
    finally:
        kubectl("-n", OPERATOR_NS, "scale", f"deployment/{OPERATOR}", f"--replicas={before}")


def cells(faults: list[str], operations: list[str], backends: list[str], reduced: bool) -> list[Cell]:
    if reduced:
        return [Cell(f, o, b) for f, o, b in REDUCED if f in faults and o in operations and b in backends]
    return [Cell(f, o, b) for f in faults for o in operations for b in backends]


def rounds(matrix: list[Cell], serial: bool = False) -> list[list[Cell]]:
    """The cells to run, a round per fault (every operation and backend at once), or a round per cell
    (``serial``); the cells not run get their outcome here."""
    by_fault: dict[str, list[Cell]] = {}
    for cell in matrix:
        if cell.fault in NOT_RUN:
            cell.detail = NOT_RUN[cell.fault]
        elif (cell.fault, cell.operation) in NOT_APPLICABLE:
            cell.outcome, cell.detail = "n/a", "a fix ends a failing up"
        else:
            by_fault.setdefault(cell.fault if not serial else str(id(cell)), []).append(cell)
    return list(by_fault.values())


def run(
    matrix: list[Cell], step_seconds: int, bound: float, out: Path | None = None, serial: bool = False
) -> list[Cell]:
    prepare_namespace()
    if any(c.backend == "s3" for c in matrix):
        prepare_s3()
    run_id = secrets.token_hex(2)
    for round_ in rounds(matrix, serial):
        healthy_control_plane()
        fault = round_[0].fault
        said = ", ".join(f"{c.operation} ({c.backend})" for c in round_)
        print(f"chaos: {fault} during {said} ...", file=sys.stderr, flush=True)
        try:
            with (
                replicas(2)
                if fault == "leader-lost"
                else spare_node()
                if fault == "node-lost"
                else nullcontext()
            ):
                run_round(round_, step_seconds, bound, run_id)
        except Exception as e:  # a round that could not even be set up fails its cells, not the run
            traceback.print_exc()
            for cell in round_:
                if cell.outcome == "not run":
                    cell.outcome, cell.detail = "FAIL", f"{type(e).__name__}: {e}"
        finally:
            try:
                _at_once(cleanup, [cell_name(c, run_id) for c in round_])
            except Exception:
                traceback.print_exc()  # the next round's names are its own: go on
        for c in round_:
            print(
                f"chaos:   {c.operation} ({c.backend}): {c.outcome} {c.recovery_seconds}s {c.detail}",
                file=sys.stderr,
                flush=True,
            )
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps([asdict(c) for c in matrix], indent=1))
    return matrix


def load_cell(stacks: int, backend: str, step_seconds: int, bound: float, out: Path | None) -> Load:
    prepare_namespace()
    if backend == "s3":
        prepare_s3()
    run_id, load = secrets.token_hex(2), Load(stacks, backend)
    healthy_control_plane()
    try:
        run_load(load, step_seconds, bound, run_id)
    except Exception as e:
        load.cells.append(Cell("operator-kill9", "load", backend, "FAIL", detail=f"{type(e).__name__}: {e}"))
    finally:
        for name in [f"probe-{run_id}", *(f"load{i}-{run_id}" for i in range(stacks))]:
            cleanup(name)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(load), indent=1))
    return load


def table(matrix: list[Cell]) -> str:
    rows = ["| fault | operation | backend | outcome | recovery s | detail |", "|---|---|---|---|---:|---|"]
    for c in matrix:
        secs = "" if c.recovery_seconds is None else f"{c.recovery_seconds:.1f}"
        rows.append(f"| {c.fault} | {c.operation} | {c.backend} | {c.outcome} | {secs} | {c.detail[:200]} |")
    return "\n".join(rows)


def grid(matrix: list[Cell]) -> str:
    """The matrix as docs/fault-matrix.md shows it: a row per fault, a column per operation and backend, each
    cell the seconds from the fault to recovery (or what else it ended as)."""
    columns = sorted({(c.operation, c.backend) for c in matrix}, key=lambda k: (OPERATIONS.index(k[0]), k[1]))
    faults = list(dict.fromkeys(c.fault for c in matrix))
    by = {(c.fault, c.operation, c.backend): c for c in matrix}

    def said(c: Cell | None) -> str:
        if c is None:
            return ""
        if c.outcome == "pass" and c.recovery_seconds is not None:
            return f"{c.recovery_seconds:.0f}"
        if c.outcome == "pass" and c.reported_seconds is not None:
            return f"stalled {c.reported_seconds:.0f}"
        return c.outcome

    head = "| fault | " + " | ".join(f"{o} {b}" for o, b in columns) + " |"
    rows = [head, "|---|" + "---:|" * len(columns)]
    for f in faults:
        rows.append(f"| {f} | " + " | ".join(said(by.get((f, o, b))) for o, b in columns) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", default=",".join([*FAULTS, *NOT_RUN]))
    p.add_argument("--operations", default=",".join(OPERATIONS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--reduced", action="store_true", help="only the cells .ci/run runs")
    p.add_argument(
        "--serial", action="store_true", help="one cell at a time (default: a fault's cells at once)"
    )
    p.add_argument("--step-seconds", type=int, default=15, help="each command's sleep (three in a chain)")
    p.add_argument("--bound", type=float, default=600, help="seconds a cell may take to recover")
    p.add_argument("--json", type=Path, default=REPO / ".bench-logs" / "chaos.json")
    p.add_argument(
        "--load",
        type=int,
        metavar="N",
        help="instead of the matrix: N Stacks updating at once (--step-seconds each step), a probe Stack "
        "changed meanwhile, the operator killed; on the first of --backends",
    )
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("chaos: needs root (it signals the node's processes and edits iptables)")
    if not localnode._pids():
        raise SystemExit("chaos: no node is running: hack/up.sh first")
    unknown = set(args.faults.split(",")) - set(FAULTS) - set(NOT_RUN)
    if unknown:
        raise SystemExit(f"chaos: unknown faults {sorted(unknown)}; known: {', '.join([*FAULTS, *NOT_RUN])}")
    if args.load:
        load = load_cell(args.load, args.backends.split(",")[0], args.step_seconds, args.bound, args.json)
        print(table(load.cells))
        print(
            f"load: {load.stacks} Stacks + the probe: {load.outcome}; the probe's Update started "
            f"{load.probe_start_seconds} s after its change; "
            f"all Ready {load.recovery_seconds} s after the kill"
        )
        return 0 if load.outcome == "pass" else 1
    matrix = cells(args.faults.split(","), args.operations.split(","), args.backends.split(","), args.reduced)
    run(matrix, args.step_seconds, args.bound, args.json, args.serial)
    print(table(matrix))
    print()
    print(grid(matrix))
    return 0 if all(c.outcome != "FAIL" for c in matrix) else 1


if __name__ == "__main__":
    sys.exit(main())

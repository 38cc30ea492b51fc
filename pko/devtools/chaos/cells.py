"""A cell's objects: the Program (three commands that write a witness log), the volumes the judge reads
from this machine, the Stack on either backend, its passphrase; the namespace and the S3 store they
share; and the cleanup of a cell."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

from pko.devtools.chaos.kube import (
    BUCKET,
    NAMESPACE,
    REPO,
    S3_ENDPOINT,
    STEPS,
    TRANSIENT,
    VOLUMES,
    apply,
    get,
    kubectl,
    patch,
)
from pko.devtools.localnode.node import NODE2
from pko.devtools.waiting import until


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


def cell_name(cell: Cell, run_id: str) -> str:
    short = {"up-change": "chg", "refresh": "rfs", "destroy": "del"}.get(cell.operation, cell.operation)
    return f"{cell.fault.replace('-', '')[:14]}-{short}-{cell.backend}-{run_id}"


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
SPARE = NODE2
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


def cleanup(name: str) -> None:
    """The cell's objects go without a destroy (the commands touched nothing but the witness)."""
    if get("stack", name) is not None:
        patch("stack", name, {"spec": {"destroyOnFinalize": False}}, check=False)
        kubectl("-n", NAMESPACE, "delete", "stack", name, "--wait=false", check=False)
        try:
            until(
                "stack deleted",
                lambda: get("stack", name) is None,
                within=300,
                interval=1.0,
                transient=TRANSIENT,
            )
        except TimeoutError:
            patch("stack", name, {"metadata": {"finalizers": None}}, check=False)
    kubectl("-n", NAMESPACE, "delete", "program", name, "--ignore-not-found", "--wait=false", check=False)
    kubectl("-n", NAMESPACE, "delete", "secret", f"{name}-passphrase", "--ignore-not-found", check=False)
    try:
        until(
            "workspace pod gone",
            lambda: get("pod", f"{name}-workspace-0") is None,
            within=120,
            interval=1.0,
            transient=TRANSIENT,
        )
    except TimeoutError:
        pass  # the claims below wait for it (kubernetes.io/pvc-protection)
    claims = (f"{name}-witness", f"{name}-state")
    kubectl("-n", NAMESPACE, "delete", "pvc", *claims, "--ignore-not-found", "--wait=false", check=False)
    kubectl("delete", "pv", "-l", f"pko.chaos/cell={name}", "--ignore-not-found", check=False)
    shutil.rmtree(VOLUMES / name, ignore_errors=True)

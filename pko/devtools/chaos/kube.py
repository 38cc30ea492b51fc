"""The chaos matrix's view of the node: kubectl as the node's admin, and the names the cells share."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from pko.devtools.kubectl import run
from pko.devtools.localnode.node import STATE, bin_dir

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "chaos"
OPERATOR_NS = "pulumi-kubernetes-operator"
OPERATOR = "controller-manager"
VOLUMES = STATE / "volumes" / "chaos"
S3_ENDPOINT = "seaweedfs.default.svc.cluster.local:8333"
BUCKET = "pulumi-state"
FILER = "http://127.0.0.1:8888"
STEPS = ("step1", "step2", "step3")
OPERATIONS = ("up", "up-change", "refresh", "destroy")
BACKENDS = ("file", "s3")
# What a poll through a restarting apiserver meets: no answer yet, so it asks again.
TRANSIENT = (RuntimeError, subprocess.TimeoutExpired, ValueError)


def kubectl(*args: str, check: bool = True, stdin: str | None = None, timeout: float = 120) -> str:
    """The node's kubectl as its admin: the output (KubectlFailed, a RuntimeError, when it fails)."""
    kubeconfig, binary = STATE / "kubeconfig", bin_dir() / "kubectl"
    return run(*args, kubeconfig=kubeconfig, binary=binary, input=stdin, check=check, timeout=timeout).stdout


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

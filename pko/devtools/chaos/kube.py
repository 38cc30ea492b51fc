"""The chaos matrix's view of the node: kubectl as the node's admin, and the names the cells share."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

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
    env = {**os.environ, "KUBECONFIG": str(STATE / "kubeconfig")}
    proc = subprocess.run(
        [str(bin_dir() / "kubectl"), *args],
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

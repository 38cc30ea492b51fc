"""The plan-approval admission policy (config/admission) on the test apiserver, for the tests that
need it enforced: the policy, its binding and the ClusterRoles it relies on, taken from the kustomize
output of ``config/default`` (what users install), applied with server-side apply and removed again.

The apiserver enforces a new policy only once its policy informer has seen it (a few seconds):
:func:`wait_enforced` probes with server-side dry runs until the policy refuses one.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import yaml

Obj = dict[str, Any]

REPO: Final = Path(__file__).resolve().parents[2]
POLICY: Final = "pulumi-kubernetes-operator-plan-approval"
APPROVED_PLAN: Final = "pulumi.com/approved-plan"
ROLES: Final = (
    "pko-stack-approver",
    "pulumi-kubernetes-operator-approve",
    "pulumi-kubernetes-operator-edit",
    "pulumi-kubernetes-operator-view",
    "pulumi-kubernetes-operator-controller-manager",
)
_KUBECTL_TIMEOUT: Final = 180


def kubectl(
    kubeconfig: Path, *args: str, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = ["kubectl", f"--kubeconfig={kubeconfig}", *args]
    proc = subprocess.run(
        cmd, input=input, text=True, capture_output=True, timeout=_KUBECTL_TIMEOUT, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


def default_objects(kubeconfig: Path) -> list[Obj]:
    """``kubectl kustomize config/default``: what docs/install.md's install command applies."""
    out = kubectl(kubeconfig, "kustomize", str(REPO / "config" / "default")).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def admission_objects(kubeconfig: Path) -> list[Obj]:
    """The policy, its binding, the approver roles, the aggregated edit/view roles (so the built-in
    ``edit`` and ``admin`` cover Stacks) and the operator's ClusterRole."""
    wanted = [
        o
        for o in default_objects(kubeconfig)
        if o["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        or (o["kind"] == "ClusterRole" and o["metadata"]["name"] in ROLES)
    ]
    assert len(wanted) == 2 + len(ROLES), [(o["kind"], o["metadata"]["name"]) for o in wanted]
    return wanted


def _ref(obj: Obj) -> str:
    kinds = {
        "ValidatingAdmissionPolicy": "validatingadmissionpolicies.admissionregistration.k8s.io",
        "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings.admissionregistration.k8s.io",
        "ClusterRole": "clusterroles.rbac.authorization.k8s.io",
    }
    return f"{kinds[obj['kind']]}/{obj['metadata']['name']}"


@contextmanager
def installed(kubeconfig: Path) -> Iterator[list[Obj]]:
    """Apply the admission objects; afterwards delete the ones that did not exist before."""
    objs = admission_objects(kubeconfig)
    existing = {_ref(o) for o in objs if kubectl(kubeconfig, "get", _ref(o), check=False).returncode == 0}
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    kubectl(kubeconfig, "apply", "--server-side", "--field-manager=pko-test", "-f", "-", input=body)
    try:
        yield objs
    finally:
        created = [_ref(o) for o in objs if _ref(o) not in existing]
        if created:
            kubectl(kubeconfig, "delete", "--ignore-not-found", *created, check=False)


def probe_stack(name: str, digest: str = "sha256:probe") -> Obj:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "annotations": {APPROVED_PLAN: digest}},
        "spec": {"stack": "dev", "programRef": {"name": name}},
    }


def wait_enforced(kubeconfig: Path, namespace: str, user: str, timeout: float = 60.0) -> str:
    """Poll until ``user`` (who may create Stacks but not approve) is refused a server-side dry-run
    create of an approved Stack by the policy; the refusal's message."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        proc = kubectl(
            kubeconfig,
            "create",
            "--dry-run=server",
            f"--as={user}",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps(probe_stack("admission-probe")),
            check=False,
        )
        last = proc.stderr or proc.stdout
        if proc.returncode != 0 and POLICY in last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"the policy {POLICY} is not enforced after {timeout}s: {last}")
        time.sleep(0.5)

"""`config/default` on the real control plane: a server-side dry run of each install, then exactly the
install command docs/install.md gives (`kubectl apply --server-side -k config/default`), and the
apiserver asked (SubjectAccessReview) what the operator's account may do, and may not.

The cluster is shared by the whole session, so cleanup removes what `config/default` created
except the CRDs, which the session's `crds` fixture owns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from test_kustomize import CONFIG, NAMESPACE, build

from pko.devtools.kubectl import run as run_kubectl
from pko.devtools.waiting import until

OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:controller-manager"


@dataclass(frozen=True)
class Access:
    """One SubjectAccessReview question: may the operator `verb` this resource?"""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    name: str = ""
    namespace: str = ""  # "" asks for every namespace (cluster-wide)

    def __str__(self) -> str:
        res = ".".join(filter(None, (self.resource, self.group)))
        sub = f"/{self.subresource}" if self.subresource else ""
        where = f"@{self.namespace}" if self.namespace else ""
        named = f":{self.name}" if self.name else ""
        return f"{self.verb}-{res}{sub}{named}{where}"


def operator_may(kubeconfig: Path, access: Access) -> bool:
    """Ask the apiserver's authorizer directly (exact group/subresource, no discovery involved)."""
    attrs = {k: v for k, v in asdict(access).items() if v}
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": OPERATOR_SA,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": attrs,
        },
    }
    out = run_kubectl(
        "create", "-o", "json", "-f", "-", kubeconfig=kubeconfig, input=json.dumps(review)
    ).stdout
    return bool(json.loads(out)["status"].get("allowed", False))


def _wait_namespace_gone(kubeconfig: Path, name: str, timeout: float = 120.0) -> None:
    def gone() -> bool:
        return run_kubectl("get", "namespace", name, kubeconfig=kubeconfig, check=False).returncode != 0

    until(f"namespace {name} gone", gone, within=timeout, interval=1.0)


@pytest.fixture(scope="module")
def installed(cluster: Any, crds: list[str]) -> Iterator[Path]:
    """config/default applied with docs/install.md's command; removed again (except the CRDs) afterwards."""
    kubeconfig: Path = cluster.kubeconfig
    if run_kubectl("get", "namespace", NAMESPACE, kubeconfig=kubeconfig, check=False).returncode == 0:
        pytest.skip(f"namespace {NAMESPACE} already exists in this cluster; not touching it")
    try:
        # Exactly docs/install.md's install command.
        run_kubectl("apply", "--server-side", "-k", str(CONFIG / "default"), kubeconfig=kubeconfig)
        yield kubeconfig
    finally:
        # Not `delete -k config/default`: that would remove the CRDs the rest of the session uses.
        for part in ("admission", "manager", "rbac"):
            run_kubectl(
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "-k",
                str(CONFIG / part),
                kubeconfig=kubeconfig,
                check=False,
            )
        _wait_namespace_gone(kubeconfig, NAMESPACE)


@pytest.mark.cluster
@pytest.mark.parametrize("overlay", ["default", "namespaced"])
def test_default_server_side_dry_run_succeeds(cluster: Any, crds: list[str], overlay: str) -> None:
    kubeconfig: Path = cluster.kubeconfig
    if run_kubectl("get", "namespace", NAMESPACE, kubeconfig=kubeconfig, check=False).returncode == 0:
        pytest.skip(f"namespace {NAMESPACE} already exists in this cluster; not touching it")
    # A dry run creates nothing, so the objects inside the namespace would find no namespace: create
    # it for real first, the only object this test writes.
    run_kubectl("create", "namespace", NAMESPACE, kubeconfig=kubeconfig)
    try:
        proc = run_kubectl(
            "apply", "--server-side", "--dry-run=server", "-k", str(CONFIG / overlay), kubeconfig=kubeconfig
        )
        applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
        assert len(applied) == len(build(CONFIG / overlay)), proc.stdout
        assert (
            run_kubectl(
                "get", "deployment", "-n", NAMESPACE, "controller-manager", kubeconfig=kubeconfig, check=False
            ).returncode
            != 0
        ), "a dry run must not create"
    finally:
        run_kubectl("delete", "namespace", NAMESPACE, "--wait=false", kubeconfig=kubeconfig, check=False)
        _wait_namespace_gone(kubeconfig, NAMESPACE)


@pytest.mark.cluster
def test_readme_install_command_creates_the_operator(installed: Path) -> None:
    for kind, name in [
        ("deployment", "controller-manager"),
        ("serviceaccount", "controller-manager"),
        ("service", "pulumi-kubernetes-operator"),
        ("service", "pulumi-kubernetes-operator-metrics"),
        ("role", "leader-election-role"),
        ("rolebinding", "leader-election-rolebinding"),
    ]:
        run_kubectl("get", "-n", NAMESPACE, kind, name, kubeconfig=installed)
    for kind, name in [
        ("clusterrole", "pulumi-kubernetes-operator-controller-manager"),
        ("clusterrolebinding", "pulumi-kubernetes-operator"),
    ]:
        run_kubectl("get", kind, name, kubeconfig=installed)
    # Applying again is a no-op that succeeds (the install command is safe to re-run).
    run_kubectl("apply", "--server-side", "-k", str(CONFIG / "default"), kubeconfig=installed)


@pytest.mark.cluster
def test_quickstart_and_samples_are_accepted_by_the_apiserver(installed: Path) -> None:
    run_kubectl(
        "apply", "--server-side", "--dry-run=server", "-k", str(CONFIG / "quickstart"), kubeconfig=installed
    )
    run_kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "-n",
        "default",
        "-k",
        str(CONFIG / "samples"),
        kubeconfig=installed,
    )


FLUX = "source.toolkit.fluxcd.io"
OPERATOR_MAY = [
    # What the reconcilers need.
    Access("watch", "stacks", "pulumi.com"),
    Access("patch", "stacks", "pulumi.com"),
    Access("patch", "stacks", "pulumi.com", "status"),
    Access("update", "stacks", "pulumi.com", "finalizers"),
    Access("watch", "programs", "pulumi.com"),
    Access("patch", "programs", "pulumi.com", "status"),
    Access("watch", "workspacetemplates", "auto.pulumi.com"),
    Access("create", "workspaces", "auto.pulumi.com"),
    Access("delete", "workspaces", "auto.pulumi.com"),
    Access("patch", "workspaces", "auto.pulumi.com", "status"),
    Access("update", "workspaces", "auto.pulumi.com", "finalizers"),
    Access("create", "updates", "auto.pulumi.com"),
    Access("delete", "updates", "auto.pulumi.com"),
    Access("patch", "updates", "auto.pulumi.com", "status"),
    Access("use", "workspaces", "auto.pulumi.com", "rpc", "random", "default"),
    Access("create", "statefulsets", "apps"),
    Access("delete", "statefulsets", "apps"),
    Access("create", "services"),
    Access("patch", "services"),
    Access("watch", "pods"),
    Access("patch", "pods"),
    Access("get", "nodes"),  # the node of a workspace pod that is not ready (issue 28)
    # Each Workspace's NetworkPolicy (issue 46): cached, applied, put back.
    Access("watch", "networkpolicies", "networking.k8s.io"),
    Access("create", "networkpolicies", "networking.k8s.io"),
    Access("patch", "networkpolicies", "networking.k8s.io"),
    Access("create", "secrets"),
    Access("get", "secrets"),  # by name: gitAuth's, the outputs Secret
    # spec.outputs: one Secret or ConfigMap per Stack, read by name, created, updated in place.
    Access("update", "secrets"),
    Access("get", "configmaps"),
    Access("create", "configmaps"),
    Access("update", "configmaps"),
    Access("create", "events"),
    Access("patch", "events", "events.k8s.io"),
    Access("watch", "gitrepositories", FLUX),
    Access("watch", "ocirepositories", FLUX),
    Access("watch", "buckets", FLUX),
    Access("create", "leases", "coordination.k8s.io", namespace=NAMESPACE),
    Access("update", "leases", "coordination.k8s.io", namespace=NAMESPACE),
    Access("create", "serviceaccounts", "", "token", "controller-manager", NAMESPACE),
    # Each /metrics scrape's token is reviewed (--metrics-secure, the default).
    Access("create", "tokenreviews", "authentication.k8s.io"),
    Access("create", "subjectaccessreviews", "authorization.k8s.io"),
]
OPERATOR_MAY_NOT = [
    # Users own Stacks and Programs; the operator never creates or deletes them.
    Access("create", "stacks", "pulumi.com"),
    Access("delete", "stacks", "pulumi.com"),
    Access("create", "programs", "pulumi.com"),
    Access("delete", "programs", "pulumi.com"),
    # WorkspaceTemplates are users' too: the operator only reads them.
    Access("patch", "workspacetemplates", "auto.pulumi.com"),
    Access("delete", "workspacetemplates", "auto.pulumi.com"),
    # Outputs objects are garbage-collected with their owner (the Update, or the Stack).
    Access("delete", "secrets"),
    Access("delete", "configmaps"),
    Access("patch", "secrets"),
    # No Secret is cached or listed (issue 46): each one the operator reads is a GET by name.
    Access("list", "secrets"),
    Access("watch", "secrets"),
    Access("list", "secrets", namespace="default"),
    Access("watch", "secrets", namespace="default"),
    # ConfigMaps reach the workspace pod through the kubelet; none is cached or listed.
    Access("list", "configmaps"),
    Access("watch", "configmaps"),
    # Pods belong to the StatefulSet controller (the operator's pod create is only ever a dry run).
    Access("delete", "pods"),
    Access("create", "pods", "", "exec"),
    # One Node read by name at a time: never listed, watched or changed.
    Access("list", "nodes"),
    Access("watch", "nodes"),
    Access("patch", "nodes"),
    Access("delete", "gitrepositories", FLUX),
    # A Workspace's NetworkPolicy goes with it (garbage collection).
    Access("delete", "networkpolicies", "networking.k8s.io"),
    # Leader election only in its own namespace; tokens only for its own account.
    Access("create", "leases", "coordination.k8s.io", namespace="default"),
    Access("create", "serviceaccounts", "", "token", "pulumi", "default"),
    Access("create", "serviceaccounts", "", "token", "default", NAMESPACE),
    Access("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
    Access("delete", "namespaces"),
    # Approving a Stack's plan is a person's act (config/admission); the operator never sets it.
    Access("approve", "stacks", "pulumi.com"),
]


@pytest.mark.cluster
@pytest.mark.parametrize("access", OPERATOR_MAY, ids=str)
def test_operator_may(installed: Path, access: Access) -> None:
    assert operator_may(installed, access), f"the operator needs {access}"


@pytest.mark.cluster
@pytest.mark.parametrize("access", OPERATOR_MAY_NOT, ids=str)
def test_operator_may_not(installed: Path, access: Access) -> None:
    assert not operator_may(installed, access), f"least privilege: the operator must not {access}"

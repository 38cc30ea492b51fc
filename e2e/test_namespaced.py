"""The namespaced install on the real node (issue 42): an operator with Roles only runs a Stack.

``config/namespaced`` is rendered as a team would apply it, moved into a namespace of its own
(``pko-nsop``) so that it sits beside the suite's install rather than over it, and told to watch
``pko-team``. Only what a namespaced install adds is applied: the CRDs, the admission policy and the
aggregated roles are the suite's already, and its one ClusterRole (TokenReview and SubjectAccessReview)
is renamed so that the suite's keeps its rules. The suite's operator is scaled to 0 meanwhile, so
nothing else can reconcile. Judged from outside:

- the operator's ServiceAccount may list Stacks and get Secrets in ``pko-team`` and neither anywhere else
  (``kubectl auth can-i``), and its ClusterRole grants nothing but the two reviews;
- a Program Stack in ``pko-team`` is deployed by it (Ready, its ConfigMap made by the engine), and a
  Stack in ``default`` is never looked at (no status, no finalizer);
- deleting the Stack destroys what it made, under the namespaced operator.

The team's cluster admin grants what docs/install.md says the namespaced install cannot: the
workspace ServiceAccount's ``system:auth-delegator`` binding (its agent reviews the operator's tokens).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import OPERATOR_NS, REPO, RESTRICTED, Kube
from .stacks import program, stack

pytestmark = [pytest.mark.timeout(900), pytest.mark.pko_only("the namespaced install is pko's")]

NS_OPERATOR = "pko-nsop"  # where the namespaced install runs
TEAM = "pko-team"  # the one namespace it watches
NAME = "ns-team"  # the team's Stack
OUTSIDE = "ns-outside"  # a Stack in `default`, which the namespaced operator must not see
SA = f"system:serviceaccount:{NS_OPERATOR}:controller-manager"
# The objects a namespaced install adds to a cluster that has pko's CRDs and user roles already.
ADDED = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRoleBinding", "Service", "Deployment"}
OPERATOR_ROLE = "pulumi-kubernetes-operator-controller-manager"


def _render(k: Kube, tmp: Path) -> list[dict[str, Any]]:
    """config/namespaced with the node's images (config/local's patch), moved to NS_OPERATOR watching TEAM."""
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(REPO / "config" / "namespaced", tmp)],
                "images": [{"name": "pko", "newTag": "dev"}],
                "patches": [{"path": os.path.relpath(REPO / "config" / "local" / "manager_local.yaml", tmp)}],
            }
        )
    )
    rendered = k.run("kustomize", "--load-restrictor=LoadRestrictionsNone", str(tmp))
    docs = []
    for doc in (d for d in yaml.safe_load_all(rendered) if d):
        kind, meta = doc["kind"], doc["metadata"]
        if kind not in ADDED and not (kind == "ClusterRole" and meta["name"] == OPERATOR_ROLE):
            continue
        if kind == "Namespace":
            meta["name"] = NS_OPERATOR
        if meta.get("namespace") == OPERATOR_NS:
            meta["namespace"] = TEAM if meta["name"] == "pulumi-kubernetes-operator-watched" else NS_OPERATOR
        if kind.startswith("Cluster"):
            meta["name"] += f"-{NS_OPERATOR}"
        if kind == "ClusterRoleBinding":
            doc["roleRef"]["name"] = f"{OPERATOR_ROLE}-{NS_OPERATOR}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = NS_OPERATOR
        if kind == "Deployment":
            (manager,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"]
            for env in manager["env"]:
                if env["name"] == "WATCH_NAMESPACES":
                    env["value"] = TEAM
        docs.append(doc)
    return docs


def _team_setup() -> str:
    """What the team applies in its namespace, and the one binding its cluster admin grants."""
    rbac = (REPO / "config" / "samples" / "rbac.yaml").read_text()
    return (
        f"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: pulumi\n  namespace: {TEAM}\n---\n"
        f"apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n"
        f"  name: {TEAM}-pulumi-auth-delegator\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n"
        f"  kind: ClusterRole\n  name: system:auth-delegator\nsubjects:\n  - kind: ServiceAccount\n"
        f"    name: pulumi\n    namespace: {TEAM}\n---\n{rbac}"
    )


def _scale_suite_operator(k: Kube, replicas: int) -> None:
    k.run("-n", OPERATOR_NS, "scale", "deployment/controller-manager", f"--replicas={replicas}")
    k.run(
        "-n", OPERATOR_NS, "rollout", "status", "deployment/controller-manager", "--timeout=300s", timeout=320
    )
    if replicas == 0:
        k.until(
            "the suite's operator gone",
            lambda: (
                not k.json("-n", OPERATOR_NS, "get", "pods", "-l", "control-plane=controller-manager")[
                    "items"
                ]
            ),
            180,
        )


def _can(k: Kube, verb: str, resource: str, *where: str) -> bool:
    out = k.run("auth", "can-i", verb, resource, f"--as={SA}", *where, check=False).strip()
    return out == "yes"


@pytest.fixture(scope="module")
def namespaced(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Any:
    k = kube
    docs = _render(k, tmp_path_factory.mktemp("namespaced"))
    k.run("create", "namespace", TEAM)
    k.run("label", "--overwrite", "namespace", TEAM, *(f"{key}={value}" for key, value in RESTRICTED.items()))
    _scale_suite_operator(k, 0)
    try:
        k.run("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))
        k.apply(_team_setup(), TEAM)
        k.run(
            "-n",
            NS_OPERATOR,
            "rollout",
            "status",
            "deployment/controller-manager",
            "--timeout=300s",
            timeout=320,
        )
        yield k
    finally:
        k.run(
            "-n",
            TEAM,
            "delete",
            "stack",
            NAME,
            "--ignore-not-found",
            "--timeout=600s",
            check=False,
            timeout=620,
        )
        k.run("delete", "stack", OUTSIDE, "--ignore-not-found", check=False)
        k.run(
            "delete",
            "--ignore-not-found",
            "-f",
            "-",
            input=yaml.safe_dump_all(docs),
            check=False,
            timeout=300,
        )
        k.run(
            "delete", "clusterrolebinding", f"{TEAM}-pulumi-auth-delegator", "--ignore-not-found", check=False
        )
        k.run("delete", "namespace", TEAM, "--ignore-not-found", "--timeout=300s", check=False, timeout=320)
        k.run("delete", "program", OUTSIDE, f"pvc/{OUTSIDE}-state", "--ignore-not-found", check=False)
        _scale_suite_operator(k, 1)


def test_a_namespaced_install_runs_a_stack_in_its_namespace_and_sees_no_other(namespaced: Kube) -> None:
    k = namespaced
    assert _can(k, "list", "stacks.pulumi.com", "-n", TEAM)
    assert _can(k, "get", "secrets", "-n", TEAM)
    for where in (("-n", "default"), ("-n", OPERATOR_NS), ("--all-namespaces",)):
        assert not _can(k, "list", "stacks.pulumi.com", *where), where
        assert not _can(k, "list", "secrets", *where), where
    assert not _can(k, "get", "secrets", "-n", "default")  # not even by name, outside its namespace
    role = k.json("get", "clusterrole", f"{OPERATOR_ROLE}-{NS_OPERATOR}")
    assert {r for rule in role["rules"] for r in rule["resources"]} == {
        "tokenreviews",
        "subjectaccessreviews",
    }

    k.apply(program(OUTSIDE) + "---\n" + stack(OUTSIDE, f"programRef:\n    name: {OUTSIDE}"))
    k.apply(program(NAME) + "---\n" + stack(NAME, f"programRef:\n    name: {NAME}"), TEAM)

    def ready() -> dict[str, Any] | None:
        s = k.get("stack", NAME, TEAM)
        c = k.condition(s, "Ready")
        return s if c.get("status") == "True" and c.get("reason") == "ProcessingCompleted" else None

    k.until(f"stack {TEAM}/{NAME} Ready under the namespaced operator", ready, 600)
    assert (
        k.get("configmap", f"{NAME}-settings", TEAM) is not None
    )  # made by the engine in the team's namespace
    outside = k.get("stack", OUTSIDE)
    assert outside is not None
    assert not outside.get("status") and not outside["metadata"].get("finalizers"), outside

    k.run("-n", TEAM, "delete", "stack", NAME, "--timeout=600s", timeout=620)
    assert (
        k.get("configmap", f"{NAME}-settings", TEAM) is None
    )  # destroyOnFinalize, by the namespaced operator

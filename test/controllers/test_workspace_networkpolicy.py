"""Each Workspace's NetworkPolicy (pure: no cluster): it selects exactly the pod the Workspace's
StatefulSet makes, admits only the operator's pods, to the port the agent serves, and nothing else;
the operator's pods carry the labels it names in the install; the setting turns it off."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.controllers import register
from pko.controllers.options import ControllerOptions
from pko.controllers.workspace.networkpolicy import (
    CONTROLLER_NAME,
    NAMESPACE_NAME_LABEL,
    OPERATOR_POD_LABELS,
    desired_network_policy,
)
from pko.controllers.workspace.workloads import (
    ANNOTATION_APPLIED_DIGEST,
    applied_digest,
    desired_statefulset,
    parse_spec,
)
from pko.machinery.manager import Manager, ManagerOptions

from .builders import workspace

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
OPTIONS = ControllerOptions(operator_namespace="pko-system")


def pod_of(ws: Obj) -> Obj:
    """The pod template the Workspace's StatefulSet gives its pod."""
    template: Obj = desired_statefulset(ws, parse_spec(ws), OPTIONS)["spec"]["template"]
    return template


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_the_policy_selects_the_workspace_pod_and_no_other() -> None:
    ws = workspace({"image": "pulumi/pulumi:3"})
    policy = desired_network_policy(ws, "pko-system")
    selector = policy["spec"]["podSelector"]
    assert matches(selector, pod_of(ws)["metadata"]["labels"])
    other = copy.deepcopy(ws)
    other["metadata"]["name"] = "other-stack"
    assert not matches(selector, pod_of(other)["metadata"]["labels"])


def test_a_pod_template_cannot_move_the_pod_out_of_the_policy() -> None:
    """The system labels are re-asserted after the template merge; the policy relies on them."""
    ws = workspace(
        {
            "image": "pulumi/pulumi:3",
            "podTemplate": {
                "metadata": {"labels": {"auto.pulumi.com/workspace-name": "elsewhere", "team": "a"}}
            },
        }
    )
    labels = pod_of(ws)["metadata"]["labels"]
    assert labels["team"] == "a"
    assert matches(desired_network_policy(ws, "pko-system")["spec"]["podSelector"], labels)


def test_only_the_operators_pods_reach_the_agents_port_and_nothing_else_gets_in() -> None:
    ws = workspace({"image": "pulumi/pulumi:3"})
    spec = desired_network_policy(ws, "pko-system")["spec"]
    assert spec["policyTypes"] == ["Ingress"]  # egress is the user's
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer == {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "pko-system"}},
        "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
    }
    containers = pod_of(ws)["spec"]["containers"]
    agent_ports = [p for c in containers for p in c.get("ports") or [] if p["name"] == "grpc"]
    assert rule["ports"] == [{"protocol": p["protocol"], "port": p["containerPort"]} for p in agent_ports]


def test_the_policy_is_the_workspaces_and_stamped() -> None:
    ws = workspace({"image": "pulumi/pulumi:3"})
    policy = desired_network_policy(ws, "pko-system")
    meta = policy["metadata"]
    assert (meta["name"], meta["namespace"]) == ("my-stack-workspace", "ns1")
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Workspace",
        "my-stack",
        "uid-1",
        True,
    )
    assert meta["annotations"][ANNOTATION_APPLIED_DIGEST] == applied_digest(policy)
    assert desired_network_policy(ws, "other")["metadata"]["annotations"] != meta["annotations"]


@pytest.mark.parametrize("overlay", ["default", "namespaced"])
def test_the_installed_operator_pods_carry_the_labels_the_policy_admits(overlay: str) -> None:
    """config/ (and the chart, which test_helm_chart renders to the same objects): the Deployment's
    pod template has OPERATOR_POD_LABELS, and the operator's namespace is the Deployment's."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "config" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    (deploy,) = [
        d
        for d in yaml.safe_load_all(built)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "controller-manager"
    ]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert dict(OPERATOR_POD_LABELS).items() <= labels.items()


def _declared(options: ControllerOptions) -> list[str]:
    manager = Manager(object(), ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"))  # type: ignore[arg-type]
    register(manager, options)
    return sorted(manager._builders)


def test_the_setting_turns_the_controller_off() -> None:
    assert CONTROLLER_NAME in _declared(ControllerOptions())
    assert CONTROLLER_NAME not in _declared(ControllerOptions(workspace_network_policy=False))

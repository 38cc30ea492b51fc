"""Each Workspace's NetworkPolicy on a real control plane (issue 46).

The real operator (every controller, the shipped RBAC) runs a Stack: its Workspace gets a
NetworkPolicy the apiserver accepts, controlled by the Workspace, whose pod selector matches the
labels of the pod the StatefulSet controller really made and whose namespace selector matches the
operator's namespace as the apiserver labels it; the Stack still deploys through the agent. A policy
someone widens is put back; one someone deletes is made again.

Not proven here: enforcement. No CNI plugin runs in this control plane (the play-kubelet's pods
are processes on loopback), and the local e2e node's bridge plugin implements no NetworkPolicy
either; docs/security.md says so. The operator runs in-process, so no pod of it carries
OPERATOR_POD_LABELS: test_workspace_networkpolicy checks the installed Deployment's pod template.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from pko.controllers.resources import WORKSPACE_SELECTOR
from pko.controllers.workspace.networkpolicy import NETWORK_POLICIES, OPERATOR_POD_LABELS
from pko.devtools.waiting import wait_until
from pko.machinery.resource import PODS, ResourceClient

from .conftest import operator_env
from .test_stack import Env as StackEnv

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

Obj = dict[str, Any]


class Env(StackEnv):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.policies = ResourceClient(self.api, NETWORK_POLICIES, self.ns)


env = operator_env(Env)


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


async def test_a_workspace_gets_a_policy_that_selects_its_real_pod_and_admits_only_the_operator(
    env: Env,
) -> None:
    await env.create_program("guarded", {"outputs": {"greeting": "hi"}})
    await env.create_stack("guarded", {"programRef": {"name": "guarded"}})
    stack = await env.condition("guarded", "Ready", "ProcessingCompleted")
    assert stack["status"]["outputs"] == {"greeting": "hi"}

    policy = await wait_until(
        "the Workspace's NetworkPolicy",
        lambda: env.policies.get_or_none("guarded-workspace"),
        within=60,
    )
    workspace = await env.get(env.workspaces, "guarded")
    assert workspace is not None
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Workspace",
        workspace["metadata"]["uid"],
        True,
    )

    pods = (await ResourceClient(env.api, PODS, env.ns).list(label_selector=WORKSPACE_SELECTOR)).items
    selected = [p for p in pods if selects(policy["spec"]["podSelector"], p["metadata"].get("labels") or {})]
    assert [p["metadata"]["name"] for p in selected] == ["guarded-workspace-0"]

    rule, scrapes = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    operator_ns = await client.CoreV1Api(env.api).read_namespace(env.operator.namespace)
    assert selects(peer["namespaceSelector"], operator_ns.metadata.labels)
    own_ns = await client.CoreV1Api(env.api).read_namespace(env.ns)
    assert not selects(peer["namespaceSelector"], own_ns.metadata.labels)  # not the Stack's neighbours
    assert peer["podSelector"] == {"matchLabels": dict(OPERATOR_POD_LABELS)}
    (pod,) = selected
    agent_port = next(
        p for c in pod["spec"]["containers"] for p in c.get("ports") or [] if p["name"] == "grpc"
    )
    assert rule["ports"] == [{"protocol": "TCP", "port": agent_port["containerPort"]}]
    # The agent's metrics port (--workspace-metrics, https by default) admits any scraper with a token.
    metrics_port = next(
        p for c in pod["spec"]["containers"] for p in c.get("ports") or [] if p["name"] == "https-metrics"
    )
    assert scrapes == {"ports": [{"protocol": "TCP", "port": metrics_port["containerPort"]}]}


async def test_a_widened_policy_is_put_back_and_a_deleted_one_made_again(env: Env) -> None:
    await env.create_program("kept", {"outputs": {"greeting": "hi"}})
    await env.create_stack("kept", {"programRef": {"name": "kept"}})
    policy = await wait_until(
        "the Workspace's NetworkPolicy", lambda: env.policies.get_or_none("kept-workspace"), within=120
    )
    wanted = policy["spec"]

    anyone = {"ingress": [*wanted["ingress"], {"ports": [{"protocol": "TCP", "port": 50051}]}]}
    await env.policies.patch("kept-workspace", {"spec": anyone})

    async def restored() -> Obj | None:
        current = await env.policies.get_or_none("kept-workspace")
        return current if current is not None and current["spec"] == wanted else None

    await wait_until("the widened policy put back", restored, within=60)

    uid = policy["metadata"]["uid"]
    await env.policies.delete("kept-workspace")

    async def remade() -> Obj | None:
        current = await env.policies.get_or_none("kept-workspace")
        return current if current is not None and current["metadata"]["uid"] != uid else None

    again = await wait_until("the deleted policy made again", remade, within=60)
    assert again["spec"] == wanted

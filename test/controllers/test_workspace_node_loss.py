"""Issue 28, the node running the workspace pod lost: the real operator (every controller), apiserver,
kube-controller-manager and the play-kubelet, on a Node of this module's own.

The test control plane runs no node lifecycle controller, so the test plays it: when the kubelet
stops (its processes killed, its pod left in the API, as when a machine dies), the Node's Ready goes
``Unknown`` ("Kubelet stopped posting node status.") and the pod's Ready ``False``. The StatefulSet
controller never replaces that pod; the Workspace says so (``NodeLost``, Stalled, with the command
that lets Kubernetes start it elsewhere) and so does the Stack when it has an Update to run. When
the kubelet comes back (Node Ready, the pod running again) both recover and the Update runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.machinery.conditions import get_condition

from .conftest import operator_env
from .test_stack import Env as StackEnv

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

Obj = dict[str, Any]
NODE = f"pko-lost-{uuid.uuid4().hex[:6]}"
KUBELET_OPTIONS = {"node_name": NODE}
UNREACHABLE_TIMEOUT = 15.0
OPERATOR_OPTIONS = {"agent_unreachable_timeout": UNREACHABLE_TIMEOUT}
HANG_BODY: Obj = {
    "resources": {"wait": {"type": "test:index:Hang", "properties": {"seconds": 40}}},
    "outputs": {"done": "yes"},
}
# No secret: the pod the stand-in kubelet runs again gets a new emptyDir (a real node that comes
# back keeps it), without the stack settings file that holds the passphrase's salt.
PROGRAM_BODY: Obj = {
    "resources": {"echo": {"type": "test:index:Echo", "properties": {"value": "hello"}}},
    "outputs": {"greeting": "${echo.value}"},
}
OUT_OF_SERVICE = f"kubectl taint nodes {NODE} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


class Env(StackEnv):
    async def workspace_condition(self, name: str, type_: str, reason: str, *, within: float = 120.0) -> Obj:
        async def probe() -> Obj | None:
            ws = await self.get(self.workspaces, name)
            found = get_condition(((ws or {}).get("status") or {}).get("conditions"), type_)
            return ws if found is not None and found.get("reason") == reason else None

        return await self.stack_until(name, f"workspace {name} {type_}/{reason}", probe, within=within)


env = operator_env(Env)


@pytest.fixture(scope="module", autouse=True)
async def node_removed(api_client: client.ApiClient) -> AsyncIterator[None]:
    """This module's Node goes after the play-kubelet that made it (set up first, torn down last)."""
    yield
    with contextlib.suppress(ApiException):
        await client.CoreV1Api(api_client).delete_node(NODE, _preload_content=False)


def _time(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


async def lose_the_node(env: Env, pod: str) -> str:
    """What a dead machine and the node lifecycle controller leave: no kubelet, Ready=Unknown since
    two minutes (past the grace), the pod not ready. Returns the Node's lastTransitionTime."""
    await env.kubelet.stop(release_pods=False)
    since = _time(datetime.now(UTC) - timedelta(minutes=2))
    core = client.CoreV1Api(env.api)
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": since,
        "lastTransitionTime": since,
    }
    await core.patch_node_status(NODE, {"status": {"conditions": [unknown]}}, _preload_content=False)
    not_ready = {"type": "Ready", "status": "False", "lastTransitionTime": _time(datetime.now(UTC))}
    await core.patch_namespaced_pod_status(
        pod, env.ns, {"status": {"conditions": [not_ready]}}, _preload_content=False
    )
    return since


async def test_a_lost_node_stalls_the_workspace_and_the_stack_until_it_comes_back(env: Env) -> None:
    await env.create_program("lost", PROGRAM_BODY)
    await env.create_stack("lost", {"programRef": {"name": "lost"}})
    stack = await env.condition("lost", "Ready", "ProcessingCompleted")
    first = stack["status"]["lastUpdate"]["name"]
    pod = await env.kubelet.wait_ready(f"{env.ns}/lost-workspace-0")
    assert pod["spec"]["nodeName"] == NODE
    try:
        since = await lose_the_node(env, "lost-workspace-0")

        ws = await env.workspace_condition("lost", "Stalled", "NodeLost")
        stalled = get_condition(ws["status"]["conditions"], "Stalled") or {}
        ready = get_condition(ws["status"]["conditions"], "Ready") or {}
        assert (stalled["status"], ready["status"], ready["reason"]) == ("True", "False", "NodeLost")
        message = stalled["message"]
        assert message.startswith(
            f"The workspace pod {env.ns}/lost-workspace-0 is on node {NODE}, which has not been ready "
            f"since {since} (Kubelet stopped posting node status.). Kubernetes will not start the pod "
            "elsewhere while the node may still run it."
        ), message
        assert OUT_OF_SERVICE in message

        # An Update to run: the Stack says why it cannot, in the Workspace's words.
        await env.stacks.patch("lost", {"spec": {"config": {"lost:extra": "1"}}})
        stack = await env.condition("lost", "Stalled", "WorkspaceFailed", within=60)
        stack_stalled = get_condition(stack["status"]["conditions"], "Stalled") or {}
        assert stack_stalled["message"] == f"NodeLost: {message}"
    finally:
        # The node comes back: Ready again, its kubelet runs the pod again.
        await env.kubelet.start()

    ws = await env.workspace_condition("lost", "Ready", "Succeeded", within=180)
    assert get_condition(ws["status"]["conditions"], "Stalled") is None

    async def updated() -> Obj | None:
        current = await env.get(env.stacks, "lost")
        status = (current or {}).get("status") or {}
        last = status.get("lastUpdate") or {}
        ready = get_condition(status.get("conditions"), "Ready") or {}
        done = last.get("name") != first and last.get("state") == "succeeded"
        return current if done and ready.get("status") == "True" else None

    stack = await env.stack_until("lost", "the Update after the node came back", updated, within=240)
    assert get_condition(stack["status"]["conditions"], "Stalled") is None
    assert stack["status"]["observedGeneration"] == stack["metadata"]["generation"]

    await env.stacks.delete("lost")
    with contextlib.suppress(ApiException):
        await env.programs.delete("lost")


def _said(stack: Obj | None) -> tuple[str, ...]:
    """The Stack's conditions as ``type=reason`` (True ones only, and Ready's status)."""
    conditions = ((stack or {}).get("status") or {}).get("conditions") or []
    return tuple(
        f"{c['type']}={c.get('reason')}"
        for c in conditions
        if c.get("status") == "True" or c["type"] == "Ready"
    )


async def test_an_update_in_flight_on_a_lost_node_fails_then_the_stack_says_node_lost(env: Env) -> None:
    """The agent dies with its node mid-up: the Stack says ``NodeLost`` as soon as the Workspace
    does, while the Update still waits for the agent; the Update ends ``AgentUnreachable`` after the
    budget, the retry finds the Workspace Stalled, and the Stack keeps saying it (no flip back to a
    retry or a running Update) until the node returns."""
    await env.create_program("hang", HANG_BODY)
    await env.create_stack("hang", {"programRef": {"name": "hang"}})

    async def running() -> Obj | None:
        stack = await env.get(env.stacks, "hang")
        current = ((stack or {}).get("status") or {}).get("currentUpdate") or {}
        update = await env.get(env.updates, current["name"]) if current.get("name") else None
        progressing = get_condition(((update or {}).get("status") or {}).get("conditions"), "Progressing")
        return stack if progressing is not None and progressing.get("reason") == "Progressing" else None

    await env.stack_until("hang", "the first up running", running, within=180)
    seen: list[tuple[str, ...]] = []
    try:
        await lose_the_node(env, "hang-workspace-0")
        deadline = time.monotonic() + UNREACHABLE_TIMEOUT + 120
        stalled_at: float | None = None
        while time.monotonic() < deadline:
            said = _said(await env.get(env.stacks, "hang"))
            if not seen or seen[-1] != said:
                seen.append(said)
            if "Stalled=WorkspaceFailed" in said and stalled_at is None:
                stalled_at = time.monotonic()
            last = (((await env.get(env.stacks, "hang")) or {}).get("status") or {}).get("lastUpdate") or {}
            if (
                stalled_at is not None
                and last.get("state") == "failed"
                and time.monotonic() - stalled_at > 10
            ):
                break
            await asyncio.sleep(0.25)
        assert stalled_at is not None, seen
        # Once it says NodeLost it keeps saying it.
        first = next(i for i, said in enumerate(seen) if "Stalled=WorkspaceFailed" in said)
        assert all(said == seen[first] for said in seen[first:]), seen
        stack = await env.get(env.stacks, "hang")
        stalled = get_condition((stack or {})["status"]["conditions"], "Stalled") or {}
        assert stalled["message"].startswith("NodeLost: ") and OUT_OF_SERVICE in stalled["message"]
        last = (stack or {})["status"]["lastUpdate"]
        assert last["state"] == "failed" and "lost contact with the workspace agent" in last["message"], last
    finally:
        print("the Stack's conditions, in order:", *seen, sep="\n  ")
        await env.kubelet.start()

    async def recovered() -> Obj | None:
        stack = await env.get(env.stacks, "hang")
        last = ((stack or {}).get("status") or {}).get("lastUpdate") or {}
        ready = get_condition(((stack or {}).get("status") or {}).get("conditions"), "Ready") or {}
        return stack if last.get("state") == "succeeded" and ready.get("status") == "True" else None

    stack = await env.stack_until("hang", "the retried up after the node came back", recovered, within=240)
    assert get_condition(stack["status"]["conditions"], "Stalled") is None
    await env.stacks.delete("hang")
    with contextlib.suppress(ApiException):
        await env.programs.delete("hang")

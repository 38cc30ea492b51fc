"""Faults around a running Update: none leaves it Progressing, none fails it for nothing.

The real operator (with a short ``agent_unreachable_timeout``), apiserver and
kube-controller-manager; the play-kubelet runs real agents with the stand-in Pulumi CLI.

* the workspace pod is replaced mid-up: the new agent does not know the operation -> ``OperationLost``;
* the agent stops answering for longer than the timeout -> ``AgentUnreachable``;
* a shorter silence, and a Workspace whose readiness flaps (the node lifecycle controller marks the
  pod NotReady, then it recovers), do not fail an Update that is still running (upstream PR 1155).
"""

from __future__ import annotations

import asyncio
import copy
import signal

import pytest

from pko.devtools.waiting import wait_until
from pko.machinery.resource import PODS, ResourceClient

from .conftest import operator_env
from .test_update import SLOW_PROGRAM, Env, Obj, assert_succeeded, condition

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

UNREACHABLE_TIMEOUT = 30.0
OPERATOR_OPTIONS = {"engine_event_log_level": "info", "agent_unreachable_timeout": UNREACHABLE_TIMEOUT}


env = operator_env(Env)


async def test_pod_replaced_mid_up_ends_operation_lost(env: Env) -> None:
    ws = await env.workspace("replaced", SLOW_PROGRAM.format(name="replaced", seconds=90))
    update = await env.wait_running(await env.create_update(ws, "up"))
    pods = ResourceClient(env.api, PODS, env.ns)
    old = await pods.get("replaced-workspace-0")
    await pods.delete("replaced-workspace-0", grace_period_seconds=0)
    update = await env.wait_complete(update, within=240)
    failed = condition(update, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "OperationLost"), update["status"]
    assert "replaced" in update["status"]["message"], update["status"]
    new = await pods.get("replaced-workspace-0")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]


async def test_agent_silent_beyond_the_timeout_ends_agent_unreachable(env: Env) -> None:
    ws = await env.workspace("silent", SLOW_PROGRAM.format(name="silent", seconds=300))
    update = await env.wait_running(await env.create_update(ws, "up"))
    pod_key = f"{env.ns}/silent-workspace-0"
    assert env.kubelet.kill(pod_key, "pulumi", signal.SIGSTOP), env.kubelet.describe()
    try:
        update = await env.wait_complete(update, within=UNREACHABLE_TIMEOUT + 120)
    finally:
        env.kubelet.kill(pod_key, "pulumi", signal.SIGCONT)
    failed = condition(update, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "AgentUnreachable"), update["status"]
    assert "lost contact with the workspace agent" in update["status"]["message"]
    assert update["status"]["endTime"]


async def test_a_short_silence_and_a_readiness_flap_do_not_fail_a_running_update(env: Env) -> None:
    ws = await env.workspace("flap", SLOW_PROGRAM.format(name="flap", seconds=25))
    update = await env.wait_running(await env.create_update(ws, "up"))
    pod_key = f"{env.ns}/flap-workspace-0"

    # The agent stops answering for a while, well within the timeout.
    assert env.kubelet.kill(pod_key, "pulumi", signal.SIGSTOP), env.kubelet.describe()
    await asyncio.sleep(UNREACHABLE_TIMEOUT / 3)
    env.kubelet.kill(pod_key, "pulumi", signal.SIGCONT)

    # The pod is marked NotReady (as the node lifecycle controller does), then recovers.
    pods = ResourceClient(env.api, PODS, env.ns)
    pod = await pods.get("flap-workspace-0")
    healthy = copy.deepcopy(pod["status"])
    unready = copy.deepcopy(healthy)
    for c in unready.get("conditions") or []:
        if c["type"] in ("Ready", "ContainersReady"):
            c["status"] = "False"
    await pods.patch(
        "flap-workspace-0", [{"op": "replace", "path": "/status", "value": unready}], patch_type="json",
        subresource="status",
    )  # fmt: skip

    async def workspace_not_ready() -> Obj | None:
        w = await env.workspaces.get("flap", env.ns)
        return w if condition(w, "Ready").get("status") == "False" else None

    await wait_until("workspace flap not Ready", workspace_not_ready, within=60)
    current = await env.updates.get(update["metadata"]["name"], env.ns)
    assert condition(current, "Progressing")["status"] == "True", current["status"]
    await pods.patch(
        "flap-workspace-0", [{"op": "replace", "path": "/status", "value": healthy}], patch_type="json",
        subresource="status",
    )  # fmt: skip

    assert_succeeded(await env.wait_complete(update, within=240))

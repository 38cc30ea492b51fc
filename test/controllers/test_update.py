"""The Update reconciler end to end: the real operator, apiserver, kube-controller-manager, the
play-kubelet running real agents with the stand-in Pulumi CLI.

Each workspace holds one program (written into ``/share/workspace`` by an init container from the
Workspace's pod template); Updates are created as the Stack controller creates them: controlled by
the Workspace.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pko.agentclient import AgentClient, AgentError, resolve_address
from pko.controllers.resources import STACK_FINALIZER, STACKS, UPDATES, WORKSPACES
from pko.controllers.update.status import is_complete
from pko.devtools.operatorharness import OperatorEnv
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.resource import EVENTS, PODS, SECRETS, ResourceClient
from pko.tokens import TokenSource

from .conftest import operator_env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

# The Program artifact server on a free port (its default port may be taken by another test run).
OPERATOR_OPTIONS = {"engine_event_log_level": "info"}
Obj = dict[str, Any]

GOOD_PROGRAM = """\
name: outputs
runtime: yaml
resources:
  pw:
    type: random:RandomPassword
    properties:
      length: 16
  echo:
    type: test:index:Echo
    properties:
      value: hello
outputs:
  greeting: ${echo.value}
  password: ${pw.result}
  "weird key/1": ${echo.value}
"""

SLOW_PROGRAM = """\
name: {name}
runtime: yaml
resources:
  wait:
    type: test:index:Hang
    properties:
      seconds: {seconds}
outputs:
  done: yes
"""

BAD_PROGRAM = """\
name: bad
runtime: yaml
outputs:
  broken: ${nothing.here}
"""


# --- helpers -------------------------------------------------------------------------------------


def program_init_container(program: str) -> Obj:
    encoded = base64.b64encode(program.encode()).decode()
    script = f"mkdir -p /share/workspace && echo {encoded} | base64 -d > /share/workspace/Pulumi.yaml"
    return {
        "name": "program",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "share", "mountPath": "/share"}],
    }


def condition(obj: Obj | None, type_: str) -> Obj:
    return get_condition(((obj or {}).get("status") or {}).get("conditions"), type_) or {}


class Env(OperatorEnv):
    """The module's handles: admin API, namespace, operator, kubelet, and clients of every namespace."""

    def __post_init__(self) -> None:
        self.updates = ResourceClient(self.api, UPDATES)
        self.workspaces = ResourceClient(self.api, WORKSPACES)
        self.secrets = ResourceClient(self.api, SECRETS)
        self.events = ResourceClient(self.api, EVENTS)
        self.stacks = ResourceClient(self.api, STACKS)
        self._workspaces: dict[str, Obj] = {}

    async def workspace(self, name: str, program: str) -> Obj:
        """A Ready Workspace running ``program`` (created once per name)."""
        if name in self._workspaces:
            return self._workspaces[name]
        body = {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "Workspace",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "podTemplate": {
                    "spec": {
                        "containers": [{"name": "pulumi"}],
                        "initContainers": [program_init_container(program)],
                    }
                }
            },
        }
        await self.workspaces.apply(body, field_manager="pko-tests")

        async def ready() -> Obj | None:
            ws = await self.workspaces.get(name, self.ns)
            return ws if condition(ws, "Ready").get("status") == "True" else None

        try:
            ws: Obj = await wait_until(f"workspace {name} Ready", ready, within=180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.kubelet.describe()}") from None
        self._workspaces[name] = ws
        return ws

    async def create_update(
        self,
        ws: Obj,
        type_: str = "up",
        *,
        owner: bool = True,
        workspace_name: str | None = None,
        **spec: Any,
    ) -> Obj:
        """An Update controlled by ``ws`` (as the Stack controller makes them) running in ``ws`` or in
        ``workspace_name``."""
        target = workspace_name or ws["metadata"]["name"]
        name = f"{target}-{uuid.uuid4().hex[:8]}"
        meta: Obj = {
            "name": name,
            "namespace": self.ns,
            "labels": {"pulumi.com/stack-name": ws["metadata"]["name"]},
        }
        if owner:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "auto.pulumi.com/v1alpha1",
                    "kind": "Workspace",
                    "name": ws["metadata"]["name"],
                    "uid": ws["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        body: Obj = {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "Update",
            "metadata": meta,
            "spec": {"workspaceName": target, "stackName": "dev", "type": type_, **spec},
        }
        return await self.updates.create(body)

    async def wait_complete(self, update: Obj, within: float = 180.0) -> Obj:
        name = update["metadata"]["name"]

        async def done() -> Obj | None:
            u = await self.updates.get_or_none(name, self.ns)
            return u if u is not None and is_complete(u) else None

        try:
            result: Obj = await wait_until(f"update {name} complete", done, within=within)
        except AssertionError as exc:
            current = await self.updates.get_or_none(name, self.ns)
            raise AssertionError(
                f"{exc}\nstatus: {json.dumps((current or {}).get('status'), indent=1)}"
            ) from None
        return result

    async def wait_running(self, update: Obj, within: float = 120.0) -> Obj:
        name = update["metadata"]["name"]

        async def running() -> Obj | None:
            u = await self.updates.get_or_none(name, self.ns)
            return u if condition(u, "Progressing").get("reason") == "Progressing" else None

        result: Obj = await wait_until(f"update {name} running", running, within=within)
        return result


env = operator_env(Env)


def assert_succeeded(update: Obj) -> None:
    assert condition(update, "Complete")["reason"] == "Updated", update["status"]
    failed = condition(update, "Failed")
    assert (failed["status"], failed["reason"]) == ("False", "UpdateSucceeded"), update["status"]
    assert condition(update, "Progressing")["status"] == "False"
    status = update["status"]
    assert status["startTime"] and status["endTime"]
    assert status["observedGeneration"] == update["metadata"]["generation"]


# --- tests ---------------------------------------------------------------------------------------


async def test_up_records_outputs_in_an_immutable_secret(env: Env) -> None:
    ws = await env.workspace("good", GOOD_PROGRAM)
    update = await env.wait_complete(await env.create_update(ws, "up", message="first up"))
    assert_succeeded(update)
    status = update["status"]
    assert status["projectInfo"] == {"name": "outputs", "runtime": "yaml"}
    # what the engine did, as the Stack counts what its destroy must delete (issue 30)
    assert sum(status["resourceChanges"].values()) >= 3, status
    name = update["metadata"]["name"]
    assert status["outputs"] == f"{name}-stack-outputs"
    secret = await env.secrets.get(status["outputs"], env.ns)
    assert secret["immutable"] is True
    assert secret["metadata"]["labels"] == {
        "auto.pulumi.com/component": "update",
        "auto.pulumi.com/update-name": name,
    }
    (ref,) = secret["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("Update", name, True)
    data = {k: json.loads(base64.b64decode(v)) for k, v in secret["data"].items()}
    assert data["greeting"] == "hello"
    assert data["weird_key_1"] == "hello"
    assert isinstance(data["password"], str) and len(data["password"]) == 16
    # The secret output is listed as secret, and never leaks into the status.
    assert json.loads(secret["metadata"]["annotations"]["pulumi.com/secrets"]) == ["password"]
    assert data["password"] not in json.dumps(update)
    events = await env.events_for(name, reason="UpdateSucceeded")
    assert [(e["type"], e["reason"]) for e in events] == [("Normal", "UpdateSucceeded")]


@pytest.mark.parametrize("type_", ["preview", "refresh", "destroy"])
async def test_other_operation_types(env: Env, type_: str) -> None:
    """Each type on a Workspace and project of its own: a stack another test wrote may be unreadable
    by now (a test that changes the operator's pod template rolls every Workspace's pod, and the
    stand-in kubelet's new pod lacks the settings file with the passphrase's salt)."""
    ws = await env.workspace(f"good-{type_}", GOOD_PROGRAM.replace("name: outputs", f"name: outputs-{type_}"))
    if type_ in ("refresh", "destroy"):  # a stack to act on: only a preview or an up creates one
        assert_succeeded(await env.wait_complete(await env.create_update(ws, "up")))
    update = await env.wait_complete(await env.create_update(ws, type_))
    assert_succeeded(update)
    if type_ == "destroy":
        assert update["status"]["resourceChanges"].get("delete", 0) >= 3, update["status"]


async def test_program_error_fails_with_the_message(env: Env) -> None:
    ws = await env.workspace("bad", BAD_PROGRAM)
    update = await env.wait_complete(await env.create_update(ws, "up"))
    failed = condition(update, "Failed")
    assert failed["status"] == "True"
    assert failed["reason"] not in ("UpdateSucceeded", "")
    message = update["status"]["message"]
    assert "nothing" in message, message
    assert len(message.splitlines()) <= 12
    assert condition(update, "Complete")["reason"] == "Updated"
    events = await env.events_for(update["metadata"]["name"], reason="UpdateFailed")
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "UpdateFailed")]


DRIFT_PROGRAM = """\
name: drift
runtime: yaml
resources:
  thing:
    type: test:index:Drift
    properties:
      path: {path}
"""


async def test_a_preview_only_refresh_records_the_drift_and_plans_reach_the_agent(
    env: Env, tmp_path: Path
) -> None:
    """Issue 29's building blocks through the operator: ``previewOnly`` reaches the agent and the
    drifted resource lands in ``status.changes`` (state untouched, so a second check finds it too);
    ``savePlan`` and ``plan`` reach it too. The stand-in CLI saves no plan (the real engine's plans
    are tested in test/agent/test_update_plans.py), so the up ends ``PlanNotFound`` in the agent's
    words, which name the preview's operation id: the name was resolved to that uid."""
    cloud = tmp_path / "cloud-value"  # the "cloud" side of a test:index:Drift resource
    cloud.write_text("v1")
    ws = await env.workspace("drift", DRIFT_PROGRAM.format(path=cloud))
    assert_succeeded(await env.wait_complete(await env.create_update(ws, "up")))
    cloud.write_text("v2")  # changed out of band
    drifted = [
        {
            "urn": "urn:pulumi:dev::drift::test:index:Drift::thing",
            "type": "test:index:Drift",
            "op": "update",
            "paths": ["value"],
        }
    ]
    for _ in range(2):
        check = await env.wait_complete(await env.create_update(ws, "refresh", previewOnly=True))
        assert_succeeded(check)
        assert check["status"]["changes"] == drifted, check["status"]

    preview = await env.wait_complete(await env.create_update(ws, "preview", savePlan=True))
    assert_succeeded(preview)
    up = await env.wait_complete(await env.create_update(ws, "up", plan=preview["metadata"]["name"]))
    failed = condition(up, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "PlanNotFound"), up["status"]
    assert repr(preview["metadata"]["uid"]) in up["status"]["message"], up["status"]
    nameless = await env.wait_complete(await env.create_update(ws, "up", plan="no-such-preview"))
    assert condition(nameless, "Failed")["reason"] == "PlanNotFound"
    assert nameless["status"]["message"] == "the plan's preview Update 'no-such-preview' was not found"


async def test_orphaned_update_is_canceled(env: Env) -> None:
    ws = await env.workspace("good", GOOD_PROGRAM)
    update = await env.wait_complete(await env.create_update(ws, "up", owner=False))
    failed = condition(update, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "Canceled")
    complete, progressing = condition(update, "Complete"), condition(update, "Progressing")
    assert (complete["status"], complete["reason"]) == ("True", "Failed")
    assert (progressing["status"], progressing["reason"]) == ("False", "Failed")


async def test_missing_workspace_waits_without_failing(env: Env) -> None:
    # Owned by a real Workspace (an owner that does not exist would get it garbage-collected).
    owner = await env.workspace("good", GOOD_PROGRAM)
    update = await env.create_update(owner, "up", workspace_name="nowhere")

    async def waiting() -> Obj | None:
        u = await env.updates.get_or_none(update["metadata"]["name"], env.ns)
        return u if condition(u, "Progressing").get("reason") == "WorkspaceNotFound" else None

    u = await wait_until("WorkspaceNotFound", waiting, within=60)
    assert condition(u, "Complete")["status"] == "False"
    assert condition(u, "Failed")["status"] == "False"
    # The Workspace appears and becomes Ready: its watch starts the waiting Update.
    # (Its own project: the file backend is shared, and each workspace has its own passphrase salt.)
    await env.workspace("nowhere", GOOD_PROGRAM.replace("name: outputs", "name: later"))
    assert_succeeded(await env.wait_complete(update))


async def test_agent_killed_mid_up_fails_with_a_clear_reason(env: Env) -> None:
    ws = await env.workspace("killed", SLOW_PROGRAM.format(name="killed", seconds=30))
    update = await env.wait_running(await env.create_update(ws, "up"))
    pod_key = f"{env.ns}/killed-workspace-0"
    await asyncio.sleep(1.0)
    assert env.kubelet.kill(pod_key, "pulumi", signal.SIGKILL), env.kubelet.describe()
    update = await env.wait_complete(update, within=240)
    failed = condition(update, "Failed")
    assert failed["status"] == "True"
    # The container restarts (same pod, same journal): the agent reports the operation it lost.
    assert failed["reason"] == "AgentRestarted", update["status"]
    assert update["status"]["message"]


async def test_the_lock_and_create_the_killed_agent_left_are_removed_by_the_one_up_that_redoes_it(
    env: Env,
) -> None:
    """The agent killed -9 mid-create: the engine's state keeps a pending create, and its lock. While the
    lock reads as another host's, the next up fails StackLocked with ``status.pendingOperations``, the
    lock left alone. As this pod's own (taken before the agent restarted), the next up removes it and
    runs again within the same Update, which succeeds: its message and a ``StaleLockRemoved`` Event name
    the lock and the pending create, and the agent clears the now stale record
    (``clearedPendingOperations``)."""
    ws = await env.workspace("pending", SLOW_PROGRAM.format(name="pending", seconds=15))
    wait = {"urn": "urn:pulumi:dev::pending::test:index:Hang::wait", "type": "creating"}
    killed = await env.wait_running(await env.create_update(ws, "up"))
    await asyncio.sleep(1.5)
    assert env.kubelet.kill(f"{env.ns}/pending-workspace-0", "pulumi", signal.SIGKILL), env.kubelet.describe()
    assert condition(await env.wait_complete(killed, within=240), "Failed")["reason"] == "AgentRestarted"

    backend = Path(env.kubelet.pulumi.backend_url.removeprefix("file://"))
    (lock_file,) = (backend / ".pulumi" / "locks" / "organization" / "pending" / "dev").glob("*.json")
    lock = json.loads(lock_file.read_text())
    lock_file.write_text(json.dumps({**lock, "hostname": "laptop"}))
    locked = await env.wait_complete(await env.create_update(ws, "up"), within=240)
    assert condition(locked, "Failed")["reason"] == "StackLocked", locked["status"]
    assert "@laptop (pid " in locked["status"]["message"], locked["status"]
    assert "removed" not in locked["status"]["message"], locked["status"]
    assert locked["status"]["pendingOperations"] == [wait], locked["status"]
    assert "clearedPendingOperations" not in locked["status"]
    assert lock_file.exists()

    lock_file.write_text(json.dumps(lock))
    redone = await env.wait_complete(await env.create_update(ws, "up"), within=240)
    assert_succeeded(redone)
    message = redone["status"]["message"]
    assert f"removed the stack's lock held by {lock['username']}@{lock['hostname']}" in message, message
    assert f"creating {wait['urn']}" in message, message
    assert redone["status"]["clearedPendingOperations"] == [wait], redone["status"]
    assert "pendingOperations" not in redone["status"]
    name = redone["metadata"]["name"]
    events = await env.events_for(name, reason="StaleLockRemoved")
    (removed,) = [e for e in events if e["reason"] == "StaleLockRemoved"]
    assert removed["type"] == "Warning" and wait["urn"] in removed["message"], removed
    events = await env.events_for(name, reason="UpdateSucceeded")
    assert [e["reason"] for e in events if e["reason"].startswith("Update")] == ["UpdateSucceeded"], events
    assert not lock_file.exists()
    checkpoint = json.loads((backend / ".pulumi" / "stacks" / "pending" / "dev.json").read_text())
    latest = checkpoint["checkpoint"]["latest"]
    assert not latest.get("pending_operations"), latest


async def test_operator_restart_mid_up_reattaches_and_records_once(env: Env) -> None:
    ws = await env.workspace("restart", SLOW_PROGRAM.format(name="restart", seconds=15))
    update = await env.wait_running(await env.create_update(ws, "up"), within=180)
    await asyncio.sleep(2.0)
    await env.operator.restart()
    update = await env.wait_complete(update, within=240)
    assert_succeeded(update)
    assert update["status"]["outputs"]
    events = await env.events_for(update["metadata"]["name"], reason="UpdateSucceeded")
    await asyncio.sleep(2.0)  # a second (wrong) recording would have sent its Event by now
    events = await env.events_for(update["metadata"]["name"], reason="UpdateSucceeded")
    succeeded = [e for e in events if e["reason"] == "UpdateSucceeded"]
    assert len(succeeded) == 1 and succeeded[0].get("count", 1) == 1, events
    assert not [e for e in events if e["reason"] == "UpdateFailed"]


async def test_an_upgrade_that_changes_the_pod_waits_for_the_running_update_then_rolls(env: Env) -> None:
    """pko upgraded mid-update (issue 41): the new operator's pod template differs (here its pull
    policy, as a new agent image would), yet the pod running the operation stays until it ends, so the
    Update is neither lost nor run again; the Workspace says why meanwhile, and rolls after."""
    ws = await env.workspace("upgrade", SLOW_PROGRAM.format(name="upgrade", seconds=30))
    pods = ResourceClient(env.api, PODS, env.ns)
    before = await pods.get("upgrade-workspace-0")
    update = await env.wait_running(await env.create_update(ws, "up"), within=180)
    previous = env.operator.options
    env.operator.options = replace(previous, agent_image_pull_policy="Always")
    try:
        await env.operator.restart()

        async def holding() -> Obj | None:
            w = await env.workspaces.get("upgrade", env.ns)
            return w if condition(w, "Ready").get("reason") == "UpdateRunning" else None

        held = await wait_until("the Workspace holds its roll", holding, within=60)
        assert condition(held, "Ready")["status"] == "False"
        assert update["metadata"]["name"] in condition(held, "Ready")["message"]
        update = await env.wait_complete(update, within=240)
        assert_succeeded(update)
        assert (await pods.get("upgrade-workspace-0"))["metadata"]["uid"] == before["metadata"]["uid"]

        async def rolled() -> Obj | None:
            pod = await pods.get_or_none("upgrade-workspace-0")
            if pod is None or pod["metadata"]["uid"] == before["metadata"]["uid"]:
                return None
            policies = {c.get("imagePullPolicy") for c in pod["spec"]["initContainers"]}
            return pod if "Always" in policies else None

        await wait_until("the pod rolled once the Update ended", rolled, within=120)
        ready = await wait_until(
            "the Workspace Ready again",
            lambda: _ready_workspace(env, "upgrade"),
            within=180,
        )
        assert condition(ready, "Ready")["reason"] == "Succeeded"
        events = await env.events_for(update["metadata"]["name"], reason="UpdateSucceeded")
        assert len([e for e in events if e["reason"] == "UpdateSucceeded"]) == 1, events
    finally:
        env.operator.options = previous
        await env.operator.restart()


async def _ready_workspace(env: Env, name: str) -> Obj | None:
    w = await env.workspaces.get(name, env.ns)
    return w if condition(w, "Ready").get("status") == "True" else None


async def test_deleting_a_running_update_cancels_it(env: Env) -> None:
    ws = await env.workspace("cancel", SLOW_PROGRAM.format(name="cancel", seconds=60))
    created = await env.create_update(ws, "up")
    await env.updates.patch(
        created["metadata"]["name"], {"metadata": {"finalizers": [STACK_FINALIZER]}}, namespace=env.ns
    )
    update = await env.wait_running(created, within=180)
    await asyncio.sleep(1.0)
    await env.updates.delete(update["metadata"]["name"], env.ns)
    name = update["metadata"]["name"]
    # Canceled, recorded, then (no Stack owns it) the finalizer is dropped and the Update goes.
    seen: dict[str, Obj] = {}

    async def gone() -> bool:
        u = await env.updates.get_or_none(name, env.ns)
        if u is not None and is_complete(u):
            seen["last"] = u
        return u is None

    await wait_until("cancelled update deleted", gone, within=120)
    if "last" in seen:
        assert condition(seen["last"], "Failed")["reason"] == "Canceled", seen["last"]["status"]


async def test_ttl_deletes_after_the_stack_recorded_it(env: Env) -> None:
    ws = await env.workspace("good", GOOD_PROGRAM)
    # No Stack: deleted once the TTL passed, with an UpdateExpired event.
    plain = await env.wait_complete(await env.create_update(ws, "preview", ttlAfterCompleted="2s"))
    name = plain["metadata"]["name"]
    await wait_until("expired update deleted", lambda: _gone(env, name), within=60)
    events = await env.events_for(name, reason="UpdateExpired")
    assert ("Normal", "UpdateExpired", "ttl expired and was deleted") in [
        (e["type"], e["reason"], e["message"]) for e in events
    ]

    # Owned by a Stack that has not recorded it: kept; recorded: deleted (and the Stack's
    # finalizer does not keep it).
    stack = await env.stacks.create(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": f"ttl-{uuid.uuid4().hex[:6]}", "namespace": env.ns},
            "spec": {"stack": "dev", "programRef": {"name": "none"}},
        }
    )
    update = await env.create_update(ws, "preview", ttlAfterCompleted="1s")
    uname = update["metadata"]["name"]
    refs = [
        *update["metadata"]["ownerReferences"],
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "name": stack["metadata"]["name"],
            "uid": stack["metadata"]["uid"],
            "blockOwnerDeletion": True,
        },
    ]
    await env.updates.patch(
        uname, {"metadata": {"ownerReferences": refs, "finalizers": [STACK_FINALIZER]}}, namespace=env.ns
    )
    await env.wait_complete(update)
    await asyncio.sleep(4.0)
    assert await env.updates.get_or_none(uname, env.ns) is not None, "deleted before the Stack recorded it"
    await env.stacks.patch(
        stack["metadata"]["name"],
        {"status": {"lastUpdate": {"name": uname, "type": "preview", "state": "succeeded"}}},
        namespace=env.ns,
        subresource="status",
    )
    await wait_until("recorded update deleted", lambda: _gone(env, uname), within=90)


async def _gone(env: Env, name: str) -> bool:
    return await env.updates.get_or_none(name, env.ns) is None


async def test_wrong_audience_token_is_refused(env: Env) -> None:
    ws = await env.workspace("good", GOOD_PROGRAM)
    pod = await ResourceClient(env.api, PODS).get("good-workspace-0", env.ns)
    address = resolve_address("good", env.ns, mode="pod-ip", pod=pod, static=None)
    assert address is not None
    op = env.operator
    assert op.api is not None
    tokens = TokenSource(op.api, op.namespace, op.service_account)
    async with AgentClient(address, f"other.{env.ns}", tokens, retry_budget=2.0) as client:
        with pytest.raises(AgentError) as info:
            await client.pulumi_version()
    assert info.value.code == "UNAUTHENTICATED"
    # The right audience works (the same operator identity).
    async with AgentClient(address, f"good.{env.ns}", tokens) as client:
        assert await client.pulumi_version()
    del ws

"""A switch from the Go operator to pko with an update in flight (issue 41), at control-plane level.

The real operator, apiserver, kube-controller-manager and the play-kubelet. A Program Stack is
deployed, the operator stopped, and what it left is rewritten into the Go operator v2.9.0's shapes:
the Program's status without conditions and with the Go operator's digest, the Workspace naming
that digest without pko's stamp, the workspace pod running another operator's agent (a gRPC server
without pko's service: every pko call is answered UNIMPLEMENTED, as the Go agent answers), the
Stack's ``status.currentUpdate`` naming an Update the Go operator started, Progressing. Then pko
starts. Measured on the live cluster before the fix: the Stack Stalled ``WorkspaceFailed`` for
294 s (the fetch looping on ``digest mismatch``), three Updates before Ready.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from pko.controllers.program.artifact import build_artifact
from pko.controllers.resources import STACK_NAME_LABEL
from pko.controllers.stack.status import MSG_UPDATE, mark_reconciling
from pko.machinery.conditions import get_condition
from pko.machinery.resource import PODS, STATEFULSETS, ResourceClient

from .conftest import operator_env
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]
KUBELET_OPTIONS = {"max_grace": 8.0}  # the rolled pod's old process is killed this soon
GO_DIGEST = "sha256:9e9a" + "0" * 60  # the Workspace's: the digest of the Go operator's tarball
GO_REVISION = "1"  # the Stack's: the Go operator records a Program's generation as the commit
GO_URL = "http://pulumi-kubernetes-operator.pulumi-kubernetes-operator.svc.cluster.local/programs/{ns}/p/1"
# Another operator's agent: a gRPC server that answers every call of pko's agent API UNIMPLEMENTED
# "unknown service", as the Go operator's agent (grpc-go) does, and that finishes its work on
# SIGTERM instead of exiting (killed after the grace period).
FOREIGN_SERVER = """
import asyncio, os, signal
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server
SERVICE = "pko.agent.v1.AutomationService"
METHODS = ("WhoAmI", "SelectStack", "Info", "SetAllConfig", "AddEnvironments", "Install", "PulumiVersion",
           "Preview", "Refresh", "Up", "Destroy", "StartOperation", "WatchOperation", "GetOperation",
           "CancelOperation")
async def unknown(stream):
    raise GRPCError(Status.UNIMPLEMENTED, "unknown service " + SERVICE)
class Foreign:
    def __mapping__(self):
        return {f"/{SERVICE}/{m}": Handler(unknown, Cardinality.UNARY_UNARY, object, object) for m in METHODS}
signal.signal(signal.SIGTERM, signal.SIG_IGN)
async def main():
    server = Server([Foreign()])
    await server.start(os.environ["POD_IP"], 50051)
    await server.wait_closed()
asyncio.run(main())
"""
# The Go operator writes a Stack's status with a plain update and no field owner: the apiserver files
# it under the name its User-Agent gives (controller-runtime's binary, ``manager``). Its Workspace
# writes are seeded the same way (pko's own applies then conflict with them unless forced).
GO_MANAGER = "manager"

# No secret in the state: the stand-in CLI keeps the passphrase's salt in the stack's settings file,
# which a replaced pod's empty workspace lacks (the live cluster kept its state on a claim).
PROGRAM_BODY: Obj = {
    "resources": {"echo": {"type": "test:index:Echo", "properties": {"value": "hello"}}},
    "outputs": {"greeting": "${echo.value}"},
}

env = operator_env(Env)


def condition(obj: Obj | None, type_: str) -> Obj:
    return get_condition(((obj or {}).get("status") or {}).get("conditions"), type_) or {}


def go_condition(type_: str, status: str) -> Obj:
    return {"type": type_, "status": status, "reason": "Progressing", "message": "",
            "lastTransitionTime": "2026-12-06T17:00:00Z", "observedGeneration": 1}  # fmt: skip


async def as_the_go_operator_left_it(env: Env, first: Obj) -> str:
    """Rewrite what pko wrote into the Go operator's shapes (see the module docstring); the name of
    the Update in flight."""
    ns = env.ns
    program = await env.programs.get("p")
    artifact = {**program["status"]["artifact"], "url": GO_URL.format(ns=ns), "digest": GO_DIGEST}
    go_status = {"observedGeneration": program["metadata"]["generation"], "artifact": artifact}
    await env.programs.patch("p", [{"op": "replace", "path": "/status", "value": go_status}],
                             patch_type="json", subresource="status")  # fmt: skip

    stamp = "/metadata/annotations/auto.pulumi.com~1applied-digest"
    await env.workspaces.patch("s", [
        {"op": "remove", "path": stamp},
        {"op": "replace", "path": "/spec/flux", "value": {"url": GO_URL.format(ns=ns), "digest": GO_DIGEST}},
    ], patch_type="json", field_manager=GO_MANAGER)  # fmt: skip

    statefulsets = ResourceClient(env.api, STATEFULSETS, ns)
    sts = await statefulsets.get("s-workspace")
    containers = sts["spec"]["template"]["spec"]["containers"]
    index = next(i for i, c in enumerate(containers) if c["name"] == "pulumi")
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    await statefulsets.patch("s-workspace", [
        {"op": "remove", "path": stamp},
        {"op": "replace", "path": "/spec/template/spec/initContainers", "value": []},
        {"op": "replace", "path": f"/spec/template/spec/containers/{index}/command",
         "value": [sys.executable, "-c", FOREIGN_SERVER]},
        {"op": "add", "path": f"/spec/template/spec/containers/{index}/env/-", "value": pod_ip},
    ], patch_type="json")  # fmt: skip
    pods = ResourceClient(env.api, PODS, ns)

    async def foreign_pod() -> Obj | None:
        pod = await env.get(pods, "s-workspace-0")
        running = pod is not None and pod["status"].get("phase") == "Running" and pod["status"].get("podIP")
        command = next((c.get("command") for c in (pod or {}).get("spec", {}).get("containers", [])), None)
        return pod if running and command and command[0] == sys.executable else None

    await env.stack_until("s", "the workspace pod runs the other agent", foreign_pod, within=120)

    update = {
        "apiVersion": first["apiVersion"],
        "kind": "Update",
        "metadata": {
            "name": "s-go",
            "namespace": ns,
            "labels": first["metadata"].get("labels") or {},
            "ownerReferences": first["metadata"]["ownerReferences"],
            "finalizers": first["metadata"].get("finalizers") or [],
        },
        "spec": {k: v for k, v in first["spec"].items() if k != "message"},
    }
    created = await env.updates.create(update)
    progressing = {
        "observedGeneration": created["metadata"]["generation"],
        "startTime": "2026-12-06T17:00:00Z",
        "conditions": [go_condition("Progressing", "True"), go_condition("Complete", "False")],
    }
    await env.updates.patch("s-go", [{"op": "add", "path": "/status", "value": progressing}],
                            patch_type="json", subresource="status")  # fmt: skip

    stack = await env.stacks.get("s")
    last = {
        **stack["status"]["lastUpdate"],
        "lastAttemptedCommit": GO_REVISION,
        "lastSuccessfulCommit": GO_REVISION,
    }
    current = {"name": "s-go", "generation": stack["metadata"]["generation"], "reconcileRequest": "",
               "commit": GO_REVISION}  # fmt: skip
    status = {**stack["status"], "lastUpdate": last, "currentUpdate": current}
    # The Go operator's conditions while its Update runs (pko words them as it does).
    mark_reconciling(
        status, "StackProcessing", MSG_UPDATE, stack["metadata"]["generation"], datetime.now(UTC)
    )
    replace = [{"op": "replace", "path": "/status", "value": status}]
    await env.stacks.patch("s", replace, patch_type="json", subresource="status", field_manager=GO_MANAGER)
    return "s-go"


async def test_a_switch_with_an_update_in_flight_ends_it_once_and_is_ready_after_one_up(env: Env) -> None:
    await env.create_program("p", PROGRAM_BODY)
    await env.create_stack("s", {"programRef": {"name": "p"}})
    deployed = await env.condition("s", "Ready", "ProcessingCompleted")
    first = await env.updates.get(deployed["status"]["lastUpdate"]["name"])

    await env.operator.stop()
    in_flight = await as_the_go_operator_left_it(env, first)

    await env.operator.start()
    started = time.monotonic()
    stalled: set[str] = set()
    mismatches: list[str] = []
    pods = ResourceClient(env.api, PODS, env.ns)
    seen = {first["metadata"]["name"], in_flight}

    async def ready_after_a_new_up() -> Obj | None:
        stack = await env.get(env.stacks, "s")
        if condition(stack, "Stalled").get("status") == "True":
            stalled.add(str(condition(stack, "Stalled").get("reason")))
        pod = await env.get(pods, "s-workspace-0")
        for c in ((pod or {}).get("status") or {}).get("initContainerStatuses") or []:
            message = str(((c.get("state") or {}).get("terminated") or {}).get("message") or "")
            message += str(((c.get("lastState") or {}).get("terminated") or {}).get("message") or "")
            if "digest mismatch" in message:
                mismatches.append(message)
        last = ((stack or {}).get("status") or {}).get("lastUpdate") or {}
        ready = condition(stack, "Ready")
        done = ready.get("status") == "True" and last.get("name") not in seen
        return stack if done else None

    async def probe() -> Obj | None:
        found = await ready_after_a_new_up()
        if found is None:
            await asyncio.sleep(0.5)
        return found

    stack = await env.stack_until("s", "s Ready after one new up", probe, within=240)
    elapsed = time.monotonic() - started

    assert not mismatches, mismatches
    assert not stalled, stalled
    # The status the Go operator wrote is pko's now: nothing it left lingers.
    assert "currentUpdate" not in stack["status"], stack["status"]
    assert condition(stack, "Reconciling") == {}, stack["status"]["conditions"]
    # The Go operator's Update: ended at once, with one result that says what happened.
    gone = await env.updates.get(in_flight)
    failed = condition(gone, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "OperationLost"), gone["status"]
    assert "another operator's agent" in gone["status"]["message"], gone["status"]
    assert gone["status"]["startTime"] == "2026-12-06T17:00:00Z"  # never started again by pko
    # Exactly one Update of pko's own, which succeeded, and the Stack records it.
    listing = await env.updates.list(label_selector=f"{STACK_NAME_LABEL}=s")
    names = {u["metadata"]["name"] for u in listing.items}
    assert len(names - seen) == 1, names
    (new,) = [u for u in listing.items if u["metadata"]["name"] not in seen]
    assert condition(new, "Failed")["reason"] == "UpdateSucceeded", new["status"]
    assert stack["status"]["lastUpdate"]["name"] == new["metadata"]["name"]
    program = await env.programs.get("p")
    served = build_artifact(program).digest
    assert stack["status"]["lastUpdate"]["lastSuccessfulCommit"] == served
    workspace = await env.workspaces.get("s")
    assert workspace["spec"]["flux"]["digest"] == served
    assert "auto.pulumi.com/applied-digest" in workspace["metadata"]["annotations"]
    assert elapsed < 120, f"Ready {elapsed:.0f}s after pko started"
    print(f"switch with an update in flight: Ready {elapsed:.1f}s after pko started")

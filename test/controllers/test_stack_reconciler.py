"""The Stack reconciler alone against a real apiserver; the test plays the Workspace and Update controllers.

Only the stack controller runs in the manager: the test writes the Workspace's and the Updates'
status as their controllers would (and a Program's or Flux source's artifact as theirs would), so
each Stack behaviour is driven step by step and checked exactly: what the Stack creates, what it
records, and that it stops writing once it has nothing to do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo
from pko.devtools.kstatus import kstatus

from pko.controllers.resources import PROGRAMS, STACKS, UPDATES, WORKSPACES
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack import reconciler as stack_controller
from pko.controllers.stack.branchpoll import BranchResolver
from pko.controllers.stack.status import parse_time
from pko.devtools.fluxsource import GITREPOSITORY_CRD
from pko.devtools.gitserver import git_commit, serve_git
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import format_time
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import EVENTS, SECRETS, Obj, Resource, ResourceClient, api_error_status

from .conftest import new_manager, running

SECRET_RECHECK = 4.0
FAST = RetrySettings(deterministic_base=1.0, deterministic_factor=2.0, transient_base=1.0, transient_cap=2.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Env:
    """The namespace, clients, and the moves the other controllers would make."""

    def __init__(self, api: Any, namespace: str, reconciler: stack_controller.StackReconciler) -> None:
        self.ns = namespace
        self.reconciler = reconciler
        self.stacks = ResourceClient(api, STACKS, namespace=namespace)
        self.workspaces = ResourceClient(api, WORKSPACES, namespace=namespace)
        self.updates = ResourceClient(api, UPDATES, namespace=namespace)
        self.programs = ResourceClient(api, PROGRAMS, namespace=namespace)
        self.secrets = ResourceClient(api, SECRETS, namespace=namespace)

    async def get(self, client: ResourceClient, name: str) -> Obj | None:
        try:
            return await client.get(name, self.ns)
        except Exception as exc:
            if api_error_status(exc) == 404:
                return None
            raise

    async def stack(self, name: str) -> Obj:
        obj = await self.get(self.stacks, name)
        assert obj is not None, name
        return obj

    async def create_stack(self, name: str, spec: Obj, **meta: Any) -> None:
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "namespace": self.ns, **meta},
            "spec": {"stack": "dev", **spec},
        }
        await self.stacks.create(body)

    async def program(self, name: str, revision: int = 1) -> None:
        if await self.get(self.programs, name) is None:
            await self.programs.create(
                {
                    "apiVersion": "pulumi.com/v1",
                    "kind": "Program",
                    "metadata": {"name": name, "namespace": self.ns},
                    "program": {"outputs": {"x": 1}},
                }
            )
        artifact = {
            "path": f"programs/{self.ns}/{name}/{revision}.tar.gz",
            "url": f"http://artifacts/programs/{self.ns}/{name}/{revision}",
            "revision": str(revision),
            "digest": "sha256:" + f"{revision:064x}",
            "lastUpdateTime": format_time(),
        }
        await self.programs.apply_status(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Program",
                "metadata": {"name": name, "namespace": self.ns},
                "status": {"observedGeneration": 1, "artifact": artifact},
            },
            field_manager="test-program",
        )

    async def workspace(self, name: str) -> Obj:
        found: list[Obj] = []

        async def exists() -> bool:
            ws = await self.get(self.workspaces, name)
            if ws is not None:
                found[:] = [ws]
            return ws is not None

        await wait_until(f"workspace {name}", exists, within=30.0)
        return found[0]

    async def make_ready(
        self, name: str, *, stalled: tuple[str, str] | None = None, newer_than: int | None = None
    ) -> Obj:
        """Mark the Workspace Ready (or Stalled) for its generation (once it is above ``newer_than``)."""
        ws = await self.workspace(name)
        if newer_than is not None:

            async def changed() -> bool:
                ws.update(await self.workspace(name))
                return int(ws["metadata"]["generation"]) > newer_than

            await wait_until(f"workspace {name} respecified", changed, within=30.0)
        if stalled is None:
            conditions = [self._cond("Ready", "True", "Succeeded", "")]
        else:
            conditions = [
                self._cond("Ready", "False", stalled[0], stalled[1]),
                self._cond("Stalled", "True", stalled[0], stalled[1]),
            ]
        return await self.workspaces.apply_status(
            {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "Workspace",
                "metadata": {"name": name, "namespace": self.ns},
                "status": {"observedGeneration": ws["metadata"]["generation"], "conditions": conditions},
            },
            field_manager="test-workspace",
        )

    @staticmethod
    def _cond(type_: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": format_time(),
        }

    async def updates_of(self, stack: str) -> list[Obj]:
        listed = await self.updates.list(label_selector=f"pulumi.com/stack-name={stack}")
        return sorted(listed.items, key=lambda u: str(u["metadata"]["name"]))

    async def next_update(self, stack: str, seen: set[str], within: float = 30.0) -> Obj:
        found: list[Obj] = []

        async def new() -> bool:
            fresh = [u for u in await self.updates_of(stack) if u["metadata"]["name"] not in seen]
            found[:] = fresh
            return bool(fresh)

        await wait_until(f"a new Update of {stack}", new, within=within)
        assert len(found) == 1, [u["metadata"]["name"] for u in found]
        seen.add(found[0]["metadata"]["name"])
        return found[0]

    async def complete(
        self,
        update: Obj,
        *,
        failed: str | None = None,
        message: str = "",
        outputs: dict[str, Any] | None = None,
        secret_keys: list[str] | None = None,
        project: tuple[str, str] | None = ("proj", "yaml"),
        changes: dict[str, int] | None = None,
    ) -> None:
        name = update["metadata"]["name"]
        status: Obj = {"observedGeneration": update["metadata"]["generation"], "message": message}
        if changes is not None:
            status["resourceChanges"] = changes
        if outputs is not None:
            secret = f"{name}-stack-outputs"
            await self.secrets.create(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": secret,
                        "namespace": self.ns,
                        "annotations": {"pulumi.com/secrets": json.dumps(sorted(secret_keys or []))},
                    },
                    "data": {
                        k: base64.b64encode(json.dumps(v).encode()).decode() for k, v in outputs.items()
                    },
                    "immutable": True,
                }
            )
            status["outputs"] = secret
        if project is not None:
            status["projectInfo"] = {"name": project[0], "runtime": project[1]}
        status["permalink"] = f"https://app.example.com/{name}"
        status["conditions"] = [
            self._cond("Progressing", "False", "Complete", ""),
            self._cond("Complete", "True", "Updated", ""),
            self._cond("Failed", "True", failed, message)
            if failed
            else self._cond("Failed", "False", "UpdateSucceeded", ""),
        ]
        await self.updates.apply_status(
            {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "Update",
                "metadata": {"name": name, "namespace": self.ns},
                "status": status,
            },
            field_manager="test-update",
        )

    async def conditions(self, name: str) -> dict[str, tuple[str, str, str]]:
        obj = await self.stack(name)
        return {
            c["type"]: (c["status"], c["reason"], c["message"])
            for c in (obj.get("status") or {}).get("conditions") or []
        }

    async def wait_condition(
        self, name: str, type_: str, reason: str, within: float = 30.0
    ) -> dict[str, tuple[str, str, str]]:
        seen: list[dict[str, tuple[str, str, str]]] = [{}]

        async def holds() -> bool:
            seen[0] = await self.conditions(name)
            got = seen[0].get(type_)
            return got is not None and got[0] == "True" and got[1] == reason

        try:
            await wait_until(f"{name}: {type_}={reason}", holds, within=within)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; conditions: {seen[0]}") from None
        return seen[0]

    def reconciles(self) -> float:
        registry = self.reconciler.manager.registry
        return sum(
            registry.get_sample_value(
                "controller_runtime_reconcile_total", {"controller": "stack-controller", "result": result}
            )
            or 0.0
            for result in ("success", "error", "requeue", "requeue_after")
        )

    async def events_of(self, name: str) -> list[str]:
        """The reasons of the Events about ``name`` (one per Event object)."""
        listing = await ResourceClient(self.stacks.api, EVENTS, self.ns).list(
            field_selector=f"involvedObject.name={name}"
        )
        return [str(e.get("reason")) for e in listing.items]

    async def quiet(self, name: str, seconds: float = 3.0) -> None:
        """No writes to the Stack for ``seconds`` (no hot loop)."""
        before = (await self.stack(name))["metadata"]["resourceVersion"]
        await asyncio.sleep(seconds)
        after = (await self.stack(name))["metadata"]["resourceVersion"]
        assert before == after, f"{name} was written while idle"


@pytest.fixture(scope="module")
async def env(api_client: Any, namespace: str) -> AsyncIterator[Env]:
    manager = new_manager(
        api_client, namespace, discovery_interval=2.0, optional_sync_timeout=10.0, shutdown_grace_period=5.0
    )
    clock = FakeClock()
    reconciler = stack_controller.setup(
        manager, retry=FAST, branches=BranchResolver(clock=clock), secret_recheck=SECRET_RECHECK
    )
    reconciler.clock = clock  # type: ignore[attr-defined]
    async with running(manager):
        yield Env(api_client, namespace, reconciler)


# --- the seed walkthrough, Program source --------------------------------------------------


async def test_program_stack_reaches_ready_with_secret_outputs_masked(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("prog-stack", {"programRef": {"name": "prog"}, "serviceAccountName": "pulumi"})
    ws = await env.workspace("prog-stack")
    assert ws["spec"]["flux"]["url"].endswith("/prog/1") and ws["spec"]["serviceAccountName"] == "pulumi"
    assert ws["metadata"]["ownerReferences"][0]["kind"] == "Stack"
    assert ws["spec"]["image"] == "pulumi/pulumi:latest-nonroot"  # named, so `kubectl get workspace` shows it
    stack = await env.stack("prog-stack")
    assert "finalizer.stack.pulumi.com" in stack["metadata"]["finalizers"]
    conditions = await env.wait_condition("prog-stack", "Reconciling", "StackProcessing")
    assert conditions["Reconciling"][2] == "waiting for workspace readiness"
    await env.make_ready("prog-stack")
    seen: set[str] = set()
    update = await env.next_update("prog-stack", seen)
    assert update["spec"]["type"] == "up" and update["spec"]["message"] == "Initial stack update"
    assert update["metadata"]["finalizers"] == ["finalizer.stack.pulumi.com"]
    stack = await env.stack("prog-stack")
    assert stack["status"]["currentUpdate"]["name"] == update["metadata"]["name"]
    await env.complete(update, outputs={"password": "hunter2", "count": 3}, secret_keys=["password"])
    await env.wait_condition("prog-stack", "Ready", "ProcessingCompleted")
    status = (await env.stack("prog-stack"))["status"]
    assert status["outputs"] == {"count": 3, "password": "[secret]"}
    last = status["lastUpdate"]
    assert last["state"] == "succeeded" and last["type"] == "up" and last["failures"] == 0
    assert last["lastSuccessfulCommit"] == "sha256:" + f"{1:064x}" and last["permalink"].endswith(
        update["metadata"]["name"]
    )
    assert status["projectInfo"] == {"name": "proj", "runtime": "yaml"}
    assert "currentUpdate" not in status and "nextRetryTime" not in status
    recorded = await env.get(env.updates, update["metadata"]["name"])
    assert recorded is not None and not recorded["metadata"].get("finalizers")
    await env.quiet("prog-stack")

    # a new Program revision runs again (in the Workspace respecified for it)
    generation = (await env.workspace("prog-stack"))["metadata"]["generation"]
    await env.program("prog", revision=2)
    await env.make_ready("prog-stack", newer_than=generation)
    update = await env.next_update("prog-stack", seen)
    await env.complete(update)

    async def recorded_r2() -> bool:
        return (await env.stack("prog-stack"))["status"]["lastUpdate"].get(
            "lastSuccessfulCommit"
        ) == "sha256:" + f"{2:064x}"

    await wait_until("revision 2 recorded", recorded_r2, within=30.0)

    # the reconciliation-request annotation runs again and is echoed
    await env.stacks.patch(
        "prog-stack", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "r1"}}}
    )
    update = await env.next_update("prog-stack", seen)
    assert update["spec"]["message"] == 'Sync request: "r1"'
    assert (await env.stack("prog-stack"))["status"]["observedReconcileRequest"] == "r1"
    await env.complete(update)

    async def echoed() -> bool:
        return (await env.stack("prog-stack"))["status"]["lastUpdate"].get("reconcileRequest") == "r1"

    await wait_until("request echoed in lastUpdate", echoed, within=30.0)


async def test_failures_are_classified_retried_then_stalled_with_next_retry_time(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("failing", {"programRef": {"name": "prog"}, "maxUpdateFailures": 1})
    await env.make_ready("failing")
    seen: set[str] = set()
    update = await env.next_update("failing", seen)
    await env.complete(update, failed="ProgramError", message="error: boom\n  at index.ts:3")
    conditions = await env.wait_condition("failing", "Reconciling", "RetryingAfterFailure")
    assert conditions["Reconciling"][2] == "0 update failure(s)"
    status = (await env.stack("failing"))["status"]
    assert status["lastFailure"]["reason"] == "ProgramError" and status["lastFailure"]["transient"] is False
    assert status["lastFailure"]["message"] == "error: boom\n  at index.ts:3"
    assert status["nextRetryTime"]
    # the retry comes after the (fast, test) backoff; a second deterministic failure spends the budget
    update = await env.next_update("failing", seen)
    await env.complete(update, failed="ProgramError", message="error: boom")
    conditions = await env.wait_condition("failing", "Stalled", "UpdateFailed")
    assert conditions["Stalled"][2] == "up failed 1 times; not retrying until the spec or source changes"
    assert "nextRetryTime" not in (await env.stack("failing"))["status"]
    await env.quiet("failing")
    assert len(await env.updates_of("failing")) == 2

    # a spec change resets the budget
    generation = (await env.workspace("failing"))["metadata"]["generation"]
    await env.stacks.patch("failing", {"spec": {"config": {"a": "b"}}})
    await env.make_ready("failing", newer_than=generation)
    update = await env.next_update("failing", seen)
    await env.complete(update, failed="UpdateConflict", message="Another update is currently in progress")
    await env.wait_condition("failing", "Reconciling", "RetryingAfterFailure")
    assert (await env.stack("failing"))["status"]["lastFailure"]["transient"] is True


async def test_a_lost_update_does_not_wedge_the_stack(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("lost", {"programRef": {"name": "prog"}})
    await env.make_ready("lost")
    seen: set[str] = set()
    update = await env.next_update("lost", seen)
    name = update["metadata"]["name"]
    await env.updates.patch(name, {"metadata": {"finalizers": None}})
    await env.updates.delete(name)
    retry = await env.next_update("lost", seen)
    status = (await env.stack("lost"))["status"]
    assert status["lastFailure"]["reason"] == "UpdateLost"
    await env.complete(retry)
    await env.wait_condition("lost", "Ready", "ProcessingCompleted")


async def test_a_stack_retries_when_its_own_retry_policy_says(env: Env) -> None:
    """The operator's backoff here is FAST (1 s, transient capped at 2 s); the Stack's own policy
    waits 5 s after a deterministic failure and 3 s after a transient one (fixed: factor 1, no
    jitter; its own transient cap, as the operator's would win over a longer wait)."""
    await env.program("prog")
    policy = {
        "deterministic": {"baseSeconds": 5, "factor": 1},
        "transient": {"baseSeconds": 3, "factor": 1, "jitter": 0, "maxSeconds": 60},
    }
    await env.create_stack("tuned", {"programRef": {"name": "prog"}, "retryPolicy": policy})
    await env.make_ready("tuned")
    seen: set[str] = set()
    update = await env.next_update("tuned", seen)
    for failed, message, wait in (
        ("ProgramError", "error: boom", 5),
        ("UpdateConflict", "Another update is currently in progress", 3),
    ):
        await env.complete(update, failed=failed, message=message)

        async def recorded(name: str = update["metadata"]["name"]) -> bool:
            status = (await env.stack("tuned")).get("status") or {}
            return (status.get("lastUpdate") or {}).get("name") == name and "nextRetryTime" in status

        await wait_until(f"{failed} recorded", recorded, within=30.0)
        status = (await env.stack("tuned"))["status"]
        failed_at = parse_time(status["lastUpdate"]["lastResyncTime"])
        assert failed_at is not None
        assert parse_time(status["nextRetryTime"]) == failed_at + timedelta(seconds=wait)
        update = await env.next_update("tuned", seen, within=wait + 30.0)
        retried_at = parse_time(update["metadata"]["creationTimestamp"])
        assert retried_at is not None and wait <= (retried_at - failed_at).total_seconds() < wait + 20
    await env.complete(update)
    await env.wait_condition("tuned", "Ready", "ProcessingCompleted")
    assert "nextRetryTime" not in (await env.stack("tuned"))["status"]


async def test_destroy_on_finalize_keeps_the_finalizer_until_a_destroy_succeeds(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("doomed", {"programRef": {"name": "prog"}, "destroyOnFinalize": True})
    await env.make_ready("doomed")
    seen: set[str] = set()
    await env.complete(await env.next_update("doomed", seen), changes={"create": 3})
    await env.wait_condition("doomed", "Ready", "ProcessingCompleted")
    before = await env.workspace("doomed")
    await env.stacks.delete("doomed")
    destroy = await env.next_update("doomed", seen)
    assert destroy["spec"]["type"] == "destroy" and destroy["spec"]["message"] == "Stack marked for deletion"
    # The destroy runs in the Workspace as it is: its pod holds the stack (issue 30).
    ws = await env.workspace("doomed")
    assert ws["metadata"]["generation"] == before["metadata"]["generation"] and ws["spec"] == before["spec"]
    await env.complete(destroy, failed="ResourceOperationFailed", message="deleting failed: still in use")
    conditions = await env.wait_condition("doomed", "Reconciling", "RetryingAfterFailure")
    stack = await env.stack("doomed")
    assert "finalizer.stack.pulumi.com" in stack["metadata"]["finalizers"]
    assert stack["status"]["lastUpdate"]["type"] == "destroy" and conditions["Ready"][0] == "False"
    destroy = await env.next_update("doomed", seen)
    assert destroy["spec"]["type"] == "destroy"
    await env.complete(destroy, changes={"delete": 3})

    async def gone() -> bool:
        return await env.get(env.stacks, "doomed") is None

    await wait_until("the Stack to be released", gone, within=30.0)


async def _deployed_then_deleted(env: Env, name: str, seen: set[str], **spec: Any) -> None:
    """A Program Stack deployed (3 resources) and deleted; its Workspace Ready throughout."""
    await env.program(name)
    await env.create_stack(name, {"programRef": {"name": name}, "destroyOnFinalize": True, **spec})
    await env.make_ready(name)
    await env.complete(await env.next_update(name, seen), changes={"create": 3}, outputs={"url": "u"})
    await env.wait_condition(name, "Ready", "ProcessingCompleted")
    assert (await env.stack(name))["status"]["resourceCount"] == 3


async def _released_by_hand(env: Env, name: str) -> None:
    await env.stacks.patch(name, {"metadata": {"finalizers": []}})

    async def gone() -> bool:
        return await env.get(env.stacks, name) is None

    await wait_until(f"{name} released", gone, within=30.0)


async def test_a_stack_missing_from_its_backend_stalls_the_deletion_until_fixed_or_released(env: Env) -> None:
    seen: set[str] = set()
    await _deployed_then_deleted(env, "vanished", seen)
    await env.stacks.delete("vanished")
    missing = "stack 'dev' not found in backend file:///state"
    await env.complete(await env.next_update("vanished", seen), failed="StackNotFound", message=missing)
    conditions = await env.wait_condition("vanished", "Stalled", "StackNotFound")
    message = conditions["Stalled"][2]
    assert message.startswith(f"{missing}; nothing was destroyed. The Stack last knew of 3 resource(s)")
    assert f"kubectl patch stack vanished -n {env.ns}" in message
    stack = await env.stack("vanished")
    assert stack["metadata"]["finalizers"] == ["finalizer.stack.pulumi.com"]
    assert (
        stack["status"]["lastFailure"]["reason"] == "StackNotFound" and "nextRetryTime" not in stack["status"]
    )
    await env.quiet("vanished")  # not retried by itself
    assert len(await env.updates_of("vanished")) == 2
    # The backend fixed, a retry is asked for by annotation: the destroy runs again.
    await env.stacks.patch(
        "vanished", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "fixed"}}}
    )
    retry = await env.next_update("vanished", seen)
    assert retry["spec"]["type"] == "destroy"
    await env.complete(retry, failed="StackNotFound", message=missing)
    await env.wait_condition("vanished", "Stalled", "StackNotFound")
    await _released_by_hand(env, "vanished")


async def test_a_destroy_that_deleted_nothing_of_what_was_deployed_is_not_done(env: Env) -> None:
    seen: set[str] = set()
    await _deployed_then_deleted(env, "amnesia", seen)
    await env.stacks.delete("amnesia")
    await env.complete(await env.next_update("amnesia", seen))  # succeeded, deleted nothing
    conditions = await env.wait_condition("amnesia", "Stalled", "StackNotFound")
    assert conditions["Stalled"][2].startswith("the destroy deleted nothing: stack 'dev' holds none of the 3")
    stack = await env.stack("amnesia")
    assert stack["metadata"]["finalizers"] == ["finalizer.stack.pulumi.com"]
    assert stack["status"]["lastUpdate"]["state"] == "failed"
    await _released_by_hand(env, "amnesia")


async def test_without_a_workspace_the_destroy_gets_one_that_never_creates_the_stack(env: Env) -> None:
    """No Workspace (reclaimed): one is built for the destroy, from the source while it is there, from
    the saved projectInfo once it is gone (and the Stack says the destroy runs in a new pod)."""
    seen: set[str] = set()
    await _deployed_then_deleted(env, "rebuilt", seen)
    await env.workspaces.delete("rebuilt")

    async def no_workspace() -> bool:
        return await env.get(env.workspaces, "rebuilt") is None

    await wait_until("the Workspace gone", no_workspace, within=30.0)
    await env.stacks.delete("rebuilt")
    ws = await env.workspace("rebuilt")
    assert ws["spec"]["stacks"] == [{"name": "dev", "create": False}] and "flux" in ws["spec"]

    await _deployed_then_deleted(env, "orphan", seen)
    await env.workspaces.delete("orphan")
    await wait_until("the Workspace gone", lambda: _absent(env, env.workspaces, "orphan"), within=30.0)
    await env.programs.delete("orphan")
    await wait_until("the Program gone", lambda: _absent(env, env.programs, "orphan"), within=30.0)
    await env.stacks.delete("orphan")
    ws = await env.workspace("orphan")
    assert ws["spec"].get("projectInfo") == {"name": "proj", "runtime": "yaml"} and "flux" not in ws["spec"]
    assert ws["spec"]["stacks"] == [{"name": "dev", "create": False}]
    conditions = await env.wait_condition("orphan", "Reconciling", "StackProcessing")
    assert (
        "the destroy runs in a new workspace pod from the saved project info" in conditions["Reconciling"][2]
    )
    await env.make_ready("orphan")
    destroy = await env.next_update("orphan", seen)
    await env.complete(destroy, changes={"delete": 3})
    await wait_until("orphan released", lambda: _absent(env, env.stacks, "orphan"), within=30.0)
    await env.make_ready("rebuilt")
    await env.complete(await env.next_update("rebuilt", seen), changes={"delete": 3})
    await wait_until("rebuilt released", lambda: _absent(env, env.stacks, "rebuilt"), within=30.0)


async def _absent(env: Env, client: ResourceClient, name: str) -> bool:
    return await env.get(client, name) is None


@pytest.mark.parametrize(
    ("backend", "volume", "says"),
    [
        ("file:///state", {"name": "state", "emptyDir": {}}, 'emptyDir volume "state"'),
        ("file:///tmp/state", None, "container's own filesystem"),
        ("file:///state", {"name": "state", "persistentVolumeClaim": {"claimName": "c"}}, None),
        ("s3://bucket/prefix", None, None),
    ],
)
async def test_a_backend_that_dies_with_its_pod_carries_a_warning(
    env: Env, backend: str, volume: Obj | None, says: str | None
) -> None:
    name = f"warn-{uuid.uuid4().hex[:6]}"
    pod: Obj = {}
    if volume is not None:
        mount = {"name": "state", "mountPath": "/state"}
        pod = {"containers": [{"name": "pulumi", "volumeMounts": [mount]}], "volumes": [volume]}
    spec: Obj = {"programRef": {"name": "prog"}, "backend": backend}
    if pod:
        spec["workspaceTemplate"] = {"spec": {"podTemplate": {"spec": pod}}}
    await env.program("prog")
    await env.create_stack(name, spec)
    await env.workspace(name)
    await env.quiet(name)
    conditions = await env.conditions(name)
    events = await env.events_of(name)
    if says is None:
        assert "EphemeralBackend" not in conditions and "EphemeralBackend" not in events
        return
    status, reason, message = conditions["EphemeralBackend"]
    assert (status, reason) == ("True", "EphemeralBackend") and says in message and backend in message
    assert "Ready" in conditions  # a warning: nothing is refused
    assert events.count("EphemeralBackend") == 1


async def test_suspend_starts_nothing_until_cleared(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("paused", {"programRef": {"name": "prog"}, "suspend": True})
    await env.wait_condition("paused", "Suspended", "Suspended")
    assert await env.updates_of("paused") == []
    # Never deployed: not Current to kstatus readers (a Flux dependsOn waits on it).
    assert kstatus(await env.stack("paused")) == "InProgress"
    await env.quiet("paused")
    await env.stacks.patch("paused", {"spec": {"suspend": False}})
    await env.make_ready("paused")
    await env.next_update("paused", set())
    assert "Suspended" not in await env.conditions("paused")


async def test_deprecated_fields_are_warned_once_per_generation(env: Env) -> None:
    await env.program("prog")
    spec = {"programRef": {"name": "prog"}, "suspend": True, "envSecrets": ["legacy-env"]}
    await env.create_stack("legacy", spec)
    await env.wait_condition("legacy", "Suspended", "Suspended")
    request = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "again"}}}
    await env.stacks.patch("legacy", request)  # reconciled again, same generation

    async def request_seen() -> bool:
        return (await env.stack("legacy")).get("status", {}).get("observedReconcileRequest") == "again"

    await wait_until("the reconciliation request to be observed", request_seen, within=30.0)
    await env.quiet("legacy")

    async def warnings() -> list[tuple[str, int]]:
        listing = await ResourceClient(env.stacks.api, EVENTS, env.ns).list(
            field_selector="involvedObject.name=legacy,reason=DeprecatedField"
        )
        return [(e["message"], int(e.get("count") or 1)) for e in listing.items]

    assert await warnings() == [("spec.envSecrets is deprecated; use spec.envRefs", 1)]
    await env.stacks.patch("legacy", {"spec": {"envSecrets": ["legacy-env", "more-env"]}})

    async def warned_again() -> bool:
        return await warnings() == [("spec.envSecrets is deprecated; use spec.envRefs", 2)]

    await wait_until("one more warning for the new generation", warned_again, within=30.0)


async def test_workspace_stall_is_reported(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("old-cli", {"programRef": {"name": "prog"}})
    await env.make_ready("old-cli", stalled=("IncompatibleConfiguration", "needs pulumi >= 3.202.0"))
    conditions = await env.wait_condition("old-cli", "Stalled", "PulumiVersionTooLow")
    assert conditions["Stalled"][2] == "IncompatibleConfiguration: needs pulumi >= 3.202.0"


async def test_prerequisite_success_runs_the_dependant_at_once(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("child", {"programRef": {"name": "prog"}, "prerequisites": [{"name": "parent"}]})
    conditions = await env.wait_condition("child", "Reconciling", "PrerequisiteNotSatisfied")
    assert (
        conditions["Reconciling"][2]
        == 'unable to fetch prerequisite "parent": stacks.pulumi.com "parent" not found'
    )
    await env.create_stack("parent", {"programRef": {"name": "prog"}})
    await env.make_ready("parent")
    await env.complete(await env.next_update("parent", set()))
    await env.make_ready("child")
    await env.next_update("child", set(), within=15)


# --- git sources -----------------------------------------------------------------------------


def _commit(repo: Repo, text: str) -> str:
    return git_commit(repo, {"Pulumi.yaml": text.encode()}, text.encode(), branch="master", when=1700000000)


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Repo]]:
    root: Path = tmp_path_factory.mktemp("stack-git")
    repo = Repo.init_bare(str(root))
    _commit(repo, "name: one\nruntime: yaml\n")
    with serve_git(repo) as url:
        yield url, repo


async def test_git_commit_and_branch_heads_are_pinned_and_a_push_is_picked_up(
    env: Env, git_server: tuple[str, Repo]
) -> None:
    url, repo = git_server
    head = repo.refs[b"refs/heads/master"].decode()
    await env.create_stack("pinned", {"projectRepo": url, "commit": "a" * 40, "repoDir": "app"})
    ws = await env.workspace("pinned")
    assert ws["spec"]["git"] == {"url": url, "ref": "a" * 40, "dir": "app"}

    await env.create_stack("tracking", {"projectRepo": url, "branch": "master"})
    ws = await env.workspace("tracking")
    assert ws["spec"]["git"]["ref"] == head
    await env.make_ready("tracking")
    seen: set[str] = set()
    await env.complete(await env.next_update("tracking", seen))
    await env.wait_condition("tracking", "Ready", "ProcessingCompleted")
    assert (await env.stack("tracking"))["status"]["lastUpdate"]["lastSuccessfulCommit"] == head

    generation = (await env.workspace("tracking"))["metadata"]["generation"]
    pushed = await asyncio.to_thread(_commit, repo, "name: two\nruntime: yaml\n")
    clock: FakeClock = env.reconciler.clock  # type: ignore[attr-defined]
    clock.now += 61  # the poll interval has passed (the real requeue is 60 s: nudge instead of waiting)
    await env.stacks.patch(
        "tracking", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "poll"}}}
    )
    ws = await env.make_ready("tracking", newer_than=generation)
    update = await env.next_update("tracking", seen)
    assert (await env.workspace("tracking"))["spec"]["git"]["ref"] == pushed
    await env.complete(update)

    async def recorded() -> bool:
        return (await env.stack("tracking"))["status"]["lastUpdate"].get("lastSuccessfulCommit") == pushed

    await wait_until("the pushed commit recorded", recorded, within=30.0)


# --- schema-valid but wrong ------------------------------------------------------------------

# Mistakes the Stack CRD's CEL rules refuse on create (two sources, commit and branch, projectRepo
# without either, a ref whose member is not the one its type names) never reach the operator:
# test/api/test_cel_rules.py has them, and test/api/test_validation.py their Python twins.
WRONG: list[tuple[str, Obj, str, str, str]] = [
    ("no-source", {}, "Stalled", "SpecInvalid", "one of projectRepo, fluxSource or programRef is required"),
    (
        "cross-ns",
        {
            "programRef": {"name": "p"},
            "envRefs": {"T": {"type": "Secret", "secret": {"namespace": "other", "name": "s", "key": "k"}}},
        },
        "Stalled",
        "SpecInvalid",
        "cross-namespace refs are not allowed",
    ),
    (
        "env-ref",
        {"programRef": {"name": "p"}, "envRefs": {"T": {"type": "Env", "env": {"name": "HOME"}}}},
        "Stalled",
        "SpecInvalid",
        'ref type "Env" is deprecated',
    ),
    (
        "fs-ref",
        {
            "programRef": {"name": "p"},
            "secretsRef": {"k": {"type": "FS", "filesystem": {"path": "/etc/passwd"}}},
        },
        "Stalled",
        "SpecInvalid",
        'ref type "FS" is deprecated',
    ),
    (
        "missing-program",
        {"programRef": {"name": "nope"}},
        "Stalled",
        "SourceUnavailable",
        "unable to retrieve program for stack",
    ),
    (
        "no-artifact",
        {"programRef": {"name": "bare"}},
        "Stalled",
        "SourceUnavailable",
        "Program has no artifact",
    ),
    (
        "flux-absent",
        {
            "fluxSource": {
                "sourceRef": {
                    "apiVersion": "source.toolkit.fluxcd.io/v1",
                    "kind": "GitRepository",
                    "name": "g",
                }
            }
        },
        "Stalled",
        "SourceUnavailable",
        "are Flux's CRDs installed?",
    ),
    (
        "flux-kind",
        {"fluxSource": {"sourceRef": {"apiVersion": "example.com/v1", "kind": "Thing", "name": "g"}}},
        "Stalled",
        "SpecInvalid",
        "unsupported Flux source",
    ),
    (
        "flux-version",
        {
            "fluxSource": {
                "sourceRef": {"apiVersion": "gitrepositories", "kind": "GitRepository", "name": "g"}
            }
        },
        "Stalled",
        "SpecInvalid",
        "must be <group>/<version>",
    ),
    (
        "git-secret",
        {"projectRepo": "https://127.0.0.1:9/r.git", "branch": "main", "gitAuthSecret": "nope"},
        "Stalled",
        "SpecInvalid",
        'secrets "nope" not found',
    ),
    (
        "git-key",
        {
            "projectRepo": "https://127.0.0.1:9/r.git",
            "branch": "main",
            "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "gitcreds", "key": "nokey"}}},
        },
        "Stalled",
        "SpecInvalid",
        'no key "nokey"',
    ),
    (
        "git-literal-auth",
        {
            "projectRepo": "http://127.0.0.1:9/r.git",
            "branch": "main",
            "gitAuth": {"accessToken": {"type": "Literal", "literal": {"value": "t"}}},
        },
        "Stalled",
        "SpecInvalid",
        "no longer supported in v2",
    ),
    (
        # refused before any lookup or Workspace: no 30 s SourceUnavailable loop, no failing fetch
        "bad-scheme",
        {"projectRepo": "hhtp://github.com/x/y.git", "branch": "main"},
        "Stalled",
        "SpecInvalid",
        "spec.projectRepo: invalid URL scheme: hhtp",
    ),
    (
        "unreachable",
        {"projectRepo": "http://127.0.0.1:9/r.git", "branch": "main"},
        "Stalled",
        "SourceUnavailable",
        "listing http://127.0.0.1:9/r.git",
    ),
    (
        "dup-config",
        {"programRef": {"name": "p"}, "config": {"k": "1"}, "secrets": {"k": "2"}},
        "Stalled",
        "SpecInvalid",
        "key is also set in spec.config",
    ),
    (
        "self-prereq",
        {"programRef": {"name": "p"}, "prerequisites": [{"name": "self-prereq"}]},
        "Stalled",
        "SpecInvalid",
        "cannot be its own prerequisite",
    ),
    (
        "token-conflict",
        {
            "programRef": {"name": "p"},
            "accessTokenSecret": "t",
            "envRefs": {"PULUMI_ACCESS_TOKEN": {"type": "Literal", "literal": {"value": "x"}}},
        },
        "Stalled",
        "SpecInvalid",
        "conflicts with spec.accessTokenSecret",
    ),
    (
        "missing-prereq",
        {"programRef": {"name": "p"}, "prerequisites": [{"name": "ghost"}, {"name": "ghost2"}]},
        "Reconciling",
        "PrerequisiteNotSatisfied",
        "multiple prerequisites were not satisfied ghost, ghost2",
    ),
]


async def test_schema_valid_but_wrong_stacks_end_with_a_clear_reason_and_stay_quiet(env: Env) -> None:
    await env.program("p")
    await env.programs.create(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Program",
            "metadata": {"name": "bare", "namespace": env.ns},
            "program": {"outputs": {"x": 1}},
        }
    )
    await env.secrets.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gitcreds", "namespace": env.ns},
            "stringData": {"token": "t"},
        }
    )
    for name, spec, _, _, _ in WRONG:
        await env.create_stack(name, spec)
    for name, _, type_, reason, text in WRONG:
        conditions = await env.wait_condition(name, type_, reason)
        assert text in conditions[type_][2], (name, conditions[type_][2])
        assert ("Stalled" in conditions) != ("Reconciling" in conditions), name
        # Flux's health checks and kpt (kstatus) see each as a failure or still in progress, never done.
        expected = "Failed" if type_ == "Stalled" else "InProgress"
        assert kstatus(await env.stack(name)) == expected, name
    versions = {name: (await env.stack(name))["metadata"]["resourceVersion"] for name, *_ in WRONG}
    reconciles = env.reconciles()
    await asyncio.sleep(60)  # a minute of watching: no write, no Update, no hot loop
    for name, *_ in WRONG:
        assert (await env.stack(name))["metadata"]["resourceVersion"] == versions[name], (
            f"{name} kept being written"
        )
        assert await env.updates_of(name) == []
    assert await env.get(env.workspaces, "bad-scheme") is None
    # Not a hot loop: unavailable sources are looked at again every 30 s and missing Secrets every
    # SECRET_RECHECK (4 s in this module), nothing else: at most one reconcile per 4 s per Stack.
    assert env.reconciles() - reconciles <= len(WRONG) * (60 / SECRET_RECHECK + 1)


@pytest.mark.parametrize(
    ("name", "url"), [("helper-ext", "ext::sh -c touch% pwned"), ("helper-fd", "fd::17")]
)
async def test_a_git_remote_helper_url_is_spec_invalid_with_no_lookup_and_no_workspace(
    env: Env, name: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # git reads <transport>::<address> as a remote helper (ext:: runs a command); parsed as scp-like
    # it was SSH host "ext" and the Stack waited on "host key verification failed".
    listed: list[str] = []
    lister = env.reconciler.branches._lister

    def recording(target: str, creds: Any) -> Any:
        listed.append(target)
        return lister(target, creds)

    monkeypatch.setattr(env.reconciler.branches, "_lister", recording)
    await env.create_stack(name, {"projectRepo": url, "branch": "main"})
    conditions = await env.wait_condition(name, "Stalled", "SpecInvalid")
    message = conditions["Stalled"][2]
    assert message.startswith("spec.projectRepo: git remote-helper URLs"), message
    assert "https://, http://, ssh://" in message and url.partition("::")[2] not in message
    await env.quiet(name)
    assert [target for target in listed if "::" in target] == []  # other Stacks may be looked up
    assert await env.get(env.workspaces, name) is None
    assert await env.updates_of(name) == []


async def test_a_missing_secret_created_later_unstalls_the_stack(env: Env) -> None:
    # https: credentials over plain http:// are refused before their Secret is read (insecuretransport)
    spec = {"projectRepo": "https://127.0.0.1:9/late.git", "branch": "main", "gitAuthSecret": "late"}
    await env.create_stack("late-secret", spec)
    conditions = await env.wait_condition("late-secret", "Stalled", "SpecInvalid")
    assert 'secrets "late" not found' in conditions["Stalled"][2]
    # Secrets are not watched: the operator looks again (every SECRET_RECHECK s here) and moves on.
    await env.secrets.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "late", "namespace": env.ns},
            "stringData": {"accessToken": "t"},
        }
    )
    conditions = await env.wait_condition("late-secret", "Stalled", "SourceUnavailable")
    assert "listing https://127.0.0.1:9/late.git" in conditions["Stalled"][2]


async def test_history_is_bounded_and_recorded_updates_are_released(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("history", {"programRef": {"name": "prog"}})
    await env.make_ready("history")
    seen: set[str] = set()
    await env.complete(await env.next_update("history", seen))
    for i in range(7):
        request = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": f"again-{i}"}}}
        await env.stacks.patch("history", request)
        await env.complete(await env.next_update("history", seen))

    async def recorded() -> bool:
        return (await env.stack("history"))["status"]["lastUpdate"].get("reconcileRequest") == "again-6"

    await wait_until("the last run recorded", recorded, within=30.0)

    async def bounded() -> bool:
        kept = [u for u in await env.updates_of("history") if not u["metadata"].get("deletionTimestamp")]
        return len(kept) <= 5

    await wait_until("at most 5 Updates kept", bounded, within=30.0)
    for update in await env.updates_of("history"):
        assert not update["metadata"].get("finalizers"), update["metadata"]["name"]


async def test_reclaim_policy_delete_removes_the_workspace_after_success(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("reclaimed", {"programRef": {"name": "prog"}, "workspaceReclaimPolicy": "Delete"})
    await env.make_ready("reclaimed")
    update = await env.next_update("reclaimed", set())
    await env.complete(update)
    await env.wait_condition("reclaimed", "Ready", "ProcessingCompleted")

    async def workspace_gone() -> bool:
        ws = await env.get(env.workspaces, "reclaimed")
        return ws is None or bool(ws["metadata"].get("deletionTimestamp"))

    await wait_until("the Workspace deleted", workspace_gone, within=30.0)
    # the Update outlives its Workspace: the Stack owns it too
    assert await env.get(env.updates, update["metadata"]["name"]) is not None


async def test_namespace_terminating_keeps_the_finalizer_with_a_clear_reason(
    api_client: Any, crds: Any
) -> None:
    """In a namespace being deleted no Workspace can be created to destroy: Stalled, finalizer kept."""
    from kubernetes_asyncio import client

    ns = f"stack-terminating-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace({"metadata": {"name": ns}})
    manager = Manager(
        api_client,
        ManagerOptions(
            metrics_bind_address="0", health_probe_bind_address="0", namespace=ns, shutdown_grace_period=5
        ),
    )
    local = Env(api_client, ns, stack_controller.setup(manager, retry=FAST))
    task = asyncio.create_task(manager.run())
    try:
        await local.program("prog")
        await local.create_stack("doomed", {"programRef": {"name": "prog"}, "destroyOnFinalize": True})
        await local.make_ready("doomed")
        await local.complete(await local.next_update("doomed", set()))
        await local.wait_condition("doomed", "Ready", "ProcessingCompleted")
        # The Workspace goes first (nothing holds it), then the Stack waits on its finalizer.
        await core.delete_namespace(ns)
        conditions = await local.wait_condition("doomed", "Stalled", "NamespaceTerminating", within=60)
        message = conditions["Stalled"][2]
        assert f'namespace "{ns}" is terminating' in message and "kubectl patch stack doomed" in message
        assert "finalizer.stack.pulumi.com" in (await local.stack("doomed"))["metadata"]["finalizers"]
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)
        for name in ("doomed",):
            with contextlib.suppress(Exception):
                await local.stacks.patch(name, {"metadata": {"finalizers": None}})
        for update in await local.updates_of("doomed"):
            with contextlib.suppress(Exception):
                await local.updates.patch(update["metadata"]["name"], {"metadata": {"finalizers": None}})


# --- Flux (last: it installs a Flux CRD, then removes it) --------------------------------------

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
GITREPOSITORIES = Resource("source.toolkit.fluxcd.io", "v1", "gitrepositories", "GitRepository")
FLUX_CRD: Obj = GITREPOSITORY_CRD  # the CRD alone: no source-controller runs here


async def test_flux_source_artifact_is_deployed_and_a_new_revision_redeploys(
    env: Env, api_client: Any
) -> None:
    crds = ResourceClient(api_client, CRDS)
    sources = ResourceClient(api_client, GITREPOSITORIES, namespace=env.ns)
    ref = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "repo"}
    await env.create_stack("fluxed", {"fluxSource": {"sourceRef": ref, "dir": "app"}})
    conditions = await env.wait_condition("fluxed", "Stalled", "SourceUnavailable")
    assert "are Flux's CRDs installed?" in conditions["Stalled"][2]
    await crds.apply(FLUX_CRD, field_manager="test")
    try:

        async def served() -> bool:
            try:
                await sources.list()
            except Exception:
                return False
            return True

        await wait_until("the GitRepository CRD served", served, within=30.0)
        meta = {"name": "repo", "namespace": env.ns}
        await sources.create(
            {
                "apiVersion": ref["apiVersion"],
                "kind": "GitRepository",
                "metadata": meta,
                "spec": {"url": "https://e/r"},
            }
        )

        async def write_status(revision: str | None, ready: tuple[str, str, str]) -> None:
            condition = {
                "type": "Ready",
                "status": ready[0],
                "reason": ready[1],
                "message": ready[2],
                "lastTransitionTime": format_time(),
            }
            status: Obj = {"conditions": [condition]}
            if revision is not None:
                status["artifact"] = {
                    "url": f"http://source-controller/gitrepository/{env.ns}/repo/{revision}.tar.gz",
                    "digest": f"sha256:{revision * 16}",
                    "revision": f"main@sha1:{revision}",
                    "lastUpdateTime": format_time(),
                }
            body = {
                "apiVersion": ref["apiVersion"],
                "kind": "GitRepository",
                "metadata": meta,
                "status": status,
            }
            await sources.apply_status(body, field_manager="source-controller")

        await write_status(None, ("False", "GitOperationFailed", "auth failed"))

        async def not_ready_reported() -> bool:
            stalled = (await env.conditions("fluxed")).get("Stalled")
            return stalled is not None and "GitOperationFailed: auth failed" in stalled[2]

        await wait_until("the source's failure reported", not_ready_reported, within=60)
        assert (await env.conditions("fluxed"))["Stalled"][2] == (
            "Flux source has no artifact (GitOperationFailed: auth failed)"
        )

        await write_status("aaaa", ("True", "Succeeded", "stored artifact"))
        ws: Obj = {}

        async def has_flux() -> bool:
            found = await env.get(env.workspaces, "fluxed")
            ws.update(found or {})
            return found is not None and "flux" in found["spec"]

        await wait_until("the Workspace's flux source", has_flux, within=45)
        assert ws["spec"]["flux"] == {
            "url": f"http://source-controller/gitrepository/{env.ns}/repo/aaaa.tar.gz",
            "digest": "sha256:" + "aaaa" * 16,
            "dir": "app",
        }
        await env.make_ready("fluxed")
        seen: set[str] = set()
        await env.complete(await env.next_update("fluxed", seen))
        await env.wait_condition("fluxed", "Ready", "ProcessingCompleted")
        assert (await env.stack("fluxed"))["status"]["lastUpdate"][
            "lastSuccessfulCommit"
        ] == "sha256:" + "aaaa" * 16

        generation = int(ws["metadata"]["generation"])
        await write_status("bbbb", ("True", "Succeeded", "stored artifact"))
        await env.make_ready("fluxed", newer_than=generation)
        update = await env.next_update("fluxed", seen)
        assert update["spec"]["message"] == f'New commit detected: "sha256:{"bbbb" * 16}"'
    finally:
        await crds.delete("gitrepositories.source.toolkit.fluxcd.io")

"""The Stack reconciler alone (see stackenv.py): deleting a Stack: destroy on finalize, a destroy that
finds nothing, a destroy without a Workspace, reclaim policy Delete, a terminating namespace."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from pko.controllers.stack import reconciler as stack_controller
from pko.devtools.waiting import wait_until
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import ResourceClient

from .stackenv import FAST, Env, stack_env

env = stack_env()


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

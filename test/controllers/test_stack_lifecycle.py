"""Stack paths around deletion, reclaim, metrics and failure recording that no other module drives.

As in test_stack_reconciler, only the stack controller runs and the test plays the Workspace and
Update controllers (``Env`` from there), so each step is exact. Retries are slow in this module
(60 s): nothing runs again unless a test asks for it.

* a preview-only Stack with ``destroyOnFinalize`` is released without a destroy (docs/stacks.md, Deletion);
* prerequisites are neither waited for nor triggered while a Stack is being deleted;
* ``workspaceReclaimPolicy: Delete`` reclaims the Workspace after a success only, never a failure;
* the Stack gauges forget a deleted Stack (``stacks_active`` goes down; no series of it says 1);
* ``status.lastUpdate.message`` is the failed Update's whole message;
* a refresh request outlives a refresh that failed for a transient cause (the fault matrix's agent
  killed mid-refresh): retried after the Stack's own transient backoff, then observed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pko.controllers.resources import REFRESH_REQUEST_ANNOTATION
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack import reconciler as stack_controller
from pko.controllers.stack.status import parse_time
from pko.devtools.operatorharness import new_manager, running
from pko.devtools.waiting import wait_until
from pko.machinery.resource import EVENTS, Obj, ResourceClient

from .stackenv import Env

SLOW = RetrySettings(deterministic_base=60.0, transient_base=60.0, transient_cap=120.0)
FINALIZER = "finalizer.stack.pulumi.com"


@pytest.fixture(scope="module")
async def env(api_client: Any, namespace: str) -> AsyncIterator[Env]:
    manager = new_manager(api_client, namespace, shutdown_grace_period=5.0)
    reconciler = stack_controller.setup(manager, retry=SLOW)
    async with running(manager):
        yield Env(api_client, namespace, reconciler)


async def _events(env: Env, name: str, reason: str) -> list[Obj]:
    listing = await ResourceClient(env.stacks.api, EVENTS, env.ns).list(
        field_selector=f"involvedObject.name={name},reason={reason}"
    )
    return list(listing.items)


async def _gone_watching_updates(env: Env, name: str, types: dict[str, str], within: float = 30.0) -> None:
    """Wait until the Stack is gone, noting the type of every Update of it seen meanwhile."""

    async def gone() -> bool:
        for update in await env.updates_of(name):
            types[update["metadata"]["name"]] = update["spec"]["type"]
        return await env.get(env.stacks, name) is None

    await wait_until(f"{name} released", gone, within=within)


async def _ready_once(env: Env, name: str, spec: Obj) -> Obj:
    """Create the Stack, run its first operation to success; returns that Update."""
    await env.create_stack(name, spec)
    await env.make_ready(name)
    update = await env.next_update(name, set())
    await env.complete(update)
    await env.wait_condition(name, "Ready", "ProcessingCompleted")
    return update


# --- deletion ----------------------------------------------------------------------------------


async def test_a_preview_stack_with_destroy_on_finalize_is_released_without_a_destroy(env: Env) -> None:
    """docs/stacks.md: "Without destroyOnFinalize (or for a preview-only Stack) it is removed once any running
    Update has been recorded": a preview-only Stack never changed anything, so nothing is destroyed."""
    await env.program("prog")
    spec = {"programRef": {"name": "prog"}, "preview": True, "destroyOnFinalize": True}
    preview = await _ready_once(env, "previewed", spec)
    assert preview["spec"]["type"] == "preview"
    generation = (await env.workspace("previewed"))["metadata"]["generation"]

    await env.stacks.delete("previewed")
    types: dict[str, str] = {}
    await _gone_watching_updates(env, "previewed", types)
    assert set(types.values()) <= {"preview"}, types
    detected = [e["message"] for e in await _events(env, "previewed", "StackUpdateDetected")]
    assert "Stack marked for deletion" not in detected, detected
    # the Workspace was never respecified for a destroy (from status.projectInfo)
    ws = await env.get(env.workspaces, "previewed")
    assert ws is None or ws["metadata"]["generation"] == generation


async def test_a_preview_stack_deleted_during_its_preview_waits_for_it_then_goes(env: Env) -> None:
    await env.program("prog")
    spec = {"programRef": {"name": "prog"}, "preview": True, "destroyOnFinalize": True}
    await env.create_stack("peeking", spec)
    await env.make_ready("peeking")
    preview = await env.next_update("peeking", set())
    await env.stacks.delete("peeking")  # (a new generation, for a custom resource)

    async def observed() -> bool:
        stack = await env.stack("peeking")
        return bool(stack["metadata"].get("deletionTimestamp")) and stack["metadata"]["generation"] == (
            stack.get("status") or {}
        ).get("observedGeneration")

    await wait_until("the deletion observed", observed, within=30.0)
    await env.quiet("peeking", 2.0)  # waits on the running preview, writing nothing meanwhile
    stack = await env.stack("peeking")
    assert FINALIZER in stack["metadata"]["finalizers"]
    assert stack["status"]["currentUpdate"]["name"] == preview["metadata"]["name"]
    await env.complete(preview)
    types: dict[str, str] = {}
    await _gone_watching_updates(env, "peeking", types)
    assert set(types.values()) <= {"preview"}, types

    async def recorded() -> bool:  # the preview was recorded before the Stack went (Events are async)
        created = [e["message"] for e in await _events(env, "peeking", "StackCreated")]
        return created == ["Successfully updated stack"]

    await wait_until("the preview recorded (StackCreated)", recorded, within=30.0)

    async def collected() -> bool:  # released by the Stack (no Update controller here), then collected
        return await env.get(env.updates, preview["metadata"]["name"]) is None

    # kube-controller-manager's garbage collector learns of new resources (our CRDs) by
    # rediscovering them every 30 s: in a control plane just started for this module, collection
    # can take that long on top.
    await wait_until("the recorded preview garbage-collected", collected, within=120)


async def test_prerequisites_are_neither_awaited_nor_triggered_while_deleting(env: Env) -> None:
    """A Stack being deleted runs its destroy even though one prerequisite is missing and another is
    out of date; the stale one is not asked to run again (no reconciliation-request annotation)."""
    await env.program("prog")
    await _ready_once(env, "base", {"programRef": {"name": "prog"}})
    child = {"programRef": {"name": "prog"}, "destroyOnFinalize": True, "prerequisites": [{"name": "base"}]}
    seen: set[str] = set()
    await env.create_stack("dependent", child)
    await env.make_ready("dependent")
    await env.complete(await env.next_update("dependent", seen))
    await env.wait_condition("dependent", "Ready", "ProcessingCompleted")

    # Suspended (no operation starts), then made to depend on a Stack that does not exist and on
    # "base" having succeeded within the last second, which it soon has not.
    prerequisites = [
        {"name": "base", "requirement": {"succeededWithinDuration": "1s"}},
        {"name": "ghost"},
    ]
    await env.stacks.patch("dependent", {"spec": {"suspend": True, "prerequisites": prerequisites}})
    await env.wait_condition("dependent", "Suspended", "Suspended")
    await asyncio.sleep(2.5)  # "base" is now out of date for the dependent

    # Deleting a suspended Stack still runs its destroy (in its Workspace as it is).
    await env.stacks.delete("dependent")
    destroy = await env.next_update("dependent", seen)
    assert destroy["spec"]["type"] == "destroy"
    conditions = await env.conditions("dependent")
    assert conditions.get("Reconciling", ("", "", ""))[1] != "PrerequisiteNotSatisfied", conditions
    base = await env.stack("base")
    assert "pulumi.com/reconciliation-request" not in (base["metadata"].get("annotations") or {})
    await env.complete(destroy)
    await _gone_watching_updates(env, "dependent", {})
    base = await env.stack("base")
    assert "pulumi.com/reconciliation-request" not in (base["metadata"].get("annotations") or {})
    assert len(await env.updates_of("base")) == 1  # "base" never ran again


# --- workspace reclaim ---------------------------------------------------------------------------


async def test_reclaim_policy_delete_keeps_the_workspace_after_a_failure(env: Env) -> None:
    """docs/stacks.md: ``Delete`` deletes the Workspace "after each successful operation": a failed one keeps
    it (and its pod, for the retry and for a look at what went wrong)."""
    await env.program("prog")
    await env.create_stack("keeps", {"programRef": {"name": "prog"}, "workspaceReclaimPolicy": "Delete"})
    ws = await env.make_ready("keeps")
    uid = ws["metadata"]["uid"]
    seen: set[str] = set()
    await env.complete(await env.next_update("keeps", seen), failed="ProgramError", message="error: boom")
    await env.wait_condition("keeps", "Reconciling", "RetryingAfterFailure")
    await env.quiet("keeps", 2.0)
    kept = await env.get(env.workspaces, "keeps")
    assert kept is not None and kept["metadata"]["uid"] == uid, kept and kept["metadata"]
    assert not kept["metadata"].get("deletionTimestamp")
    assert await _events(env, "keeps", "WorkspaceDeleted") == []

    # the next run (asked for) uses the same Workspace; its success reclaims it
    request = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "again"}}}
    await env.stacks.patch("keeps", request)
    retry = await env.next_update("keeps", seen)
    assert retry["metadata"]["ownerReferences"][0]["uid"] == uid
    await env.complete(retry)
    await env.wait_condition("keeps", "Ready", "ProcessingCompleted")

    async def reclaimed() -> bool:
        found = await env.get(env.workspaces, "keeps")
        return found is None or bool(found["metadata"].get("deletionTimestamp"))

    await wait_until("the Workspace reclaimed after the success", reclaimed, within=30.0)
    assert len(await _events(env, "keeps", "WorkspaceDeleted")) == 1


# --- metrics -------------------------------------------------------------------------------------


async def test_gauges_forget_a_deleted_stack(env: Env) -> None:
    await env.program("prog")
    registry = env.reconciler.manager.registry
    labels = {"namespace": env.ns, "name": "counted"}
    await env.create_stack("counted", {"programRef": {"name": "prog"}})
    await env.make_ready("counted")
    await env.complete(await env.next_update("counted", set()), failed="ProgramError", message="error: x")
    await env.wait_condition("counted", "Reconciling", "RetryingAfterFailure")

    async def failing() -> bool:
        return registry.get_sample_value("stacks_failing", labels) == 1

    await wait_until("stacks_failing=1", failing, within=30.0)
    assert registry.get_sample_value("stacks_reconciling", labels) == 1
    assert registry.get_sample_value("stacks_next_retry_timestamp_seconds", labels)
    active = registry.get_sample_value("stacks_active")
    assert active is not None and active >= 1

    await env.stacks.delete("counted")
    await _gone_watching_updates(env, "counted", {})

    async def forgotten() -> bool:
        return registry.get_sample_value("stacks_active") == active - 1

    await wait_until(f"stacks_active back to {active - 1}", forgotten, within=30.0)
    # Each per-Stack series is gone or 0: a deleted Stack is neither failing nor reconciling.
    assert registry.get_sample_value("stacks_failing", labels) in (None, 0.0)
    assert registry.get_sample_value("stacks_reconciling", labels) in (None, 0.0)
    assert registry.get_sample_value("stacks_next_retry_timestamp_seconds", labels) is None
    await asyncio.sleep(1.0)  # and no late write of the deleted Stack brings them back
    assert registry.get_sample_value("stacks_active") == active - 1
    assert registry.get_sample_value("stacks_failing", labels) in (None, 0.0)


# --- failure recording ---------------------------------------------------------------------------


async def test_last_update_message_is_the_failed_updates_message(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("told", {"programRef": {"name": "prog"}})
    await env.make_ready("told")
    update = await env.next_update("told", set())
    # More than the 10 lines lastFailure keeps: lastUpdate has all of it.
    message = "\n".join(["error: update failed"] + [f"  line {i}" for i in range(1, 15)])
    await env.complete(update, failed="ResourceOperationFailed", message=message)
    await env.wait_condition("told", "Reconciling", "RetryingAfterFailure")
    status = (await env.stack("told"))["status"]
    last = status["lastUpdate"]
    assert (last["name"], last["state"], last["type"]) == (update["metadata"]["name"], "failed", "up")
    assert last["message"] == message
    assert status["lastFailure"]["message"] == "\n".join(message.splitlines()[-10:])
    events = await _events(env, "told", "StackUpdateFailure")
    assert [e["message"] for e in events] == [f"Failed to update stack: {message}"]


async def test_a_stack_that_never_ran_and_cannot_is_released_at_once(env: Env) -> None:
    """docs/stacks.md: "A Stack that never ran an operation and cannot (an invalid spec, a Stalled
    Workspace) is released at once", even with ``destroyOnFinalize``: there is nothing to destroy."""
    await env.program("prog")
    invalid = {"programRef": {"name": "prog"}, "destroyOnFinalize": True, "prerequisites": [{"name": "inv"}]}
    await env.create_stack("inv", invalid)
    await env.wait_condition("inv", "Stalled", "SpecInvalid")
    await env.create_stack("wsfail", {"programRef": {"name": "prog"}, "destroyOnFinalize": True})
    await env.make_ready("wsfail", stalled=("PodFailed", "the workspace pod cannot start"))
    await env.wait_condition("wsfail", "Stalled", "WorkspaceFailed")
    for name in ("inv", "wsfail"):
        await env.stacks.delete(name)
    for name in ("inv", "wsfail"):
        types: dict[str, str] = {}
        await _gone_watching_updates(env, name, types, within=20.0)
        assert types == {}, (name, types)


# --- refresh on request --------------------------------------------------------------------------


async def test_a_refresh_request_outlives_a_transient_failure_and_is_retried_after_the_backoff(
    env: Env,
) -> None:
    """The first refresh ends as the agent says when it was killed mid-operation: the token is not
    observed, the Stack says it retries (not Ready), the refresh runs again after the Stack's own
    transient backoff (2 s: the operator's here is 60 s), not before, and once it succeeds the
    token is observed and the Stack is Ready."""
    await env.program("prog")
    policy = {"transient": {"baseSeconds": 2, "factor": 1, "jitter": 0}}
    first = await _ready_once(env, "refreshed", {"programRef": {"name": "prog"}, "retryPolicy": policy})
    seen = {first["metadata"]["name"]}
    await env.stacks.patch("refreshed", {"metadata": {"annotations": {REFRESH_REQUEST_ANNOTATION: "r1"}}})
    refresh = await env.next_update("refreshed", seen)
    assert refresh["spec"]["type"] == "refresh"
    stopped = "the agent stopped before the operation finished"
    await env.complete(refresh, failed="AgentRestarted", message=stopped)

    conditions = await env.wait_condition("refreshed", "Reconciling", "RetryingAfterFailure")
    assert 'refresh request "r1" failed 1 time(s) for a transient cause' in conditions["Reconciling"][2]
    assert conditions["Ready"][0] == "False" and "Stalled" not in conditions
    status = (await env.stack("refreshed"))["status"]
    assert "observedRefreshRequest" not in status
    last = status["lastRefresh"]
    assert (last["name"], last["token"], last["state"], last["reason"], last["failures"]) == (
        refresh["metadata"]["name"], "r1", "failed", "Transient", 1,
    )  # fmt: skip
    assert last["message"] == stopped
    failed_at = parse_time(last["lastResyncTime"])

    retry = await env.next_update("refreshed", seen)
    assert retry["spec"]["type"] == "refresh"
    assert retry["metadata"]["annotations"][REFRESH_REQUEST_ANNOTATION] == "r1"
    started = parse_time(retry["metadata"]["creationTimestamp"])
    assert failed_at is not None and started is not None and (started - failed_at).total_seconds() >= 2
    await env.complete(retry)
    await env.wait_condition("refreshed", "Ready", "ProcessingCompleted")
    status = (await env.stack("refreshed"))["status"]
    assert status["observedRefreshRequest"] == "r1"
    assert status["lastRefresh"]["name"] == retry["metadata"]["name"]
    assert (status["lastRefresh"]["state"], status["lastRefresh"]["failures"]) == ("succeeded", 0)
    await env.quiet("refreshed")
    assert len(await env.updates_of("refreshed")) == 3  # the up and two refreshes: nothing more
    assert [e["message"] for e in await _events(env, "refreshed", "StackRefreshed")] == [
        "Successfully refreshed stack"
    ]
    assert len(await _events(env, "refreshed", "StackRefreshFailed")) == 1

"""The Argo CD health and actions on Stacks the real Stack reconciler wrote, read back from a real
apiserver, and the actions' patches applied as Argo CD applies them (a JSON merge patch of what the
script returned) with the reconciler reacting to them.

As in controllers/test_stack_reconciler.py only the stack controller runs and the test plays the
Workspace and Update controllers, so each state is reached exactly and held: retries are slow (60 s)
here, so nothing runs again unless the test asks for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from controllers.stackenv import Env

from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack import reconciler as stack_controller
from pko.devtools.argocd import Health, Scripts, discover, health, merge_patch, run_action
from pko.devtools.operatorharness import new_manager, running
from pko.devtools.waiting import wait_until
from pko.machinery.resource import Obj

pytestmark = pytest.mark.cluster

SLOW = RetrySettings(deterministic_base=60.0, transient_base=60.0, transient_cap=120.0)
SCRIPTS = Scripts.from_configmap()
READY_MESSAGE = "the stack has been processed and is up to date"


@pytest.fixture(scope="module")
async def env(api_client: Any, namespace: str) -> AsyncIterator[Env]:
    manager = new_manager(api_client, namespace, shutdown_grace_period=5.0)
    reconciler = stack_controller.setup(manager, retry=SLOW)
    async with running(manager):
        yield Env(api_client, namespace, reconciler)


def enabled(obj: Obj) -> set[str]:
    return {name for name, action in discover(obj, SCRIPTS).items() if not action.disabled}


async def health_of(env: Env, name: str) -> Health:
    return health(await env.stack(name), SCRIPTS)


async def act(env: Env, name: str, action: str) -> Obj:
    """Run ``action`` on the live Stack as Argo CD does: the script on the object as read, then a
    merge patch of the difference; returns the patch sent."""
    live = await env.stack(name)
    patch = merge_patch(live, run_action(action, live, SCRIPTS))
    await env.stacks.patch(name, patch)
    return patch


async def first_update(env: Env, name: str, spec: Obj, seen: set[str]) -> Obj:
    await env.program("prog")
    await env.create_stack(name, {"programRef": {"name": "prog"}, **spec})
    await env.make_ready(name)
    return await env.next_update(name, seen)


async def test_a_stack_is_progressing_until_its_update_succeeds_then_healthy(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("fine", {"programRef": {"name": "prog"}})
    await env.wait_condition("fine", "Reconciling", "StackProcessing")
    assert await health_of(env, "fine") == Health("Progressing", "waiting for workspace readiness")
    assert enabled(await env.stack("fine")) == {"refresh"}

    await env.make_ready("fine")
    update = await env.next_update("fine", set())
    await wait_until("the Update recorded as current", lambda: _current(env, "fine"), within=30.0)
    assert await health_of(env, "fine") == Health("Progressing", "stack is being processed")

    await env.complete(update)
    await env.wait_condition("fine", "Ready", "ProcessingCompleted")
    assert await health_of(env, "fine") == Health("Healthy", READY_MESSAGE)
    assert enabled(await env.stack("fine")) == {"refresh"}

    # A new generation, as the apiserver stored it (before the operator saw it): Progressing,
    # whatever the last status said.
    changed = await env.stacks.patch("fine", {"spec": {"resyncFrequencySeconds": 120}})
    assert changed["status"]["conditions"][0]["status"] == "True"  # Ready, from the old generation
    assert health(changed, SCRIPTS) == Health(
        "Progressing", "Waiting for the operator to observe generation 2"
    )


async def _current(env: Env, name: str) -> bool:
    return bool(((await env.stack(name)).get("status") or {}).get("currentUpdate"))


async def test_a_failure_that_needs_a_fix_is_degraded_and_the_retry_action_runs_it_again(env: Env) -> None:
    seen: set[str] = set()
    update = await first_update(env, "broken", {"maxUpdateFailures": 3}, seen)
    await env.complete(update, failed="ProgramError", message="error: an unknown resource 'nothing'")
    await env.wait_condition("broken", "Reconciling", "RetryingAfterFailure")
    stack = await env.stack("broken")
    got = health(stack, SCRIPTS)
    assert got.status == "Degraded", got
    assert got.message == (
        "ProgramError: error: an unknown resource 'nothing' "
        f"(0 update failure(s); next retry at {stack['status']['nextRetryTime']})"
    )
    assert enabled(stack) == {"refresh", "retry"}

    patch = await act(env, "broken", "retry")
    token = patch["metadata"]["annotations"]["pulumi.com/reconciliation-request"]
    assert patch == {"metadata": {"annotations": {"pulumi.com/reconciliation-request": token}}}
    retried = await env.next_update("broken", seen)  # at once, not after the 60 s backoff
    assert retried["spec"]["message"] == f'Sync request: "{token}"'
    await wait_until("the retry recorded as current", lambda: _current(env, "broken"), within=30.0)
    assert await health_of(env, "broken") == Health("Progressing", "stack is being processed")
    assert "retry" not in enabled(await env.stack("broken"))

    await env.complete(retried)
    await env.wait_condition("broken", "Ready", "ProcessingCompleted")
    assert await health_of(env, "broken") == Health("Healthy", READY_MESSAGE)


async def test_a_transient_failure_being_retried_is_progressing(env: Env) -> None:
    update = await first_update(env, "locked", {}, set())
    await env.complete(update, failed="StackLocked", message="error: the stack is locked by ci-run-7")
    await env.wait_condition("locked", "Reconciling", "RetryingAfterFailure")
    stack = await env.stack("locked")
    assert stack["status"]["lastFailure"]["transient"] is True
    got = health(stack, SCRIPTS)
    assert got.status == "Progressing", got
    assert got.message.startswith("StackLocked: error: the stack is locked by ci-run-7 (0 update failure(s)")


async def test_a_stalled_stack_is_degraded_and_the_retry_action_releases_it(env: Env) -> None:
    seen: set[str] = set()
    update = await first_update(env, "stuck", {"maxUpdateFailures": 0}, seen)
    await env.complete(update, failed="ConfigInvalid", message="error: missing required configuration key")
    conditions = await env.wait_condition("stuck", "Stalled", "UpdateFailed")
    assert await health_of(env, "stuck") == Health("Degraded", conditions["Stalled"][2])
    assert enabled(await env.stack("stuck")) == {"refresh", "retry"}

    await act(env, "stuck", "retry")
    retried = await env.next_update("stuck", seen)
    await env.complete(retried)
    await env.wait_condition("stuck", "Ready", "ProcessingCompleted")
    assert await health_of(env, "stuck") == Health("Healthy", READY_MESSAGE)


async def test_a_suspended_stack_is_suspended_and_offers_no_action(env: Env) -> None:
    await env.program("prog")
    await env.create_stack("paused", {"programRef": {"name": "prog"}, "suspend": True})
    conditions = await env.wait_condition("paused", "Suspended", "Suspended")
    assert await health_of(env, "paused") == Health("Suspended", conditions["Suspended"][2])
    assert enabled(await env.stack("paused")) == set()


async def test_the_refresh_action_stores_its_request_on_the_live_stack(env: Env) -> None:
    seen: set[str] = set()
    update = await first_update(env, "refreshed", {}, seen)
    await env.complete(update)
    await env.wait_condition("refreshed", "Ready", "ProcessingCompleted")
    patch = await act(env, "refreshed", "refresh")
    token = patch["metadata"]["annotations"]["pulumi.com/refresh-request"]
    assert patch == {"metadata": {"annotations": {"pulumi.com/refresh-request": token}}}
    stored = await env.stack("refreshed")
    assert stored["metadata"]["annotations"]["pulumi.com/refresh-request"] == token
    refresh = await env.next_update("refreshed", seen)  # the reconciler runs the one refresh asked for
    assert refresh["spec"]["type"] == "refresh"
    await env.complete(refresh)

    async def observed() -> bool:
        return bool((await env.stack("refreshed"))["status"].get("observedRefreshRequest") == token)

    await wait_until("the refresh request observed", observed, within=30.0)
    assert await health_of(env, "refreshed") == Health("Healthy", READY_MESSAGE)


async def test_a_drifted_stack_stays_healthy_and_names_the_drift(env: Env) -> None:
    seen: set[str] = set()
    update = await first_update(env, "drifty", {"driftDetection": {"intervalSeconds": 3600}}, seen)
    await env.complete(update)
    check = await env.next_update("drifty", seen)  # the first check runs once something is deployed
    assert check["spec"]["type"] == "refresh" and check["spec"]["previewOnly"] is True
    urn = "urn:pulumi:dev::proj::kubernetes:core/v1:ConfigMap::settings"
    await env.updates.apply_status(
        {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "Update",
            "metadata": {"name": check["metadata"]["name"], "namespace": env.ns},
            "status": {
                "changes": [
                    {
                        "urn": urn,
                        "type": "kubernetes:core/v1:ConfigMap",
                        "op": "update",
                        "paths": ["data.greeting"],
                    }
                ]
            },
        },
        field_manager="test-update-changes",
    )
    await env.complete(check)
    conditions = await env.wait_condition("drifty", "Drifted", "DriftDetected")
    assert conditions["Ready"][0] == "True"
    assert await health_of(env, "drifty") == Health(
        "Healthy", f"{READY_MESSAGE}; drift detected: {conditions['Drifted'][2]}"
    )


async def test_a_plan_awaiting_approval_is_suspended_and_the_approve_action_applies_it(env: Env) -> None:
    seen: set[str] = set()
    preview = await first_update(env, "gated", {"approval": {"mode": "Always"}}, seen)
    assert preview["spec"]["type"] == "preview" and preview["spec"]["savePlan"] is True
    urn = "urn:pulumi:dev::proj::random:index/randomPassword:RandomPassword::pw"
    await env.updates.apply_status(
        {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "Update",
            "metadata": {"name": preview["metadata"]["name"], "namespace": env.ns},
            "status": {
                "changes": [
                    {"urn": urn, "type": "random:index/randomPassword:RandomPassword", "op": "create"}
                ]
            },
        },
        field_manager="test-update-changes",
    )
    await env.complete(preview)
    await wait_until("the plan awaiting approval", lambda: _awaiting(env, "gated"), within=30.0)
    stack = await env.stack("gated")
    digest = stack["status"]["plan"]["digest"]
    got = health(stack, SCRIPTS)
    assert got == Health(
        "Suspended",
        f"Plan {digest} awaits approval: 1 to create, 0 to update, 0 to delete, 0 to replace "
        f"(preview Update {preview['metadata']['name']}). Run the approve action, or annotate "
        f"pulumi.com/approved-plan={digest}",
    )
    assert enabled(stack) == {"approve", "refresh"}

    patch = await act(env, "gated", "approve")
    assert patch == {"metadata": {"annotations": {"pulumi.com/approved-plan": digest}}}
    up = await env.next_update("gated", seen)
    assert up["spec"]["type"] == "up" and up["spec"]["plan"] == preview["metadata"]["name"]
    assert "approve" not in enabled(await env.stack("gated"))
    await env.complete(up)
    await env.wait_condition("gated", "Ready", "ProcessingCompleted")
    assert await health_of(env, "gated") == Health("Healthy", READY_MESSAGE)


async def _awaiting(env: Env, name: str) -> bool:
    for c in ((await env.stack(name)).get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready" and c["reason"] == "AwaitingApproval":
            return True
    return False

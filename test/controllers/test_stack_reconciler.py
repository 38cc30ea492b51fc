"""The Stack reconciler alone (see stackenv.py): a Program Stack deployed, its failures classified and
retried, suspend, deprecated fields, a Workspace's stall, prerequisites, an ephemeral backend's warning
and the bounded history."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from pko.controllers.stack.status import parse_time
from pko.devtools.kstatus import kstatus
from pko.devtools.waiting import wait_until
from pko.machinery.resource import EVENTS, Obj, ResourceClient

from .stackenv import Env, stack_env

env = stack_env()


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

"""Deleting a Stack without ``destroyOnFinalize``, end to end: the real operator, apiserver,
kube-controller-manager (its garbage collector) and the play-kubelet running real agents with the
stand-in Pulumi CLI.

docs/stacks.md (Suspend, deletion, workspaces): "Without ``destroyOnFinalize`` ... [the finalizer] is removed
once any running Update has been recorded, and the Stack's Workspace and Updates are
garbage-collected with it."

* an idle Stack: no destroy runs, the finalizer goes, the Workspace, its Updates and their outputs
  Secrets are garbage-collected, and the Pulumi state is untouched;
* a Stack deleted while its ``up`` runs (a slow program) waits for that Update, records it, then goes:
  it does not wedge, and the Update is not cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pko.controllers.resources import STACK_FINALIZER
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.resource import SECRETS, ResourceClient

from .conftest import operator_env
from .test_stack import Env, _state

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]


env = operator_env(Env)


async def _updates_of(env: Env, stack: str) -> list[Obj]:
    listing = await env.updates.list(label_selector=f"pulumi.com/stack-name={stack}")
    return list(listing.items)


async def _gone_watching_updates(env: Env, name: str, seen: dict[str, Obj], within: float = 120.0) -> None:
    """Wait until the Stack is gone, keeping the last version of every Update of it seen meanwhile."""

    async def gone() -> bool:
        for update in await _updates_of(env, name):
            seen[update["metadata"]["name"]] = update
        return await env.get(env.stacks, name) is None

    try:
        await wait_until(f"{name} deleted", gone, within=within)
    except AssertionError as exc:
        current = await env.get(env.stacks, name)
        raise AssertionError(
            f"{exc}\nmetadata: {(current or {}).get('metadata')}\nstatus: {(current or {}).get('status')}"
        ) from None


async def _collected(env: Env, name: str, updates: list[str]) -> None:
    """The Workspace, the Updates and their outputs Secrets are garbage-collected."""
    secrets = ResourceClient(env.api, SECRETS, env.ns)

    async def none_left() -> bool:
        if await env.get(env.workspaces, name) is not None or await _updates_of(env, name):
            return False
        for update in updates:
            if await env.get(secrets, f"{update}-stack-outputs") is not None:
                return False
        return True

    await wait_until(f"{name}'s Workspace, Updates and outputs garbage-collected", none_left, within=120)


async def test_deleting_without_destroy_on_finalize_leaves_the_state_and_collects_the_rest(env: Env) -> None:
    body = {
        "resources": {"echo": {"type": "test:index:Echo", "properties": {"value": "kept"}}},
        "outputs": {"value": "${echo.value}"},
    }
    await env.create_program("kept", body)
    await env.create_stack("kept", {"programRef": {"name": "kept"}})
    stack = await env.condition("kept", "Ready", "ProcessingCompleted")
    assert STACK_FINALIZER in stack["metadata"]["finalizers"]
    last = stack["status"]["lastUpdate"]
    before = _state(env, "kept")["checkpoint"]["latest"]["resources"]
    assert any(r["urn"].endswith("::echo") for r in before), before
    updates = [u["metadata"]["name"] for u in await _updates_of(env, "kept")]
    assert last["name"] in updates
    assert await env.get(ResourceClient(env.api, SECRETS, env.ns), f"{last['name']}-stack-outputs")

    # Seeded before the delete: the Stack and its Updates can all be gone by the first poll after it.
    seen: dict[str, Obj] = {u["metadata"]["name"]: u for u in await _updates_of(env, "kept")}
    await env.stacks.delete("kept")
    await _gone_watching_updates(env, "kept", seen)
    assert {u["spec"]["type"] for u in seen.values()} == {"up"}, sorted(seen)
    detected = [e["message"] for e in await env.events_for("kept") if e["reason"] == "StackUpdateDetected"]
    assert "Stack marked for deletion" not in detected, detected
    await _collected(env, "kept", updates)
    # nothing ran against the stack: its state is what the up left
    assert _state(env, "kept")["checkpoint"]["latest"]["resources"] == before


async def test_deleting_during_an_update_waits_for_it_then_goes(env: Env) -> None:
    body = {
        "resources": {"wait": {"type": "test:index:Hang", "properties": {"seconds": 30}}},
        "outputs": {"done": "yes"},
    }
    await env.create_program("busy", body)
    await env.create_stack("busy", {"programRef": {"name": "busy"}})

    async def running() -> Obj | None:
        stack = await env.get(env.stacks, "busy")
        current = ((stack or {}).get("status") or {}).get("currentUpdate") or {}
        if not current.get("name"):
            return None
        update = await env.get(env.updates, current["name"])
        progressing = get_condition(((update or {}).get("status") or {}).get("conditions"), "Progressing")
        return update if (progressing or {}).get("reason") == "Progressing" else None

    update: Obj = await wait_until("the busy Stack's up running", running, within=240)
    name = update["metadata"]["name"]
    await env.stacks.delete("busy")

    # While the up runs, the Stack stays (finalizer kept) and its Update is left to run.
    checked = 0
    for _ in range(8):
        await asyncio.sleep(1.0)
        stack = await env.get(env.stacks, "busy")
        current = await env.get(env.updates, name)
        complete = get_condition(((current or {}).get("status") or {}).get("conditions"), "Complete")
        if (complete or {}).get("status") == "True":
            break
        assert stack is not None and stack["metadata"].get("deletionTimestamp"), "released too early"
        assert STACK_FINALIZER in stack["metadata"]["finalizers"]
        assert stack["status"]["currentUpdate"]["name"] == name
        assert current is not None and not current["metadata"].get("deletionTimestamp")
        checked += 1
    assert checked >= 3, f"the up ended {checked} s after the deletion: too soon to tell"

    seen: dict[str, Obj] = {}
    await _gone_watching_updates(env, "busy", seen, within=240)
    # The up was recorded before the Stack went: it succeeded (not cancelled), and no destroy ran.
    final = seen[name]
    failed = get_condition(final["status"]["conditions"], "Failed")
    assert (failed or {}).get("status") == "False", final["status"]
    assert {u["spec"]["type"] for u in seen.values()} == {"up"}, sorted(seen)

    async def recorded() -> list[str] | None:  # "Successfully updated stack" (Events are sent async)
        reasons = [e["reason"] for e in await env.events_for("busy")]
        return reasons if "StackCreated" in reasons else None

    reasons = await wait_until("the up recorded (StackCreated)", recorded, within=30)
    assert reasons.count("StackCreated") == 1 and "StackUpdateFailure" not in reasons, reasons
    await _collected(env, "busy", [name])
    assert any(r["urn"].endswith("::wait") for r in _state(env, "busy")["checkpoint"]["latest"]["resources"])

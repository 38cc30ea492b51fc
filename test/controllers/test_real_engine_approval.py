"""The approval gate and drift detection (issue 29) on the real Pulumi engine: the real operator,
apiserver and kube-controller-manager, and the play-kubelet running real agents with the CLI, the
YAML language host and pulumi-kubernetes (as test_real_engine.py).

What is proved here is what a user relies on: with ``spec.approval`` nothing reaches the cluster
before the recorded plan's digest is approved, an approval applies its plan once and only that
plan (a stale digest applies nothing), ``OnDestructive`` lets additions through and holds a
delete; with ``spec.driftDetection`` a ConfigMap changed out of band is named in ``status.drift``
by URN and property path, ``Drifted`` and the metrics say so, and ``remediate`` puts it back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from pko.controllers.resources import (
    APPROVED_PLAN_ANNOTATION,
    CANCEL_REQUEST_ANNOTATION,
    REFRESH_REQUEST_ANNOTATION,
)
from pko.devtools.kstatus import kstatus
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition

from .test_real_engine import KUBELET_OPTIONS, config_map, configmap, env
from .test_stack import Env

__all__ = ["KUBELET_OPTIONS", "env"]

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]


def urn(project: str, name: str) -> str:
    return f"urn:pulumi:dev::{project}::kubernetes:core/v1:ConfigMap::{name}"


def ready(stack: Obj | None) -> Obj | None:
    return get_condition(((stack or {}).get("status") or {}).get("conditions"), "Ready")


async def updates_of(env: Env, stack: str, type_: str) -> list[Obj]:
    listing = await env.updates.list(label_selector=f"pulumi.com/stack-name={stack}")
    return [u for u in listing.items if (u.get("spec") or {}).get("type") == type_]


async def awaiting(env: Env, name: str, *, not_digest: str | None = None, within: float = 300) -> Obj:
    """The Stack waiting for approval of a recorded plan (other than ``not_digest``)."""

    async def probe() -> Obj | None:
        stack = await env.get(env.stacks, name)
        condition = ready(stack) or {}
        plan = ((stack or {}).get("status") or {}).get("plan") or {}
        if condition.get("reason") != "AwaitingApproval" or not plan.get("digest"):
            return None
        return stack if plan["digest"] != not_digest else None

    return await env.stack_until(name, f"{name} awaiting approval", probe, within=within)


async def approve(env: Env, name: str, digest: str) -> None:
    await env.stacks.patch(name, {"metadata": {"annotations": {APPROVED_PLAN_ANNOTATION: digest}}})


async def ready_after(env: Env, name: str, update_name: str | None = None, within: float = 300) -> Obj:
    """Ready, with a last update other than ``update_name``."""

    async def probe() -> Obj | None:
        stack = await env.get(env.stacks, name)
        last = ((stack or {}).get("status") or {}).get("lastUpdate") or {}
        if (ready(stack) or {}).get("status") == "True" and last.get("name") != update_name:
            return stack
        return None

    return await env.stack_until(name, f"{name} Ready", probe, within=within)


async def set_program(env: Env, name: str, body: Obj) -> None:
    await env.programs.patch(name, {"program": body})


async def test_an_approved_plan_is_applied_once_and_a_new_change_needs_a_new_approval(env: Env) -> None:
    # An output the preview cannot know (the object's uid): pulumi 3.274's `up --plan` then exits 1
    # without an error after applying every step; the agent records what it did as a success.
    await env.create_program(
        "gated",
        {
            "resources": {"cm": config_map(env, "gated-cm", {"greeting": "hello"})},
            "outputs": {"uid": "${cm.metadata.uid}"},
        },
    )
    await env.create_stack("gated", {"programRef": {"name": "gated"}, "approval": {"mode": "Always"}})
    stack = await awaiting(env, "gated")
    plan = stack["status"]["plan"]
    assert plan["summary"] == {"create": 1, "update": 0, "delete": 0, "replace": 0}, plan
    assert plan["digest"].startswith("sha256:") and len(plan["digest"]) == 71, plan
    assert plan["digest"] in (ready(stack) or {})["message"], ready(stack)
    assert get_condition(stack["status"]["conditions"], "Reconciling") is None, stack["status"]
    assert get_condition(stack["status"]["conditions"], "Stalled") is None, stack["status"]
    events = await env.events_for("gated", reason="AwaitingApproval")
    assert any(e["reason"] == "AwaitingApproval" and "1 to create" in e["message"] for e in events), events
    assert await configmap(env, "gated-cm") is None  # nothing applied before approval
    assert await updates_of(env, "gated", "up") == []
    # Not Current to kstatus readers (Flux's health checks, dependsOn, kpt): Ready=False holds them.
    assert kstatus(stack) == "InProgress"

    await approve(env, "gated", plan["digest"])
    stack = await ready_after(env, "gated")
    assert kstatus(stack) == "Current"
    ups = await updates_of(env, "gated", "up")
    assert [u["spec"].get("plan") for u in ups] == [plan["update"]], ups
    assert stack["status"]["lastUpdate"]["name"] == ups[0]["metadata"]["name"]
    assert "plan" not in stack["status"], stack["status"]  # consumed
    applied = await configmap(env, "gated-cm")
    assert applied is not None and applied["data"] == {"greeting": "hello"}, applied
    assert stack["status"]["outputs"] == {"uid": applied["metadata"]["uid"]}, stack["status"]

    # A new change is previewed and waits: the old approval (still on the Stack) does not apply it.
    await set_program(env, "gated", {"resources": {"cm": config_map(env, "gated-cm", {"greeting": "bye"})}})
    stack = await awaiting(env, "gated", not_digest=plan["digest"])
    # pulumi-kubernetes replaces a ConfigMap whose data changes (pods see a new one).
    assert stack["status"]["plan"]["summary"]["replace"] == 1, stack["status"]["plan"]
    assert f"the approved digest {plan['digest']} is not the recorded plan's" in ready(stack)["message"]
    assert len(await updates_of(env, "gated", "up")) == 1
    same = await configmap(env, "gated-cm")
    assert same is not None and same["data"] == {"greeting": "hello"}
    assert same["metadata"]["resourceVersion"] == applied["metadata"]["resourceVersion"]


async def test_approving_a_stale_digest_applies_nothing_and_keeps_the_new_plan(env: Env) -> None:
    await env.create_program("stale", {"resources": {"cm": config_map(env, "stale-cm", {"v": "1"})}})
    await env.create_stack("stale", {"programRef": {"name": "stale"}, "approval": {"mode": "Always"}})
    first = (await awaiting(env, "stale"))["status"]["plan"]

    # The program moves on: the recorded plan is for the old revision, so a new one is previewed.
    await set_program(env, "stale", {"resources": {"cm": config_map(env, "stale-cm", {"v": "2"})}})
    second = (await awaiting(env, "stale", not_digest=first["digest"]))["status"]["plan"]
    assert second["update"] != first["update"] and second["commit"] != first.get("commit"), (first, second)

    await approve(env, "stale", first["digest"])

    async def refused() -> Obj | None:
        stack = await env.get(env.stacks, "stale")
        message = (ready(stack) or {}).get("message") or ""
        return (
            stack if f"the approved digest {first['digest']} is not the recorded plan's" in message else None
        )

    stack = await env.stack_until("stale", "the stale approval refused", refused, within=120)
    assert stack["status"]["plan"]["digest"] == second["digest"], stack["status"]["plan"]
    assert (ready(stack) or {})["reason"] == "AwaitingApproval"
    assert await updates_of(env, "stale", "up") == []
    assert await configmap(env, "stale-cm") is None

    await approve(env, "stale", second["digest"])
    await ready_after(env, "stale")
    applied = await configmap(env, "stale-cm")
    assert applied is not None and applied["data"] == {"v": "2"}, applied


async def test_an_approved_plan_that_is_gone_applies_nothing_and_is_previewed_for_a_new_approval(
    env: Env,
) -> None:
    await env.create_program("lost", {"resources": {"cm": config_map(env, "lost-cm", {"v": "1"})}})
    await env.create_stack("lost", {"programRef": {"name": "lost"}, "approval": {"mode": "Always"}})
    first = (await awaiting(env, "lost"))["status"]["plan"]
    # The preview that saved the plan goes away (as after its TTL): the up cannot have its plan.
    await env.updates.delete(first["update"])
    await approve(env, "lost", first["digest"])

    second = (await awaiting(env, "lost", not_digest=first["digest"]))["status"]["plan"]
    assert second["update"] != first["update"], (first, second)
    [refused] = await updates_of(env, "lost", "up")
    failed = get_condition(refused["status"]["conditions"], "Failed") or {}
    assert failed.get("reason") == "PlanNotFound", refused["status"]
    assert await configmap(env, "lost-cm") is None  # nothing applied with the old approval
    stack = await env.get(env.stacks, "lost")
    assert "lastUpdate" not in (stack or {})["status"] and "lastFailure" not in stack["status"]  # type: ignore[index]
    events = await env.events_for("lost", reason="PlanOutdated")
    assert any(e["reason"] == "PlanOutdated" for e in events), events

    await approve(env, "lost", second["digest"])
    await ready_after(env, "lost")
    assert (await configmap(env, "lost-cm") or {}).get("data") == {"v": "1"}


async def test_on_destructive_applies_an_addition_at_once_and_holds_a_delete(env: Env) -> None:
    both = {
        "keep": config_map(env, "destructive-keep", {"a": "1"}),
        "drop": config_map(env, "destructive-drop", {"b": "2"}),
    }
    await env.create_program("destructive", {"resources": both})
    await env.create_stack(
        "destructive", {"programRef": {"name": "destructive"}, "approval": {"mode": "OnDestructive"}}
    )
    stack = await ready_after(env, "destructive")
    assert await configmap(env, "destructive-drop") is not None
    previews = await updates_of(env, "destructive", "preview")
    ups = await updates_of(env, "destructive", "up")
    assert [p["spec"].get("savePlan") for p in previews] == [True], previews
    assert [u["spec"].get("plan") for u in ups] == [previews[0]["metadata"]["name"]], ups

    await set_program(env, "destructive", {"resources": {"drop": None}})  # a merge patch: drop goes
    held = await awaiting(env, "destructive")
    assert held["status"]["plan"]["summary"]["delete"] == 1, held["status"]["plan"]
    assert await configmap(env, "destructive-drop") is not None  # held
    assert len(await updates_of(env, "destructive", "up")) == 1

    await approve(env, "destructive", held["status"]["plan"]["digest"])
    await ready_after(env, "destructive", stack["status"]["lastUpdate"]["name"])
    assert await configmap(env, "destructive-drop") is None
    assert await configmap(env, "destructive-keep") is not None


def drift_metrics(env: Env, name: str) -> tuple[float | None, float | None]:
    manager = env.operator.manager
    assert manager is not None
    labels = {"namespace": env.ns, "name": name}
    return (
        manager.registry.get_sample_value("pko_stack_drift_resources", labels),
        manager.registry.get_sample_value("pko_stack_last_drift_check_timestamp_seconds", labels),
    )


async def drift_checked(
    env: Env, name: str, *, detected: bool, after: str | None, within: float = 240
) -> Obj:
    """A drift check later than ``after`` (a lastCheckTime) that found drift, or not."""

    async def probe() -> Obj | None:
        stack = await env.get(env.stacks, name)
        drift = ((stack or {}).get("status") or {}).get("drift") or {}
        checked = drift.get("lastCheckTime")
        if checked and checked != after and bool(drift.get("detected")) == detected:
            return stack
        return None

    return await env.stack_until(name, f"{name}: a drift check, detected={detected}", probe, within=within)


async def test_drift_made_out_of_band_is_reported_by_urn_and_path(env: Env) -> None:
    body = {"resources": {"cm": config_map(env, "watched-cm", {"greeting": "hello"})}}
    await env.create_program("watched", body)
    await env.create_stack(
        "watched", {"programRef": {"name": "watched"}, "driftDetection": {"intervalSeconds": 60}}
    )
    stack = await drift_checked(env, "watched", detected=False, after=None)
    drifted = get_condition(stack["status"]["conditions"], "Drifted")
    assert drifted is not None and drifted["status"] == "False", stack["status"]
    assert (ready(stack) or {})["status"] == "True"
    assert drift_metrics(env, "watched")[0] == 0

    core = client.CoreV1Api(env.api)
    await core.patch_namespaced_config_map("watched-cm", env.ns, {"data": {"greeting": "changed by hand"}})
    stack = await drift_checked(
        env, "watched", detected=True, after=stack["status"]["drift"]["lastCheckTime"]
    )
    [resource] = stack["status"]["drift"]["resources"]
    assert resource["urn"] == urn("watched", "cm"), resource
    assert resource["type"] == "kubernetes:core/v1:ConfigMap"
    assert any("greeting" in path for path in resource.get("paths") or []), resource
    drifted = get_condition(stack["status"]["conditions"], "Drifted")
    assert drifted is not None and drifted["status"] == "True" and resource["urn"] in drifted["message"]
    assert (ready(stack) or {})["status"] == "True"  # drift is reported, not a failure
    count, checked_at = drift_metrics(env, "watched")
    assert count == 1 and checked_at is not None and checked_at > 0
    events = await env.events_for("watched", reason="DriftDetected")
    assert any(e["reason"] == "DriftDetected" for e in events), events
    # Not remediated: the change made by hand stays.
    assert (await configmap(env, "watched-cm") or {}).get("data") == {"greeting": "changed by hand"}

    # The next check keeps firstSeen for the same resource.
    again = await drift_checked(
        env, "watched", detected=True, after=stack["status"]["drift"]["lastCheckTime"]
    )
    assert again["status"]["drift"]["resources"][0]["firstSeen"] == resource["firstSeen"]

    await env.stacks.delete("watched")
    await wait_until("the stack gone", lambda: _gone(env, "watched"), within=120)
    assert drift_metrics(env, "watched") == (None, None)


async def _gone(env: Env, name: str) -> bool:
    return await env.get(env.stacks, name) is None


async def test_remediation_puts_drift_right_and_clears_the_condition(env: Env) -> None:
    body = {"resources": {"cm": config_map(env, "mended-cm", {"greeting": "hello"})}}
    await env.create_program("mended", body)
    spec = {"programRef": {"name": "mended"}, "driftDetection": {"intervalSeconds": 60, "remediate": True}}
    await env.create_stack("mended", spec)
    stack = await drift_checked(env, "mended", detected=False, after=None)

    core = client.CoreV1Api(env.api)
    await core.patch_namespaced_config_map("mended-cm", env.ns, {"data": {"greeting": "changed by hand"}})
    found = await drift_checked(env, "mended", detected=True, after=stack["status"]["drift"]["lastCheckTime"])
    assert found["status"]["drift"]["resources"][0]["urn"] == urn("mended", "cm")

    async def restored() -> bool:
        return (await configmap(env, "mended-cm") or {}).get("data") == {"greeting": "hello"}

    await wait_until("the drift put right", restored, within=240)
    cleared = await drift_checked(
        env, "mended", detected=False, after=found["status"]["drift"]["lastCheckTime"]
    )
    drifted = get_condition(cleared["status"]["conditions"], "Drifted")
    assert drifted is not None and drifted["status"] == "False", cleared["status"]
    assert drift_metrics(env, "mended")[0] == 0
    events = await env.events_for("mended", reason="DriftCleared")
    assert {"DriftDetected", "DriftCleared"} <= {e["reason"] for e in events}, events
    last = cleared["status"]["lastUpdate"]
    assert (last["type"], last["state"]) == ("up", "succeeded"), last


async def test_remediation_waits_for_approval_and_applies_the_approved_plan(env: Env) -> None:
    body = {"resources": {"cm": config_map(env, "guarded-cm", {"greeting": "hello"})}}
    await env.create_program("guarded", body)
    spec = {
        "programRef": {"name": "guarded"},
        "approval": {"mode": "Always"},
        "driftDetection": {"intervalSeconds": 60, "remediate": True},
    }
    await env.create_stack("guarded", spec)
    first = (await awaiting(env, "guarded"))["status"]["plan"]
    await approve(env, "guarded", first["digest"])
    stack = await drift_checked(env, "guarded", detected=False, after=None)

    core = client.CoreV1Api(env.api)
    await core.patch_namespaced_config_map("guarded-cm", env.ns, {"data": {"greeting": "changed by hand"}})
    held = await awaiting(env, "guarded", not_digest=first["digest"], within=240)
    assert held["status"]["drift"]["detected"] is True
    assert sum(held["status"]["plan"]["summary"].values()) == 1, held["status"]["plan"]
    [preview] = [
        p
        for p in await updates_of(env, "guarded", "preview")
        if p["metadata"]["name"] == held["status"]["plan"]["update"]
    ]
    assert preview["spec"].get("refresh") is True and preview["spec"].get("savePlan") is True, preview["spec"]
    assert (await configmap(env, "guarded-cm") or {}).get("data") == {"greeting": "changed by hand"}  # held

    await approve(env, "guarded", held["status"]["plan"]["digest"])
    cleared = await drift_checked(
        env, "guarded", detected=False, after=held["status"]["drift"]["lastCheckTime"]
    )
    assert (await configmap(env, "guarded-cm") or {}).get("data") == {"greeting": "hello"}
    last = cleared["status"]["lastUpdate"]
    assert (last["type"], last["state"]) == ("up", "succeeded") and last["name"] != stack["status"][
        "lastUpdate"
    ]["name"]


async def test_a_refresh_request_runs_one_refresh_and_is_recorded(env: Env) -> None:
    body = {"resources": {"cm": config_map(env, "refreshed-cm", {"greeting": "hello"})}}
    await env.create_program("refreshed", body)
    await env.create_stack("refreshed", {"programRef": {"name": "refreshed"}})
    stack = await ready_after(env, "refreshed")
    await env.stacks.patch("refreshed", {"metadata": {"annotations": {REFRESH_REQUEST_ANNOTATION: "r1"}}})

    async def recorded() -> Obj | None:
        found = await env.get(env.stacks, "refreshed")
        return found if ((found or {}).get("status") or {}).get("observedRefreshRequest") == "r1" else None

    done = await env.stack_until("refreshed", "the refresh recorded", recorded, within=240)
    refreshes = await updates_of(env, "refreshed", "refresh")
    assert len(refreshes) == 1 and not refreshes[0]["spec"].get("previewOnly"), refreshes
    assert done["status"]["lastUpdate"]["name"] == stack["status"]["lastUpdate"]["name"]  # not an up
    events = await env.events_for("refreshed", reason="StackRefreshed")
    assert any(e["reason"] == "StackRefreshed" for e in events), events


async def test_a_cancel_request_cancels_the_running_update_and_holds_until_the_next_change(env: Env) -> None:
    # A Deployment that never becomes ready keeps pulumi-kubernetes waiting: the up runs until cancelled.
    deployment = {
        "type": "kubernetes:apps/v1:Deployment",
        "properties": {
            "metadata": {"name": "never-ready", "namespace": env.ns},
            "spec": {
                "selector": {"matchLabels": {"app": "never-ready"}},
                "template": {
                    "metadata": {"labels": {"app": "never-ready"}},
                    "spec": {"containers": [{"name": "c", "image": "example.invalid/never:1"}]},
                },
            },
        },
    }
    await env.create_program("cancelled", {"resources": {"d": deployment}})
    await env.create_stack("cancelled", {"programRef": {"name": "cancelled"}})

    async def running() -> Obj | None:
        ups = await updates_of(env, "cancelled", "up")
        for update in ups:
            if (
                get_condition((update.get("status") or {}).get("conditions"), "Progressing")
                and (get_condition(update["status"]["conditions"], "Progressing") or {}).get("status")
                == "True"
            ):
                return update
        return None

    update = await env.stack_until("cancelled", "the up running", running, within=300)
    await env.stacks.patch("cancelled", {"metadata": {"annotations": {CANCEL_REQUEST_ANNOTATION: "c1"}}})

    async def cancelled() -> Obj | None:
        stack = await env.get(env.stacks, "cancelled")
        condition = ready(stack) or {}
        return stack if condition.get("reason") == "Cancelled" else None

    stack = await env.stack_until("cancelled", "the Stack Cancelled", cancelled, within=300)
    status = stack["status"]
    assert status["observedCancelRequest"] == "c1"
    assert status["lastUpdate"]["name"] == update["metadata"]["name"], status["lastUpdate"]
    assert status["lastFailure"]["reason"] == "Cancelled", status["lastFailure"]
    assert "nextRetryTime" not in status, status
    assert get_condition(status["conditions"], "Stalled") is None
    assert get_condition(status["conditions"], "Reconciling") is None
    assert kstatus(stack) == "InProgress"  # waits for a person, as kstatus readers should
    # Held: no new up starts by itself (a transient failure would be retried within 5-10 s).
    await asyncio.sleep(15)
    ups = await updates_of(env, "cancelled", "up")
    assert [u["metadata"]["name"] for u in ups] in ([], [update["metadata"]["name"]]), ups
    assert (ready(await env.get(env.stacks, "cancelled")) or {}).get("reason") == "Cancelled"

"""Argo CD's view of Stacks on the real node: config/argocd's health check and actions, as users paste
them (argocd-cm.yaml), run in test/argocd's emulation of Argo CD's Lua sandbox on the Stacks the real
operator and engine produce, and the actions' patches applied with kubectl as Argo CD applies them
(a JSON merge patch of what the script returned).

Independent of the other e2e modules (only the session's ``kube`` and test_walkthrough's manifests
and waits); it also checks every Stack the earlier modules left on the node.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pko.devtools.argocd import Health, Scripts, discover, health, merge_patch, run_action

from .conftest import Kube
from .stacks import BROKEN_PROGRAM, gone, program, ready, stack

pytestmark = pytest.mark.timeout(1800)

SCRIPTS = Scripts.from_configmap()
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended"}


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def act(k: Kube, name: str, action: str) -> dict[str, Any]:
    """``action`` on the live Stack as Argo CD runs it; the merge patch sent."""
    live = k.get("stack", name)
    assert live is not None, name
    patch = merge_patch(live, run_action(action, live, SCRIPTS))
    k.run("patch", "stack", name, "--type=merge", "-p", json.dumps(patch))
    return patch


def delete(k: Kube, name: str) -> None:
    k.run("delete", "stack", name, "--wait=false", "--ignore-not-found")
    gone(k, "stack", name, within=600)
    k.run("delete", "pvc", f"{name}-state", "--ignore-not-found", "--wait=false")
    k.run("delete", "program", name, "--ignore-not-found")


def test_every_stack_on_the_node_has_a_health_argo_cd_accepts_and_one_that_agrees(kube: Kube) -> None:
    """A Stack of our own (Ready), and whatever the earlier modules left: no script error, a status
    Argo CD accepts, Degraded for every Stalled Stack and Healthy for every Stack Ready and observed."""
    k = kube
    name = "argocd-health"
    k.apply(program(name))
    k.apply(stack(name, f"programRef:\n    name: {name}"))
    try:
        s = ready(k, name)
        assert health(s, SCRIPTS) == Health("Healthy", _condition(s, "Ready")["message"])
        stacks = k.json("get", "stacks", "-A")["items"]
        assert any(item["metadata"]["name"] == name for item in stacks)
        for item in stacks:
            where = f"{item['metadata']['namespace']}/{item['metadata']['name']}"
            got = health(item, SCRIPTS)
            assert got.status in STATUSES and got.message, (where, got)
            observed = (item.get("status") or {}).get("observedGeneration") == item["metadata"]["generation"]
            if not observed or item["metadata"].get("deletionTimestamp"):
                continue
            if _condition(item, "Stalled").get("status") == "True":
                assert got == Health("Degraded", str(_condition(item, "Stalled").get("message"))), where
            elif (
                _condition(item, "Ready").get("status") == "True"
                and _condition(item, "Suspended").get("status") != "True"
            ):
                assert got.status == "Healthy", (where, got)
            assert set(discover(item, SCRIPTS)) == {"approve", "refresh", "retry"}, where
    finally:
        delete(k, name)


@pytest.mark.pko_only("pulumi.com/refresh-request (issue 29)")
def test_the_refresh_action_runs_one_refresh_and_the_stack_stays_healthy(kube: Kube) -> None:
    k = kube
    name = "argocd-refresh"
    k.apply(program(name))
    k.apply(stack(name, f"programRef:\n    name: {name}"))
    try:
        s = ready(k, name)
        assert {n for n, a in discover(s, SCRIPTS).items() if not a.disabled} == {"refresh"}
        patch = act(k, name, "refresh")
        token = patch["metadata"]["annotations"]["pulumi.com/refresh-request"]
        assert patch == {"metadata": {"annotations": {"pulumi.com/refresh-request": token}}}
        seen: set[str] = set()

        def refreshed() -> dict[str, Any] | None:
            s = k.get("stack", name)
            if s is None:
                return None
            seen.add(health(s, SCRIPTS).status)
            return s if (s.get("status") or {}).get("observedRefreshRequest") == token else None

        k.until(f"stack {name} refreshed for {token}", refreshed, within=600, interval=1)
        s = ready(k, name)
        assert health(s, SCRIPTS).status == "Healthy"
        assert seen <= {"Healthy", "Progressing"}, seen  # never Degraded or Suspended on the way
    finally:
        delete(k, name)


@pytest.mark.pko_only("spec.maxUpdateFailures (Stalled at the first deterministic failure)")
def test_a_program_error_stalls_the_stack_degraded_and_the_retry_action_runs_it_again(kube: Kube) -> None:
    k = kube
    name = "argocd-broken"
    k.apply(BROKEN_PROGRAM.format(name=name))
    docs = list(yaml.safe_load_all(stack(name, f"programRef:\n    name: {name}")))
    docs[1]["spec"].update({"maxUpdateFailures": 0, "destroyOnFinalize": False})
    k.apply(yaml.safe_dump_all(docs))
    try:

        def stalled() -> dict[str, Any] | None:
            s = k.get("stack", name)
            return s if s is not None and _condition(s, "Stalled").get("status") == "True" else None

        s = k.until(f"stack {name} Stalled", stalled, within=600)
        assert _condition(s, "Stalled")["reason"] == "UpdateFailed"
        assert health(s, SCRIPTS) == Health("Degraded", _condition(s, "Stalled")["message"])
        assert {n for n, a in discover(s, SCRIPTS).items() if not a.disabled} == {"refresh", "retry"}
        first = s["status"]["lastUpdate"]["name"]

        patch = act(k, name, "retry")
        token = patch["metadata"]["annotations"]["pulumi.com/reconciliation-request"]
        seen: set[str] = set()

        def failed_again() -> dict[str, Any] | None:
            s = k.get("stack", name)
            if s is None:
                return None
            seen.add(health(s, SCRIPTS).status)
            last = (s.get("status") or {}).get("lastUpdate") or {}
            again = last.get("reconcileRequest") == token and last.get("name") != first
            return s if again and _condition(s, "Stalled").get("status") == "True" else None

        s = k.until(f"stack {name} run again for {token}", failed_again, within=600, interval=1)
        assert health(s, SCRIPTS) == Health("Degraded", _condition(s, "Stalled")["message"])
        assert seen <= {"Degraded", "Progressing"}, seen
    finally:
        delete(k, name)

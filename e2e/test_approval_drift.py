"""Issue 29 on a real node, as a user drives it: a Stack with ``approval.mode: Always`` waits with its
plan, which kstatus (the library Flux's health checks read) reads as InProgress, not Current;
``kubectl pko approve`` approves it and exactly that plan is applied (one up, with the plan). A
ConfigMap that Pulumi manages (through pulumi-kubernetes) changed out of band shows as drift on the
Stack and in the metrics, and ``remediate: true`` puts it back and clears ``Drifted``. The Stack is
examples/approval as users apply it (docs/examples.md), with drift detection added (report only).
examples/drift runs beside it, applied from its folder: its ConfigMap edited as soon as its up creates it,
its first check reports the drift (the ``DriftDetected`` event) and it is put back by one more up
(``remediate: true``), then ``DriftCleared``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pko.devtools.examples import local_example
from pko.devtools.kstatus import kstatus

from .conftest import Kube
from .stacks import gone, metrics, ready

pytestmark = [
    pytest.mark.timeout(1500),
    pytest.mark.pko_only("approval and drift detection are pko's"),
]

NAME = "approved"
DRIFT = "drift"  # examples/drift: its Stack, Program, ConfigMap drift-settings
PLUGIN = Path(sys.executable).with_name("kubectl-pko")


def plugin(k: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PLUGIN), *args], capture_output=True, text=True, env=k.env, timeout=120, check=False
    )


def condition(k: Kube, type_: str) -> dict[str, Any]:
    return k.condition(k.get("stack", NAME), type_)


def ups(k: Kube, name: str = NAME) -> list[dict[str, Any]]:
    items = k.json("get", "update", "-l", f"pulumi.com/stack-name={name}")["items"]
    return [u for u in items if (u.get("spec") or {}).get("type") == "up"]


def greeting(k: Kube, configmap: str) -> str | None:
    return ((k.get("configmap", configmap) or {}).get("data") or {}).get("greeting")


def drift_condition(k: Kube) -> str | None:
    return k.condition(k.get("stack", DRIFT), "Drifted").get("status")


def test_an_approved_plan_is_applied_once_and_drift_is_seen_and_repaired(kube: Kube, tmp_path: Path) -> None:
    k = kube
    drift = {"op": "add", "path": "/spec/driftDetection", "value": {"intervalSeconds": 60}}
    k.apply(k.run("kustomize", str(local_example("approval", tmp_path / "approval", [drift]))))
    example = k.run("kustomize", str(local_example(DRIFT, tmp_path / DRIFT)))
    k.apply(example)

    # examples/drift, its ConfigMap edited out of band as soon as its up has created it, so the first
    # check (due at once after the up) finds it while this Stack waits for its approval.
    k.until(f"{DRIFT}-settings created", lambda: greeting(k, f"{DRIFT}-settings") == "hello", 600, 1)
    k.run("patch", "configmap", f"{DRIFT}-settings", "--type=merge", "-p", '{"data":{"greeting":"edited"}}')
    assert ready(k, DRIFT)["status"]["outputs"] == {"greeting": "hello"}

    # It waits, with its plan: one ConfigMap to create, nothing applied yet.
    k.until("AwaitingApproval", lambda: condition(k, "Ready").get("reason") == "AwaitingApproval", 600)
    s = k.get("stack", NAME) or {}
    plan = s["status"]["plan"]
    assert plan["summary"] == {"create": 1, "update": 0, "delete": 0, "replace": 0}, plan
    assert k.get("configmap", f"{NAME}-settings") is None
    assert ups(k) == []
    shown = plugin(k, "status", NAME)
    assert plan["digest"] in shown.stdout, shown
    # Not Current to kstatus readers (Flux's health checks and dependsOn, kpt): it waits for a person.
    assert kstatus(s) == "InProgress", s["status"].get("conditions")

    approved = plugin(k, "approve", NAME)
    assert approved.returncode == 0, approved
    assert plan["digest"] in approved.stdout and "create" in approved.stdout, approved.stdout
    k.until("Ready", lambda: condition(k, "Ready").get("status") == "True", 600)
    done = ups(k)
    assert len(done) == 1 and done[0]["spec"].get("plan") == plan["update"], done
    assert (k.get("configmap", f"{NAME}-settings") or {})["data"] == {"greeting": "hello"}
    approved_stack = k.get("stack", NAME) or {}
    assert "plan" not in approved_stack["status"]  # used once
    assert kstatus(approved_stack) == "Current"

    # Out of band: the ConfigMap edited; the next check (every 60 s) reports it, read-only.
    k.run("patch", "configmap", f"{NAME}-settings", "--type=merge", "-p", '{"data":{"greeting":"edited"}}')

    def drifted() -> dict[str, Any] | None:
        drift = ((k.get("stack", NAME) or {}).get("status") or {}).get("drift") or {}
        return drift if drift.get("detected") else None

    drift = k.until("drift detected", drifted, 240, 5)
    (resource,) = drift["resources"]
    assert resource["urn"].endswith("kubernetes:core/v1:ConfigMap::settings"), resource
    assert any(p.startswith("data") for p in resource["paths"]), resource
    assert condition(k, "Drifted").get("status") == "True"
    assert (k.get("configmap", f"{NAME}-settings") or {})["data"] == {"greeting": "edited"}  # reported only
    assert len(ups(k)) == 1
    series = re.search(rf'pko_stack_drift_resources{{[^}}]*name="{NAME}"[^}}]*}} (\S+)', metrics(k))
    assert series and float(series.group(1)) == 1.0, metrics(k)

    # remediate (approval off, else the repair would wait for an approval too): put back, cleared.
    repair = {"approval": {"mode": "Never"}, "driftDetection": {"intervalSeconds": 60, "remediate": True}}
    k.run("patch", "stack", NAME, "--type=merge", "-p", json.dumps({"spec": repair}))
    k.until(
        "repaired",
        lambda: ((k.get("configmap", f"{NAME}-settings") or {}).get("data") or {}).get("greeting") == "hello",
        300,
        5,
    )
    k.until("Drifted False", lambda: condition(k, "Drifted").get("status") == "False", 300, 5)

    # examples/drift (remediate: true) found it and put it back by itself, with one up.
    k.until("drift example repaired", lambda: greeting(k, f"{DRIFT}-settings") == "hello", 300, 5)
    k.until("drift example Drifted False", lambda: drift_condition(k) == "False", 300, 5)
    events = k.json(
        "get", "events", "--field-selector", f"involvedObject.kind=Stack,involvedObject.name={DRIFT}"
    )
    reasons = {e["reason"] for e in events["items"]}
    assert {"DriftDetected", "DriftCleared"} <= reasons, reasons
    assert len(ups(k, DRIFT)) == 2
    k.run("delete", "stack", DRIFT, "--wait=false")

    k.run("delete", "stack", NAME, "--wait=false")
    gone(k, "stack", NAME, within=600)
    assert k.get("configmap", f"{NAME}-settings") is None
    k.run("delete", "program", NAME)
    k.run("delete", "pvc", f"{NAME}-state", "--wait=false")
    gone(k, "stack", DRIFT, within=600)
    assert k.get("configmap", f"{DRIFT}-settings") is None
    k.run("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=example)

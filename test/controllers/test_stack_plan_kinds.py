"""The Stack's kinds of Update (up, preview, destroy, refresh, drift check, approval preview,
approved up) as pure decisions: the Update each is created as and read back as, and what a lost,
cancelled or running Update of each kind leaves in the Stack's status; the source read a decision
asks for (no cluster; test_stack_plan.py, test_stack_approval.py and test_stack_drift.py drive the
whole reconcile per operation)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pko.controllers.resources import CANCEL_REQUEST_ANNOTATION, REFRESH_REQUEST_ANNOTATION
from pko.controllers.stack.absorb import Absorbed, absorb
from pko.controllers.stack.kinds import KINDS, UP, UpdateKind, kind_of, recorded_kind
from pko.controllers.stack.plan import CreateUpdate, Emit, Log, ReadSource, Unresolved, decide
from pko.controllers.stack.updateobject import Run, build_update
from pko.controllers.stack.waits import Awaited
from pko.machinery.controller import Result

from .test_stack_plan import (
    DONE_UP,
    SOURCE,
    condition,
    deployed,
    kinds,
    observed,
    parsed,
    stack,
    statuses,
    update,
    workspace,
)

Obj = dict[str, Any]
PLAN_HELD = {"digest": "sha256:p", "update": "s-p", "summary": {"create": 1}, "inputs": "sha256:i",
             "time": "2026-11-27T04:00:00Z"}  # fmt: skip
SINCE = "2026-11-27T04:00:00Z"


# --- the Update each kind is created as, and read back as ----------------------------------------

# The spec each kind's Update carries (beyond its type): how the Update says what it is for.
SHAPES: dict[str, tuple[str, Obj, tuple[str, ...]]] = {
    "up": ("up", {"refresh": True}, ("savePlan", "plan", "previewOnly")),
    "preview": ("preview", {"refresh": True}, ("savePlan", "plan", "previewOnly")),
    "destroy": ("destroy", {}, ("savePlan", "plan", "previewOnly", "refresh")),
    "refresh": ("refresh", {}, ("savePlan", "plan", "previewOnly", "refresh", "targetDependents")),
    "drift check": ("refresh", {"previewOnly": True}, ("savePlan", "plan", "refresh", "targetDependents")),
    "approval preview": ("preview", {"savePlan": True, "refresh": True}, ("plan", "previewOnly")),
    "approved up": ("up", {"plan": "s-p", "refresh": True}, ("savePlan", "previewOnly")),
}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_kind_is_created_with_what_tells_it_apart_and_read_back_as_itself(kind: UpdateKind) -> None:
    type_, carried, absent = SHAPES[kind.name]
    run = Run(kind, "m", refresh=True, plan="s-p")
    body = build_update(parsed(stack()), workspace(), run.type, run.message, run=run)
    spec = body["spec"]
    assert spec["type"] == type_
    assert {k: spec.get(k) for k in carried} == carried
    assert [k for k in absent if k in spec] == []
    assert kind_of(body) is kind


def test_a_refresh_drops_the_up_options_of_the_update_template_and_a_destroy_keeps_them() -> None:
    template = {"updateTemplate": {"spec": {"refresh": True, "targetDependents": True}}}
    obj = parsed(stack(template))
    refresh_kind, destroy_kind = (next(k for k in KINDS if k.name == n) for n in ("refresh", "destroy"))
    refresh = build_update(obj, workspace(), "refresh", "m", run=Run(refresh_kind, "m"))["spec"]
    assert "refresh" not in refresh and "targetDependents" not in refresh
    destroy = build_update(obj, workspace(), "destroy", "m", run=Run(destroy_kind, "m"))["spec"]
    assert destroy["refresh"] is True and destroy["targetDependents"] is True


def test_the_kind_in_flight_is_the_recorded_one_else_read_from_the_update_else_an_up() -> None:
    drift_update = update(type_="refresh")
    drift_update["spec"]["previewOnly"] = True
    assert recorded_kind({"kind": "plan"}, drift_update).name == "approval preview"
    assert recorded_kind({}, drift_update).name == "drift check"
    assert recorded_kind({}, update(type_="destroy")).name == "destroy"
    assert recorded_kind({}, None) is UP
    recorded = {k.recorded_as for k in KINDS}
    assert recorded == {
        None,
        "plan",
        "apply",
        "refresh",
        "drift",
    }  # the names status.currentUpdate.kind holds


# --- a lost, cancelled or running Update of each kind ------------------------------------------

# currentUpdate.kind -> (a lost one is a failed update, the recorded plan survives it)
LOST: dict[str | None, tuple[bool, bool]] = {
    None: (True, True),
    "apply": (True, False),
    "plan": (False, False),
    "refresh": (False, True),
    "drift": (False, True),
}


def with_current(kind: str | None, *, cancel: str | None = None, **status: Any) -> Obj:
    current: Obj = {"name": "s-2", "generation": 1, "commit": "sha256:1"}
    if kind:
        current["kind"] = kind
    if cancel:
        current["cancelRequest"] = cancel
    annotations = {CANCEL_REQUEST_ANNOTATION: cancel} if cancel else {}
    gated = {"approval": {"mode": "Always"}}
    return stack(gated, {"lastUpdate": DONE_UP, "currentUpdate": current, **status}, annotations=annotations)


@pytest.mark.parametrize("kind", list(LOST), ids=str)
def test_a_lost_update_counts_as_a_failure_and_spends_the_plan_as_its_kind_says(kind: str | None) -> None:
    fails, keeps_plan = LOST[kind]
    obj = with_current(kind, plan=PLAN_HELD)
    status = copy.deepcopy(obj["status"])
    absorbed = absorb(observed(obj), parsed(obj), status)
    assert isinstance(absorbed, Absorbed) and absorbed.recorded is None
    assert [w.event for w in absorbed.writes if isinstance(w, Log)] == ["current update is gone; moving on"]
    assert "currentUpdate" not in status
    assert ((status.get("lastFailure") or {}).get("reason") == "UpdateLost") is fails
    assert (status.get("plan") == PLAN_HELD) is keeps_plan


@pytest.mark.parametrize("kind", ["plan", "apply"])
def test_a_cancelled_plan_preview_or_approved_up_spends_the_plan(kind: str) -> None:
    ended = update(failed="Canceled", message="the Update was canceled")
    plan = decide(observed(with_current(kind, cancel="c1", plan=PLAN_HELD, observedCancelRequest="c1"),
                           current_update=ended, source=SOURCE))  # fmt: skip
    status = statuses(plan)[-1]
    assert "plan" not in status and status["lastFailure"]["reason"] == "Cancelled"
    assert [w.reason for w in plan.writes if isinstance(w, Emit)] == ["StackUpdateCancelled"]


def test_a_cancelled_drift_check_records_nothing_of_a_check() -> None:
    ended = update(type_="refresh", failed="Canceled", message="the Update was canceled")
    obj = with_current("drift", cancel="c1", observedCancelRequest="c1")
    status = statuses(decide(observed(obj, current_update=ended, source=SOURCE)))[-1]
    assert "drift" not in status and status["lastFailure"]["reason"] == "Cancelled"


def running(type_: str = "up") -> Obj:
    upd = update(type_=type_)
    upd["status"]["conditions"] = [{"type": "Progressing", "status": "True", "reason": "Progressing"}]
    return upd


def test_a_running_drift_check_leaves_the_conditions_alone_and_an_up_is_reconciling() -> None:
    ready = [{"type": "Ready", "status": "True", "reason": "ProcessingCompleted", "message": "done",
              "lastTransitionTime": SINCE}]  # fmt: skip
    check = decide(observed(with_current("drift", conditions=ready), current_update=running("refresh")))
    assert kinds(check) == ["WriteStatus"]
    assert condition(statuses(check)[0], "Ready") == ("True", "ProcessingCompleted", "done")
    assert condition(statuses(check)[0], "Reconciling") is None
    up = decide(observed(with_current(None, conditions=ready), current_update=running()))
    assert condition(statuses(up)[0], "Reconciling") == (
        "True",
        "StackProcessing",
        "stack is being processed",
    )


def test_an_update_being_cancelled_keeps_saying_so_while_it_runs() -> None:
    cancelling = [{"type": "Reconciling", "status": "True", "reason": "Cancelling", "message": "cancelling",
                   "lastTransitionTime": SINCE}]  # fmt: skip
    obj = with_current(None, cancel="c1", observedCancelRequest="c1", conditions=cancelling)
    plan = decide(observed(obj, current_update=running()))
    assert condition(statuses(plan)[0], "Reconciling") == ("True", "Cancelling", "cancelling")


def test_only_an_up_goes_through_the_approval_gate() -> None:
    gated = {"approval": {"mode": "Always"}}
    up = created_by(decide(observed(stack(gated), source=SOURCE)))
    assert up["spec"]["type"] == "preview" and up["spec"]["savePlan"] is True
    preview = created_by(decide(observed(stack({**gated, "preview": True}), source=SOURCE)))
    assert preview["spec"]["type"] == "preview" and "savePlan" not in preview["spec"]
    destroying = deployed(gated, plan=PLAN_HELD)
    plan = decide(observed(destroying, workspace=workspace()))
    destroy = next(w for w in plan.writes if isinstance(w, CreateUpdate)).body
    assert destroy["spec"]["type"] == "destroy" and "plan" not in destroy["spec"]
    assert statuses(plan)[-1]["plan"] == PLAN_HELD  # a destroy neither uses nor spends it


def created_by(plan: Any) -> Obj:
    assert plan.then is not None, kinds(plan)
    body: Obj = next(w for w in plan.then(workspace()).writes if isinstance(w, CreateUpdate)).body
    return body


# --- prerequisites by kind -------------------------------------------------------------------


def test_a_refresh_request_runs_while_prerequisites_are_unmet_and_an_up_waits_for_them() -> None:
    spec = {"prerequisites": [{"name": "ghost"}]}
    requested = stack(spec, {"lastUpdate": DONE_UP}, annotations={REFRESH_REQUEST_ANNOTATION: "r1"})
    refresh = decide(observed(requested, source=SOURCE, prerequisites={"ghost": None}))
    assert refresh.then is not None
    create = next(w for w in refresh.then(workspace()).writes if isinstance(w, CreateUpdate))
    assert create.body["spec"]["type"] == "refresh"
    up = decide(observed(stack(spec), source=SOURCE, prerequisites={"ghost": None}))
    reconciling = condition(statuses(up)[0], "Reconciling")
    assert up.then is None and reconciling is not None and reconciling[1] == "PrerequisiteNotSatisfied"


# --- the source read a decision asks for -------------------------------------------------------


def test_a_decision_that_needs_the_source_asks_for_it_and_decides_again_with_the_answer() -> None:
    obj = stack(finalizers=[])
    asked = decide(observed(obj))
    assert asked.writes == [ReadSource(parsed(obj))]  # nothing before the read: not even the finalizer
    assert asked.then is not None
    resolved = asked.then(SOURCE)
    assert kinds(resolved) == ["AddFinalizer", "WriteStatus", "ApplyWorkspace"]
    gone = asked.then(Unresolved("SourceUnavailable", "Program has no artifact", Awaited.PROGRAM))
    assert kinds(gone) == ["AddFinalizer", "WriteStatus"]
    assert condition(statuses(gone)[0], "Stalled") == ("True", "SourceUnavailable", "Program has no artifact")
    assert gone.result == Result.done()  # the Program watch wakes it: no timer (stack/waits.py)


def test_an_invalid_stack_reads_no_source() -> None:
    invalid = stack({"programRef": None, "projectRepo": None})
    plan = decide(observed(invalid))
    assert not any(isinstance(w, ReadSource) for w in plan.writes)
    assert condition(statuses(plan)[0], "Stalled") is not None

"""The approval gate (issue 29) as pure functions: the digest, the summary, the gate, and the
Stack's ``decide`` through preview -> wait -> approve -> up (no cluster; the real engine runs the
same path in test_real_engine_approval.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pko.controllers.resources import APPROVED_PLAN_ANNOTATION
from pko.controllers.stack.approval import (
    PLAN_INPUTS_ANNOTATION,
    Apply,
    Preview,
    Wait,
    canonical_json,
    destructive,
    gate,
    plan_digest,
    plan_inputs,
    summarize,
)
from pko.controllers.stack.plan import CreateUpdate, Emit, decide
from pko.machinery.controller import Result

from .test_stack_plan import DONE_UP, SOURCE, condition, kinds, observed, stack, statuses, update, workspace

Obj = dict[str, Any]
CM = "urn:pulumi:dev::p::kubernetes:core/v1:ConfigMap::cm"
ROOT = "urn:pulumi:dev::p::pulumi:pulumi:Stack::p-dev"
CHANGES = [
    {"urn": CM, "type": "kubernetes:core/v1:ConfigMap", "op": "update", "paths": ["data.b", "data.a"]},
    {"urn": ROOT, "type": "pulumi:pulumi:Stack", "op": "update"},
]
GATED = {"approval": {"mode": "Always"}}


# --- digests and summaries ---------------------------------------------------------------------


def test_canonical_json_has_one_spelling_per_value() -> None:
    assert canonical_json({"b": [1, "é"], "a": None}) == '{"a":null,"b":[1,"é"]}'


def test_the_digest_is_deterministic_and_covers_inputs_base_and_every_change() -> None:
    inputs = plan_inputs({"stack": "dev", "config": {"x": "1"}}, "sha256:1", refresh=False)
    digest = plan_digest(inputs, "s-1", CHANGES)
    assert digest.startswith("sha256:") and len(digest) == 71
    assert plan_digest(inputs, "s-1", list(reversed(copy.deepcopy(CHANGES)))) == digest  # order-free
    reordered = [{**CHANGES[0], "paths": ["data.a", "data.b"]}, CHANGES[1]]
    assert plan_digest(inputs, "s-1", reordered) == digest
    assert plan_digest(inputs, "s-2", CHANGES) != digest  # another base state
    assert plan_digest(inputs, "s-1", CHANGES, "s-p2") != plan_digest(inputs, "s-1", CHANGES, "s-p1")
    assert plan_digest(inputs, "s-1", CHANGES[:1]) != digest
    assert plan_digest(inputs, "s-1", [{**CHANGES[0], "op": "replace"}, CHANGES[1]]) != digest
    other = plan_inputs({"stack": "dev", "config": {"x": "2"}}, "sha256:1", refresh=False)
    assert plan_digest(other, "s-1", CHANGES) != digest


@pytest.mark.parametrize(
    "changed",
    [
        {"config": {"x": "2"}},
        {"environment": ["prod"]},
        {"envRefs": {"A": {"type": "Literal", "literal": {"value": "b"}}}},
        {"secretsRef": {"k": {"type": "Secret", "secret": {"name": "s", "key": "k"}}}},
        {"targets": ["urn:x"]},
        {"stack": "prod"},
    ],
)
def test_the_inputs_change_with_config_and_environment(changed: Obj) -> None:
    base = {"stack": "dev", "config": {"x": "1"}}
    assert plan_inputs({**base, **changed}, "c", refresh=False) != plan_inputs(base, "c", refresh=False)


def test_the_inputs_change_with_the_revision_and_refresh_but_not_unrelated_fields() -> None:
    spec = {"stack": "dev", "config": {"x": "1"}}
    first = plan_inputs(spec, "c1", refresh=False)
    assert plan_inputs(spec, "c2", refresh=False) != first
    assert plan_inputs(spec, "c1", refresh=True) != first
    assert (
        plan_inputs(
            {**spec, "resyncFrequencySeconds": 300, "approval": {"mode": "Always"}}, "c1", refresh=False
        )
        == first
    )


def test_the_summary_counts_each_user_resource_once_by_what_happens_to_it() -> None:
    changes = [
        {"urn": "a", "type": "t", "op": "create"},
        {"urn": "b", "type": "t", "op": "create-replacement"},
        {"urn": "b", "type": "t", "op": "replace"},
        {"urn": "b", "type": "t", "op": "delete-replaced"},
        {"urn": "c", "type": "t", "op": "delete"},
        {"urn": "d", "type": "t", "op": "update"},
        {"urn": "e", "type": "t", "op": "read"},
        {"urn": ROOT, "type": "pulumi:pulumi:Stack", "op": "create"},
        {"urn": "p", "type": "pulumi:providers:kubernetes", "op": "create"},
    ]
    assert summarize(changes) == {"create": 1, "update": 1, "delete": 1, "replace": 1}
    assert destructive({"create": 3, "update": 2, "delete": 0, "replace": 0}) is False
    assert destructive({"delete": 1}) and destructive({"replace": 1})


# --- the gate --------------------------------------------------------------------------------


def plan(summary: Obj | None = None, inputs: str = "in") -> Obj:
    counts = summary or {"create": 0, "update": 1, "delete": 0, "replace": 0}
    return {"digest": "sha256:d", "update": "s-p", "summary": counts, "inputs": inputs}


def test_the_gate_previews_without_a_plan_or_when_the_inputs_moved() -> None:
    assert isinstance(gate("Always", None, "", "in", "s", "ns"), Preview)
    moved = gate("Always", plan(), "sha256:d", "other", "s", "ns")
    assert isinstance(moved, Preview) and "changed" in moved.message


def test_the_gate_waits_for_the_recorded_digest_and_says_how_to_approve() -> None:
    waiting = gate("Always", plan(), "", "in", "s", "ns")
    assert isinstance(waiting, Wait)
    assert "kubectl annotate stack s -n ns --overwrite pulumi.com/approved-plan=sha256:d" in waiting.message
    assert "0 to create, 1 to update, 0 to delete, 0 to replace" in waiting.message
    stale = gate("Always", plan(), "sha256:old", "in", "s", "ns")
    assert isinstance(stale, Wait)
    assert stale.message.startswith("the approved digest sha256:old is not the recorded plan's sha256:d")
    approved = gate("Always", plan(), "sha256:d", "in", "s", "ns")
    assert approved == Apply("s-p", "sha256:d", "Applying approved plan sha256:d")


def test_on_destructive_applies_additions_at_once_and_holds_deletes_and_replacements() -> None:
    additive = plan({"create": 2, "update": 1, "delete": 0, "replace": 0})
    assert isinstance(gate("OnDestructive", additive, "", "in", "s", "ns"), Apply)
    assert isinstance(gate("Always", additive, "", "in", "s", "ns"), Wait)
    for summary in ({"create": 0, "update": 0, "delete": 1, "replace": 0}, {"replace": 1}):
        assert isinstance(gate("OnDestructive", plan(summary), "", "in", "s", "ns"), Wait)


def test_a_plan_that_changes_no_resource_is_applied_without_asking() -> None:
    empty = plan({"create": 0, "update": 0, "delete": 0, "replace": 0})
    assert isinstance(gate("Always", empty, "", "in", "s", "ns"), Apply)


# --- decide: preview, wait, approve, up ------------------------------------------------------


def run_then(plan_: Any) -> Any:
    assert plan_.then is not None, kinds(plan_)
    return plan_.then(workspace())


def created(plan_: Any) -> Obj:
    [create] = [w for w in plan_.writes if isinstance(w, CreateUpdate)]
    body: Obj = create.body
    return body


def preview_done(body: Obj, changes: list[Obj]) -> Obj:
    done = update(body["metadata"]["name"], type_="preview", changes=changes)
    done["spec"] = body["spec"]
    done["metadata"]["annotations"] = body["metadata"]["annotations"]
    return done


def current_of(status: Obj) -> Obj:
    current: Obj = status["currentUpdate"]
    return current


def test_an_up_under_approval_previews_with_a_saved_plan_then_waits_without_hot_looping() -> None:
    first = run_then(decide(observed(stack(GATED), source=SOURCE)))
    body = created(first)
    assert body["spec"]["type"] == "preview" and body["spec"]["savePlan"] is True
    assert body["metadata"]["annotations"][PLAN_INPUTS_ANNOTATION].startswith("sha256:")
    status = statuses(first)[-1]
    assert current_of(status)["kind"] == "plan"

    # The preview completes: its plan is recorded, an Event says so, the Stack waits.
    obj = stack(GATED, status)
    waiting = decide(observed(obj, current_update=preview_done(body, CHANGES), source=SOURCE))
    assert waiting.then is None and waiting.result == Result.done()
    recorded = statuses(waiting)[-1]
    assert "currentUpdate" not in recorded and "lastUpdate" not in recorded  # a plan is not a sync
    assert recorded["plan"]["update"] == body["metadata"]["name"]
    assert recorded["plan"]["summary"] == {"create": 0, "update": 1, "delete": 0, "replace": 0}
    ready = condition(recorded, "Ready")
    assert ready is not None and ready[:2] == ("False", "AwaitingApproval")
    assert condition(recorded, "Reconciling") is None and condition(recorded, "Stalled") is None
    reasons = [w.reason for w in waiting.writes if isinstance(w, Emit)]
    assert reasons == ["PlanRecorded", "AwaitingApproval"]

    # Reconciled again without an approval: the same wait, no Update, no Event.
    again = decide(observed(stack(GATED, recorded), source=SOURCE))
    assert again.then is None and kinds(again) == ["WriteStatus"]
    assert statuses(again)[-1] == recorded


def awaiting_status(*, approved: str | None = None, spec: Obj | None = None) -> tuple[Obj, Obj]:
    first = run_then(decide(observed(stack(spec or GATED), source=SOURCE)))
    body = created(first)
    obj = stack(spec or GATED, statuses(first)[-1])
    recorded = statuses(decide(observed(obj, current_update=preview_done(body, CHANGES), source=SOURCE)))[-1]
    annotations = {APPROVED_PLAN_ANNOTATION: approved} if approved is not None else {}
    return stack(spec or GATED, recorded, annotations=annotations), recorded


def test_approving_the_recorded_digest_runs_the_up_with_the_saved_plan() -> None:
    _, recorded = awaiting_status()
    obj, _ = awaiting_status(approved=recorded["plan"]["digest"])
    applying = run_then(decide(observed(obj, source=SOURCE)))
    body = created(applying)
    assert body["spec"]["type"] == "up" and body["spec"]["plan"] == recorded["plan"]["update"]
    status = statuses(applying)[-1]
    assert current_of(status)["kind"] == "apply"

    # It succeeds: recorded as the sync, the plan consumed; the same approval applies nothing more.
    done = update(body["metadata"]["name"], type_="up", resourceChanges={"update": 1})
    done["spec"] = body["spec"]
    approved = stack(GATED, status, annotations=obj["metadata"]["annotations"])
    after = decide(observed(approved, current_update=done, source=SOURCE))
    final = statuses(after)[-1]
    assert (
        final["lastUpdate"]["name"] == body["metadata"]["name"]
        and final["lastUpdate"]["state"] == "succeeded"
    )
    assert "plan" not in final
    assert condition(final, "Ready") is not None and condition(final, "Ready")[:2] == (
        "True",
        "ProcessingCompleted",
    )  # type: ignore[index]
    assert not any(isinstance(w, CreateUpdate) for w in after.writes)


def test_a_stale_approval_waits_with_a_message_naming_both_digests() -> None:
    obj, recorded = awaiting_status(approved="sha256:stale")
    plan_ = decide(observed(obj, source=SOURCE))
    assert plan_.then is None
    ready = condition(statuses(plan_)[-1], "Ready")
    assert ready is not None and ready[1] == "AwaitingApproval"
    assert (
        f"the approved digest sha256:stale is not the recorded plan's {recorded['plan']['digest']}"
        in ready[2]
    )


def test_an_approved_plan_for_an_old_revision_is_previewed_again() -> None:
    _, recorded = awaiting_status()
    obj, _ = awaiting_status(approved=recorded["plan"]["digest"])
    moved = SOURCE.__class__(SOURCE.source, "sha256:2")
    plan_ = run_then(decide(observed(obj, source=moved)))
    body = created(plan_)
    assert body["spec"]["type"] == "preview" and body["spec"]["savePlan"] is True
    assert "plan" not in statuses(plan_)[-1]


@pytest.mark.parametrize("reason", ["PlanMismatch", "PlanNotFound"])
def test_an_up_whose_plan_no_longer_holds_previews_again_instead_of_failing(reason: str) -> None:
    _, recorded = awaiting_status()
    obj, _ = awaiting_status(approved=recorded["plan"]["digest"])
    applying = run_then(decide(observed(obj, source=SOURCE)))
    body = created(applying)
    refused = update(body["metadata"]["name"], type_="up", failed=reason, message="the plan no longer holds")
    refused["spec"] = body["spec"]
    status = statuses(applying)[-1]
    again = decide(observed(stack(GATED, status, annotations=obj["metadata"]["annotations"]),
                            current_update=refused, source=SOURCE))  # fmt: skip
    assert "PlanOutdated" in [w.reason for w in again.writes if isinstance(w, Emit)]
    middle = statuses(again)[0]
    assert "lastFailure" not in middle and "lastUpdate" not in middle  # not a failure to back off from
    preview = created(run_then(again))
    assert preview["spec"]["type"] == "preview" and preview["spec"]["savePlan"] is True


def test_a_failed_plan_preview_is_a_failed_sync_that_backs_off() -> None:
    first = run_then(decide(observed(stack(GATED), source=SOURCE)))
    body = created(first)
    failed = preview_done(body, [])
    failed["status"]["conditions"][1] = {"type": "Failed", "status": "True", "reason": "ProgramError"}
    failed["status"]["message"] = "error: bad program"
    plan_ = decide(observed(stack(GATED, statuses(first)[-1]), current_update=failed, source=SOURCE))
    status = statuses(plan_)[-1]
    assert status["lastUpdate"]["state"] == "failed" and status["lastUpdate"]["type"] == "preview"
    assert status["lastFailure"]["reason"] == "ProgramError" and "nextRetryTime" in status
    assert plan_.then is None  # waits for the backoff


def test_without_approval_an_up_runs_at_once_as_before() -> None:
    body = created(run_then(decide(observed(stack(), source=SOURCE))))
    assert body["spec"]["type"] == "up"
    assert not {"plan", "savePlan", "previewOnly"} & set(body["spec"])
    assert "annotations" not in body["metadata"]


def test_a_synced_stack_drops_a_plan_it_no_longer_needs() -> None:
    recorded = {"digest": "sha256:d", "update": "s-p", "inputs": "x", "summary": {"create": 1},
                "time": "2026-11-27T04:00:00Z"}  # fmt: skip
    status = {"lastUpdate": DONE_UP, "plan": recorded}
    plan_ = decide(observed(stack(GATED, status), source=SOURCE))
    assert "plan" not in statuses(plan_)[-1]


@pytest.mark.parametrize("approval", [None, {"mode": "Never"}])
def test_switching_approval_off_drops_the_waiting_plan_and_runs_the_up(approval: Obj | None) -> None:
    obj, _ = awaiting_status()
    obj["spec"].pop("approval")
    if approval is not None:
        obj["spec"]["approval"] = approval
    plan_ = decide(observed(obj, source=SOURCE))
    assert "plan" not in statuses(plan_)[-1]
    body = created(run_then(plan_))
    assert body["spec"]["type"] == "up" and "plan" not in body["spec"]

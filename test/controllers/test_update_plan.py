"""The Update reconcile's decisions as pure functions (no cluster): ``decide`` (``refused``: in
``test_update_refused.py``)."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from pko.api.generated.pko.agent import v1 as pb

from pko.controllers.resources import STACK_FINALIZER
from pko.controllers.update import status as us
from pko.controllers.update.plan import (
    STACK_RECORD_RECHECK,
    CancelGone,
    CancelOperation,
    CreateOutputs,
    DeleteUpdate,
    Emit,
    Failure,
    Follow,
    ForgetOutcome,
    KeepOutcome,
    Log,
    Observed,
    Outcome,
    RemoveFinalizer,
    SelectAndStart,
    StopFollowing,
    WriteStatus,
    decide,
    refused,
    stack_recorded,
    watch_ended,
)
from pko.machinery.controller import Result

from .updatecases import (
    KEY,
    NOW,
    READY_WS,
    UID,
    assert_ended,
    assert_transient_wait,
    completed,
    cond,
    failed_result,
    kinds,
    make_update,
    observed,
    only_status,
    running,
    start_refused,
    succeeded,
)

# --- decide ----------------------------------------------------------------------------------------


def test_a_vanished_update_without_a_watch_forgets_and_stops() -> None:
    plan = decide(Observed(KEY, None, NOW))
    assert plan.writes == [ForgetOutcome(None), StopFollowing()]
    assert plan.result == Result.done()


def test_a_vanished_update_with_a_watch_cancels_its_operation() -> None:
    last = running(make_update())
    plan = decide(Observed(KEY, None, NOW, last=last))
    assert plan.writes == [ForgetOutcome(UID), StopFollowing(), CancelGone(last)]
    assert plan.result == Result.done()


def test_a_pending_result_is_written_without_keeping_it_again() -> None:
    update = running(make_update())
    outcome = Outcome(UID, result=succeeded())
    plan = decide(observed(update, outcome=outcome))
    assert kinds(plan) == ["CreateOutputs", "WriteStatus", "Log", "Emit", "ForgetOutcome"]
    create = plan.writes[0]
    assert isinstance(create, CreateOutputs) and create.outcome == outcome
    assert create.secret["metadata"]["name"] == "s-18f-stack-outputs"
    status = only_status(plan, 1)
    assert status["outputs"] == "s-18f-stack-outputs"
    assert cond(status, "Complete")[:2] == ("True", "Updated")
    assert status["endTime"] == "2025-01-02T03:01:00Z"
    assert plan.writes[2] == Log(
        "update succeeded", {"update": KEY, "operation": UID, "type": "up", "reason": "UpdateSucceeded"}
    )
    assert plan.writes[3] == Emit("Normal", "UpdateSucceeded", "up succeeded")
    assert plan.writes[4] == ForgetOutcome(UID)
    assert plan.result == Result.done()


def test_a_result_after_removing_a_stale_lock_is_a_warning_event_naming_it() -> None:
    removed = pb.RemovedLock(
        lock=pb.LockInfo(owner="pulumi@web-workspace-0 (pid 31)"),
        pending_operations=[
            pb.PendingOperation(urn="urn:pulumi:dev::p::test:index:Hang::wait", type="creating")
        ],
    )
    for result in (succeeded(removed_lock=removed), failed_result()):
        if result.state == pb.OperationState.FAILED:
            result.removed_lock = removed
        plan = decide(observed(running(make_update()), outcome=Outcome(UID, result=result)))
        note = us.removed_lock_note(result)
        assert "pulumi@web-workspace-0 (pid 31)" in note and "test:index:Hang::wait" in note, note
        events = [w for w in plan.writes if isinstance(w, Emit)]
        assert events[-1] == Emit("Warning", "StaleLockRemoved", note), events
        assert len(events) == 2 and events[0].reason in {"UpdateSucceeded", "UpdateFailed"}, events
        (log,) = [w for w in plan.writes if isinstance(w, Log)]
        assert log.fields["removedLock"] == note, log
    plan = decide(observed(running(make_update()), outcome=Outcome(UID, result=succeeded())))
    assert not [w for w in plan.writes if isinstance(w, Emit) and w.reason == "StaleLockRemoved"]


def test_a_pending_failure_without_outputs_writes_no_secret() -> None:
    update = running(make_update(type="preview"))
    outcome = Outcome(UID, result=failed_result())
    plan = decide(observed(update, outcome=outcome))
    assert kinds(plan) == ["WriteStatus", "Log", "Emit", "ForgetOutcome"]
    assert "outputs" not in only_status(plan)
    log = plan.writes[1]
    assert isinstance(log, Log) and log.event == "update failed"
    assert log.fields["reason"] == "UpdateFailed" and log.fields["type"] == "preview"
    assert plan.writes[2] == Emit("Warning", "UpdateFailed", "preview failed (UpdateFailed): boom")


def test_a_pending_end_is_written() -> None:
    update = running(make_update())
    outcome = Outcome(UID, reason=us.REASON_OPERATION_LOST, message="the pod was replaced")
    assert_ended(
        decide(observed(update, outcome=outcome)),
        us.REASON_OPERATION_LOST,
        "the pod was replaced",
        keep=False,
    )


def test_an_outcome_of_another_incarnation_is_dropped_first() -> None:
    update = running(make_update())
    plan = decide(observed(update, outcome=Outcome("other-uid", reason="X")))
    assert plan.writes == [ForgetOutcome(None), Follow()]


def test_an_outcome_of_a_completed_update_is_dropped() -> None:
    update = completed(make_update(), NOW)
    plan = decide(observed(update, outcome=Outcome(UID, reason="X")))
    assert plan.writes == [ForgetOutcome(None)]
    assert plan.result == Result.done()


def test_complete_without_ttl_is_done() -> None:
    plan = decide(observed(completed(make_update(), NOW)))
    assert plan.writes == [] and plan.result == Result.done()


def test_complete_with_ttl_remaining_requeues_for_the_rest() -> None:
    update = completed(make_update(ttlAfterCompleted="10m"), NOW - timedelta(minutes=4))
    plan = decide(observed(update))
    assert plan.writes == []
    assert plan.result == Result.requeue_after(360.0)


def test_complete_with_ttl_expired_deletes_then_says_so() -> None:
    update = completed(make_update(ttlAfterCompleted="1m"), NOW - timedelta(minutes=4))
    plan = decide(observed(update))
    assert plan.writes == [
        DeleteUpdate(),
        Log("update expired", {"update": KEY, "ttl": "1m"}),
        Emit("Normal", "UpdateExpired", "ttl expired and was deleted"),
    ]
    assert plan.result == Result.done()


def test_complete_with_ttl_expired_waits_for_the_stack_to_record_it() -> None:
    update = completed(make_update(ttlAfterCompleted="1m"), NOW - timedelta(minutes=4))
    plan = decide(observed(update, stack_recorded=False))
    assert plan.writes == []
    assert plan.result == Result.requeue_after(STACK_RECORD_RECHECK)


def test_complete_with_a_bad_ttl_is_done() -> None:
    update = completed(make_update(ttlAfterCompleted="soon"), NOW - timedelta(minutes=4))
    plan = decide(observed(update))
    assert plan.writes == [] and plan.result == Result.done()


def test_complete_and_deleting_drops_the_finalizer_once_recorded() -> None:
    update = completed(make_update(), NOW)
    update["metadata"]["deletionTimestamp"] = "2025-01-02T03:04:00Z"
    update["metadata"]["finalizers"] = [STACK_FINALIZER]
    assert decide(observed(update)).writes == [RemoveFinalizer()]
    waiting = decide(observed(update, stack_recorded=False))
    assert waiting.writes == [] and waiting.result == Result.requeue_after(STACK_RECORD_RECHECK)
    update["metadata"]["finalizers"] = []
    assert decide(observed(update, stack_recorded=False)).writes == []


def test_stack_recorded() -> None:
    update = make_update()
    assert stack_recorded(update, None)
    assert stack_recorded(update, {"status": {"lastUpdate": {"name": "s-18f"}}})
    assert not stack_recorded(update, {"status": {"lastUpdate": {"name": "s-17a"}}})
    assert not stack_recorded(update, {"status": {}})


def test_running_follows() -> None:
    plan = decide(observed(running(make_update())))
    assert plan.writes == [Follow()] and plan.result == Result.done() and plan.then is None


def test_running_and_deleting_cancels_then_follows_or_records() -> None:
    update = running(make_update())
    update["metadata"]["deletionTimestamp"] = "2025-01-02T03:04:00Z"
    plan = decide(observed(update))
    assert plan.writes == [CancelOperation()] and plan.then is not None
    assert plan.then(pb.OperationStatus(operation_id=UID), NOW).writes == [Follow()]
    recorded = plan.then(pb.OperationStatus(operation_id=UID, result=failed_result()), NOW)
    assert kinds(recorded) == ["KeepOutcome", "WriteStatus", "Log", "Emit", "ForgetOutcome"]
    assert recorded.writes[0] == KeepOutcome(Outcome(UID, result=failed_result()))


def test_running_and_orphaned_cancels() -> None:
    plan = decide(observed(running(make_update(owned=False))))
    assert plan.writes == [CancelOperation()]


def test_deleted_before_start_ends_canceled() -> None:
    update = make_update()
    update["metadata"]["deletionTimestamp"] = "2025-01-02T03:04:00Z"
    assert_ended(
        decide(observed(update)), us.REASON_CANCELED, "the Update was deleted before its operation started"
    )


def test_orphaned_before_start_ends_canceled() -> None:
    plan = decide(observed(make_update(owned=False)))
    assert_ended(plan, us.REASON_CANCELED, "the Update has no controlling owner (orphaned)")


def test_workspace_missing_waits_for_it() -> None:
    plan = decide(observed(make_update(), workspace=None))
    assert kinds(plan) == ["WriteStatus"] and plan.result == Result.done()
    assert cond(only_status(plan), "Progressing") == ("False", "WorkspaceNotFound", "workspace 's' not found")


def test_workspace_not_ready_waits_for_it() -> None:
    ws = copy.deepcopy(READY_WS)
    ws["status"]["conditions"][0]["status"] = "False"
    plan = decide(observed(make_update(), workspace=ws))
    assert kinds(plan) == ["WriteStatus"] and plan.result == Result.done()
    assert cond(only_status(plan), "Progressing") == (
        "False",
        "WorkspaceNotReady",
        "workspace 's' is not ready",
    )


def test_a_bad_request_ends_the_update() -> None:
    plan = decide(observed(make_update(type="bogus")))
    end = plan.writes[0]
    assert isinstance(end, KeepOutcome) and end.outcome.reason == us.REASON_UPDATE_FAILED
    assert_ended(plan, us.REASON_UPDATE_FAILED, end.outcome.message)


def test_start_selects_and_starts() -> None:
    update = make_update()
    plan = decide(observed(update))
    assert plan.writes == [SelectAndStart("dev", us.operation_request(update))]
    assert plan.result == Result.done() and plan.then is not None


def test_started_and_running_marks_it_started_then_follows() -> None:
    plan = decide(observed(make_update()))
    assert plan.then is not None
    later = NOW + timedelta(seconds=3)
    rest = plan.then(pb.OperationStatus(operation_id=UID, attached=True), later)
    assert kinds(rest) == ["WriteStatus", "Log", "Follow"] and rest.result == Result.done()
    status = only_status(rest)
    assert cond(status, "Progressing")[:2] == ("True", "Progressing")
    assert status["startTime"] == "2025-01-02T03:04:08Z"
    assert rest.writes[1] == Log("update started", {"update": KEY, "operation": UID, "attached": True})


def test_started_with_a_result_records_it() -> None:
    plan = decide(observed(make_update()))
    assert plan.then is not None
    rest = plan.then(pb.OperationStatus(operation_id=UID, result=succeeded()), NOW)
    assert kinds(rest) == ["KeepOutcome", "CreateOutputs", "WriteStatus", "Log", "Emit", "ForgetOutcome"]
    assert rest.writes[4] == Emit("Normal", "UpdateSucceeded", "up succeeded")


# --- a destroy or refresh never creates the stack (issue 30) ---------------------------------------


def _ws_declaring(create: bool | None) -> dict[str, Any]:
    ws = copy.deepcopy(READY_WS)
    entry: dict[str, Any] = {"name": "dev"}
    if create is not None:
        entry["create"] = create
    ws["spec"] = {"stacks": [entry]}
    return ws


def test_only_a_preview_or_an_up_may_create_the_stack() -> None:
    for type_, create in (("up", True), ("preview", True), ("destroy", False), ("refresh", False)):
        plan = decide(observed(make_update(type=type_)))
        write = plan.writes[0]
        assert isinstance(write, SelectAndStart) and write.create is create, type_


def test_an_up_does_not_create_a_stack_the_workspace_may_not_create() -> None:
    for declared, create in ((False, False), (True, True), (None, False)):
        obs = Observed(KEY, make_update(type="up"), NOW, workspace=_ws_declaring(declared))
        write = decide(obs).writes[0]
        assert isinstance(write, SelectAndStart) and write.create is create, declared


def test_a_stack_missing_from_the_backend_ends_the_update_stack_not_found() -> None:
    update = make_update(type="destroy")
    write = decide(observed(update)).writes[0]
    assert isinstance(write, SelectAndStart)
    message = "stack 'dev' not found in backend file:///state"
    failure = Failure(code="NOT_FOUND", reason="NotFound", message=message)
    plan = refused(observed(update), write, failure, NOW)
    assert plan is not None
    assert_ended(plan, us.REASON_STACK_NOT_FOUND, message)


# --- update plans (issue 29) -------------------------------------------------------------------------


def _saved_preview() -> dict[str, Any]:
    preview = make_update(type="preview", savePlan=True)
    preview["metadata"].update(name="s-17e", uid="uid-of-s-17e")
    preview["status"] = us.result_status(preview, succeeded(), None, NOW)
    return preview


def test_an_up_with_a_plan_applies_the_named_previews_plan_by_its_uid() -> None:
    update = make_update(plan="s-17e")
    plan = decide(observed(update, plan_source=_saved_preview()))
    (start,) = plan.writes
    assert isinstance(start, SelectAndStart) and start.request.up is not None
    assert start.request.up.plan == "uid-of-s-17e"
    assert start.request == us.operation_request(update, "uid-of-s-17e")


def test_an_up_whose_plan_preview_is_gone_ends_plan_not_found() -> None:
    plan = decide(observed(make_update(plan="s-17e"), plan_source=None))
    assert_ended(plan, us.REASON_PLAN_NOT_FOUND, "the plan's preview Update 's-17e' was not found")


def test_a_plan_is_only_resolved_for_an_up() -> None:
    preview = make_update(type="preview", plan="s-17e")
    (start,) = decide(observed(preview)).writes
    assert isinstance(start, SelectAndStart) and start.request.preview is not None


# --- another operator's agent (a switch from the Go operator) --------------------------------------

GO_ANSWER = "unknown service pko.agent.v1.AutomationService"


def go_running() -> dict[str, Any]:
    """An Update the Go operator started (its conditions as Go writes them), Progressing."""
    update = make_update()
    update["status"] = {
        "observedGeneration": 1,
        "startTime": "2025-01-02T03:00:00Z",
        "conditions": [
            {"type": "Progressing", "status": "True", "reason": "Progressing", "message": ""},
            {"type": "Complete", "status": "False", "reason": "Progressing", "message": ""},
        ],
    }
    return update


def test_a_followed_operation_ends_at_once_when_the_agent_is_another_operators() -> None:
    ended = watch_ended(UID, "UNIMPLEMENTED", GO_ANSWER)
    assert ended is not None and ended.uid == UID and ended.reason == us.REASON_OPERATION_LOST
    assert GO_ANSWER in ended.message
    for said in ("another operator's agent", "Go Pulumi Kubernetes Operator", "rolls to pko's agent"):
        assert said in ended.message
    lost = watch_ended(UID, "NOT_FOUND", "unknown operation")
    assert lost is not None and lost.reason == us.REASON_OPERATION_LOST and "replaced" in lost.message
    # anything else leaves it running: tried again within the unreachable budget
    for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "INTERNAL"):
        assert watch_ended(UID, code, "x") is None


def test_the_go_operators_update_in_flight_is_followed_then_ends_with_one_result_never_started() -> None:
    update = go_running()
    assert kinds(decide(observed(update))) == ["Follow"]  # never started again: only followed
    ended = watch_ended(UID, "UNIMPLEMENTED", GO_ANSWER)
    assert ended is not None
    plan = decide(observed(update, outcome=ended))
    assert_ended(plan, us.REASON_OPERATION_LOST, ended.message, keep=False)
    write = plan.writes[0]
    assert isinstance(write, WriteStatus) and write.outcome == ended  # preconditioned: written once
    update["status"] = write.status
    after = decide(observed(update, outcome=ended))
    assert kinds(after) == ["ForgetOutcome"]  # recorded: nothing is written or started again
    assert kinds(decide(observed(update))) == []


def test_an_update_not_started_waits_for_pkos_agent_instead_of_failing() -> None:
    plan = start_refused(Failure(code="UNIMPLEMENTED", reason="Unimplemented", message=GO_ANSWER))
    assert plan is not None
    text = cond(only_status(plan), "Progressing")[2]
    assert_transient_wait(plan, text)
    assert (
        GO_ANSWER in text and "another operator's agent" in text and text.endswith("the Update starts there")
    )

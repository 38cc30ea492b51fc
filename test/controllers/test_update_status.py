"""The Update's status, outputs Secret and operation request as pure functions (no cluster)."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pko.api.generated.pko.agent import v1 as pb

from pko.controllers.update import status as us
from pko.controllers.update.watch import UpdateWatches
from pko.machinery.conditions import get_condition

from .builders import make_update, succeeded

NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def cond(status: dict[str, Any], type_: str) -> tuple[str, str]:
    c = get_condition(status["conditions"], type_)
    assert c is not None
    return c["status"], c["reason"]


def test_sanitize_output_key() -> None:
    assert us.sanitize_output_key("simple-key_1.x") == "simple-key_1.x"
    assert us.sanitize_output_key("a b/c:d$é") == "a_b_c_d__"


def test_outputs_secret_shape() -> None:
    update = make_update()
    outputs = {
        "url": pb.OutputValue(value=b'"http://x"', secret=False),
        "db password": pb.OutputValue(value=b'"hunter2"', secret=True),
        "a/token": pb.OutputValue(value=b'{"k": 1}', secret=True),
    }
    secret = us.outputs_secret(update, outputs)
    meta = secret["metadata"]
    assert meta["name"] == "s-18f-stack-outputs"
    assert meta["namespace"] == "ns"
    assert meta["labels"] == {"auto.pulumi.com/component": "update", "auto.pulumi.com/update-name": "s-18f"}
    assert json.loads(meta["annotations"]["pulumi.com/secrets"]) == ["a_token", "db_password"]
    assert secret["immutable"] is True
    decoded = {k: json.loads(base64.b64decode(v)) for k, v in secret["data"].items()}
    assert decoded == {"url": "http://x", "db_password": "hunter2", "a_token": {"k": 1}}
    (ref,) = meta["ownerReferences"]
    assert ref["kind"] == "Update" and ref["controller"] is True and ref["uid"] == update["metadata"]["uid"]


def test_outputs_secret_no_secrets_annotation_is_empty_list() -> None:
    secret = us.outputs_secret(make_update(), {})
    assert secret["metadata"]["annotations"]["pulumi.com/secrets"] == "[]"
    assert secret["data"] == {}


def test_result_status_success() -> None:
    update = make_update()
    update["status"] = us.started_status(update, NOW)
    status = us.result_status(update, succeeded(), "s-18f-stack-outputs", NOW)
    assert cond(status, "Progressing") == ("False", "Complete")
    assert cond(status, "Complete") == ("True", "Updated")
    assert cond(status, "Failed") == ("False", "UpdateSucceeded")
    assert status["outputs"] == "s-18f-stack-outputs"
    assert status["permalink"] == "file:///x"
    assert status["projectInfo"] == {"name": "proj", "runtime": "yaml"}
    assert status["observedGeneration"] == 3
    assert status["startTime"] == "2025-01-02T03:04:05Z"  # kept from the start
    assert status["endTime"] == "2025-01-02T03:01:00Z"
    assert status["message"] == "deploy it"
    assert "resourceChanges" not in status  # the agent said nothing of them


def test_result_status_keeps_the_resource_changes() -> None:
    update = make_update()
    result = succeeded(change_summary={"same": 2, "create": 1})
    status = us.result_status(update, result, None, NOW)
    assert status["resourceChanges"] == {"create": 1, "same": 2}


STEP2 = "urn:pulumi:dev::p::command:local:Command::step2"
SLOW = "urn:pulumi:dev::p::command:local:Command::slow"


def test_result_status_lists_the_cleared_and_the_remaining_pending_operations() -> None:
    result = succeeded(
        cleared_pending_operations=[pb.PendingOperation(urn=STEP2, type="creating")],
        pending_operations=[pb.PendingOperation(urn=SLOW, type="creating")],
    )
    status = us.result_status(make_update(), result, None, NOW)
    assert status["clearedPendingOperations"] == [{"urn": STEP2, "type": "creating"}]
    assert status["pendingOperations"] == [{"urn": SLOW, "type": "creating"}]
    assert cond(status, "Failed") == ("False", "UpdateSucceeded")
    assert {"pendingOperations", "clearedPendingOperations"} <= set(us.STATUS_FIELDS)


def test_result_status_without_pending_operations_has_neither_field() -> None:
    status = us.result_status(make_update(), succeeded(), None, NOW)
    assert "pendingOperations" not in status and "clearedPendingOperations" not in status


def test_a_failure_lists_its_pending_operations_even_from_an_agent_that_only_reports_them_there() -> None:
    pending = [pb.PendingOperation(urn=STEP2, type="creating")]
    newer = failed("StackLocked", pending_operations=pending)
    newer.pending_operations = pending
    older = failed("StackLocked", pending_operations=pending)
    for result in (newer, older):
        status = us.result_status(make_update(), result, None, NOW)
        assert status["pendingOperations"] == [{"urn": STEP2, "type": "creating"}]
        assert "clearedPendingOperations" not in status


def failed(reason: str, **failure: Any) -> pb.OperationResult:
    return pb.OperationResult(
        operation_id="x",
        type=pb.OperationType.UP,
        state=pb.OperationState.FAILED,
        failure=pb.Failure(reason=reason, **failure),
    )


def test_result_status_program_error_message_is_the_tail() -> None:
    detail = "\n".join(f"line {i}" for i in range(100)) + "\nerror: boom"
    status = us.result_status(make_update(), failed("ProgramError", message="boom", detail=detail), None, NOW)
    assert cond(status, "Complete") == ("True", "Updated")
    assert cond(status, "Failed") == ("True", "ProgramError")
    lines = status["message"].splitlines()
    assert lines[0] == "boom"
    assert lines[-1] == "error: boom"
    assert len(lines) <= 1 + us.MESSAGE_LINES
    assert "line 0" not in status["message"]
    assert "outputs" not in status
    assert status["endTime"] == "2025-01-02T03:04:05Z"


def test_result_message_lock_and_pending_operations() -> None:
    result = failed(
        "StackLocked",
        message="the stack is locked by me@host (pid 42)",
        lock=pb.LockInfo(owner="me@host (pid 42)", location="file:///locks/x.json"),
        pending_operations=[
            pb.PendingOperation(urn="urn:pulumi:dev::p::test:index:Echo::a", type="creating")
        ],
    )
    message = us.result_message(result)
    assert "lock held by me@host (pid 42) at file:///locks/x.json" in message
    assert "pending operations: creating urn:pulumi:dev::p::test:index:Echo::a" in message
    assert us.failed_reason(result) == "StackLocked"


REMOVED = pb.RemovedLock(
    lock=pb.LockInfo(
        owner="pulumi@web-workspace-0 (pid 31)",
        location="file:///locks/x.json",
        acquired=datetime(2025, 1, 2, 2, 59, 0, tzinfo=UTC),
    ),
    pending_operations=[pb.PendingOperation(urn=STEP2, type="creating")],
)


def test_a_success_after_removing_a_stale_lock_says_whose_and_what_its_update_left() -> None:
    status = us.result_status(make_update(), succeeded(removed_lock=REMOVED), None, NOW)
    note, summary = status["message"].splitlines()
    assert note.startswith(
        "removed the stack's lock held by pulumi@web-workspace-0 (pid 31), taken at 2025-01-02T02:59:00Z: "
    ), note
    assert note.endswith(f"left 1 pending operation(s), check each resource: creating {STEP2}"), note
    assert summary == "deploy it"
    assert cond(status, "Failed") == ("False", "UpdateSucceeded")
    # Nothing removed, nothing said; a lock with no pending operations, none listed.
    assert us.result_status(make_update(), succeeded(), None, NOW)["message"] == "deploy it"
    bare = us.removed_lock_note(succeeded(removed_lock=pb.RemovedLock(lock=pb.LockInfo(owner="a@b"))))
    assert bare.startswith("removed the stack's lock held by a@b: ") and "pending" not in bare, bare


def test_a_failure_after_removing_a_stale_lock_keeps_its_own_message_first() -> None:
    result = failed("ProgramError", message="boom", detail="error: boom")
    result.removed_lock = REMOVED
    status = us.result_status(make_update(), result, None, NOW)
    lines = status["message"].splitlines()
    assert lines[0] == "boom" and lines[1] == us.removed_lock_note(result), lines
    assert get_condition(status["conditions"], "Failed")["message"] == "boom"


@pytest.mark.parametrize(
    ("state", "reason", "expected"),
    [
        (pb.OperationState.SUCCEEDED, "", "UpdateSucceeded"),
        (pb.OperationState.FAILED, "", "UpdateFailed"),
        (pb.OperationState.FAILED, "PendingOperations", "PendingOperations"),
        (pb.OperationState.CANCELLED, "Cancelled", "Canceled"),
        (pb.OperationState.CANCELLED, "Terminated", "Terminated"),
        (pb.OperationState.FAILED, "AgentRestarted", "AgentRestarted"),
        (pb.OperationState.CANCELLED, "", "Canceled"),
    ],
)
def test_failed_reason(state: pb.OperationState, reason: str, expected: str) -> None:
    result = pb.OperationResult(state=state, failure=pb.Failure(reason=reason) if reason else None)
    assert us.failed_reason(result) == expected


def test_message_is_capped() -> None:
    result = failed("OperationFailed", message="x" * 10000)
    assert len(us.result_message(result)) == us.MESSAGE_MAX_CHARS


def test_waiting_and_started_status() -> None:
    update = make_update()
    waiting = us.waiting_status(update, us.REASON_WORKSPACE_NOT_READY, "workspace 's' is not ready", NOW)
    assert cond(waiting, "Progressing") == ("False", "WorkspaceNotReady")
    assert cond(waiting, "Complete") == ("False", "Progressing")
    assert cond(waiting, "Failed") == ("False", "Progressing")
    assert "startTime" not in waiting
    update["status"] = waiting
    started = us.started_status(update, NOW)
    assert cond(started, "Progressing") == ("True", "Progressing")
    assert started["startTime"] == "2025-01-02T03:04:05Z"
    update["status"] = started
    assert us.is_running(update) and not us.is_complete(update)
    update["status"] = us.result_status(update, succeeded(), None, NOW)
    assert us.is_complete(update) and not us.is_running(update)


def test_ended_status() -> None:
    update = make_update()
    status = us.ended_status(update, us.REASON_CANCELED, "orphaned", NOW)
    # the Go operator's markFailed: Progressing/Complete reason "Failed", Failed says why
    assert cond(status, "Progressing") == ("False", "Failed")
    assert cond(status, "Complete") == ("True", "Failed")
    assert cond(status, "Failed") == ("True", "Canceled")
    assert status["message"] == "orphaned"


def test_operation_request_up_maps_every_option() -> None:
    update = make_update(
        parallel=4,
        message="msg",
        expectNoChanges=True,
        replace=["urn:a"],
        target=["urn:b"],
        targetDependents=True,
        refresh=True,
        continueOnError=True,
    )
    req = us.operation_request(update).up
    assert req is not None
    assert req.operation_id == update["metadata"]["uid"]
    assert (req.parallel, req.message, req.expect_no_changes) == (4, "msg", True)
    assert (req.replace, req.target, req.target_dependents) == (["urn:a"], ["urn:b"], True)
    assert (req.refresh, req.continue_on_error) == (True, True)


def test_operation_request_other_types() -> None:
    preview = us.operation_request(make_update(type="preview", expectNoChanges=True)).preview
    assert preview is not None and preview.expect_no_changes is True
    refresh = us.operation_request(make_update(type="refresh", runProgram=True)).refresh
    assert refresh is not None and refresh.run_program is True
    destroy = us.operation_request(make_update(type="destroy", remove=True, runProgram=False)).destroy
    assert destroy is not None and destroy.remove is True and destroy.run_program is False
    assert destroy.parallel is None
    with pytest.raises(ValueError, match="unsupported update type"):
        us.operation_request(make_update(type="nope"))


async def test_watch_registry_one_task_per_update() -> None:
    watches = UpdateWatches()
    runner = asyncio.create_task(watches.run())
    started = asyncio.Event()
    release = asyncio.Event()

    async def follow() -> None:
        started.set()
        await release.wait()

    assert watches.start("ns/a", "uid1", follow, info={"x": 1})
    assert not watches.start("ns/a", "uid1", follow)
    await started.wait()
    assert watches.running("ns/a", "uid1") and len(watches) == 1
    assert watches.info("ns/a") == {"x": 1}
    watches.set_sequence("uid1", 7)
    assert watches.last_sequence("uid1") == 7
    release.set()
    await asyncio.sleep(0.01)
    assert not watches.running("ns/a", "uid1") and watches.info("ns/a") is None
    # A task still running when the registry stops is cancelled; later starts are refused.
    release.clear()
    assert watches.start("ns/b", "uid2", follow)
    await asyncio.sleep(0.01)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert len(watches) == 0
    assert not watches.start("ns/c", "uid3", follow)


def test_operation_request_passes_the_plan_options_on() -> None:
    """Issue 29: a preview saves its plan, an up applies the one of the preview it names (by that
    preview's operation id, its uid), a refresh only previews."""
    preview = us.operation_request(make_update(type="preview", savePlan=True)).preview
    assert preview is not None and preview.save_plan is True
    up = us.operation_request(make_update(plan="s-17e"), "uid-of-s-17e").up
    assert up is not None and up.plan == "uid-of-s-17e"
    refresh = us.operation_request(make_update(type="refresh", previewOnly=True)).refresh
    assert refresh is not None and refresh.preview_only is True
    plain = us.operation_request(make_update())
    assert plain.up is not None and plain.up.plan is None
    # An option of another type is not passed on.
    assert us.operation_request(
        make_update(type="preview", plan="x", previewOnly=True)
    ).preview == pb.PreviewRequest(operation_id=make_update()["metadata"]["uid"])


def test_result_status_records_the_change_set() -> None:
    result = succeeded(
        changes=[
            pb.ResourceChange(urn="urn:a", type="t:a", op="update", paths=["spec.replicas"]),
            pb.ResourceChange(urn="urn:b", type="t:b", op="delete"),
        ]
    )
    status = us.result_status(make_update(), result, None, NOW)
    assert status["changes"] == [
        {"urn": "urn:a", "type": "t:a", "op": "update", "paths": ["spec.replicas"]},
        {"urn": "urn:b", "type": "t:b", "op": "delete"},
    ]
    assert "changes" not in us.result_status(make_update(), succeeded(), None, NOW)
    assert "changes" in us.STATUS_FIELDS


def _preview(**spec: Any) -> dict[str, Any]:
    preview = make_update(**{"type": "preview", "savePlan": True, **spec})
    preview["metadata"].update(name="s-17e", uid="uid-of-s-17e")
    preview["status"] = us.result_status(preview, succeeded(), None, NOW)
    return preview


def test_plan_problem_names_why_a_preview_saved_no_plan() -> None:
    up = make_update(plan="s-17e")
    assert us.plan_problem(up, _preview()) is None
    assert us.plan_problem(up, None) == "the plan's preview Update 's-17e' was not found"
    not_saved = _preview(savePlan=False)
    assert "is not a preview that saves its plan" in (us.plan_problem(up, not_saved) or "")
    other_ws = _preview(workspaceName="t")
    assert us.plan_problem(up, other_ws) == "preview 's-17e' ran with workspaceName 't', this up has 's'"
    failed_preview = _preview()
    failed_preview["status"] = us.result_status(
        failed_preview, failed("ProgramError", message="x"), None, NOW
    )
    assert us.plan_problem(up, failed_preview) == "preview 's-17e' has not succeeded, so it saved no plan"
    running = _preview()
    running["status"] = us.started_status(running, NOW)
    assert "has not succeeded" in (us.plan_problem(up, running) or "")

"""The Stack's Argo CD health (config/argocd/health.lua, as pasted from argocd-cm.yaml) on
hand-written Stacks: the states the issue 29 controller side adds (AwaitingApproval, Drifted), the
ones a live operator passes through too fast to read, and statuses the Go operator wrote. The states
the real operator produces are read back live in test_live_stacks.py."""

from __future__ import annotations

from typing import Any

import pytest

from pko.devtools.argocd import Health, Scripts, health

Obj = dict[str, Any]
SCRIPTS = Scripts.from_configmap()
DIGEST = "sha256:" + "ab" * 32
READY_MESSAGE = "the stack has been processed and is up to date"


def cond(type_: str, status: str, reason: str, message: str = "") -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-27T20:00:00Z",
        "observedGeneration": 3,
    }


def stack(*conditions: Obj, generation: int = 3, observed: int | None = 3, **status: Any) -> Obj:
    body: Obj = {"observedGeneration": observed, "conditions": list(conditions), **status}
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": "s", "namespace": "ns", "generation": generation},
        "spec": {"stack": "dev", "programRef": {"name": "p"}},
        "status": {k: v for k, v in body.items() if v is not None},
    }


def check(obj: Obj) -> Health:
    return health(obj, SCRIPTS)


READY = cond("Ready", "True", "ProcessingCompleted", READY_MESSAGE)
AWAITING = cond("Ready", "False", "AwaitingApproval", "a plan awaits approval")
PLAN: Obj = {
    "digest": DIGEST,
    "update": "s-6f1a2",
    "summary": {"create": 2, "update": 1, "delete": 0, "replace": 1},
    "time": "2026-11-27T20:00:00Z",
}


def test_a_plan_awaiting_approval_is_suspended_with_its_summary_and_digest() -> None:
    got = check(stack(AWAITING, plan=PLAN))
    assert got == Health(
        "Suspended",
        f"Plan {DIGEST} awaits approval: 2 to create, 1 to update, 0 to delete, 1 to replace "
        f"(preview Update s-6f1a2). Run the approve action, or annotate pulumi.com/approved-plan={DIGEST}",
    )


def test_a_plan_summary_with_operations_left_out_counts_them_as_none() -> None:
    got = check(stack(AWAITING, plan={"digest": DIGEST, "summary": {"delete": 4}}))
    assert got.status == "Suspended"
    assert "0 to create, 0 to update, 4 to delete, 0 to replace." in got.message
    assert "preview Update" not in got.message


def test_awaiting_approval_before_the_plan_is_recorded_is_still_suspended() -> None:
    got = check(stack(AWAITING))
    assert got.status == "Suspended" and "(no digest yet)" in got.message


def test_a_drifted_stack_that_is_ready_stays_healthy_and_names_the_drift() -> None:
    drifted = cond("Drifted", "True", "DriftDetected", "2 resources differ from the stack's state")
    got = check(stack(READY, drifted, drift={"resources": 2}))
    drift = "drift detected: 2 resources differ from the stack's state"
    assert got == Health("Healthy", f"{READY_MESSAGE}; {drift}")


def test_drift_cleared_is_plain_healthy() -> None:
    assert check(stack(READY, cond("Drifted", "False", "NoDrift"))) == Health("Healthy", READY_MESSAGE)


def test_a_drifted_stack_being_updated_is_progressing() -> None:
    drifted = cond("Drifted", "True", "DriftDetected", "1 resource differs")
    running = cond("Reconciling", "True", "StackProcessing", "stack is being processed")
    notready = cond("Ready", "False", "NotReadyInProgress", "reconciliation is in progress")
    assert check(stack(notready, running, drifted)) == Health("Progressing", "stack is being processed")


def test_stalled_is_degraded_with_its_message_whatever_else_holds() -> None:
    message = "up failed 4 times; not retrying until the spec or source changes"
    stalled = cond("Stalled", "True", "UpdateFailed", message)
    notready = cond("Ready", "False", "NotReadyStalled", "reconciliation is stalled")
    suspended = cond("Suspended", "True", "Suspended", "spec.suspend is set")
    assert check(stack(notready, stalled, suspended)) == Health("Degraded", message)


def test_stalled_without_a_message_says_its_reason() -> None:
    assert check(stack(cond("Stalled", "True", "SpecInvalid"))) == Health("Degraded", "SpecInvalid")


def test_a_suspended_ready_stack_is_suspended() -> None:
    message = "spec.suspend is set: no new operation starts until it is cleared"
    assert check(stack(READY, cond("Suspended", "True", "Suspended", message))) == Health(
        "Suspended", message
    )


@pytest.mark.parametrize(
    ("generation", "observed"), [(4, 3), (1, None)], ids=["observed-behind", "never-observed"]
)
def test_a_generation_the_operator_has_not_observed_is_progressing_whatever_the_old_status_says(
    generation: int, observed: int | None
) -> None:
    got = check(stack(READY, generation=generation, observed=observed))
    assert got == Health("Progressing", f"Waiting for the operator to observe generation {generation}")


def test_a_stack_without_status_is_progressing() -> None:
    obj = stack()
    del obj["status"]
    assert check(obj) == Health("Progressing", "Waiting for the operator to observe generation 3")


def _retrying(reason: str, transient: bool, **extra: Any) -> Obj:
    return stack(
        cond("Ready", "False", "NotReadyInProgress", "reconciliation is in progress"),
        cond("Reconciling", "True", reason, "2 update failure(s)"),
        lastUpdate={"state": "failed", "type": "up", "failures": 2, "message": "long output\nerror: boom"},
        lastFailure={
            "reason": "ProgramError" if not transient else "StackLocked",
            "message": "error: boom",
            "transient": transient,
            "countedFailures": 2,
        },
        nextRetryTime="2026-11-27T20:03:00Z",
        **extra,
    )


def test_a_failure_that_needs_a_fix_is_degraded_while_it_is_retried() -> None:
    assert check(_retrying("RetryingAfterFailure", transient=False)) == Health(
        "Degraded", "ProgramError: error: boom (2 update failure(s); next retry at 2026-11-27T20:03:00Z)"
    )


def test_a_failed_preview_is_degraded_too() -> None:
    assert check(_retrying("PreviewFailed", transient=False)).status == "Degraded"


def test_a_transient_failure_being_retried_is_progressing() -> None:
    assert check(_retrying("RetryingAfterFailure", transient=True)) == Health(
        "Progressing", "StackLocked: error: boom (2 update failure(s); next retry at 2026-11-27T20:03:00Z)"
    )


def test_a_retry_the_go_operator_recorded_without_last_failure_counts_as_needing_a_fix() -> None:
    obj = _retrying("RetryingAfterFailure", transient=True)
    del obj["status"]["lastFailure"], obj["status"]["nextRetryTime"]
    assert check(obj) == Health("Degraded", "UpdateFailed: long output\nerror: boom (2 update failure(s))")


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("StackProcessing", "waiting for workspace readiness"),
        ("PrerequisiteNotSatisfied", 'prerequisite not satisfied for "db": prerequisite failed'),
    ],
)
def test_reconciling_is_progressing_with_its_message(reason: str, message: str) -> None:
    notready = cond("Ready", "False", "NotReadyInProgress", "reconciliation is in progress")
    got = check(stack(notready, cond("Reconciling", "True", reason, message)))
    assert got == Health("Progressing", message)


def test_ready_false_for_a_reason_it_does_not_know_is_progressing_with_that_message() -> None:
    got = check(stack(cond("Ready", "False", "SomethingNew", "a future reason")))
    assert got == Health("Progressing", "a future reason")


def test_conditions_not_written_yet_are_progressing() -> None:
    assert check(stack()) == Health("Progressing", "Waiting for the stack to be reconciled")


def test_an_update_cancelled_on_request_is_suspended_until_someone_runs_it_again() -> None:
    message = "Update s-9 was cancelled on request 't1' (pulumi.com/cancel-request)"
    obj = stack(
        cond("Ready", "False", "Cancelled", message),
        lastUpdate={"state": "failed", "type": "up", "failures": 0},
        lastFailure={"reason": "Cancelled", "message": message, "transient": False, "countedFailures": 0},
    )
    assert check(obj) == Health(
        "Suspended", f"{message}. Nothing runs until the next change; run the retry action to run it again"
    )

"""``why`` (pure): one paragraph from the conditions, the Updates and the Workspace, ending ``Fix:``."""

from __future__ import annotations

from pko.kubectl.why import explain

from .stacks import (
    DIGEST,
    NOW,
    awaiting_status,
    cond,
    drift_status,
    ready_status,
    retrying_status,
    stack,
    stalled_status,
    update,
    workspace,
)


def test_ready() -> None:
    said = explain(
        stack(status=ready_status()), workspace=None, last_update=None, current_update=None, now=NOW
    )
    assert said.ready
    assert said.text == (
        "Ready: ProcessingCompleted: the stack has been processed and is up to date. "
        "The last up (Update web-1) succeeded 5m ago."
    )


def test_stalled_source_unavailable() -> None:
    said = explain(
        stack(status=stalled_status()), workspace=workspace(), last_update=None, current_update=None, now=NOW
    )
    assert not said.ready
    assert said.text.startswith("Stalled: SourceUnavailable: branch 'main' not found. Fix: make the source")


def test_retrying_after_a_program_error_quotes_the_update() -> None:
    said = explain(
        stack(status=retrying_status()),
        workspace=workspace(),
        last_update=update(),
        current_update=None,
        now=NOW,
    )
    assert said.text == (
        "Reconciling: RetryingAfterFailure: 1 update failure(s). "
        "The last up (Update web-2) failed: ProgramError: Updating (dev): / "
        "pulumi:pulumi:Stack web-dev **failed** / error: program failed. "
        "Classified ProgramError (deterministic), 2 failures in a row. "
        "Retried at 2025-01-20T10:46:30Z (in 90s). "
        "Fix: fix the program (kubectl pko logs web -n ns shows the engine output), then "
        "kubectl pko retry web -n ns to run again now (else it is retried as scheduled)."
    )


def test_stalled_update_failed_says_how_to_start_over() -> None:
    status = retrying_status()
    status["conditions"] = [
        cond("Ready", "False", "NotReadyStalled", "reconciliation is stalled"),
        cond(
            "Stalled",
            "True",
            "UpdateFailed",
            "up failed 4 times; not retrying until the spec or source changes",
        ),
    ]
    status.pop("nextRetryTime")
    said = explain(
        stack(status=status), workspace=workspace(), last_update=None, current_update=None, now=NOW
    )
    assert "The last Update web-2 no longer exists." in said.text
    assert said.text.endswith(
        "Fix: fix the program (kubectl pko logs web -n ns shows the engine output), then "
        "kubectl pko retry web -n ns (a new spec or source revision also starts over)."
    )


def test_a_policy_violation_names_the_policy_and_how_to_pass_it() -> None:
    status = retrying_status()
    status["lastFailure"]["reason"] = "PolicyViolation"
    status["conditions"] = [
        cond("Ready", "False", "NotReadyStalled", "reconciliation is stalled"),
        cond("Stalled", "True", "PolicyViolation", "policy pack guard: no-public-services: mandatory"),
    ]
    status.pop("nextRetryTime")
    said = explain(
        stack(status=status), workspace=workspace(), last_update=None, current_update=None, now=NOW
    )
    assert said.text.endswith(
        "Fix: change the program (or the pack's config in spec.policyPacks) so that the mandatory policy "
        "the message names passes, then kubectl pko retry web -n ns (a new spec or source revision also "
        "starts over)."
    )


def test_waiting_for_the_workspace_names_its_reason_and_fix() -> None:
    status = {
        "conditions": [
            cond("Ready", "False", "NotReadyInProgress", "reconciliation is in progress"),
            cond("Reconciling", "True", "StackProcessing", "waiting for workspace readiness"),
        ],
        "currentUpdate": {"name": "web-3"},
    }
    waiting = update("web-3", failed=None, running=False)
    waiting["status"]["conditions"] = [
        cond("Progressing", "False", "WorkspaceNotReady", "workspace 'web' is not ready")
    ]
    said = explain(
        stack(status=status),
        workspace=workspace(reason="PermissionDenied", message="may not use workspaces/rpc"),
        last_update=None,
        current_update=waiting,
        now=NOW,
    )
    assert (
        "The up Update web-3 has not started: WorkspaceNotReady: workspace 'web' is not ready." in said.text
    )
    assert "Workspace web is not Ready: PermissionDenied: may not use workspaces/rpc." in said.text
    assert "Fix: bind the ClusterRole system:auth-delegator" in said.text


def test_running_update_means_wait() -> None:
    status = {
        "conditions": [
            cond("Ready", "False", "NotReadyInProgress", "reconciliation is in progress"),
            cond("Reconciling", "True", "StackProcessing", "stack is being processed"),
        ],
        "currentUpdate": {"name": "web-3"},
    }
    said = explain(
        stack(status=status),
        workspace=workspace(),
        last_update=None,
        current_update=update("web-3", running=True),
        now=NOW,
    )
    assert "The up Update web-3 is running (for 5m)." in said.text
    assert said.text.endswith(
        "Fix: nothing: wait for the operation (kubectl pko logs web -n ns shows its engine output)."
    )


def test_suspended_prerequisites_and_unobserved() -> None:
    suspended = {
        "conditions": [
            cond("Ready", "False", "Suspended", "spec.suspend is set"),
            cond("Suspended", "True", "Suspended", "spec.suspend is set"),
        ]
    }
    said = explain(
        stack(status=suspended, suspend=True), workspace=None, last_update=None, current_update=None, now=NOW
    )
    assert said.text.startswith(
        "Suspended: Suspended: spec.suspend is set. Fix: kubectl patch stack web -n ns"
    )
    waiting = {
        "conditions": [
            cond("Ready", "False", "NotReadyInProgress", ""),
            cond("Reconciling", "True", "PrerequisiteNotSatisfied", "prerequisite failed"),
        ]
    }
    said = explain(
        stack(status=waiting, prerequisites=[{"name": "db"}]),
        workspace=None,
        last_update=None,
        current_update=None,
        now=NOW,
    )
    assert said.text.endswith("Fix: get the prerequisites Ready first: kubectl pko why db -n ns.")
    said = explain(stack(), workspace=None, last_update=None, current_update=None, now=NOW)
    assert said.text.startswith("Pending: NotObserved: the operator has not reported on this Stack yet.")
    assert "Fix: check that the operator is running" in said.text


def test_transient_failure_is_retried_by_itself() -> None:
    status = retrying_status(reason="StackLocked")
    status["lastFailure"]["transient"] = True
    said = explain(
        stack(status=status),
        workspace=workspace(),
        last_update=update(failed="StackLocked"),
        current_update=None,
        now=NOW,
    )
    assert "Classified StackLocked (transient)" in said.text
    assert said.text.endswith(
        "Fix: nothing: a transient failure is retried by itself "
        "(or kubectl pko retry web -n ns to retry now)."
    )


def test_awaiting_approval_names_the_plan_and_how_to_approve_it() -> None:
    waiting = stack(status=awaiting_status())
    said = explain(waiting, workspace=workspace(), last_update=None, current_update=None, now=NOW)
    assert not said.ready
    assert said.text == (
        f"AwaitingApproval: plan {DIGEST} (preview Update web-preview-1, recorded 5m ago) has "
        "1 to create, 2 to update, 0 to delete, 1 to replace. Fix: review the plan (kubectl pko status "
        "web -n ns; kubectl pko logs web -n ns --update web-preview-1), then kubectl pko approve web -n ns."
    )
    waiting["metadata"]["annotations"] = {"pulumi.com/approved-plan": "sha256:old"}
    text = explain(waiting, workspace=None, last_update=None, current_update=None, now=NOW).text
    assert " The approved digest sha256:old is another plan's. Fix: " in text


def test_drift_is_mentioned_ready_or_not() -> None:
    said = explain(
        stack(status=drift_status()), workspace=None, last_update=None, current_update=None, now=NOW
    )
    assert said.ready
    assert said.text.endswith(
        " succeeded 5m ago. Drift: 2 resources differ from the stack's state "
        "(checked 5m ago; kubectl pko status web -n ns lists them)."
    )
    failing = retrying_status()
    failing["drift"] = drift_status()["drift"]
    text = explain(stack(status=failing), workspace=None, last_update=None, current_update=None, now=NOW).text
    assert "Drift: 2 resources differ" in text and text.index("Drift:") < text.index("Fix:")

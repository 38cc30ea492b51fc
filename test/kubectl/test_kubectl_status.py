"""``status`` (pure): readiness, the table, the detail view and the document, secrets masked."""

from __future__ import annotations

import json

import pytest
import yaml

from pko.kubectl.exitcodes import ExitCode
from pko.kubectl.stackview import age, masked, readiness, time_until
from pko.kubectl.status import details, document, exit_code, summary, table

from .stacks import (
    DIGEST,
    EARLIER,
    NOW,
    SECRET_WIRE,
    awaiting_status,
    cond,
    drift_status,
    ready_status,
    retrying_status,
    stack,
    stalled_status,
    update,
)


def test_readiness_follows_the_deciding_condition() -> None:
    assert readiness(stack(status=ready_status())).ready
    stalled = readiness(stack(status=stalled_status()))
    assert (stalled.ready, stalled.state, stalled.reason) == (False, "Stalled", "SourceUnavailable")
    retrying = readiness(stack(status=retrying_status()))
    assert (retrying.state, retrying.reason) == ("Reconciling", "RetryingAfterFailure")
    assert readiness(stack()).state == "Pending"  # no status: the operator has not looked yet


def test_ready_for_an_older_generation_is_not_ready() -> None:
    newer = stack(status=ready_status())
    newer["metadata"]["generation"] = 2
    state = readiness(newer)
    assert (state.ready, state.state, state.reason) == (False, "Pending", "GenerationNotObserved")


def test_suspended_and_not_ready() -> None:
    status = {
        "conditions": [
            cond("Ready", "False", "Suspended", "spec.suspend is set"),
            cond("Suspended", "True", "Suspended", "spec.suspend is set"),
        ]
    }
    assert readiness(stack(status=status, suspend=True)).state == "Suspended"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (5, "5s"),
        (119, "119s"),
        (200, "3m20s"),
        (600, "10m"),
        (4 * 3600 + 60, "4h1m"),
        (30 * 3600, "30h"),
        (5 * 86400, "5d"),
    ],
)
def test_ages_as_kubectl_prints_them(seconds: int, text: str) -> None:
    assert age(seconds) == text


def test_time_until() -> None:
    assert time_until("2025-01-20T10:46:30Z", NOW) == "in 90s"
    assert time_until("2025-01-20T10:44:00Z", NOW) == "now"
    assert time_until(None, NOW) == ""


def test_secrets_in_wire_form_are_masked_anywhere() -> None:
    assert masked({"a": [SECRET_WIRE, {"b": SECRET_WIRE}], "c": "plain"}) == {
        "a": ["[secret]", {"b": "[secret]"}],
        "c": "plain",
    }


def test_summary_document() -> None:
    ready = stack(status={**ready_status(), "outputs": {"password": "[secret]", "token": SECRET_WIRE}})
    doc = summary(ready, update("web-1", failed=None))
    assert doc["ready"] is True and doc["state"] == "Ready"
    assert doc["outputs"] == {"password": "[secret]", "token": "[secret]"}
    assert doc["lastUpdate"]["resourceChanges"] == {"create": 2, "same": 1}
    assert "plan" not in doc and "drift" not in doc  # absent from the status: not mentioned
    assert "hunter2" not in document([doc], single=True, fmt="json")
    assert json.loads(document([doc], single=True, fmt="json"))["name"] == "web"
    assert yaml.safe_load(document([doc, doc], single=False, fmt="yaml"))["items"][1]["name"] == "web"


def test_a_plan_awaiting_approval() -> None:
    waiting = stack(status=awaiting_status())
    state = readiness(waiting)
    assert (state.ready, state.state, state.reason) == (False, "AwaitingApproval", "AwaitingApproval")
    text = details(waiting, None, NOW)
    assert "State:           AwaitingApproval\n" in text
    assert (
        f"Plan:            {DIGEST}\n"
        "  Changes:       1 to create, 2 to update, 0 to delete, 1 to replace\n"
        "  Update:        web-preview-1\n"
        "  Recorded:      2025-01-20T10:40:00Z (5m ago)\n"
        "  Commit:        abc123\n"
        "  Approval:      awaiting approval: kubectl pko approve web -n ns\n"
    ) in text
    doc = summary(waiting)
    assert (doc["state"], doc["plan"]["digest"], doc["plan"]["summary"]["replace"]) == (
        "AwaitingApproval",
        DIGEST,
        1,
    )
    assert "approvedPlan" not in doc
    assert exit_code([waiting]) == ExitCode.NOT_READY

    waiting["metadata"]["annotations"] = {"pulumi.com/approved-plan": "sha256:old"}
    assert "  Approval:      awaiting approval: kubectl pko approve web -n ns\n" in details(
        waiting, None, NOW
    )
    assert "(the approved digest sha256:old is another plan's)" in details(waiting, None, NOW)
    assert summary(waiting)["approvedPlan"] == "sha256:old"
    waiting["metadata"]["annotations"] = {"pulumi.com/approved-plan": DIGEST}
    assert "  Approval:      approved: the operator applies this plan\n" in details(waiting, None, NOW)


def test_drift_with_each_resource_and_its_paths() -> None:
    drifted = stack(status=drift_status())
    text = details(drifted, None, NOW)
    assert (
        "Drift:           detected in 2 resources (checked 5m ago)\n"
        "  urn:pulumi:dev::web::kubernetes:apps/v1:Deployment::web\n"
        "    Type:        kubernetes:apps/v1:Deployment\n"
        "    Paths:       spec.replicas, spec.template.spec.containers[0].image\n"
        "    First seen:  2025-01-20T09:45:00Z (60m ago)\n"
        "  urn:pulumi:dev::web::kubernetes:core/v1:ConfigMap::page\n"
        "    Type:        kubernetes:core/v1:ConfigMap\n"
        "    Paths:       (none: the resource is gone)\n"
    ) in text
    assert summary(drifted)["drift"]["resources"][0]["paths"][0] == "spec.replicas"
    assert table([drifted], NOW, all_namespaces=False).splitlines()[1].split()[2:4] == ["Ready", "(drifted)"]
    assert readiness(drifted).ready  # drift is reported, it does not make the Stack not Ready

    clean = ready_status()
    clean["drift"] = {"lastCheckTime": EARLIER, "detected": False, "message": "refresh failed: 403"}
    text = details(stack(status=clean), None, NOW)
    assert "Drift:           none (checked 5m ago)\n  Message:       refresh failed: 403\n" in text
    assert "(drifted)" not in table([stack(status=clean)], NOW, all_namespaces=False)


def test_pending_requests() -> None:
    status = ready_status()
    status["observedCancelRequest"] = "c1"
    requested = stack(status=status)
    requested["metadata"]["annotations"] = {
        "pulumi.com/refresh-request": "r1",
        "pulumi.com/cancel-request": "c1",
    }
    text = details(requested, None, NOW)
    assert "Refresh request: r1 (pending)\n" in text and "Cancel request" not in text
    assert summary(requested)["observedCancelRequest"] == "c1"
    status["lastRefresh"] = {"name": "web-r", "token": "r1", "state": "failed", "reason": "StackLocked",
                             "message": "the stack is locked", "failures": 1}  # fmt: skip
    assert (
        "Refresh request: r1 (pending: failed 1 time(s) for a transient cause (StackLocked): the stack "
        "is locked; the operator retries it)\n"
    ) in details(requested, None, NOW)
    status["currentUpdate"] = {"name": "web-2", "kind": "refresh", "cancelRequest": "c1"}
    assert "Current update:  web-2 (cancelling on request c1, kind refresh)\n" in details(
        stack(status=status), None, NOW
    )


def test_table() -> None:
    stacks = [
        stack("web", status=ready_status()),
        stack("api", "other", status=stalled_status()),
        stack("new"),
    ]
    text = table(stacks, NOW, all_namespaces=True)
    lines = text.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "STACK", "STATE", "REASON", "LAST", "UPDATE", "UPDATED"]
    assert lines[1].split() == ["ns", "web", "dev", "Ready", "ProcessingCompleted", "up", "succeeded", "5m"]
    assert lines[2].split() == ["other", "api", "dev", "Stalled", "SourceUnavailable", "<none>", "<none>"]
    assert lines[3].split() == ["ns", "new", "dev", "Pending", "NotObserved", "<none>", "<none>"]
    assert not table(stacks[:1], NOW, all_namespaces=False).startswith("NAMESPACE")
    assert exit_code(stacks) == ExitCode.NOT_READY
    assert exit_code(stacks[:1]) == ExitCode.OK
    assert exit_code([]) == ExitCode.OK


def test_details_of_a_failing_stack() -> None:
    status = retrying_status()
    status["currentUpdate"] = {"name": "web-3", "generation": 1}
    text = details(stack(status=status), update(), NOW)
    assert "State:           Reconciling (RetryingAfterFailure)\n" in text
    assert "Last update:     web-2: up failed 5m ago (2 failures in a row)\n" in text
    assert "  Changes:       create=2, same=1\n" in text
    assert "Current update:  web-3 (running, generation 1)\n" in text
    assert "Last failure:    ProgramError (deterministic, 2 counted)\n" in text
    assert "Next retry:      2025-01-20T10:46:30Z (in 90s)\n" in text
    assert "Outputs" not in text and "Plan" not in text


def test_details_of_a_ready_stack_mask_outputs() -> None:
    text = details(stack(status=ready_status()), None, NOW)
    assert "Outputs:\n  petName: calm-dog\n  password: [secret]\n" in text
    assert "  Permalink:     file:///state/web\n" in text

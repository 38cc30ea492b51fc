"""Policy packs through the operator (pure, issue 43): ``spec.policyPacks`` on the Stack becomes the
preview's and up's Update spec and the agent's request; the violations the agent reports become the
Update's bounded status, a Warning Event per violated policy, and a Stack Stalled ``PolicyViolation``
whose message names the pack, the policy, the resource and the policy's message."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pko.api.generated.pko.agent import v1 as pb
from pko.api.limits import MAX_LISTED_ENTRIES
from pko.api.stack import Stack, StackSpec
from pydantic import ValidationError

from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.policyevents import policy_violation_events
from pko.controllers.stack.status import mark_result, record_failed
from pko.controllers.stack.updateobject import build_update
from pko.controllers.update.status import operation_request, result_status

NOW = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)
URN = "urn:pulumi:dev::policed::command:local:Command::step"
PACKS = [
    {"name": "commands", "path": "policies/commands", "config": {"commands-have-delete": "disabled"}},
    {"name": "platform", "path": "/opt/policy/platform"},
]
WS = {"metadata": {"name": "my-stack", "uid": "ws-uid"}}
# What the agent says of a run a mandatory policy stopped (agent/policypacks.py).
REFUSED = (
    f"1 mandatory policy violation(s): pko-commands@0.1.0 no-forbidden-commands (mandatory) on {URN}: "
    "this command says 'forbidden'"
)


def stack(**spec: Any) -> Stack:
    return Stack.model_validate(
        {
            "metadata": {"name": "my-stack", "namespace": "ns", "uid": "stack-uid"},
            "spec": {"stack": "dev", "programRef": {"name": "p"}, **spec},
        }
    )


def violation(
    level: str, policy: str, urn: str = URN, said: str = "this command says 'forbidden'"
) -> pb.PolicyViolation:
    return pb.PolicyViolation(
        policy_pack="pko-commands",
        policy_pack_version="0.1.0",
        policy=policy,
        enforcement_level=level,
        urn=urn,
        message=f"The policy's description.\n{said}",
    )


def test_packs_go_to_previews_and_ups_and_to_the_agent_with_their_config_as_json() -> None:
    s = stack(policyPacks=PACKS)
    for type_ in ("preview", "up"):
        update = build_update(s, WS, type_, "m", now=NOW)
        assert update["spec"]["policyPacks"] == PACKS
        update["metadata"]["uid"] = "u-1"
        request = operation_request(update)
        op = request.preview if type_ == "preview" else request.up
        assert op is not None
        assert [(p.name, p.path, p.config) for p in op.policy_pack] == [
            ("commands", "policies/commands", json.dumps({"commands-have-delete": "disabled"})),
            ("platform", "/opt/policy/platform", ""),
        ]
    for type_ in ("destroy", "refresh"):
        assert "policyPacks" not in build_update(s, WS, type_, "m", now=NOW)["spec"]
    assert "policyPacks" not in build_update(stack(), WS, "up", "m", now=NOW)["spec"]


def test_a_pack_needs_a_dns_label_name_and_a_path() -> None:
    StackSpec.model_validate({"stack": "dev", "policyPacks": [{"name": "ok-1", "path": "p"}]})
    for bad in ({"name": "Not_A_Label", "path": "p"}, {"name": "ok"}, {"name": "ok", "path": ""}):
        with pytest.raises(ValidationError):
            StackSpec.model_validate({"stack": "dev", "policyPacks": [bad]})


def test_the_update_records_mandatory_violations_first_and_bounded() -> None:
    update = {"metadata": {"name": "u", "uid": "u-1", "generation": 1}, "spec": {"type": "up"}}
    advisory = violation("advisory", "commands-have-delete", said="no delete command")
    result = pb.OperationResult(
        state=pb.OperationState.FAILED,
        failure=pb.Failure(reason="PolicyViolation", message=REFUSED),
        policy_violations=[advisory, violation("mandatory", "no-forbidden-commands")],
    )
    status = result_status(update, result, None, NOW)
    assert [(v["policy"], v["enforcementLevel"], v["urn"]) for v in status["policyViolations"]] == [
        ("no-forbidden-commands", "mandatory", URN),
        ("commands-have-delete", "advisory", URN),
    ]
    assert status["policyViolationCount"] == 2
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "PolicyViolation", REFUSED)

    many = [violation("advisory", "p", urn=f"{URN}-{n}") for n in range(MAX_LISTED_ENTRIES + 5)]
    status = result_status(
        update, pb.OperationResult(state=pb.OperationState.SUCCEEDED, policy_violations=many), None, NOW
    )
    assert len(status["policyViolations"]) <= MAX_LISTED_ENTRIES
    assert status["policyViolationCount"] == MAX_LISTED_ENTRIES + 5
    clean = result_status(update, pb.OperationResult(state=pb.OperationState.SUCCEEDED), None, NOW)
    assert "policyViolations" not in clean and "policyViolationCount" not in clean


def ended(reason: str | None, message: str, violations: list[dict[str, Any]]) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True", "reason": "Updated"}]
    if reason is not None:
        conditions.append({"type": "Failed", "status": "True", "reason": reason})
    return {
        "metadata": {"name": "u-1"},
        "spec": {"type": "up"},
        "status": {"message": message, "conditions": conditions, "policyViolations": violations},
    }


def listed(level: str, policy: str, urn: str, said: str) -> dict[str, Any]:
    return {
        "policyPack": "pko-commands",
        "policyPackVersion": "0.1.0",
        "policy": policy,
        "enforcementLevel": level,
        "urn": urn,
        "message": f"The policy's description.\n{said}",
    }


def test_one_warning_event_per_violated_policy_naming_resources_and_message() -> None:
    update = ended(
        "PolicyViolation",
        REFUSED,
        [
            listed("mandatory", "no-forbidden-commands", URN, "this command says 'forbidden'"),
            listed("mandatory", "no-forbidden-commands", URN + "2", "this command says 'forbidden'"),
            listed("advisory", "commands-have-delete", URN, "no delete command"),
        ],
    )
    events = policy_violation_events(update)
    assert [(e.type, e.reason) for e in events] == [("Warning", "PolicyViolation")] * 2
    assert events[0].message == (
        "policy no-forbidden-commands of pack pko-commands@0.1.0 (mandatory, the update was refused): "
        f"{URN}: this command says 'forbidden'; {URN}2: this command says 'forbidden'"
    )
    assert events[1].message == (
        "policy commands-have-delete of pack pko-commands@0.1.0 (advisory, reported): "
        f"{URN}: no delete command"
    )
    assert policy_violation_events(ended(None, "", [])) == []


def test_a_mandatory_violation_stalls_the_stack_at_once_naming_the_violation() -> None:
    status: dict[str, Any] = {}
    current = {"name": "u-1", "generation": 1, "commit": "r1", "reconcileRequest": ""}
    record_failed(status, current, ended("PolicyViolation", REFUSED, []), NOW)
    assert status["lastFailure"]["reason"] == "PolicyViolation" and not status["lastFailure"]["transient"]
    mark_result(status, StackSpec.model_validate({"stack": "dev"}), RetrySettings(), 1, NOW)
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "PolicyViolation")
    assert (
        stalled["message"] == f"{REFUSED}\nnot retrying until the program, a policy pack or the spec changes"
    )
    assert "nextRetryTime" not in status


def test_a_pack_that_does_not_load_is_retried_as_a_deterministic_failure() -> None:
    status: dict[str, Any] = {}
    current = {"name": "u-1", "generation": 1, "commit": "r1", "reconcileRequest": ""}
    said = "policy pack 'broken' could not be loaded: SyntaxError: Unexpected identifier 'is'"
    record_failed(status, current, ended("PolicyPackFailed", said, []), NOW)
    assert status["lastFailure"]["reason"] == "PolicyPackFailed"
    mark_result(status, StackSpec.model_validate({"stack": "dev"}), RetrySettings(), 1, NOW)
    reconciling = next(c for c in status["conditions"] if c["type"] == "Reconciling")
    assert reconciling["reason"] == "RetryingAfterFailure" and "nextRetryTime" in status

"""What a Stack records stays bounded however large the program (issue 44), as pure functions: an
Update's change set, pending operations and outputs Secret, the plan's summary and digest, the
drift record and its message, each from thousands of resources, under ``MAX_OBJECT_BYTES``; the
summary and approval's destructive rule still count the changes past the listed ones. The same on a
real control plane with the stand-in CLI: test_status_bounds_cluster.py."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from pko.api import limits
from pko.api.generated.pko.agent import v1 as pb
from pko.api.stack import StackDrift
from pko.api.update import ResourceChange, UpdateStatus

from pko.controllers.bounds import bounded_list, cap_head, cap_tail, json_size
from pko.controllers.resources import OMITTED_OUTPUTS_ANNOTATION
from pko.controllers.stack.approval import Apply, Wait, gate, record_plan
from pko.controllers.stack.drift import record_drift
from pko.controllers.update import status as us
from pko.machinery.conditions import get_condition

from .builders import make_update, succeeded

Obj = dict[str, Any]
NOW = datetime(2026, 12, 7, 1, 0, 0, tzinfo=UTC)
PET = "random:index/randomPet:RandomPet"


def urn(i: int, type_: str = PET) -> str:
    return f"urn:pulumi:dev::big::{type_}::pet-{i:05d}"


def changes(n: int, op: str = "create", paths: int = 0) -> list[pb.ResourceChange]:
    return [
        pb.ResourceChange(urn=urn(i), type=PET, op=op, paths=[f"p{k:03d}" for k in range(paths)])
        for i in range(n)
    ]


def recorded(result: pb.OperationResult, **spec: Any) -> Obj:
    """The Update as the Update controller leaves it after ``result``."""
    update = make_update(**spec)
    update["status"] = us.result_status(update, result, None, NOW)
    return update


# --- the bounding rule -------------------------------------------------------------------------


def test_a_bounded_list_is_a_prefix_with_a_total_and_a_marker() -> None:
    items = [{"urn": urn(i), "paths": [str(k) for k in range(30)]} for i in range(600)]
    listed = bounded_list(items)
    assert listed.total == 600 and listed.truncated
    assert len(listed.entries) == limits.MAX_LISTED_ENTRIES
    assert [e["urn"] for e in listed.entries] == [e["urn"] for e in items[: len(listed.entries)]]
    assert all(e["paths"] == [str(k) for k in range(limits.MAX_LISTED_PATHS)] for e in listed.entries)
    assert json_size(listed.entries) <= limits.MAX_LISTED_BYTES

    small = bounded_list(items[:3], max_paths=50)
    assert small.entries == items[:3] and small.total == 3 and not small.truncated
    cut_paths = bounded_list(items[:3])
    assert cut_paths.total == 3 and len(cut_paths.entries) == 3 and cut_paths.truncated


def test_long_urns_stop_the_list_at_its_byte_budget_whatever_the_count() -> None:
    items = [{"urn": "urn:" + "x" * 4000 + str(i)} for i in range(100)]
    listed = bounded_list(items)
    assert 0 < len(listed.entries) < 100 and listed.truncated and listed.total == 100
    assert json_size(listed.entries) <= limits.MAX_LISTED_BYTES
    assert bounded_list([{"urn": "u" * (limits.MAX_LISTED_BYTES + 1)}]).entries == []


def test_messages_are_capped_at_either_end() -> None:
    text = "first\n" + "x" * 10_000 + "\nlast"
    assert len(cap_tail(text, 100)) == 100 and cap_tail(text, 100).endswith("last")
    assert len(cap_head(text, 100)) == 100 and cap_head(text, 100).startswith("first")
    assert cap_head("short", 100) == "short" == cap_tail("short", 100)


# --- an Update -----------------------------------------------------------------------------------


def test_an_update_of_five_thousand_changes_lists_the_first_and_counts_them_all() -> None:
    many = [*changes(4999, paths=40), pb.ResourceChange(urn=urn(99999), type=PET, op="delete")]
    update = recorded(succeeded(changes=list(reversed(many))))
    status = update["status"]
    assert status["changeCount"] == 5000 and status["changesTruncated"] is True
    listed = status["changes"]
    assert 0 < len(listed) <= limits.MAX_LISTED_ENTRIES
    assert [c["urn"] for c in listed] == [urn(i) for i in range(len(listed))]  # sorted, whatever the order
    assert all(len(c["paths"]) == limits.MAX_LISTED_PATHS for c in listed)
    assert status["changeSummary"] == {"create": 4999, "update": 0, "delete": 1, "replace": 0}
    assert json_size(update) < limits.MAX_OBJECT_BYTES
    UpdateStatus.model_validate(status)  # the CRD's fields

    small = recorded(succeeded(changes=changes(3)))["status"]
    assert small["changeCount"] == 3 and "changesTruncated" not in small and len(small["changes"]) == 3


def test_pending_operations_and_a_long_error_are_bounded() -> None:
    pending = [pb.PendingOperation(urn=urn(i), type="creating") for i in range(3000)]
    failed = pb.OperationResult(
        operation_id="x",
        type=pb.OperationType.UP,
        state=pb.OperationState.FAILED,
        failure=pb.Failure(reason="PendingOperations", message="m", pending_operations=pending),
        stderr="error: boom\n" * 50_000,
        pending_operations=pending,
    )
    update = recorded(failed)
    status = update["status"]
    assert len(status["pendingOperations"]) == limits.MAX_LISTED_ENTRIES
    assert len(status["message"]) <= limits.MAX_MESSAGE_CHARS and "and 2990 more" in status["message"]
    assert json_size(update) < limits.MAX_OBJECT_BYTES


def test_outputs_past_the_budget_are_left_out_and_named() -> None:
    big = json.dumps("x" * (200 * 1024)).encode()
    outputs = {f"out{i:03d}": pb.OutputValue(value=big) for i in range(6)}
    outputs |= {f"tiny{i:04d}": pb.OutputValue(value=b"1") for i in range(100)}
    outputs["zzz secret"] = pb.OutputValue(value=b'"s"', secret=True)
    secret = us.outputs_secret(make_update(), outputs)
    raw = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert sum(len(k) + len(v) for k, v in raw.items()) <= limits.MAX_OUTPUTS_BYTES
    # By name: the first two large values fit, the other four are left out, later small ones still fit.
    assert {"out000", "out001", "tiny0000", "tiny0099", "zzz_secret"} <= raw.keys()
    omitted = json.loads(secret["metadata"]["annotations"][OMITTED_OUTPUTS_ANNOTATION])
    assert omitted == {"count": 4, "keys": ["out002", "out003", "out004", "out005"]}
    assert json.loads(secret["metadata"]["annotations"]["pulumi.com/secrets"]) == ["zzz_secret"]
    assert json_size(secret) < limits.MAX_OBJECT_BYTES
    assert OMITTED_OUTPUTS_ANNOTATION not in us.outputs_secret(make_update(), {})["metadata"]["annotations"]


# --- the Stack: a plan and a drift check ----------------------------------------------------------


def test_a_plan_counts_every_change_so_a_delete_past_the_listed_ones_needs_approval() -> None:
    many = [*changes(2999), pb.ResourceChange(urn=urn(99999), type=PET, op="delete")]
    preview = recorded(succeeded(changes=many), type="preview")
    assert all(c["op"] == "create" for c in preview["status"]["changes"])  # the delete is not listed
    status: Obj = {}
    plan = record_plan(status, preview, NOW, "abc")
    assert plan["summary"] == {"create": 2999, "update": 0, "delete": 1, "replace": 0}
    assert isinstance(gate("OnDestructive", plan, "", plan["inputs"], "s", "ns"), Wait)
    assert isinstance(gate("OnDestructive", plan, plan["digest"], plan["inputs"], "s", "ns"), Apply)

    # The same listed changes with another total are another digest.
    other = json.loads(json.dumps(preview))
    other["status"]["changeCount"] = 3001
    assert record_plan({}, other, NOW, "abc")["digest"] != plan["digest"]
    assert json_size(status) < limits.MAX_OBJECT_BYTES


def test_a_drift_check_of_thousands_records_the_first_with_the_count() -> None:
    refresh = recorded(succeeded(changes=changes(2500, op="update", paths=3)), type="refresh")
    status: Obj = {}
    result = record_drift(status, refresh, 1, NOW)
    drift = status["drift"]
    assert drift["detected"] is True and drift["count"] == 2500 and drift["truncated"] is True
    assert 0 < len(drift["resources"]) <= limits.MAX_LISTED_ENTRIES
    assert json_size(drift["resources"]) <= limits.MAX_LISTED_BYTES
    StackDrift.model_validate(drift)
    drifted = get_condition(status["conditions"], "Drifted")
    assert drifted is not None and drifted["message"].startswith("2500 resource(s) differ")
    assert len(drifted["message"]) <= limits.MAX_SHORT_MESSAGE_CHARS
    assert [e.message for e in result.events] == [drifted["message"]]

    long_paths = [
        pb.ResourceChange(urn=urn(i) + "x" * 3000, type=PET, op="update", paths=["a" * 3000])
        for i in range(9)
    ]
    record_drift(status, recorded(succeeded(changes=long_paths), type="refresh"), 1, NOW)
    message = get_condition(status["conditions"], "Drifted")["message"]  # type: ignore[index]
    assert len(message) == limits.MAX_SHORT_MESSAGE_CHARS and message.endswith("...")


# --- the documented numbers are the enforced ones --------------------------------------------------


def test_the_api_reference_states_the_bounds_it_enforces() -> None:
    doc = ResourceChange.model_fields["paths"].description or ""
    assert f"at most {limits.MAX_LISTED_PATHS}" in doc
    changes_doc = UpdateStatus.model_fields["changes"].description or ""
    drift_doc = StackDrift.model_fields["resources"].description or ""
    for text in (changes_doc, drift_doc):
        assert f"first {limits.MAX_LISTED_ENTRIES}" in text
        assert f"{limits.MAX_LISTED_BYTES // 1024} KiB" in text
        assert f"first {limits.MAX_LISTED_PATHS} paths" in text

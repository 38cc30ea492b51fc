"""Operation outcomes: failure classification, config planning, engine-event shape, the journal."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pko.agent import failures, stackconfig
from pko.agent.engineevents import engine_event_to_json
from pko.agent.journal import Journal, valid_operation_id
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from pulumi.automation import events

LOCKED = (
    "error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end or "
    "delete the lock file with `pulumi cancel`.\n"
    "  file:///tmp/b/.pulumi/locks/organization/proj/dev/4f0e.json: created by alice@box (pid 4242) "
    "at 2026-11-23T01:00:00+00:00"
)


# -- failure classification -------------------------------------------------------------------------
def _classify(text: str, error_class: str = "CommandError", **kw: object) -> pb.Failure:
    obs = failures.RunObservations()
    for event in kw.pop("events", []):  # type: ignore[attr-defined]
        obs.observe(event)
    return failures.classify(error_class=error_class, error_text=text, observations=obs, pending=[])


def test_known_cloud_errors_map_like_the_go_agent() -> None:
    conflict = _classify("error: [409] Conflict: Another update is currently in progress.")
    assert (conflict.reason, conflict.code, conflict.message) == (
        "UpdateConflict",
        409,
        "Another update is currently in progress",
    )
    token = _classify("error: invalid access token")
    assert (token.reason, token.code) == ("InvalidAccessToken", 401)


def test_a_diy_lock_names_its_owner() -> None:
    f = _classify(LOCKED, "ConcurrentUpdateError")
    assert f.reason == "StackLocked" and f.code == 409
    assert f.lock is not None
    assert f.lock.owner == "alice@box (pid 4242)"
    assert f.lock.location.endswith("/locks/organization/proj/dev/4f0e.json")
    assert f.lock.acquired is not None and f.lock.acquired.year == 2026


def test_colour_codes_never_reach_a_message() -> None:
    text = "Duration: 1s\n\x1b[31mError\x1b[0m: error resolving type of resource settings: no plugin\n"
    failure = _classify(text)
    assert failure.message == "Error: error resolving type of resource settings: no plugin"
    assert "\x1b" not in failure.detail


def test_only_a_lock_left_by_a_dead_process_of_this_pod_is_stale() -> None:
    started = datetime(2026, 11, 23, 2, 0, tzinfo=UTC)
    before, after = datetime(2026, 11, 23, 1, 0, tzinfo=UTC), datetime(2026, 11, 23, 3, 0, tzinfo=UTC)

    def lock(owner: str, at: datetime | None) -> pb.LockInfo:
        return pb.LockInfo(owner=owner, location="file:///s/x.json", acquired=at)

    assert failures.stale_own_lock(
        lock("pulumi@web-workspace-0 (pid 31)", before), "web-workspace-0", started
    )
    # taken since this agent started: a live process of this pod (an exec'd `pulumi import`) holds it
    assert not failures.stale_own_lock(
        lock("pulumi@web-workspace-0 (pid 31)", after), "web-workspace-0", started, alive=lambda _: True
    )
    # taken in the second the agent started, printed without its fraction: still live
    assert not failures.stale_own_lock(
        lock("pulumi@web-workspace-0 (pid 31)", started),
        "web-workspace-0",
        started.replace(microsecond=600_000),
        alive=lambda _: True,
    )
    # another host's lock (a laptop, another pod) is never ours to remove
    assert not failures.stale_own_lock(lock("alice@laptop (pid 31)", before), "web-workspace-0", started)
    assert not failures.stale_own_lock(
        lock("pulumi@web-workspace-0 (pid 31)", None), "web-workspace-0", started
    )
    assert not failures.stale_own_lock(None, "web-workspace-0", started)


def test_a_lock_of_this_host_taken_in_the_agents_first_second_is_stale_once_its_process_is_gone() -> None:
    started = datetime(2026, 11, 23, 2, 0, 0, 600_000, tzinfo=UTC)
    same_second = pb.LockInfo(
        owner="pulumi@web-workspace-0 (pid 31)",
        location="file:///s/x.json",
        acquired=started.replace(microsecond=0),
    )
    assert failures.stale_own_lock(same_second, "web-workspace-0", started, alive=lambda pid: pid != 31)
    assert not failures.stale_own_lock(same_second, "web-workspace-0", started, alive=lambda pid: pid == 31)
    # another host's pid says nothing about this host's processes
    assert not failures.stale_own_lock(
        pb.LockInfo(owner="alice@laptop (pid 31)", acquired=started),
        "web-workspace-0",
        started,
        alive=lambda _: False,
    )
    # no pid to check: live
    assert not failures.stale_own_lock(
        pb.LockInfo(owner="pulumi@web-workspace-0", acquired=started),
        "web-workspace-0",
        started,
        alive=lambda _: False,
    )
    assert failures.pid_alive(os.getpid())


def test_a_zombie_holds_no_lock() -> None:
    """A killed process nobody has reaped yet (its parent died too) is dead, not live."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        child.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        assert not failures.pid_alive(child.pid)
    finally:
        child.wait()
    assert not failures.pid_alive(child.pid)


def test_program_and_resource_errors_are_told_apart() -> None:
    stack_diag = {
        "diagnosticEvent": {
            "severity": "error",
            "message": "undefined variable nope",
            "urn": "urn:pulumi:dev::p::pulumi:pulumi:Stack::p-dev",
        }
    }
    program = _classify("error: update failed", events=[stack_diag])
    assert (program.reason, program.message) == ("ProgramError", "undefined variable nope")

    resource_diag = {
        "diagnosticEvent": {
            "severity": "error",
            "message": "boom",
            "urn": "urn:pulumi:dev::p::test:index:Fail::f",
        }
    }
    failed = {
        "resOpFailedEvent": {"metadata": {"urn": "urn:pulumi:dev::p::test:index:Fail::f", "op": "create"}}
    }
    resource = _classify("error: update failed", events=[resource_diag, failed])
    assert (resource.reason, resource.message) == ("ResourceOperationFailed", "boom")

    other = _classify("first\nerror: something else")
    assert (other.reason, other.message, other.detail) == (
        "OperationFailed",
        "error: something else",
        "first\nerror: something else",
    )


def test_pending_operations_come_from_the_deployment() -> None:
    deployment = {
        "resources": [],
        "pending_operations": [{"resource": {"urn": "urn:a", "type": "t:a"}, "type": "creating"}],
    }
    assert failures.pending_operations(deployment) == [pb.PendingOperation(urn="urn:a", type="creating")]
    assert failures.pending_operations(None) == []


# -- config planning -----------------------------------------------------------------------------------
def _env(values: dict[str, str]) -> Callable[[str], str | None]:
    return lambda name: values.get(name)


def test_plain_config_uses_escaped_keys_and_paths() -> None:
    items = [
        pb.ConfigItem(key="name", value=Value.from_dict("x")),
        pb.ConfigItem(key="a.b", value=Value.from_dict("kept whole")),
        pb.ConfigItem(key="nested.list[0]", path=True, value=Value.from_dict("p")),
        pb.ConfigItem(key="aws:region", value_from=pb.ConfigValueFrom(env="REGION"), secret=True),
    ]
    plan = stackconfig.plan("proj", items, _env({"REGION": "eu-west-1"}))
    assert isinstance(plan, stackconfig.PathConfig)
    assert {k: (v.value, v.secret) for k, v in plan.values.items()} == {
        'proj:["name"]': ("x", False),
        'proj:["a.b"]': ("kept whole", False),
        "proj:nested.list[0]": ("p", False),
        'aws:["region"]': ("eu-west-1", True),
    }


def test_structured_config_becomes_one_json_document(tmp_path: Path) -> None:
    doc = tmp_path / "doc.json"
    doc.write_text('{"k": [1, 2]}')
    items = [
        pb.ConfigItem(key="obj", value=Value.from_dict({"a": [1, "b"]})),
        pb.ConfigItem(key="file", value_from=pb.ConfigValueFrom(path=str(doc), json=True), secret=True),
        pb.ConfigItem(key="plain", value=Value.from_dict("s")),
    ]
    plan = stackconfig.plan("proj", items, _env({}))
    assert isinstance(plan, stackconfig.JsonConfig)
    assert json.loads(plan.document) == {
        "proj:obj": {"value": '{"a":[1,"b"]}', "objectValue": {"a": [1, "b"]}, "secret": False},
        "proj:file": {"value": '{"k": [1, 2]}', "objectValue": {"k": [1, 2]}, "secret": True},
        "proj:plain": {"value": "s", "secret": False},
    }


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            pb.ConfigItem(key="k", value_from=pb.ConfigValueFrom(env="MISSING")),
            "missing value for environment variable: MISSING",
        ),
        (
            pb.ConfigItem(key="k", value_from=pb.ConfigValueFrom(path="/nonexistent/x")),
            "unreadable path: /nonexistent/x",
        ),
        (pb.ConfigItem(key="k"), "invalid config value"),
        (
            pb.ConfigItem(key="k", path=True, value=Value.from_dict([1])),
            "path=true is incompatible with JSON values",
        ),
    ],
)
def test_unusable_config_items_are_refused(item: pb.ConfigItem, message: str) -> None:
    with pytest.raises(stackconfig.ConfigError, match=message):
        stackconfig.plan("proj", [item], _env({}))


# -- engine events --------------------------------------------------------------------------------------
def test_engine_events_keep_the_cli_json_shape() -> None:
    raw = {
        "sequence": 4,
        "timestamp": 1700000000,
        "resourcePreEvent": {
            "metadata": {
                "op": "create",
                "urn": "urn:pulumi:dev::p::random:index/randomString:RandomString::r",
                "type": "random:index/randomString:RandomString",
                "provider": "",
                "new": {
                    "type": "random:index/randomString:RandomString",
                    "urn": "urn:pulumi:dev::p::random:index/randomString:RandomString::r",
                    "inputs": {"length": 8, "snake_case_key": True},
                    "outputs": {},
                    "custom": True,
                    "delete": False,
                    "id": "",
                    "parent": "",
                    "protect": False,
                    "retainOnDelete": False,
                },
                "detailedDiff": {},
            },
            "planning": True,
        },
    }
    out = engine_event_to_json(events.EngineEvent.from_json(raw))
    assert out["sequence"] == 4 and out["timestamp"] == 1700000000
    meta = out["resourcePreEvent"]["metadata"]
    assert meta["op"] == "create"
    assert meta["new"]["inputs"] == {"length": 8, "snake_case_key": True}  # user keys untouched
    assert meta["new"]["retainOnDelete"] is False
    assert out["resourcePreEvent"]["planning"] is True
    assert engine_event_to_json(
        events.EngineEvent.from_json({"sequence": 9, "timestamp": 1, "cancelEvent": {}})
    ) == {
        "sequence": 9,
        "timestamp": 1,
        "cancelEvent": {},
    }


# -- journal -----------------------------------------------------------------------------------------------
def test_journal_round_trip_and_torn_last_line(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.create("u-1", pb.OperationType.UP, {"operationId": "u-1"})
    j.append_event("u-1", 1, {"a": 1})
    j.append_event("u-1", 2, {"b": 2})
    j.close()
    with (tmp_path / "u-1" / "events.jsonl").open("a") as f:
        f.write('{"sequence": 3, "ev')  # the agent died mid-write
    assert list(j.events("u-1")) == [(1, {"a": 1}), (2, {"b": 2})]
    assert j.result("u-1") is None
    j.write_result(pb.OperationResult(operation_id="u-1", state=pb.OperationState.SUCCEEDED))
    result = j.result("u-1")
    assert result is not None and result.state == pb.OperationState.SUCCEEDED
    record = j.load("u-1")
    assert record is not None and record.type == pb.OperationType.UP
    assert j.ids() == ["u-1"]


@pytest.mark.parametrize("op_id", ["../x", "a/b", "", ".", "..", "-x", "x" * 300])
def test_operation_ids_are_safe_path_names(op_id: str) -> None:
    assert not valid_operation_id(op_id)


def test_reasonable_operation_ids_are_accepted() -> None:
    assert valid_operation_id("my-stack-18c3f2a9b1e")
    assert valid_operation_id("Update_1.2")


def test_integral_numbers_stay_integers_after_the_wire() -> None:
    """google.protobuf.Value carries numbers as doubles: a Stack's ``count: 3`` must reach Pulumi as 3."""
    sent = [
        pb.ConfigItem(key="count", value=Value.from_dict(3)),
        pb.ConfigItem(key="obj", value=Value.from_dict({"n": [1, 2.5]})),
    ]
    received = [pb.ConfigItem().parse(bytes(item)) for item in sent]
    plan = stackconfig.plan("proj", received, _env({}))
    assert isinstance(plan, stackconfig.JsonConfig)
    doc = json.loads(plan.document)
    assert doc["proj:count"]["value"] == "3" and doc["proj:count"]["objectValue"] == 3
    assert doc["proj:obj"]["value"] == '{"n":[1,2.5]}'

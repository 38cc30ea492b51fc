"""Per-resource change sets from engine events, PlanMismatch from the engine's words, and the plan store,
as pure functions (no engine). The events are trimmed from what Pulumi v3.274.1 emitted (recorded with
the Automation API, `pulumi preview`, `pulumi refresh --preview-only` and `pulumi up --plan` on a Python
dynamic provider), plus the `diffs`/`detailedDiff` a provider such as Kubernetes reports;
test_update_plans.py runs the same on the real engine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pko.agent import failures
from pko.agent.engineevents import ChangeSet, differing_paths, resource_changes, step_paths
from pko.agent.plans import PlanStore, default_plans_dir
from pko.api.generated.pko.agent import v1 as pb

FILE = "pulumi-python:dynamic:Resource"
PROVIDER = "pulumi:providers:pulumi-python"


def urn(name: str, type_: str = FILE) -> str:
    return f"urn:pulumi:dev::demo::{type_}::{name}"


def state(inputs: dict[str, Any], outputs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": FILE, "inputs": inputs, "outputs": outputs if outputs is not None else {}}


def step(kind: str, op: str, name: str, old: Any = None, new: Any = None, **extra: Any) -> dict[str, Any]:
    metadata = {"op": op, "urn": urn(name), "type": FILE, "provider": "", "old": old, "new": new, **extra}
    metadata.setdefault("detailedDiff", {})
    return {"sequence": 1, "timestamp": 1795800774, kind: {"metadata": metadata}}


# --- what the engine emits ---------------------------------------------------------------------------


def test_a_preview_reports_each_step_but_same_with_the_inputs_that_differ() -> None:
    """`pulumi preview`: a pre event and an outputs event per step (the same op); the dynamic provider
    gives no diffs, so the paths are the inputs that differ (new outputs are not known yet)."""
    old = state({"content": "one", "path": "/a"}, {"content": "one", "path": "/a"})
    new = state({"content": "two", "path": "/a"})
    events = [
        {"sequence": 1, "timestamp": 1, "preludeEvent": {"config": {"demo:content": "two"}}},
        step("resourcePreEvent", "same", "b", old, old),
        step("resourcePreEvent", "update", "a", old, new),
        step("resOutputsEvent", "update", "a", old, new),
        step("resourcePreEvent", "create", "c", None, state({"content": "sea"})),
        {"sequence": 9, "timestamp": 1, "summaryEvent": {"resourceChanges": {"same": 1, "update": 1}}},
    ]
    assert resource_changes(events) == [
        pb.ResourceChange(urn=urn("a"), type=FILE, op="update", paths=["content"]),
        pb.ResourceChange(urn=urn("c"), type=FILE, op="create"),
    ]


def test_a_preview_only_refresh_reports_drift_and_gone_resources_not_the_refresh_steps() -> None:
    """`pulumi refresh --preview-only`: every resource gets a `refresh` pre event before it is read
    (old and new alike), then an outputs event: `same`, `update` with what was read, or `delete`."""
    before = state({"content": "one", "path": "/a"}, {"content": "one", "path": "/a"})
    read = state({"content": "drifted\n", "path": "/a"}, {"content": "drifted\n", "path": "/a"})
    bee = state({"content": "bee", "path": "/b"}, {"content": "bee", "path": "/b"})
    events = [
        step("resourcePreEvent", "refresh", "a", before, before),
        step("resourcePreEvent", "refresh", "b", bee, bee),
        step("resourcePreEvent", "refresh", "s", before, before),
        step("resOutputsEvent", "same", "s", before, before),
        step("resOutputsEvent", "delete", "b", bee, None),
        step("resOutputsEvent", "update", "a", before, read),
    ]
    assert [(c.urn, c.op, list(c.paths)) for c in resource_changes(events)] == [
        (urn("a"), "update", ["content"]),
        (urn("b"), "delete", []),
    ]


def test_a_refresh_step_the_engine_gave_a_diff_is_reported() -> None:
    events = [step("resourcePreEvent", "refresh", "a", diffs=["spec"], detailedDiff={"spec.replicas": {}})]
    assert [(c.op, list(c.paths)) for c in resource_changes(events)] == [("refresh", ["spec.replicas"])]


def test_outputs_are_compared_only_where_the_inputs_agree_and_both_are_known() -> None:
    read_back = step_paths(
        {"old": state({"p": 1}, {"p": 1, "value": "one"}), "new": state({"p": 1}, {"p": 1, "value": "two"})}
    )
    assert read_back == ["value"]
    assert step_paths({"old": state({"p": 1}, {"p": 1, "v": 2}), "new": state({"p": 1})}) == []


def test_the_engines_detailed_diff_wins_then_its_diffs() -> None:
    old, new = state({"a": 1}), state({"a": 2})
    detailed = {"spec.template.metadata.labels.app": {"kind": "update"}, "data.x": {"kind": "add"}}
    assert step_paths({"old": old, "new": new, "diffs": ["spec"], "detailedDiff": detailed}) == [
        "data.x",
        "spec.template.metadata.labels.app",
    ]
    assert step_paths({"old": old, "new": new, "diffs": ["spec", "data", "spec"], "detailedDiff": {}}) == [
        "data",
        "spec",
    ]
    assert step_paths({"old": None, "new": new, "detailedDiff": {}}) == []


def test_paths_go_through_objects_and_quote_keys_that_are_no_names() -> None:
    old = {"metadata": {"labels": {"app": "x"}, "annotations": {"pulumi.com/skipAwait": "true"}}, "n": [1]}
    new = {"metadata": {"labels": {"app": "y", "tier": "web"}, "annotations": {}}, "n": [1, 2], "demo:k": 1}
    assert differing_paths(old, new) == [
        '["demo:k"]',
        'metadata.annotations["pulumi.com/skipAwait"]',
        "metadata.labels.app",
        "metadata.labels.tier",
        "n",
    ]
    assert differing_paths({"a": {"b": 1}}, {"a": {"b": 1}}) == []


def test_one_entry_per_resource_and_step_sorted_with_paths_merged() -> None:
    """A replacement is three steps of one URN; pre and outputs events of a step are one entry."""
    changes = ChangeSet()
    for op in ("delete-replaced", "replace", "create-replacement"):
        changes.observe(step("resourcePreEvent", op, "r", diffs=["path"]))
    changes.observe(step("resourcePreEvent", "update", "a", diffs=["x"]))
    changes.observe(step("resOutputsEvent", "update", "a", diffs=["y"]))
    changes.observe({"resourcePreEvent": {"metadata": {"op": "update"}}})  # no URN: ignored
    assert [(c.urn, c.op, list(c.paths)) for c in changes.changes()] == [
        (urn("a"), "update", ["x", "y"]),
        (urn("r"), "create-replacement", ["path"]),
        (urn("r"), "delete-replaced", ["path"]),
        (urn("r"), "replace", ["path"]),
    ]


# --- PlanMismatch ---------------------------------------------------------------------------------


def _diagnostic(message: str, urn_: str) -> dict[str, Any]:
    return {
        "diagnosticEvent": {"message": message + "\n", "severity": "error", "urn": urn_, "prefix": "error: "}
    }


def _classify(events: list[dict[str, Any]], error_class: str, text: str = "") -> pb.Failure:
    observations = failures.RunObservations()
    for event in events:
        observations.observe(event)
    return failures.classify(error_class=error_class, error_text=text, observations=observations, pending=[])


def test_a_step_the_plan_lacks_is_plan_mismatch_naming_the_resource() -> None:
    created = urn("e")
    failure = _classify(
        [
            _diagnostic(
                "create is not allowed by the plan: no steps were expected for this resource", created
            ),
            _diagnostic("Resource monitor has terminated, shutting down", ""),
        ],
        "CommandError",
        "error: create is not allowed by the plan: no steps were expected for this resource",
    )
    assert failure.reason == "PlanMismatch"
    assert failure.message == (
        f"the update does not match its plan: {created}: create is not allowed by the plan: no steps were "
        "expected for this resource"
    )


def test_changed_properties_are_plan_mismatch_not_the_python_programs_error() -> None:
    """A Python program the engine stops mid-registration fails too (RuntimeError, a traceback on
    the stack): the plan's refusal is the cause."""
    provider = urn("default", PROVIDER)
    said = f"resource {provider} violates plan: properties changed: ~~demo:content[{{three}}!={{four}}]"
    failure = _classify(
        [_diagnostic(said, provider), _diagnostic("Program failed with an unhandled exception:\n...", "")],
        "RuntimeError",
    )
    assert (failure.reason, failure.message) == (
        "PlanMismatch",
        f"the update does not match its plan: {said}",
    )


def test_plan_mismatch_from_the_error_text_alone() -> None:
    failure = _classify([], "CommandError", "Updating (dev):\nerror: no plan for resource urn:x\n")
    assert (failure.reason, failure.message) == (
        "PlanMismatch",
        "the update does not match its plan: no plan for resource urn:x",
    )
    assert _classify([], "CommandError", "error: boom").reason == "OperationFailed"


# --- the plan store ---------------------------------------------------------------------------------


def test_only_a_committed_plan_is_found_and_at_most_keep_are_kept(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans", keep=2)
    assert store.find("p-1") is None and store.ids() == []
    for i in range(1, 4):
        store.partial(f"p-{i}").write_text("{}")
        os.utime(store.partial(f"p-{i}"), (1000 + i, 1000 + i))
        assert store.commit(f"p-{i}")
    assert store.ids() == ["p-3", "p-2"], "the oldest was pruned"
    assert store.find("p-3") == tmp_path / "plans" / "p-3.json"
    assert store.commit("p-9") is False, "the engine wrote no plan"
    store.partial("p-8").write_text("{")
    store.discard("p-8")
    assert store.find("p-8") is None and not store.partial("p-8").exists()
    store.remove("p-3")
    assert store.ids() == ["p-2"]
    store.partial("p-7").write_text("{")  # a preview the agent died in
    store.partial("p-6").write_text("{}")
    assert store.commit("p-6") and not store.partial("p-7").exists()
    assert store.ids() == ["p-6", "p-2"]


def test_an_invalid_plan_id_is_never_a_path(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans")
    (tmp_path / "secret.json").write_text("{}")
    assert store.find("../secret") is None
    store.remove("../secret")
    assert (tmp_path / "secret.json").exists()
    with pytest.raises(ValueError):
        store.path("../secret")


def test_plans_live_in_the_agents_state_directory() -> None:
    assert default_plans_dir(Path("/share/workspace")) == Path("/share/.agent/plans")


def _observed(events: list[dict[str, Any]]) -> failures.RunObservations:
    observations = failures.RunObservations()
    for event in events:
        observations.observe(event)
    return observations


def test_a_run_that_ends_with_its_summary_and_reports_nothing_applied_silently() -> None:
    """pulumi 3.274's `up --plan` exits 1 after applying every step when a stack output the preview
    could not know differs; only such a run counts as applied, never one that said anything."""
    summary = {"summaryEvent": {"resourceChanges": {"create": 2}}}
    assert _observed([summary]).applied_silently("\n\n")
    assert not _observed([]).applied_silently("")  # ended before its summary
    assert not _observed([summary]).applied_silently("error: something")
    assert not _observed(
        [summary, _diagnostic("create is not allowed by the plan", urn("e"))]
    ).applied_silently("")
    failed = {"resOpFailedEvent": {"metadata": {"urn": urn("e")}}}
    assert not _observed([summary, failed]).applied_silently("")
    assert _observed([summary, {"cancelEvent": {}}]).applied_silently("")  # the end of every run


def test_the_agent_log_lists_every_change_the_status_may_cut() -> None:
    """The operator lists at most pko.api.limits.MAX_LISTED_ENTRIES changes in an Update's status; the
    agent's log has one ``resource change`` line for each, in the change set's order."""
    from pko.agent.runnerresults import log_changes
    from structlog.testing import capture_logs

    changes = [
        pb.ResourceChange(urn=urn(f"r{i:04d}"), type=FILE, op="create", paths=["a"]) for i in range(1000)
    ]
    with capture_logs() as logs:
        log_changes("op-1", changes)
    lines = [e for e in logs if e["event"] == "resource change"]
    assert [e["urn"] for e in lines] == [c.urn for c in changes]
    assert lines[0] == {
        "event": "resource change",
        "log_level": "info",
        "operation": "op-1",
        "urn": urn("r0000"),
        "type": FILE,
        "op": "create",
        "paths": ["a"],
    }

"""The "what next" decision of a Stack (pure): plan_sync (Go: isSynced) runs an update for a new
generation, request or commit, a resync or a branch poll, a due retry or a deletion; and a
prerequisite Stack's requirement."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pko.controllers.stack.status import plan_sync, record_succeeded, requirement_error

from .builders import SETTINGS, T0, current, failed_status, spec, stack_obj, update

# --- plan_sync (Go: isSynced) ----------------------------------------------------------------


def succeeded(
    commit: str = "r1", generation: int = 1, request: str = "", at: datetime = T0
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    record_succeeded(status, current("s-1", generation, commit, request), update("s-1"), None, at)
    return status


def test_plan_runs_first_update_new_generation_request_and_commit() -> None:
    s = spec()
    assert plan_sync(stack_obj(), s, {}, "r1", T0, SETTINGS).message == "Initial stack update"
    assert plan_sync(stack_obj(2), s, succeeded(), "r1", T0, SETTINGS).message == "New stack generation: 2"
    assert plan_sync(stack_obj(1, "now"), s, succeeded(), "r1", T0, SETTINGS).message == 'Sync request: "now"'
    assert plan_sync(stack_obj(), s, succeeded(), "r2", T0, SETTINGS).message == 'New commit detected: "r2"'
    decision = plan_sync(stack_obj(), s, succeeded(), "r1", T0, SETTINGS)
    assert decision.synced and decision.requeue_after is None


def test_plan_resyncs_with_continue_resync_on_commit_match() -> None:
    s = spec(continueResyncOnCommitMatch=True, resyncFrequencySeconds=300)
    early = plan_sync(stack_obj(), s, succeeded(), "r1", T0 + timedelta(seconds=100), SETTINGS)
    assert early.synced and early.requeue_after == 200
    late = plan_sync(stack_obj(), s, succeeded(), "r1", T0 + timedelta(seconds=300), SETTINGS)
    assert not late.synced and late.message == "Resync time elapsed: 5m0s"


def test_plan_polls_a_branch_at_the_resync_frequency_at_least_a_minute() -> None:
    s = spec(resyncFrequencySeconds=10)
    decision = plan_sync(stack_obj(), s, succeeded(), "r1", T0, SETTINGS, polls_branch=True)
    assert decision.synced and decision.requeue_after is not None and 30 <= decision.requeue_after < 90
    # On its tick, the next poll is one interval later.
    tick = T0 + timedelta(seconds=decision.requeue_after)
    later = plan_sync(stack_obj(), s, succeeded(), "r1", tick, SETTINGS, polls_branch=True)
    assert later.requeue_after is not None and abs(later.requeue_after - 60) < 1e-6


def test_branch_polls_of_a_fleet_are_spread_over_the_interval_and_stay_put() -> None:
    """A fleet reconciled all at once (an operator start) polls spread over the whole interval,
    each Stack at its own phase, which no extra reconcile moves."""
    s = spec(resyncFrequencySeconds=600)
    ticks = []
    for i in range(400):
        obj = stack_obj()
        obj["metadata"]["uid"] = f"uid-{i}"
        decision = plan_sync(obj, s, succeeded(), "r1", T0, SETTINGS, polls_branch=True)
        assert decision.requeue_after is not None and 300 <= decision.requeue_after < 900
        tick = T0 + timedelta(seconds=decision.requeue_after)
        ticks.append(tick.timestamp() % 600)
        # an extra reconcile 100 s later aims at the same tick
        extra = plan_sync(obj, s, succeeded(), "r1", T0 + timedelta(seconds=100), SETTINGS, polls_branch=True)
        assert extra.requeue_after is not None
        assert abs((T0 + timedelta(seconds=100 + extra.requeue_after) - tick).total_seconds()) in (0.0, 600.0)
    buckets = [0] * 10  # polls per tenth of the interval: about 40 each
    for t in ticks:
        buckets[int(t // 60)] += 1
    assert max(buckets) < 2 * min(buckets), buckets


def test_plan_retries_after_the_backoff_and_stops_when_stalled() -> None:
    s = spec()
    status = failed_status(1)
    waiting = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=4), SETTINGS)
    assert waiting.synced and waiting.requeue_after == 6
    due = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=10), SETTINGS)
    assert not due.synced and due.message == "Backoff time elapsed: 10s"
    stalled = plan_sync(stack_obj(), s, failed_status(4), "r1", T0 + timedelta(days=2), SETTINGS)
    assert stalled.synced and stalled.requeue_after is None
    new_commit = plan_sync(stack_obj(), s, failed_status(4), "r2", T0, SETTINGS)
    assert not new_commit.synced


def test_plan_on_deletion_destroys_once() -> None:
    s = spec(destroyOnFinalize=True)
    assert plan_sync(stack_obj(2, deleting=True), s, succeeded(), "r1", T0, SETTINGS).message == (
        "Stack marked for deletion"
    )
    destroyed: dict[str, Any] = {}
    record_succeeded(destroyed, current("d", generation=2), update("d", type_="destroy"), None, T0)
    assert plan_sync(stack_obj(2, deleting=True), s, destroyed, "r1", T0, SETTINGS).synced


# --- prerequisites ---------------------------------------------------------------------------


def prereq(status: dict[str, Any], generation: int = 1, request: str | None = None) -> dict[str, Any]:
    obj = stack_obj(generation, request)
    obj["status"] = status
    return obj


def test_prerequisite_requirements() -> None:
    def message(obj: dict[str, Any], within: timedelta | None = None, now: datetime = T0) -> str | None:
        error = requirement_error(obj, within, now)
        return None if error is None else error.message

    assert message(prereq({})) == "prerequisite has not run to completion"
    assert message(prereq(succeeded(), 2)) == "prerequisite has not run to completion"
    assert message(prereq(succeeded(), 1, "again")) == "prerequisite has not run to completion"
    assert message(prereq(failed_status(1))) == "prerequisite failed"
    assert message(prereq(succeeded())) is None
    old = requirement_error(prereq(succeeded()), timedelta(minutes=5), T0 + timedelta(hours=1))
    assert old is not None and old.message == "prerequisite is out of date" and old.touch == "after-s-1"

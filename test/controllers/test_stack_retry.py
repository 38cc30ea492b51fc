"""A Stack's retries after a failed Update (pure): failures classified transient or not, the backoffs
(upstream's cooldown for deterministic failures, a fast jittered one for transient ones) as the
operator's settings and the Stack's retryPolicy shape them, and when a Stack stalls instead."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.retry import (
    classify_failure,
    deterministic_delay,
    for_stack,
    jitter_fraction,
    retry_delay,
    tail_lines,
    transient_delay,
)
from pko.controllers.stack.status import mark_result, plan_sync, record_failed, record_succeeded

from .builders import SETTINGS, T0, current, failed_status, spec, stack_obj, types, update

# --- result conditions and retries -----------------------------------------------------------


def test_deterministic_failure_retries_with_the_go_cooldown_then_stalls() -> None:
    s = spec()
    delays = []
    for n in (1, 2, 3):
        status = failed_status(n)
        mark_result(status, s, SETTINGS, 1, T0)
        assert types(status)["Reconciling"] == ("True", "RetryingAfterFailure", f"{n - 1} update failure(s)")
        delays.append(
            (datetime.fromisoformat(status["nextRetryTime"].replace("Z", "+00:00")) - T0).total_seconds()
        )
    assert delays == [10, 30, 90]
    status = failed_status(4)
    mark_result(status, s, SETTINGS, 1, T0)
    assert types(status)["Stalled"] == (
        "True",
        "UpdateFailed",
        "up failed 3 times; not retrying until the spec or source changes",
    )
    assert "nextRetryTime" not in status and "Reconciling" not in types(status)


def test_per_stack_failure_budget_and_backoff_cap() -> None:
    status = failed_status(2)
    mark_result(status, spec(maxUpdateFailures=1), SETTINGS, 1, T0)
    assert types(status)["Stalled"][1] == "UpdateFailed"
    assert deterministic_delay(5, for_stack(spec(retryMaxBackoffDurationSeconds=60), SETTINGS)) == 60
    assert deterministic_delay(20, SETTINGS) == 24 * 3600


def test_transient_failures_back_off_fast_with_jitter_and_never_stall() -> None:
    status = failed_status(8, reason="Unavailable")
    mark_result(status, spec(), SETTINGS, 1, T0)
    assert types(status)["Reconciling"][1] == "RetryingAfterFailure"
    retry_in = (datetime.fromisoformat(status["nextRetryTime"].replace("Z", "+00:00")) - T0).total_seconds()
    assert 240 <= retry_in <= 300  # jittered (+-20%), and never beyond the 5 min cap
    capped_at_60 = for_stack(spec(retryMaxBackoffDurationSeconds=60), SETTINGS)
    capped = {transient_delay(12, capped_at_60, f"c-{i}") for i in range(20)}
    assert max(capped) <= 60  # the Stack's cap holds after the jitter
    first = transient_delay(0, SETTINGS, "a")
    assert 4 <= first <= 6
    assert {round(transient_delay(0, SETTINGS, f"s-{i}"), 3) for i in range(20)} != {5.0}
    assert jitter_fraction("x", 0.2) == jitter_fraction("x", 0.2)


def test_preview_stack_ends_failed_instead_of_retrying_a_deterministic_failure() -> None:
    status = failed_status(1, type_="preview")
    mark_result(status, spec(preview=True), SETTINGS, 1, T0)
    assert types(status)["Stalled"] == (
        "True",
        "UpdateFailed",
        "preview failed 1 times; not retrying until the spec or source changes",
    )
    status = failed_status(1, reason="Unavailable", type_="preview")
    mark_result(status, spec(preview=True), SETTINGS, 1, T0)
    assert types(status)["Reconciling"] == ("True", "PreviewFailed", "preview failed (0 attempt(s))")


def test_success_is_ready_and_clears_next_retry_time() -> None:
    status = failed_status(1)
    status["nextRetryTime"] = "x"
    record_succeeded(status, current("ok"), update("ok"), None, T0)
    mark_result(status, spec(), SETTINGS, 1, T0)
    assert types(status) == {
        "Ready": ("True", "ProcessingCompleted", "the stack has been processed and is up to date")
    }
    assert "nextRetryTime" not in status


# --- classification --------------------------------------------------------------------------


def test_failure_classification_is_closed_and_reads_lock_owner_and_pending_urns() -> None:
    assert classify_failure("UpdateConflict", "").transient
    assert classify_failure("InvalidAccessToken", "").reason == "AuthFailed"
    assert classify_failure("InstallationFailed", "").reason == "InstallFailed"
    locked = classify_failure("StackLocked", "the stack is locked by alice@host (pid 42)")
    assert locked.transient and locked.lock_owner == "alice@host (pid 42)"
    pending = classify_failure(
        "PendingOperations",
        "the stack has 1 pending operation(s): urn:pulumi:dev::p::random:index:RandomPet::a",
    )
    assert not pending.transient and pending.pending_operations == (
        "urn:pulumi:dev::p::random:index:RandomPet::a",
    )
    assert classify_failure("UpdateFailed", "error: 503 Service Unavailable").reason == "Transient"
    assert (
        classify_failure("UpdateFailed", "Missing required configuration variable 'x'").reason
        == "ConfigInvalid"
    )
    assert classify_failure("UpdateFailed", "error: something odd").reason == "OperationFailed"
    assert classify_failure(None, "").reason == "OperationFailed"
    # The Update controller's reasons for an operation its workspace pod lost or could not serve.
    assert classify_failure("OperationLost", "the workspace agent no longer knows this operation").transient
    assert classify_failure("AgentUnreachable", "lost contact with the workspace agent for 30s").transient
    assert classify_failure("AgentRestarted", "the agent stopped before the operation finished").transient


def test_message_keeps_the_last_lines() -> None:
    text = "\n".join(f"line {i}" for i in range(30))
    assert tail_lines(text).splitlines() == [f"line {i}" for i in range(20, 30)]
    assert len(tail_lines("x" * 5000)) == 2000


# --- tunable retries (issue 28) ---------------------------------------------------------------


def retry_in(status: dict[str, Any]) -> float:
    """Seconds from the failure (at T0) to ``status.nextRetryTime``."""
    return (datetime.fromisoformat(status["nextRetryTime"].replace("Z", "+00:00")) - T0).total_seconds()


def test_without_settings_the_backoff_is_the_built_in_one() -> None:
    assert (SETTINGS.transient_base, SETTINGS.transient_factor, SETTINGS.transient_cap, SETTINGS.jitter) == (
        5.0,
        2.0,
        300.0,
        0.2,
    )
    assert (SETTINGS.deterministic_base, SETTINGS.deterministic_factor, SETTINGS.max_backoff) == (
        10.0,
        3.0,
        86400.0,
    )
    # A Stack that sets nothing (or 0, upstream's "unset") takes the operator's settings as they are.
    assert for_stack(spec(), SETTINGS) == SETTINGS
    unset = spec(retryPolicy={"transient": {}}, retryMaxBackoffDurationSeconds=0)
    assert for_stack(unset, SETTINGS) == SETTINGS
    assert [deterministic_delay(n, SETTINGS) for n in range(10)] == [
        10, 30, 90, 270, 810, 2430, 7290, 21870, 65610, 86400,
    ]  # fmt: skip


def test_operator_settings_shape_both_backoffs() -> None:
    settings = RetrySettings(
        transient_base=2, transient_factor=3, transient_cap=60, jitter=0,
        deterministic_base=30, deterministic_factor=2, max_backoff=600,
    )  # fmt: skip
    assert [transient_delay(n, settings, "u") for n in range(6)] == [2, 6, 18, 54, 60, 60]
    assert [deterministic_delay(n, settings) for n in range(7)] == [30, 60, 120, 240, 480, 600, 600]
    fixed = RetrySettings(transient_factor=1, deterministic_factor=1, jitter=0)
    assert {transient_delay(n, fixed, "u") for n in range(50)} == {5}
    assert {deterministic_delay(n, fixed) for n in range(50)} == {10}


def test_a_stack_overrides_each_setting_it_names_and_keeps_the_operators_others() -> None:
    operator = RetrySettings(transient_cap=120, max_update_failures=5)
    policy = {"transient": {"baseSeconds": 1, "jitter": 0}, "deterministic": {"factor": 1.5}}
    expected = replace(operator, transient_base=1, jitter=0, deterministic_factor=1.5)
    assert for_stack(spec(retryPolicy=policy), operator) == expected
    full = spec(
        maxUpdateFailures=1,
        retryMaxBackoffDurationSeconds=900,
        retryPolicy={
            "transient": {"baseSeconds": 3, "factor": 4, "maxSeconds": 700, "jitter": 0.5},
            "deterministic": {"baseSeconds": 20, "factor": 2},
        },
    )
    assert for_stack(full, operator) == RetrySettings(
        max_update_failures=1, deterministic_base=20, deterministic_factor=2, transient_base=3,
        transient_factor=4, transient_cap=700, jitter=0.5, max_backoff=900,
    )  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [
        RetrySettings(),
        RetrySettings(jitter=0.9),
        RetrySettings(transient_cap=2.5, jitter=0.5),  # a cap in fractions of a second: never rounded up
        RetrySettings(transient_cap=7, max_backoff=3),  # the longest wait of any retry wins
    ],
    ids=["defaults", "wide-jitter", "fractional-cap", "max-backoff-below-transient-cap"],
)
def test_the_cap_is_the_longest_wait_whatever_the_jitter_and_rounding(settings: RetrySettings) -> None:
    cap = min(settings.transient_cap, settings.max_backoff)
    for n in range(40):
        for i in range(25):
            assert transient_delay(n, settings, f"u-{i}") <= cap
            whole = retry_delay(transient=True, failures=n, spec=spec(), settings=settings, seed=f"u-{i}")
            assert whole == int(whole) and 1 <= whole <= cap
        assert deterministic_delay(n, settings) <= settings.max_backoff


def test_a_stacks_max_backoff_caps_its_own_longer_transient_cap() -> None:
    policy = {"transient": {"baseSeconds": 20, "maxSeconds": 600}}
    s = spec(retryMaxBackoffDurationSeconds=30, retryPolicy=policy)
    assert retry_delay(transient=True, failures=5, spec=s, settings=SETTINGS, seed="u") == 30
    assert retry_delay(transient=False, failures=5, spec=s, settings=SETTINGS, seed="u") == 30


def test_huge_factors_and_failure_counts_stay_at_the_cap() -> None:
    steep = RetrySettings(transient_factor=1e300, deterministic_factor=1e300)
    assert deterministic_delay(100_000, steep) == steep.max_backoff
    assert transient_delay(100_000, steep, "u") == steep.transient_cap


@pytest.mark.parametrize(
    "bad",
    [
        {"transient_factor": 0.5},
        {"deterministic_factor": 0},
        {"transient_base": 0},
        {"deterministic_base": -10},
        {"transient_cap": 0.5},
        {"max_backoff": math.inf},
        {"jitter": 1},
        {"jitter": -0.1},
        {"jitter": math.nan},
        {"max_update_failures": -1},
    ],
    ids=lambda bad: f"{next(iter(bad))}={next(iter(bad.values()))}",
)
def test_nonsense_settings_are_refused_naming_the_setting(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"invalid retry settings: {next(iter(bad))} must"):
        RetrySettings(**bad)


def test_a_stack_policy_sets_next_retry_time_and_a_fix_starts_the_backoff_over() -> None:
    s = spec(maxUpdateFailures=10, retryPolicy={"deterministic": {"baseSeconds": 7, "factor": 2}})
    delays = []
    for n in (1, 2, 3, 4):
        status = failed_status(n)
        mark_result(status, s, SETTINGS, 1, T0)
        delays.append(retry_in(status))
    assert delays == [7, 14, 28, 56]
    waiting = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=50), SETTINGS)
    assert waiting.synced and waiting.requeue_after == 6
    due = plan_sync(stack_obj(), s, status, "r1", T0 + timedelta(seconds=56), SETTINGS)
    assert not due.synced and due.message == "Backoff time elapsed: 56s"
    # The user fixes the cause (a new generation, commit or request): it runs at once...
    assert plan_sync(stack_obj(2), s, status, "r1", T0, SETTINGS).message == "New stack generation: 2"
    assert plan_sync(stack_obj(), s, status, "r2", T0, SETTINGS).message == 'New commit detected: "r2"'
    assert plan_sync(stack_obj(1, "fixed"), s, status, "r1", T0, SETTINGS).message == 'Sync request: "fixed"'
    # ...and should it fail again, the backoff starts over from the base.
    record_failed(status, current("s-9", generation=2), update("s-9", failed="ProgramError"), T0)
    mark_result(status, s, SETTINGS, 2, T0)
    assert retry_in(status) == 7 and status["lastFailure"]["countedFailures"] == 1


def test_a_cause_that_goes_away_is_picked_up_within_the_stacks_transient_bound() -> None:
    s = spec(retryPolicy={"transient": {"baseSeconds": 2, "factor": 3, "maxSeconds": 40, "jitter": 0}})
    delays = []
    for n in range(1, 7):
        status = failed_status(n, reason="Unavailable")
        mark_result(status, s, SETTINGS, 1, T0)
        delays.append(retry_in(status))
        assert plan_sync(stack_obj(), s, status, "r1", T0, SETTINGS).requeue_after == delays[-1]
    assert delays == [2, 6, 18, 40, 40, 40]
    assert types(status)["Reconciling"][1] == "RetryingAfterFailure"  # never Stalled

"""The Update reconcile's pure ``refused``: what a refused start, cancel or write does next."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from pko.controllers.secretaccess import SecretAccess
from pko.controllers.update import status as us
from pko.controllers.update.plan import (
    RECORD_RETRY,
    SECRET_FORBIDDEN_RETRY,
    TRANSIENT_REQUEUE,
    CancelOperation,
    CreateOutputs,
    DeleteUpdate,
    Emit,
    Failure,
    ForgetOutcome,
    Outcome,
    Plan,
    WriteStatus,
    decide,
    refused,
)
from pko.machinery.controller import Result

from .updatecases import (
    NOW,
    UID,
    assert_ended,
    assert_transient_wait,
    completed,
    make_update,
    observed,
    running,
    start_refused,
    succeeded,
)


def test_start_with_the_agent_unreachable_waits() -> None:
    message = "the pod of workspace 's' has no address yet"
    assert_transient_wait(start_refused(Failure(message=message, unreachable=True)), message)


def test_start_with_a_transient_agent_error_waits() -> None:
    failure = Failure(code="UNAVAILABLE", reason="Unavailable", message="down", transient=True)
    assert_transient_wait(start_refused(failure), "Unavailable: down")


def test_start_with_a_busy_agent_waits() -> None:
    for code in ("ABORTED", "FAILED_PRECONDITION"):
        failure = Failure(code=code, reason="Busy", message="another operation runs")
        assert_transient_wait(start_refused(failure), "Busy: another operation runs")


def test_start_refused_for_good_ends_the_update() -> None:
    failure = Failure(code="INVALID_ARGUMENT", reason="InstallationFailed", message="no such plugin")
    plan = start_refused(failure)
    assert plan is not None
    assert_ended(plan, "InstallationFailed", "no such plugin")
    plan = start_refused(Failure(code="INTERNAL", message="oops"))
    assert plan is not None
    assert_ended(plan, us.REASON_UPDATE_FAILED, "oops")


def cancel_refused(failure: Failure, *, watch_running: bool) -> Plan | None:
    update = running(make_update(owned=False))
    return refused(observed(update, watch_running=watch_running), CancelOperation(), failure, NOW)


def test_cancel_unreachable_while_watched_tries_again() -> None:
    plan = cancel_refused(Failure(message="no address", unreachable=True), watch_running=True)
    assert plan is not None and plan.writes == []
    assert plan.result == Result.requeue_after(TRANSIENT_REQUEUE)
    transient = Failure(code="UNAVAILABLE", reason="Unavailable", message="down", transient=True)
    plan = cancel_refused(transient, watch_running=True)
    assert plan is not None and plan.writes == [] and plan.result == Result.requeue_after(TRANSIENT_REQUEUE)


def test_cancel_unreachable_without_a_watch_ends_canceled() -> None:
    plan = cancel_refused(Failure(message="no address", unreachable=True), watch_running=False)
    assert plan is not None
    assert_ended(plan, us.REASON_CANCELED, "the Update was canceled; its operation could not be: no address")


def test_cancel_of_an_unknown_operation_ends_canceled_even_while_watched() -> None:
    failure = Failure(code="NOT_FOUND", reason="NotFound", message="no such op", transient=True)
    plan = cancel_refused(failure, watch_running=True)
    assert plan is not None
    message = "the Update was canceled; its operation could not be: NotFound: no such op"
    assert_ended(plan, us.REASON_CANCELED, message)


def record_write(plan: Plan) -> WriteStatus:
    writes = [w for w in plan.writes if isinstance(w, WriteStatus)]
    assert len(writes) == 1 and writes[0].outcome is not None
    return writes[0]


def test_a_stale_result_write_keeps_the_outcome_and_retries() -> None:
    update = running(make_update())
    outcome = Outcome(UID, result=succeeded())
    write = record_write(decide(observed(update, outcome=outcome)))
    plan = refused(observed(update, outcome=outcome), write, Failure(status=409), NOW)
    assert plan is not None and plan.writes == []
    assert plan.result == Result.requeue_after(RECORD_RETRY)


def test_a_result_write_of_a_vanished_update_forgets_the_outcome() -> None:
    update = running(make_update())
    outcome = Outcome(UID, reason="X", message="y")
    write = record_write(decide(observed(update, outcome=outcome)))
    plan = refused(observed(update, outcome=outcome), write, Failure(status=404), NOW)
    assert plan is not None and plan.writes == [ForgetOutcome(UID)] and plan.result == Result.done()
    assert refused(observed(update), write, Failure(status=500), NOW) is None


def test_an_outputs_secret_refused_404_forgets_the_outcome() -> None:
    update = running(make_update())
    outcome = Outcome(UID, result=succeeded())
    create = decide(observed(update, outcome=outcome)).writes[0]
    assert isinstance(create, CreateOutputs)
    plan = refused(observed(update), create, Failure(status=404), NOW)
    assert plan is not None and plan.writes == [ForgetOutcome(UID)]
    assert refused(observed(update), create, Failure(status=500), NOW) is None


def test_an_outputs_secret_refused_403_keeps_the_outcome_and_names_the_binding() -> None:
    """The secrets-per-namespace install, unbound in the Update's namespace: a Warning Event that names
    the RoleBinding to make, the outcome kept (no ForgetOutcome), tried again later."""
    update = running(make_update())
    outcome = Outcome(UID, result=succeeded())
    create = decide(observed(update, outcome=outcome)).writes[0]
    assert isinstance(create, CreateOutputs)
    access = SecretAccess("pko/controller-manager")
    seen = dataclasses.replace(observed(update, outcome=outcome), access=access)
    plan = refused(seen, create, Failure(status=403), NOW)
    assert plan is not None and plan.result == Result.requeue_after(SECRET_FORBIDDEN_RETRY)
    secret = create.secret["metadata"]
    events = [w for w in plan.writes if isinstance(w, Emit)]
    assert events == [
        Emit(
            "Warning",
            "SecretForbidden",
            f"the operator may not create Secret {secret['namespace']}/{secret['name']} (403 Forbidden): "
            "bind ClusterRole pko-stack-secrets to ServiceAccount pko/controller-manager in namespace "
            f"{secret['namespace']} with a RoleBinding (docs/install.md, Secrets per namespace)",
        )
    ]
    assert not [w for w in plan.writes if isinstance(w, ForgetOutcome)]


def test_other_status_writes_expect_no_failure() -> None:
    wait = decide(observed(make_update(), workspace=None)).writes[0]
    assert isinstance(wait, WriteStatus) and wait.outcome is None
    assert refused(observed(make_update()), wait, Failure(status=409), NOW) is None


def test_a_delete_refused_404_or_409_is_done_without_the_event() -> None:
    update = completed(make_update(ttlAfterCompleted="1m"), NOW - timedelta(minutes=4))
    for status in (404, 409):
        plan = refused(observed(update), DeleteUpdate(), Failure(status=status), NOW)
        assert plan is not None and plan.writes == [] and plan.result == Result.done()
    assert refused(observed(update), DeleteUpdate(), Failure(status=500), NOW) is None

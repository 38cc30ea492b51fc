"""Which pending operations an operation that succeeded leaves stale (agent/pendingops.py); the real
engine's side is test_pending_operations.py."""

from __future__ import annotations

from pko.agent import pendingops
from pko.agent.pendingops import Settlement, live_urns, settle, without_pending
from pko.api.generated.pko.agent import v1 as pb

UP, REFRESH, DESTROY, PREVIEW = (
    pb.OperationType.UP,
    pb.OperationType.REFRESH,
    pb.OperationType.DESTROY,
    pb.OperationType.PREVIEW,
)
A = "urn:pulumi:dev::p::command:local:Command::a"
B = "urn:pulumi:dev::p::command:local:Command::b"


def op(urn: str, type_: str = "creating") -> pb.PendingOperation:
    return pb.PendingOperation(urn=urn, type=type_)


def test_a_create_whose_resource_exists_again_is_stale_after_an_up_a_refresh_or_a_destroy() -> None:
    for kind in (UP, REFRESH, DESTROY):
        for targeted in (False, True):
            assert settle([op(A)], kind, {A}, targeted=targeted) == Settlement(clear=(op(A),)), (
                kind,
                targeted,
            )


def test_a_create_nothing_refers_to_is_stale_after_a_whole_up_or_destroy() -> None:
    assert settle([op(B)], UP, {A}, targeted=False) == Settlement(clear=(op(B),))
    assert settle([op(A), op(B)], DESTROY, set(), targeted=False) == Settlement(clear=(op(A), op(B)))


def test_a_create_missing_from_the_state_stays_after_a_refresh_or_a_targeted_operation() -> None:
    assert settle([op(B)], REFRESH, {A}, targeted=False) == Settlement(keep=(op(B),))
    assert settle([op(B)], UP, {A}, targeted=True) == Settlement(keep=(op(B),))
    assert settle([op(B)], DESTROY, set(), targeted=True) == Settlement(keep=(op(B),))


def test_updates_deletes_and_reads_are_never_cleared() -> None:
    for kind in ("updating", "deleting", "reading", "importing"):
        assert settle([op(A, kind)], UP, {A}, targeted=False) == Settlement(keep=(op(A, kind),)), kind


def test_a_preview_clears_nothing() -> None:
    assert settle([op(A)], PREVIEW, {A}, targeted=False) == Settlement(keep=(op(A),))


def test_one_operation_that_must_stay_keeps_them_all_as_stack_import_drops_all_or_none() -> None:
    assert settle([op(A), op(B)], UP, {A}, targeted=True) == Settlement(keep=(op(A), op(B)))
    assert settle([op(A), op(B, "deleting")], UP, {A, B}, targeted=False) == Settlement(
        keep=(op(A), op(B, "deleting"))
    )


def test_no_pending_operations_settle_to_nothing() -> None:
    assert settle([], UP, {A}, targeted=False) == Settlement()


def test_live_urns_leave_out_resources_pending_deletion() -> None:
    deployment = {
        "resources": [
            {"urn": A, "type": "command:local:Command"},
            {"urn": B, "type": "command:local:Command", "delete": True},
            {"type": "no urn"},
        ]
    }
    assert live_urns(deployment) == {A}
    assert live_urns(None) == set() and live_urns({}) == set()
    # A replaced resource's old copy is not a creation: its pending create stays after a refresh.
    assert settle([op(B)], REFRESH, live_urns(deployment), targeted=False).keep == (op(B),)


def test_without_pending_drops_only_the_pending_operations() -> None:
    deployment = {
        "manifest": {"time": "t"},
        "resources": [{"urn": A}],
        "pending_operations": [{"type": "creating"}],
    }
    assert without_pending(deployment) == {"manifest": {"time": "t"}, "resources": [{"urn": A}]}
    assert "pending_operations" in deployment  # the input is left alone
    assert pendingops.CREATING == "creating"

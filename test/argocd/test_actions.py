"""The Stack's Argo CD actions (config/argocd/actions, as pasted from argocd-cm.yaml) on
hand-written Stacks: which are offered when, what each writes, and the patch Argo CD sends."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pko.devtools.argocd import Action, LuaScriptError, Scripts, discover, merge_patch, run_action

Obj = dict[str, Any]
SCRIPTS = Scripts.from_configmap()
DIGEST = "sha256:" + "cd" * 32
TOKEN = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def cond(type_: str, status: str, reason: str, message: str = "") -> Obj:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def stack(
    *conditions: Obj, annotations: dict[str, str] | None = None, suspend: bool = False, **status: Any
) -> Obj:
    metadata: Obj = {"name": "s", "namespace": "ns", "generation": 2, "uid": "u-1"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": metadata,
        "spec": {"stack": "dev", "programRef": {"name": "p"}, "suspend": suspend, "config": {}},
        "status": {"observedGeneration": 2, "conditions": list(conditions), "outputs": {}, **status},
    }


def enabled(obj: Obj) -> set[str]:
    return {name for name, action in discover(obj, SCRIPTS).items() if not action.disabled}


READY = cond("Ready", "True", "ProcessingCompleted")
AWAITING = cond("Ready", "False", "AwaitingApproval")
PLAN: Obj = {"digest": DIGEST, "summary": {"create": 1}}
FAILED: Obj = {"state": "failed", "type": "up", "failures": 1}
RETRYING = cond("Reconciling", "True", "RetryingAfterFailure", "1 update failure(s)")


def test_discovery_lists_the_three_actions_with_names_and_icons_for_the_ui() -> None:
    actions = discover(stack(READY), SCRIPTS)
    assert actions == {
        "approve": Action("approve", True, "fa fa-fw fa-check", "Approve plan"),
        "refresh": Action("refresh", False, "fa fa-fw fa-sync", "Refresh"),
        "retry": Action("retry", True, "fa fa-fw fa-redo", "Retry"),
    }


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (stack(READY), {"refresh"}),
        (stack(AWAITING, plan=PLAN), {"approve", "refresh"}),
        (stack(AWAITING, plan=PLAN, annotations={"pulumi.com/approved-plan": DIGEST}), {"refresh"}),
        (
            stack(AWAITING, plan=PLAN, annotations={"pulumi.com/approved-plan": "sha256:old"}),
            {"approve", "refresh"},
        ),
        (stack(AWAITING), {"refresh"}),
        (
            stack(cond("Ready", "False", "NotReadyInProgress"), RETRYING, lastUpdate=FAILED),
            {"refresh", "retry"},
        ),
        (stack(cond("Stalled", "True", "SpecInvalid")), {"refresh", "retry"}),
        (stack(RETRYING, lastUpdate=FAILED, currentUpdate={"name": "s-2"}), {"refresh"}),
        (stack(READY, lastUpdate={"state": "succeeded"}), {"refresh"}),
        (stack(cond("Stalled", "True", "UpdateFailed"), lastUpdate=FAILED, suspend=True), set()),
        (stack(AWAITING, plan=PLAN, suspend=True), {"approve"}),
    ],
    ids=[
        "ready",
        "awaiting-approval",
        "already-approved",
        "an-older-plan-approved",
        "awaiting-without-plan-yet",
        "failed-waiting-for-retry",
        "stalled",
        "retry-running",
        "succeeded",
        "suspended",
        "suspended-awaiting",
    ],
)
def test_an_action_is_enabled_only_where_it_applies(obj: Obj, expected: set[str]) -> None:
    assert enabled(obj) == expected


def test_discovery_on_a_stack_the_operator_has_not_seen_offers_refresh_only() -> None:
    obj = stack()
    del obj["status"]
    assert enabled(obj) == {"refresh"}


def test_approve_names_the_digest_of_the_plan_awaiting_approval() -> None:
    obj = stack(AWAITING, plan=PLAN, annotations={"team": "infra"})
    new = run_action("approve", obj, SCRIPTS)
    assert new["metadata"]["annotations"] == {"team": "infra", "pulumi.com/approved-plan": DIGEST}
    assert merge_patch(obj, new) == {"metadata": {"annotations": {"pulumi.com/approved-plan": DIGEST}}}


def test_approve_creates_the_annotations_when_the_stack_has_none() -> None:
    new = run_action("approve", stack(AWAITING, plan=PLAN), SCRIPTS)
    assert new["metadata"]["annotations"] == {"pulumi.com/approved-plan": DIGEST}


@pytest.mark.parametrize(
    "obj",
    [stack(READY, plan=PLAN), stack(AWAITING), stack(AWAITING, plan={"digest": ""})],
    ids=["not-awaiting", "no-plan", "empty-digest"],
)
def test_approve_refuses_when_no_plan_awaits_approval(obj: Obj) -> None:
    with pytest.raises(LuaScriptError, match="no plan awaits approval"):
        run_action("approve", obj, SCRIPTS)


@pytest.mark.parametrize(
    ("action", "annotation"),
    [("refresh", "pulumi.com/refresh-request"), ("retry", "pulumi.com/reconciliation-request")],
)
def test_refresh_and_retry_write_a_new_utc_timestamp_token_and_nothing_else(
    action: str, annotation: str
) -> None:
    obj = stack(READY, annotations={annotation: "2020-01-01T00:00:00Z", "keep": "me"})
    # Lua's os.date reads C's time(), which glibc serves from the coarse clock: at a second's turn it
    # can still say the second before the one datetime.now() just said.
    before = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    new = run_action(action, obj, SCRIPTS)
    after = datetime.now(UTC)
    token = new["metadata"]["annotations"][annotation]
    assert TOKEN.match(token), token
    assert before <= datetime.fromisoformat(token.replace("Z", "+00:00")) <= after + timedelta(seconds=1)
    # Argo CD patches the difference: the token only (the empty maps the Lua round trip turned
    # into [] are repaired as Argo CD repairs them, so they are no change).
    assert merge_patch(obj, new) == {"metadata": {"annotations": {annotation: token}}}


@pytest.mark.parametrize("action", ["refresh", "retry"])
def test_refresh_and_retry_create_the_annotations_when_the_stack_has_none(action: str) -> None:
    new = run_action(action, stack(READY), SCRIPTS)
    assert len(new["metadata"]["annotations"]) == 1

"""``approve`` (pure): the plan a Stack waits on, and when the plugin refuses to approve it."""

from __future__ import annotations

import pytest

from pko.kubectl.approval import (
    APPROVED_PLAN_ANNOTATION,
    approved_digest,
    awaiting_approval,
    change_lines,
    check_approvable,
    describe,
    plan_of,
    summary_text,
)
from pko.kubectl.exitcodes import ExitCode, PluginError

from .stacks import DIGEST, NOW, Obj, awaiting_status, preview, ready_status, stack


def _approved(obj: Obj, digest: str) -> Obj:
    obj["metadata"]["annotations"] = {APPROVED_PLAN_ANNOTATION: digest}
    return obj


def _refused(obj: Obj, digest: str | None = None) -> str:
    with pytest.raises(PluginError) as caught:
        check_approvable(obj, digest)
    assert caught.value.code == ExitCode.REFUSED
    return caught.value.message


def test_the_recorded_plan_and_its_summary() -> None:
    waiting = stack(status=awaiting_status())
    plan = plan_of(waiting)
    assert plan is not None
    assert (plan.digest, plan.update, plan.commit) == (DIGEST, "web-preview-1", "abc123")
    assert summary_text(plan.summary) == "1 to create, 2 to update, 0 to delete, 1 to replace"
    assert describe(plan, NOW) == (
        f"Plan {DIGEST} (preview Update web-preview-1, recorded 5m ago): "
        "1 to create, 2 to update, 0 to delete, 1 to replace"
    )
    assert awaiting_approval(waiting) and not awaiting_approval(stack(status=ready_status()))
    assert plan_of(stack(status=ready_status())) is None
    # Counts the operator left out (or spelt oddly) read as 0, never as a crash.
    odd = awaiting_status()
    odd["plan"]["summary"] = {"create": "3", "delete": None}
    found = plan_of(stack(status=odd))
    assert (
        found is not None
        and summary_text(found.summary) == "3 to create, 0 to update, 0 to delete, 0 to replace"
    )


def test_a_waiting_plan_is_approvable_with_or_without_its_digest() -> None:
    waiting = stack(status=awaiting_status())
    assert check_approvable(waiting, None).digest == DIGEST
    assert check_approvable(waiting, DIGEST).digest == DIGEST
    # A stale approval of another plan is replaced.
    assert check_approvable(_approved(stack(status=awaiting_status()), "sha256:old"), None).digest == DIGEST


def test_no_plan_is_refused() -> None:
    message = _refused(stack(status=ready_status()))
    assert message.startswith(
        "Stack ns/web has no recorded plan (status.plan) (Ready: True, ProcessingCompleted)"
    )
    assert "spec.approval" in message


def test_a_digest_not_reviewed_is_refused() -> None:
    message = _refused(stack(status=awaiting_status()), "sha256:reviewed-earlier")
    assert message == (
        f"--digest sha256:reviewed-earlier is not the plan Stack ns/web recorded ({DIGEST}): the plan "
        "changed since it was reviewed; review it again (kubectl pko status web -n ns)."
    )


def test_a_plan_not_waiting_is_refused() -> None:
    status = ready_status()
    status["plan"] = awaiting_status()["plan"]  # e.g. OnDestructive applying it at once
    assert "is not awaiting approval (Ready: True, ProcessingCompleted)" in _refused(stack(status=status))


def test_a_stack_changed_since_its_plan_is_refused() -> None:
    changed = stack(status=awaiting_status())
    changed["metadata"]["generation"] = 2
    assert "changed (generation 2) since its plan was recorded (generation 1)" in _refused(changed)


def test_an_approval_in_place_is_returned() -> None:
    done = _approved(stack(status=awaiting_status()), DIGEST)
    assert approved_digest(done) == DIGEST and approved_digest(stack()) == ""
    assert check_approvable(done, None).digest == DIGEST
    # Also once the operator has moved on (applying it): nothing to write, nothing to refuse.
    applying = _approved(stack(status=ready_status()), DIGEST)
    applying["status"]["plan"] = awaiting_status()["plan"]
    assert check_approvable(applying, DIGEST).digest == DIGEST


def test_the_preview_changes_one_line_per_resource() -> None:
    assert change_lines(preview()) == [
        "  +  create  pet (random:index/randomPet:RandomPet)",
        "  ~  update  web (kubernetes:apps/v1:Deployment): spec.replicas",
        "  ~  update  page (kubernetes:core/v1:ConfigMap): data.index.html",
        "  +- replace web (kubernetes:core/v1:Service): spec.clusterIP",
    ]
    assert change_lines(None) == []


def test_a_cut_change_list_says_so() -> None:
    cut = preview()
    cut["status"] |= {"changeCount": 3000, "changesTruncated": True}
    lines = change_lines(cut)
    assert lines[:-1] == change_lines(preview())
    listed = len(cut["status"]["changes"])
    assert (
        lines[-1].startswith(f"  ... the Update lists {listed} of 3000 changes")
        and "resource change" in lines[-1]
    )

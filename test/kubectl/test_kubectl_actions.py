"""``retry``, ``refresh``, ``cancel``, ``approve`` and ``logs`` (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pko.kubectl.actions import (
    cancel_unsupported,
    current_request,
    refresh_unsupported,
    retry_notes,
    retry_value,
)
from pko.kubectl.logs import chosen_update, engine_lines, workspace_pod

from .stacks import NOW, ready_status, retrying_status, stack, update


def test_retry_value_is_fresh() -> None:
    assert retry_value(NOW, "") == "2025-01-20T10:45:00.000000Z"
    assert retry_value(NOW, "2025-01-20T10:45:00.000000Z") == "2025-01-20T10:45:00.000000Z-1"
    later = datetime(2025, 1, 20, 10, 45, 0, 1, tzinfo=UTC)
    assert retry_value(later, retry_value(NOW, "")) != retry_value(NOW, "")
    annotated = stack()
    annotated["metadata"]["annotations"] = {"pulumi.com/reconciliation-request": "x"}
    assert current_request(annotated) == "x" and current_request(stack()) == ""


def test_retry_notes() -> None:
    assert retry_notes(stack(status=ready_status())) == []
    busy = retrying_status()
    busy["currentUpdate"] = {"name": "web-3"}
    assert retry_notes(stack(status=busy, suspend=True)) == [
        "Update web-3 is running: the retry starts once it ends.",
        "spec.suspend is set: nothing runs until it is cleared.",
    ]


def test_refresh_says_what_exists() -> None:
    assert "set spec.refresh: true (kubectl patch stack web -n ns" in refresh_unsupported(stack())
    assert "every up refreshes first: kubectl pko retry web -n ns runs one" in refresh_unsupported(
        stack(refresh=True)
    )


def test_cancel_says_what_exists() -> None:
    assert cancel_unsupported(stack(status=ready_status())).endswith("Stack ns/web has no Update running.")
    busy = retrying_status()
    busy["currentUpdate"] = {"name": "web-3"}
    text = cancel_unsupported(stack(status=busy))
    assert "kubectl delete update web-3 -n ns" in text and "starts a new Update about 5 s later" in text


def test_chosen_update_running_then_last() -> None:
    busy = retrying_status()
    assert chosen_update(stack(status=busy), None) == "web-2"
    busy["currentUpdate"] = {"name": "web-3"}
    assert chosen_update(stack(status=busy), None) == "web-3"
    assert chosen_update(stack(status=busy), "web-1") == "web-1"
    assert chosen_update(stack(), None) is None
    assert workspace_pod(update(), "web") == ("web", "web-workspace-0")


def test_engine_lines_of_one_operation() -> None:
    def entry(msg: str, operation: str, **kw: str) -> str:
        return json.dumps({"level": "info", "ts": "t", "msg": msg, "operation": operation, **kw})

    log = "\n".join(
        [
            entry("operation started", "u1", type="up"),
            entry("pulumi", "u1", line="Updating (dev):"),
            entry("pulumi", "u2", line="another operation"),
            "not json at all",
            "{broken",
            entry("pulumi", "u1", line="    + random:RandomPet pet created"),
            entry("operation succeeded", "u1"),
        ]
    )
    assert engine_lines(log, "u1") == ["Updating (dev):", "    + random:RandomPet pet created"]
    assert engine_lines(log, "u3") == []

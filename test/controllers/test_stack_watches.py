"""What wakes the Stack reconciler: the predicates and indexes of its watches."""

from __future__ import annotations

from typing import Any

from pko.controllers.stack.watches import (
    STACK_PREDICATE,
    artifact_predicate,
    index_flux,
    index_prerequisites,
    index_program,
    stack_became_ready,
    update_predicate,
    workspace_predicate,
)

Obj = dict[str, Any]


def obj(generation: int = 1, observed: int | None = 1, conditions: Obj | None = None, **meta: Any) -> Obj:
    status: Obj = {"conditions": [{"type": t, "status": s} for t, s in (conditions or {}).items()]}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"name": "s", "namespace": "ns", "generation": generation, **meta}, "status": status}


def test_stack_events_that_reconcile() -> None:
    base = obj()
    assert STACK_PREDICATE(None, base)
    assert STACK_PREDICATE(base, obj(generation=2))
    # the generation bump of adding our own finalizer is not a reason to reconcile
    assert not STACK_PREDICATE(base, obj(generation=2, finalizers=["finalizer.stack.pulumi.com"]))
    assert STACK_PREDICATE(base, obj(annotations={"pulumi.com/reconciliation-request": "x"}))
    assert STACK_PREDICATE(base, obj(deletionTimestamp="2024-01-01T00:00:00Z"))
    assert not STACK_PREDICATE(base, obj(labels={"a": "b"}))


def test_workspace_ready_or_stalled_and_deletes() -> None:
    pending = obj(conditions={"Ready": "False"})
    assert workspace_predicate(pending, obj(conditions={"Ready": "True"}))
    assert not workspace_predicate(
        pending, obj(generation=2, conditions={"Ready": "True"})
    )  # not observed yet
    assert workspace_predicate(pending, obj(conditions={"Ready": "False", "Stalled": "True"}))
    assert not workspace_predicate(obj(conditions={"Ready": "True"}), obj(conditions={"Ready": "True"}))
    assert workspace_predicate(pending, None)


def test_update_completion_and_deletion() -> None:
    running = obj(conditions={"Complete": "False"})
    assert update_predicate(running, obj(conditions={"Complete": "True"}))
    assert not update_predicate(running, running)
    assert update_predicate(running, None)
    assert update_predicate(None, obj(conditions={"Complete": "True"}))


def test_new_artifact_revisions() -> None:
    def source(revision: str | None) -> Obj:
        status = {"artifact": {"url": "u", "revision": revision, "digest": revision}} if revision else {}
        return {"metadata": {"name": "p"}, "status": status}

    assert artifact_predicate(source(None), source("1"))
    assert artifact_predicate(source("1"), source("2"))
    assert not artifact_predicate(source("1"), source("1"))
    assert not artifact_predicate(source("1"), source(None))


def test_prerequisite_becoming_ready() -> None:
    ready = obj(conditions={"Ready": "True"})
    assert stack_became_ready(obj(conditions={"Ready": "False"}), ready)
    stale = obj(conditions={"Ready": "True"}, annotations={"pulumi.com/reconciliation-request": "new"})
    assert not stack_became_ready(obj(conditions={"Ready": "False"}), stale)


def test_indexes() -> None:
    stack = {
        "metadata": {"name": "s", "namespace": "ns"},
        "spec": {
            "programRef": {"name": "p"},
            "prerequisites": [{"name": "a"}, {"name": "b"}],
            "fluxSource": {
                "sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "Bucket", "name": "x"}
            },
        },
    }
    assert index_program(stack) == ["ns/p"]
    assert index_prerequisites(stack) == ["ns/a", "ns/b"]
    assert index_flux(stack) == ["ns/source.toolkit.fluxcd.io/Bucket/x"]

"""Predicates: what passes for adds, updates and deletes, and how they compose."""

from __future__ import annotations

import copy
from typing import Any

from pko.machinery import manager
from pko.machinery.predicates import (
    and_,
    annotation_changed,
    condition_became,
    condition_changed,
    deletion_started,
    finalizers_changed,
    generation_changed,
    labels_changed,
    not_,
    or_,
    owner_references_changed,
)
from pko.machinery.resource import Obj

REQUEST = "pulumi.com/reconciliation-request"


def _obj(**meta: Any) -> Obj:
    return {"metadata": {"name": "x", "generation": 1, **meta}, "status": {}}


def _with(obj: Obj, **meta: Any) -> Obj:
    new = copy.deepcopy(obj)
    new["metadata"].update(meta)
    return new


def _cond(obj: Obj, type_: str, status: str, reason: str = "R", ltt: str = "2024-01-01T00:00:00Z") -> Obj:
    new = copy.deepcopy(obj)
    new["status"]["conditions"] = [
        {"type": type_, "status": status, "reason": reason, "lastTransitionTime": ltt}
    ]
    return new


def test_metadata_predicates_judge_updates_and_pass_adds_and_deletes() -> None:
    base = _obj(
        labels={"a": "1"}, annotations={REQUEST: "t1"}, finalizers=["f"], ownerReferences=[{"uid": "1"}]
    )
    cases = [
        (generation_changed, _with(base, generation=2)),
        (labels_changed, _with(base, labels={"a": "2"})),
        (annotation_changed(REQUEST), _with(base, annotations={REQUEST: "t2"})),
        (annotation_changed(REQUEST), _with(base, annotations={})),
        (finalizers_changed, _with(base, finalizers=["f", "g"])),
        (owner_references_changed, _with(base, ownerReferences=[])),
        (deletion_started, _with(base, deletionTimestamp="2024-01-01T00:00:00Z")),
    ]
    unrelated = _with(base, resourceVersion="99", annotations={REQUEST: "t1", "other": "x"})
    for predicate, changed in cases:
        assert predicate(base, changed), predicate
        assert not predicate(base, unrelated), predicate
        assert predicate(None, base) and predicate(base, None), predicate
    # Finalizer order is not a change.
    assert not finalizers_changed(_with(base, finalizers=["a", "b"]), _with(base, finalizers=["b", "a"]))
    deleting = _with(base, deletionTimestamp="2024-01-01T00:00:00Z")
    assert not deletion_started(deleting, _with(deleting, finalizers=[]))


def test_condition_predicates() -> None:
    base = _obj()
    running = _cond(base, "Complete", "False", "Progressing")
    done = _cond(base, "Complete", "True", "Succeeded")
    completed = condition_became("Complete", "True")
    assert completed(running, done) and completed(base, done) and completed(None, done)
    assert not completed(done, _cond(done, "Complete", "True", "Succeeded", ltt="2025-01-01T00:00:00Z"))
    assert not completed(done, running) and not completed(done, None) and not completed(None, running)

    changed = condition_changed("Complete")
    assert changed(running, done) and changed(base, running)
    assert changed(running, _cond(base, "Complete", "False", "Other"))
    assert not changed(done, _cond(done, "Complete", "True", "Succeeded", ltt="2025-01-01T00:00:00Z"))
    assert not changed(base, _cond(base, "Ready", "True"))


def test_predicates_compose() -> None:
    base = _obj(labels={"a": "1"})
    spec = _with(base, generation=2)
    label = _with(base, labels={"a": "2"})
    either = or_(generation_changed, labels_changed)
    assert either(base, spec) and either(base, label) and not either(base, base)
    both = and_(generation_changed, labels_changed)
    assert not both(base, spec) and both(base, _with(spec, labels={})) and and_()(base, base)
    assert not_(generation_changed)(base, base) and not or_()(base, spec)


def test_manager_re_exports_generation_changed() -> None:
    assert manager.generation_changed is generation_changed

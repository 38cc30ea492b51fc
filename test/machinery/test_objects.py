"""Owner references and conditions (pure), finalizers against a real kube-apiserver."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from pko.machinery.conditions import get_condition, is_false, is_true, remove_condition, set_condition
from pko.machinery.objects import (
    AlreadyOwnedError,
    add_finalizer,
    controller_of,
    has_finalizer,
    owner_reference,
    remove_finalizer,
    set_controller_reference,
    set_owner_reference,
)
from pko.machinery.resource import CONFIGMAPS, Obj, ResourceClient


def _obj(
    kind: str, name: str, uid: str, ns: str = "ns", api_version: str = "auto.pulumi.com/v1alpha1"
) -> Obj:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": ns, "uid": uid}}


def test_set_controller_reference_is_idempotent_and_refuses_a_second_controller() -> None:
    ws = _obj("Workspace", "ws", "u1")
    sts: Obj = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "ws-workspace", "namespace": "ns"},
    }
    set_controller_reference(ws, sts)
    set_controller_reference(ws, sts)
    assert sts["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "Workspace",
            "name": "ws",
            "uid": "u1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert controller_of(sts) == sts["metadata"]["ownerReferences"][0]

    # The same owner under another version (or a new uid after recreation) replaces the reference.
    set_controller_reference(_obj("Workspace", "ws", "u2", api_version="auto.pulumi.com/v1"), sts)
    assert [r["uid"] for r in sts["metadata"]["ownerReferences"]] == ["u2"]

    with pytest.raises(AlreadyOwnedError):
        set_controller_reference(_obj("Workspace", "other", "u3"), sts)

    # Plain owner references sit beside the controller.
    set_owner_reference(_obj("Stack", "s", "u4", api_version="pulumi.com/v1"), sts)
    refs = sts["metadata"]["ownerReferences"]
    assert [(r["kind"], r["controller"]) for r in refs] == [("Workspace", True), ("Stack", False)]


def test_owner_must_share_the_namespace_and_have_a_uid() -> None:
    obj: Obj = {"metadata": {"name": "x", "namespace": "a"}}
    with pytest.raises(ValueError, match="namespace"):
        set_controller_reference(_obj("Workspace", "ws", "u1", ns="b"), obj)
    with pytest.raises(ValueError, match="uid"):
        owner_reference(
            {"apiVersion": "v1", "kind": "X", "metadata": {"name": "n"}},
            controller=False,
            block_owner_deletion=False,
        )
    assert controller_of({"metadata": {}}) is None


def test_set_condition_keeps_the_transition_time_while_the_status_holds() -> None:
    t1, t2 = datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC)
    conds = set_condition(None, "Ready", "False", "Pending", "waiting", 1, now=t1)
    assert conds == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Pending",
            "message": "waiting",
            "lastTransitionTime": "2024-01-01T00:00:00Z",
            "observedGeneration": 1,
        }
    ]
    same = set_condition(conds, "Ready", "False", "StillPending", "still", 2, now=t2)
    assert same[0]["lastTransitionTime"] == "2024-01-01T00:00:00Z" and same[0]["reason"] == "StillPending"
    assert conds[0]["reason"] == "Pending"  # the input is not modified
    flipped = set_condition(same, "Ready", "True", "Ready", "", None, now=t2)
    assert (
        flipped[0]["lastTransitionTime"] == "2024-01-02T00:00:00Z" and "observedGeneration" not in flipped[0]
    )
    both = set_condition(flipped, "Stalled", "False", "Fine", "", 2, now=t2)
    assert [c["type"] for c in both] == ["Ready", "Stalled"]
    assert is_true(both, "Ready") and is_false(both, "Stalled") and not is_true(both, "Missing")
    assert get_condition(remove_condition(both, "Ready"), "Ready") is None


async def test_finalizers_are_written_with_optimistic_concurrency(api_client: Any, namespace: str) -> None:
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    cm = await cms.create({"metadata": {"name": "cm", "namespace": namespace, "finalizers": ["other/keep"]}})
    stale = cm

    cm = await add_finalizer(cms, cm, "pko/finalizer")
    assert cm["metadata"]["finalizers"] == ["other/keep", "pko/finalizer"]
    assert await add_finalizer(cms, cm, "pko/finalizer") is cm  # present: no write

    # Written from a stale read, the whole list would drop pko/finalizer: the apiserver refuses.
    with pytest.raises(ApiException) as info:
        await add_finalizer(cms, stale, "third")
    assert info.value.status == 409

    cm = await remove_finalizer(cms, cm, "pko/finalizer")
    assert not has_finalizer(cm, "pko/finalizer") and has_finalizer(cm, "other/keep")

    await cms.delete("cm")  # held by other/keep
    cm = await cms.get("cm")
    assert cm["metadata"].get("deletionTimestamp")
    await remove_finalizer(cms, cm, "other/keep")
    # Gone now: removing from the last copy is a 404, which is fine.
    gone = {**cm, "metadata": {**cm["metadata"], "finalizers": ["x"]}}
    assert await remove_finalizer(cms, gone, "x") is gone

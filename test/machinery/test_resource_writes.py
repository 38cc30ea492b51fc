"""ResourceClient writes against a real kube-apiserver: patches, server-side apply (also on
``/status``), and deletes with preconditions."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from pko.machinery.resource import CONFIGMAPS, Obj, Resource, ResourceClient, api_error_status

UPDATES = Resource("auto.pulumi.com", "v1alpha1", "updates", "Update")


def _configmap(name: str, ns: str, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": data,
    }


async def _status_of(call: Any) -> int | None:
    with pytest.raises(ApiException) as info:
        await call
    return api_error_status(info.value)


async def test_merge_patch_with_a_stale_resource_version_conflicts(api_client: Any, namespace: str) -> None:
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    created = await cms.create(_configmap("cm", namespace, {"a": "1"}))
    rv = created["metadata"]["resourceVersion"]

    patched = await cms.patch("cm", {"metadata": {"resourceVersion": rv}, "data": {"b": "2", "a": None}})
    assert patched["data"] == {"b": "2"}
    assert await _status_of(cms.patch("cm", {"metadata": {"resourceVersion": rv}, "data": {"c": "3"}})) == 409


async def test_json_and_strategic_patches(api_client: Any, namespace: str) -> None:
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    await cms.create(_configmap("cm", namespace, {"a": "1"}))
    ops = [
        {"op": "test", "path": "/data/a", "value": "1"},
        {"op": "replace", "path": "/data/a", "value": "2"},
    ]
    assert (await cms.patch("cm", ops, patch_type="json"))["data"] == {"a": "2"}
    # A failed `test` operation rejects the whole patch: JSON patch's own compare-and-swap.
    assert await _status_of(cms.patch("cm", ops, patch_type="json")) == 422
    patched = await cms.patch("cm", {"data": {"b": "3"}}, patch_type="strategic", field_manager="me")
    assert patched["data"] == {"a": "2", "b": "3"}
    assert "me" in {m["manager"] for m in patched["metadata"]["managedFields"]}


async def test_server_side_apply_with_two_managers(api_client: Any, namespace: str) -> None:
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    await cms.apply(_configmap("cm", namespace, {"a": "1", "b": "2"}), field_manager="alpha")
    await cms.apply(_configmap("cm", namespace, {"c": "3"}), field_manager="beta")

    # alpha stops applying b: b goes; c (beta's) stays.
    cm = await cms.apply(_configmap("cm", namespace, {"a": "1"}), field_manager="alpha")
    assert cm["data"] == {"a": "1", "c": "3"}

    # Taking a field another manager owns: a conflict unless forced.
    assert (
        await _status_of(
            cms.apply(_configmap("cm", namespace, {"a": "9"}), field_manager="beta", force=False)
        )
        == 409
    )
    cm = await cms.apply(_configmap("cm", namespace, {"a": "9", "c": "3"}), field_manager="beta")
    assert cm["data"] == {"a": "9", "c": "3"}
    owners = {m["manager"] for m in cm["metadata"]["managedFields"]}
    assert owners == {"beta"}  # alpha lost its only field


async def test_status_subresource_apply_leaves_the_spec_alone(
    api_client: Any, crds: list[str], namespace: str
) -> None:
    updates = ResourceClient(api_client, UPDATES, namespace)
    body: Obj = {
        "apiVersion": UPDATES.api_version,
        "kind": "Update",
        "metadata": {"name": "u", "namespace": namespace},
        "spec": {"workspaceName": "ws", "type": "up"},
    }
    created = await updates.apply(body, field_manager="creator")
    assert created["metadata"]["generation"] == 1

    status = {
        "apiVersion": UPDATES.api_version,
        "kind": "Update",
        "metadata": {"name": "u", "namespace": namespace},
        # A spec in a status apply is ignored: only /status is written.
        "spec": {"workspaceName": "other"},
        "status": {
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Progressing",
                    "status": "True",
                    "reason": "Progressing",
                    "message": "",
                    "lastTransitionTime": "2024-01-01T00:00:00Z",
                }
            ],
        },
    }
    applied = await updates.apply_status(status, field_manager="pko/update-status")
    assert applied["spec"]["workspaceName"] == "ws"
    assert applied["status"]["conditions"][0]["type"] == "Progressing"
    assert applied["metadata"]["generation"] == 1  # status writes do not bump the generation
    entry = next(m for m in applied["metadata"]["managedFields"] if m["manager"] == "pko/update-status")
    assert entry.get("subresource", "status") == "status"  # the field exists since 1.22

    # The manager's next apply without an item removes it. (Leaving out the whole list would too,
    # on a newer apiserver; 1.20's structured-merge-diff leaves `conditions: null` and fails.)
    status["status"]["conditions"] = [{**status["status"]["conditions"][0], "type": "Complete"}]
    applied = await updates.apply_status(status, field_manager="pko/update-status")
    assert [c["type"] for c in applied["status"]["conditions"]] == ["Complete"]

    # A status apply never creates the object.
    status["metadata"]["name"] = "missing"
    assert await _status_of(updates.apply_status(status, field_manager="pko/update-status")) == 404


async def test_delete_preconditions_and_propagation(api_client: Any, namespace: str) -> None:
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    created = await cms.create(_configmap("cm", namespace, {"a": "1"}))
    uid, rv = created["metadata"]["uid"], created["metadata"]["resourceVersion"]
    await cms.patch("cm", {"data": {"a": "2"}})

    assert await _status_of(cms.delete("cm", uid="not-" + uid)) == 409
    assert await _status_of(cms.delete("cm", resource_version=rv)) == 409
    current = await cms.get("cm")
    await cms.delete(
        "cm",
        uid=uid,
        resource_version=current["metadata"]["resourceVersion"],
        propagation_policy="Background",
    )
    assert await _status_of(cms.get("cm")) == 404
    assert await _status_of(cms.delete("cm", propagation_policy="Orphan")) == 404

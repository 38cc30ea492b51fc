"""A Workspace reconciled again before the watch delivers the Service and StatefulSet it just created
(issue 44): the objects as applied stand for them, so nothing is applied (or dry-run) twice. Against
a real apiserver; the reconciler's Manager is never run, so its informers deliver nothing at all."""

from __future__ import annotations

from typing import Any

import pytest

from pko.controllers.resources import WORKSPACES
from pko.controllers.workspace import reconciler as workspace
from pko.devtools.operatorharness import new_manager
from pko.machinery.resource import ResourceClient

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

WRITES = ("POST", "PUT", "PATCH", "DELETE")


async def test_a_new_statefulset_is_applied_once_while_unseen(api_client: Any, namespace: str) -> None:
    manager = new_manager(api_client, namespace)
    reconciler = workspace.setup(manager)
    body = {
        "apiVersion": WORKSPACES.api_version,
        "kind": "Workspace",
        "metadata": {"name": "unseen", "namespace": namespace},
        "spec": {"image": "example/pulumi:v3", "stacks": [{"name": "dev"}]},
    }
    ws = await ResourceClient(api_client, WORKSPACES, namespace).apply(body, field_manager="pko-tests")
    reconciler.workspaces.indexer.add(ws)
    writes: list[str] = []
    original = manager.api.call

    async def counting(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITES:
            writes.append(f"{method} {path}")
        return await original(method, path, *args, **kwargs)

    manager.api.call = counting  # type: ignore[method-assign]
    try:
        await reconciler.reconcile(f"{namespace}/unseen")
        first = list(writes)
        assert [w.split("?")[0].rsplit("/", 1)[-1] for w in first if "workspaces" not in w] == [
            "unseen-workspace",  # the Service
            "pods",  # the pod's dry run
            "unseen-workspace",  # the StatefulSet
        ], first
        assert not reconciler.statefulsets.indexer.list()  # the watch never delivers it here
        await reconciler.reconcile(f"{namespace}/unseen")
        assert writes == first, writes[len(first) :]
    finally:
        manager.api.call = original  # type: ignore[method-assign]

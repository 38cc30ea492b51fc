"""The namespaced install (config/namespaced) with a Stack label selector, against the apiserver.

The operator runs as its ServiceAccount bound to what config/namespaced ships (a Role in the watched
namespace, the ClusterRole cut down to TokenReview/SubjectAccessReview), watching the module's
namespace only (``--watch-namespaces``) and only Stacks labelled ``shard=a``
(``--watch-label-selector``). Any cluster-wide list or watch would be refused (403) and the
operator would never become ready; an unlabelled Stack, or one in another namespace, is never
touched; a Stack that leaves the selector keeps its Workspace, finalizer and status as they were.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.controllers.resources import PROGRAMS, STACKS, WORKSPACES
from pko.devtools.operatorharness import Operator
from pko.devtools.waiting import wait_until
from pko.machinery.resource import SECRETS, ResourceClient

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

OPERATOR_NAMESPACED = True
OPERATOR_STACK_SELECTOR = "shard=a"

Obj = dict[str, Any]
PROGRAM: Obj = {"outputs": {"greeting": "hello"}}


@pytest.fixture
async def elsewhere(api_client: client.ApiClient) -> AsyncIterator[str]:
    """A namespace the operator does not watch."""
    name = f"unwatched-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace({"metadata": {"name": name}})
    yield name
    await core.delete_namespace(name, _preload_content=False)


async def create(api: client.ApiClient, ns: str, name: str, labels: dict[str, str] | None = None) -> None:
    """A Program and a Stack of it, both ``name``."""
    await ResourceClient(api, PROGRAMS, ns).create(
        {"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name}, "program": PROGRAM}
    )
    await ResourceClient(api, STACKS, ns).create(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"stack": "dev", "programRef": {"name": name}},
        }
    )


# A list or watch the apiserver refused; any other failure but a transient one fails the test too.
REFUSED = frozenset({401, 403})


def transient(status: int | None) -> bool:
    """A failure the informer outlives: too many requests (429) or the server's own (5xx)."""
    return status is not None and (status == 429 or status >= 500)


def touched(stack: Obj | None) -> bool:
    """Whether the operator has acted on ``stack`` (its finalizer or any status)."""
    return bool(stack and (stack["metadata"].get("finalizers") or stack.get("status")))


async def test_only_the_watched_namespaces_selected_stacks_are_reconciled_with_namespaced_rights(
    api_client: client.ApiClient, namespace: str, elsewhere: str, operator: Operator
) -> None:
    assert operator.api is not None and operator.manager is not None
    # The operator's own account may not list Stacks cluster-wide: a cluster-wide informer would fail.
    with pytest.raises(ApiException) as refused:
        await ResourceClient(operator.api, STACKS).list()
    assert refused.value.status == 403

    await create(api_client, namespace, "selected", {"shard": "a"})
    await create(api_client, namespace, "unlabelled")
    await create(api_client, elsewhere, "selected", {"shard": "a"})
    stacks, there = (
        ResourceClient(api_client, STACKS, namespace),
        ResourceClient(api_client, STACKS, elsewhere),
    )
    workspaces = ResourceClient(api_client, WORKSPACES, namespace)

    await wait_until(
        "the selected Stack's Workspace", lambda: workspaces.get_or_none("selected"), within=120
    )
    assert touched(await stacks.get_or_none("selected"))
    await asyncio.sleep(3)  # time for the operator to have acted on the others, had it seen them
    assert not touched(await stacks.get_or_none("unlabelled"))
    assert not touched(await there.get_or_none("selected"))
    assert await ResourceClient(api_client, WORKSPACES, elsewhere).get_or_none("selected") is None
    assert await workspaces.get_or_none("unlabelled") is None

    for informer in operator.manager.factory.informers:
        name = informer.resource.name
        scopes = {r.client.namespace for r in informer.reflectors}
        assert scopes == ({namespace} if informer.resource.namespaced else {None}), name
        # Never refused; the only failures tolerated are transient ones (a fresh control plane's first
        # list may get "429 storage is (re)initializing"), each counted by its status.
        statuses: Counter[int | None] = sum((r.error_statuses for r in informer.reflectors), Counter())
        assert statuses.total() == informer.stats.errors, name
        assert not {s for s in statuses if s in REFUSED}, (name, statuses)
        assert all(transient(s) for s in statuses), (name, statuses)


async def test_a_stack_that_leaves_the_selector_is_left_as_it_was(
    api_client: client.ApiClient, namespace: str, operator: Operator
) -> None:
    assert operator.manager is not None
    await create(api_client, namespace, "leaving", {"shard": "a"})
    stacks, workspaces = (
        ResourceClient(api_client, STACKS, namespace),
        ResourceClient(api_client, WORKSPACES, namespace),
    )
    workspace = await wait_until(
        "the Stack's Workspace", lambda: workspaces.get_or_none("leaving"), within=120
    )
    assert touched(await stacks.get_or_none("leaving"))

    await stacks.patch("leaving", {"metadata": {"labels": {"shard": "b"}}})
    cache = operator.manager.informer(STACKS)
    await wait_until(
        "the Stack out of the cache", lambda: cache.indexer.get_by_key(f"{namespace}/leaving") is None
    )
    await asyncio.sleep(2)  # a reconcile in flight when it left may still finish
    before = await stacks.get_or_none("leaving")
    await asyncio.sleep(5)

    after = await stacks.get_or_none("leaving")
    assert before is not None and after is not None and touched(after)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # nothing wrote it
    kept = await workspaces.get_or_none("leaving")
    assert kept is not None and "deletionTimestamp" not in kept["metadata"]
    assert kept["metadata"]["uid"] == workspace["metadata"]["uid"]

    await stacks.patch("leaving", {"metadata": {"labels": {"shard": "a"}}})
    await wait_until("the Stack back in the cache", lambda: cache.indexer.get_by_key(f"{namespace}/leaving"))


async def test_no_secret_outside_the_watched_namespaces_is_readable(
    api_client: client.ApiClient, namespace: str, elsewhere: str, operator: Operator
) -> None:
    """Issue 46: the namespaced install needs no cluster-wide Secret right. The operator GETs the
    Secrets its Stacks name in the watched namespace; it may not read one elsewhere, nor list any."""
    api = operator.api
    assert api is not None
    for ns in (namespace, elsewhere):
        await ResourceClient(api_client, SECRETS, ns).create(
            {"metadata": {"name": "team-secret"}, "stringData": {"k": "v"}}
        )
    assert await ResourceClient(api, SECRETS, namespace).get("team-secret")
    refused = [
        lambda: ResourceClient(api, SECRETS, elsewhere).get("team-secret"),
        lambda: ResourceClient(api, SECRETS, namespace).list(),
        lambda: ResourceClient(api, SECRETS).list(),
    ]
    for request in refused:
        with pytest.raises(ApiException) as denied:
            await request()
        assert denied.value.status == 403

"""An informer of several namespaces (``--watch-namespaces``): one reflector per namespace into one
cache, and a label selector carried by the list and watch (``--watch-label-selector``).

The cluster tests run the informers as a user who may list and watch ConfigMaps only in the watched
namespaces (Roles, no ClusterRole), so any cluster-wide request would fail with 403: the informer
of every namespace, run the same way, is shown to fail, so the test can tell.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_helpers import create_namespace, delete_namespace

from pko.devtools.waiting import wait_until
from pko.machinery.informer import FuncHandler, SharedInformer
from pko.machinery.informerfactory import InformerFactory
from pko.machinery.resource import CONFIGMAPS, SECRETS, Resource, ResourceClient
from pko.machinery.store import Indexer, Obj, deletion_handling_key, index_by_field, meta_namespace_key

ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")


def labelled(name: str, **labels: str) -> Obj:
    return {"metadata": {"name": name, "labels": labels}, "data": {}}


def cm(namespace: str, name: str, rv: str = "1", **labels: str) -> Obj:
    meta = {"name": name, "namespace": namespace, "resourceVersion": rv, "labels": labels}
    return {"metadata": meta, "data": {}}


# ----- pure: one namespace's relist replaces only its part of the cache --------------------------


def test_a_namespace_relist_replaces_that_namespace_only() -> None:
    store = Indexer(indexers={"app": index_by_field("metadata.labels.app")})
    store.replace_entries([store.encode(cm("a", "x", app="1")), store.encode(cm("b", "y", app="1"))])

    result = store.replace_entries([store.encode(cm("a", "z", app="1"))], namespace="a")

    assert [e.key for e in result.added_entries] == ["a/z"]
    assert [e.key for e in result.deleted_entries] == ["a/x"]
    assert result.updated_entries == []
    assert sorted(store.list_keys()) == ["a/z", "b/y"]
    assert sorted(store.index_keys("app", "1")) == ["a/z", "b/y"]

    changed = store.replace_entries([store.encode(cm("b", "y", rv="2", app="1"))], namespace="b")
    assert [new.key for _, new in changed.updated_entries] == ["b/y"] and not changed.deleted_entries
    assert sorted(store.list_keys()) == ["a/z", "b/y"]


def test_a_namespace_relist_with_an_object_of_another_namespace_raises_and_changes_nothing() -> None:
    store = Indexer()
    store.replace_entries([store.encode(cm("a", "x"))])
    with pytest.raises(ValueError, match="outside"):
        store.replace_entries([store.encode(cm("b", "y"))], namespace="a")
    assert store.list_keys() == ["a/x"]


# ----- against the apiserver, as a user limited to the watched namespaces ------------------------


@pytest.fixture
async def three(api_client: Any) -> AsyncIterator[list[str]]:
    made = [await create_namespace(api_client, "multi") for _ in range(3)]
    yield made
    for name in made:
        await delete_namespace(api_client, name)


async def limited_user(api_client: Any, namespaces: list[str]) -> str:
    """A user who may list and watch ConfigMaps in ``namespaces`` only (a Role in each)."""
    user = f"pko-test-{uuid.uuid4().hex[:8]}"
    for ns in namespaces:
        rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]
        await ResourceClient(api_client, ROLES, ns).create({"metadata": {"name": "reader"}, "rules": rules})
        await ResourceClient(api_client, ROLE_BINDINGS, ns).create(
            {
                "metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }
        )
    return user


@pytest.fixture
async def factories() -> AsyncIterator[list[InformerFactory]]:
    made: list[InformerFactory] = []
    yield made
    for factory in made:
        await factory.stop()


@pytest.mark.cluster
async def test_several_namespaces_are_watched_apart_into_one_cache_with_namespaced_rights_only(
    cluster: Any, make_client: Any, api_client: Any, three: list[str], factories: list[InformerFactory]
) -> None:
    a, b, other = three
    user = await limited_user(api_client, [a, b])
    as_user = await make_client(cluster.kubeconfig)
    as_user.set_default_header("Impersonate-User", user)
    writers = {ns: ResourceClient(api_client, CONFIGMAPS, ns) for ns in three}
    for writer in writers.values():
        await writer.create(labelled("before", app="x"))

    everywhere = InformerFactory(as_user)
    factories.append(everywhere)
    every = everywhere.informer(CONFIGMAPS)
    everywhere.start()
    # The all-namespaces informer cannot list as this user: the test below would notice one.
    assert not await every.wait_for_sync(3)
    assert every.stats.errors >= 1
    # Counted as what they are, refusals (test_namespaced tells them from transient errors so).
    assert set(every.reflectors[0].error_statuses) == {403}
    assert every.reflectors[0].error_statuses.total() == every.stats.errors

    factory = InformerFactory(as_user, namespaces=[a, b, a], label_selector="app=x")
    factories.append(factory)
    informer: SharedInformer = factory.informer(
        CONFIGMAPS, indexers={"app": index_by_field("metadata.labels.app")}
    )
    factory.start()
    assert await factory.wait_for_cache_sync(60)
    assert [r.client.namespace for r in informer.reflectors] == [a, b]
    assert informer.stats.errors == 0
    assert sorted(informer.indexer.list_keys()) == sorted([f"{a}/before", f"{b}/before"])

    seen: list[str] = []
    informer.add_event_handler(FuncHandler(add=lambda o: seen.append(meta_namespace_key(o))))
    seen.clear()
    for writer in writers.values():
        await writer.create(labelled("after", app="x"))
        await writer.create(labelled("unlabelled"))
    await wait_until(
        "both namespaces' new ConfigMaps", lambda: sorted(seen) == sorted([f"{a}/after", f"{b}/after"])
    )
    assert sorted(o["metadata"]["name"] for o in informer.indexer.by_index("namespace", b)) == [
        "after",
        "before",
    ]
    assert len(informer.indexer.by_index("app", "x")) == 4

    # An object that leaves the selector leaves the cache (the watch reports it deleted).
    gone: list[str] = []
    informer.add_event_handler(FuncHandler(delete=lambda o: gone.append(deletion_handling_key(o))))
    await writers[a].patch("after", {"metadata": {"labels": {"app": "y"}}})
    await wait_until("the relabelled ConfigMap's delete", lambda: gone == [f"{a}/after"])
    assert sorted(informer.indexer.list_keys()) == sorted([f"{a}/before", f"{b}/after", f"{b}/before"])
    assert not any(key.startswith(f"{other}/") for key in seen + informer.indexer.list_keys())
    assert informer.stats.errors == 0


# ----- pure: what the factory makes of the options ------------------------------------------------

NODES = Resource("", "v1", "nodes", "Node", namespaced=False)


def test_the_factory_watches_the_union_of_namespace_and_namespaces_once_each() -> None:
    factory = InformerFactory(None, namespace="b", namespaces=["a", "b", "c", "a"])  # type: ignore[arg-type]
    assert [r.client.namespace for r in factory.informer(CONFIGMAPS).reflectors] == ["b", "a", "c"]
    assert [r.client.namespace for r in factory.informer(NODES).reflectors] == [None]  # cluster-scoped

    one = InformerFactory(None, namespace="a", namespaces=["a"])  # type: ignore[arg-type]
    assert [r.client.namespace for r in one.informer(CONFIGMAPS).reflectors] == ["a"]
    assert [r.client.namespace for r in InformerFactory(None).informer(CONFIGMAPS).reflectors] == [None]  # type: ignore[arg-type]


def test_a_resources_own_selector_is_added_to_what_its_informer_asks() -> None:
    factory = InformerFactory(None, label_selectors={CONFIGMAPS.name: "shard=a"})  # type: ignore[arg-type]
    asked = factory.informer(CONFIGMAPS, label_selector="app=x")
    assert [r.label_selector for r in asked.reflectors] == ["app=x,shard=a"]
    assert factory.informer(CONFIGMAPS, label_selector="app=x") is asked  # the same request: no conflict
    assert [r.label_selector for r in factory.informer(SECRETS).reflectors] == [None]
    only_own = InformerFactory(None, label_selectors={CONFIGMAPS.name: "shard=a"})  # type: ignore[arg-type]
    assert [r.label_selector for r in only_own.informer(CONFIGMAPS).reflectors] == ["shard=a"]

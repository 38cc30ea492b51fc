"""Informers against a real kube-apiserver: events, indexes, bookmarks, streaming lists (and the
fallback to list+watch), 410 Gone, apiserver restarts.

Notes for a current apiserver (1.37): the watch cache sends a watch a BOOKMARK 2 s before its
``timeoutSeconds`` and about every minute, so a short ``min_watch_timeout`` shows one within
seconds. A watch from a compacted resourceVersion is answered 410 Gone only when it reaches etcd:
the watch cache keeps its own window of events (at least 75 s of them, growing with the load), so
the 410 tests run on a private control plane with ``--watch-cache=false`` and check, with a raw
watch, that the server really answers 410. The WatchList feature (streaming lists) is on by
default since 1.34 (etcd-backed watches serve it too); the fallback is shown on a private
apiserver with ``--feature-gates=WatchList=false``, which answers 422 as 1.19-1.31 and 1.33 do.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from kube_helpers import RecordingClient, create_namespace, delete_namespace
from kubernetes_asyncio.client import ApiException
from prometheus_client import CollectorRegistry

from pko.devtools.localcluster import LocalCluster
from pko.devtools.waiting import wait_until
from pko.machinery.informer import (
    LAST_APPLIED_ANNOTATION,
    Backoff,
    FuncHandler,
    SharedInformer,
    strip_managed_fields,
)
from pko.machinery.informerfactory import InformerFactory
from pko.machinery.resource import CONFIGMAPS, Resource, ResourceClient
from pko.machinery.store import (
    DeletedFinalStateUnknown,
    Obj,
    deletion_handling_key,
    index_by_field,
    index_by_owner,
    meta_namespace_key,
)

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
WIDGETS = Resource("machinery.pko.test", "v1", "widgets", "Widget")
# Only our objects: the controller-manager adds a kube-root-ca.crt ConfigMap to every namespace.
SELECTOR = "pko-test=informer"


class Recorder:
    """Records every event as (type, key, payload)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    def on_add(self, obj: Obj) -> None:
        self.events.append(("add", meta_namespace_key(obj), obj))

    def on_update(self, old: Obj, new: Obj) -> None:
        self.events.append(("update", meta_namespace_key(new), (old, new)))

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self.events.append(("delete", deletion_handling_key(obj), obj))

    def keys(self, kind: str) -> list[str]:
        return [key for k, key, _ in self.events if k == kind]

    def clear(self) -> None:
        self.events.clear()


def configmap(name: str, data: dict[str, str], labels: dict[str, str] | None = None, **meta: Any) -> Obj:
    labels = {"pko-test": "informer", **(labels or {})}
    return {"metadata": {"name": name, "labels": labels, **meta}, "data": data}


async def fresh_list(client: ResourceClient, label_selector: str | None = SELECTOR) -> dict[str, Obj]:
    """What the cache should hold: a new list, transformed the way the informer transforms."""
    page = await client.list(label_selector=label_selector)
    return {meta_namespace_key(o): strip_managed_fields(o) for o in page.items}


def cached(informer: SharedInformer) -> dict[str, Obj]:
    return {meta_namespace_key(o): o for o in informer.indexer.list()}


async def cache_matches(
    informer: SharedInformer, client: ResourceClient, label_selector: str | None = SELECTOR
) -> bool:
    return cached(informer) == await fresh_list(client, label_selector)


# ----- pure --------------------------------------------------------------------------------------


def test_default_transform_drops_managed_fields_and_last_applied_only() -> None:
    obj = {
        "metadata": {
            "name": "a",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {LAST_APPLIED_ANNOTATION: "{...}", "other": "x"},
        },
        "spec": {"k": "v"},
    }
    expected = {"metadata": {"name": "a", "annotations": {"other": "x"}}, "spec": {"k": "v"}}
    assert strip_managed_fields(obj) == expected
    assert strip_managed_fields({"metadata": {"name": "b"}}) == {"metadata": {"name": "b"}}


def test_backoff_doubles_to_a_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(1.0, 8.0, jitter=0.2)
    delays = [backoff.next() for _ in range(6)]
    for delay, base in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    backoff.reset()
    assert 0.8 <= backoff.next() <= 1.2


# ----- against the apiserver ---------------------------------------------------------------------


@pytest.fixture
async def informers() -> AsyncIterator[list[SharedInformer]]:
    """Informers appended here are stopped after the test even when it fails."""
    made: list[SharedInformer] = []
    yield made
    for informer in made:
        await informer.stop()


@pytest.mark.cluster
async def test_informer_sees_creates_updates_deletes_and_indexes_answer(
    api_client: Any, namespace: str, informers: list[SharedInformer]
) -> None:
    writer = ResourceClient(api_client, CONFIGMAPS, namespace)
    owner = await writer.create(
        configmap("owner", {"k": "v"}, annotations={LAST_APPLIED_ANNOTATION: "{}", "keep": "me"})
    )
    informer = SharedInformer(
        ResourceClient(api_client, CONFIGMAPS, namespace),
        indexers={"owner": index_by_owner("ConfigMap"), "app": index_by_field("metadata.labels.app")},
        label_selector=SELECTOR,
    )
    informers.append(informer)
    failures: list[str] = []

    def boom(obj: Obj) -> None:
        failures.append(obj["metadata"]["name"])
        raise RuntimeError("a broken handler must not starve the others")

    informer.add_event_handler(FuncHandler(add=boom))
    rec = Recorder()
    informer.add_event_handler(rec)
    assert not informer.has_synced()
    informer.start()
    assert await informer.wait_for_sync(60)
    assert rec.keys("add") == [f"{namespace}/owner"]
    assert failures == ["owner"]

    cached_owner = informer.indexer.get_by_key(f"{namespace}/owner")
    assert cached_owner is not None
    assert "managedFields" not in cached_owner["metadata"]
    assert cached_owner["metadata"]["annotations"] == {"keep": "me"}
    assert cached_owner["apiVersion"] == "v1" and cached_owner["kind"] == "ConfigMap"

    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    await writer.create(configmap("a", {"n": "1"}, labels={"app": "x"}))
    await writer.create(configmap("b", {"n": "1"}, labels={"app": "y"}, ownerReferences=[ref]))
    await wait_until("adds of a and b", lambda: len(informer.indexer) == 3)
    assert [o["metadata"]["name"] for o in informer.indexer.by_index("app", "x")] == ["a"]
    assert informer.indexer.index_keys("owner", f"{namespace}/owner") == [f"{namespace}/b"]

    a = await writer.get("a")
    a["data"] = {"n": "2"}
    a["metadata"]["labels"]["app"] = "y"
    await writer.replace(a)
    await writer.delete("b")
    await wait_until("delete of b", lambda: f"{namespace}/b" in rec.keys("delete"))
    await wait_until("update of a", lambda: f"{namespace}/a" in rec.keys("update"))

    old, new = next(p for k, key, p in rec.events if k == "update" and key == f"{namespace}/a")
    assert old["data"] == {"n": "1"} and new["data"] == {"n": "2"}
    deleted = next(p for k, key, p in rec.events if k == "delete")
    assert isinstance(deleted, dict) and deleted["metadata"]["name"] == "b"  # a real delete, not a tombstone
    assert [o["metadata"]["name"] for o in informer.indexer.by_index("app", "y")] == ["a"]
    assert informer.indexer.by_index("app", "x") == []
    assert informer.indexer.index_keys("owner", f"{namespace}/owner") == []
    assert await cache_matches(informer, writer)

    late = Recorder()
    informer.add_event_handler(late)
    assert sorted(late.keys("add")) == [f"{namespace}/a", f"{namespace}/owner"]
    assert informer.stats.lists == 1 and informer.stats.relists_gone == 0

    await informer.stop()
    assert not informer.started


@pytest.mark.cluster
async def test_custom_resources_through_a_shared_factory_with_field_index(
    api_client: Any, namespace: str
) -> None:
    crds = ResourceClient(api_client, CRDS)
    crd_name = f"{WIDGETS.plural}.{WIDGETS.group}"
    try:
        await crds.create(
            {
                "metadata": {"name": crd_name},
                "spec": {
                    "group": WIDGETS.group,
                    "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "properties": {
                                        "spec": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        }
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    except Exception as exc:
        if getattr(exc, "status", None) != 409:  # left over from an earlier run
            raise

    async def established() -> bool:
        crd = await crds.get(crd_name)
        conds = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    await wait_until("CRD established", established)

    registry = CollectorRegistry()
    factory = InformerFactory(api_client, namespace=namespace, metrics_registry=registry)
    by_program = index_by_field("spec.programRef.name", namespaced=True)
    try:
        informer = factory.informer(WIDGETS, indexers={"program": by_program})
        assert factory.informer(WIDGETS, indexers={"program": by_program}) is informer
        assert factory.informer(WIDGETS) is informer
        with pytest.raises(ValueError):
            factory.informer(WIDGETS, indexers={"program": index_by_field("spec.other")})
        rec = Recorder()
        informer.add_event_handler(rec)
        factory.start()
        assert await factory.wait_for_cache_sync(60)
        # Requested after start: started at once, and synced.
        configmaps = factory.informer(CONFIGMAPS)
        assert await configmaps.wait_for_sync(60)

        writer = ResourceClient(api_client, WIDGETS, namespace)
        for name, program in (("w1", "p1"), ("w2", "p1"), ("w3", "p2")):
            await writer.create(
                {
                    "apiVersion": WIDGETS.api_version,
                    "kind": "Widget",
                    "metadata": {"name": name},
                    "spec": {"programRef": {"name": program}},
                }
            )
        await wait_until("three widgets cached", lambda: len(informer.indexer) == 3)
        program_keys = informer.indexer.index_keys
        assert program_keys("program", f"{namespace}/p1") == [f"{namespace}/w1", f"{namespace}/w2"]
        w2 = await writer.get("w2")
        w2["spec"]["programRef"]["name"] = "p2"
        await writer.replace(w2)
        await wait_until(
            "w2 moved to p2 in the index",
            lambda: program_keys("program", f"{namespace}/p2") == [f"{namespace}/w2", f"{namespace}/w3"],
        )
        assert program_keys("program", f"{namespace}/p1") == [f"{namespace}/w1"]
        cached_w1 = informer.indexer.get_by_key(f"{namespace}/w1")
        assert cached_w1 is not None and cached_w1["kind"] == "Widget"
        assert await cache_matches(informer, writer, label_selector=None)

        lists = registry.get_sample_value("pko_reflector_lists_total", {"resource": WIDGETS.name})
        adds = registry.get_sample_value(
            "pko_reflector_watch_events_total", {"resource": WIDGETS.name, "type": "ADDED"}
        )
        assert lists == 1
        assert adds == 3
    finally:
        await factory.stop()
        await crds.delete(crd_name)


@pytest.mark.cluster
async def test_resync_redelivers_cached_objects_as_updates(
    api_client: Any, namespace: str, informers: list[SharedInformer]
) -> None:
    writer = ResourceClient(api_client, CONFIGMAPS, namespace)
    await writer.create(configmap("r", {"x": "1"}))
    informer = SharedInformer(
        ResourceClient(api_client, CONFIGMAPS, namespace), resync_period=0.2, label_selector=SELECTOR
    )
    informers.append(informer)
    rec = Recorder()
    informer.add_event_handler(rec)
    informer.start()
    assert await informer.wait_for_sync(60)
    await wait_until("two resyncs", lambda: len(rec.keys("update")) >= 2)
    old, new = next(p for k, _, p in rec.events if k == "update")
    assert old is new


# ----- bookmarks and streaming lists -------------------------------------------------------------


@pytest.mark.cluster
async def test_bookmarks_advance_the_resource_version_and_the_next_watch_resumes_from_them(
    api_client: Any, namespace: str, informers: list[SharedInformer]
) -> None:
    watched = RecordingClient(api_client, CONFIGMAPS, namespace)
    # Watches of 4-8 s: the watch cache sends each one a bookmark 2 s before its timeout.
    informer = SharedInformer(watched, label_selector=SELECTOR, min_watch_timeout=4)
    informers.append(informer)
    rec = Recorder()
    informer.add_event_handler(rec)
    informer.start()
    assert await informer.wait_for_sync(60)
    synced_rv = int(informer.last_sync_resource_version)
    bookmarks = informer.stats.events["BOOKMARK"]  # so far: the streaming list's end, if any
    # A change outside the informer's selection (no pko-test label): no event, a newer version.
    outsider = await ResourceClient(api_client, CONFIGMAPS, namespace).create(
        {"metadata": {"name": "outsider"}}
    )
    outsider_rv = int(outsider["metadata"]["resourceVersion"])
    assert outsider_rv > synced_rv

    await wait_until(
        "a bookmark past the outsider",
        lambda: int(informer.last_sync_resource_version) >= outsider_rv,
        within=30,
    )
    assert informer.stats.events["BOOKMARK"] > bookmarks
    assert rec.events == [], "the outsider is outside the selection"

    def resumed_past_outsider() -> bool:
        later = watched.calls("watch")[1:]
        return any(int(w["resource_version"] or 0) >= outsider_rv for w in later)

    # The server ends the watch at its timeout; the next watch starts from the bookmark's version
    # (nothing in the selection changed: only a bookmark can have carried it there).
    await wait_until("a watch resumed from the bookmark's resourceVersion", resumed_past_outsider, within=30)
    assert informer.stats.lists == 1 and informer.stats.relists_gone == 0
    assert rec.events == []


@pytest.mark.cluster
async def test_the_initial_sync_is_a_streaming_list_that_goes_on_as_the_watch(
    api_client: Any, namespace: str, informers: list[SharedInformer]
) -> None:
    writer = ResourceClient(api_client, CONFIGMAPS, namespace)
    created = [await writer.create(configmap(f"s-{i}", {"i": str(i)})) for i in range(3)]
    await writer.create({"metadata": {"name": "unlabelled"}})
    watched = RecordingClient(api_client, CONFIGMAPS, namespace)
    informer = SharedInformer(watched, label_selector=SELECTOR)
    informers.append(informer)
    rec = Recorder()
    informer.add_event_handler(rec)
    informer.start()
    assert await informer.wait_for_sync(60)

    assert watched.calls("list") == [], "no LIST request: the list came as a watch stream"
    [request] = watched.calls("watch")
    assert request["send_initial_events"] is True and request["resource_version"] == ""  # consistent
    assert informer.stats.lists == 1 and informer.stats.streamed_lists == 1
    assert informer.stats.streaming_refusals == 0
    assert informer.stats.events["ADDED"] == 3 and informer.stats.events["BOOKMARK"] == 1
    assert sorted(rec.keys("add")) == [f"{namespace}/s-{i}" for i in range(3)]
    # The end bookmark's version: at least that of every object listed.
    assert int(informer.last_sync_resource_version) >= max(
        int(c["metadata"]["resourceVersion"]) for c in created
    )
    assert await cache_matches(informer, writer)

    # The same stream goes on as the watch.
    await writer.create(configmap("s-late", {"i": "late"}))
    await writer.delete("s-0")
    await wait_until("the delete of s-0", lambda: f"{namespace}/s-0" in rec.keys("delete"))
    assert f"{namespace}/s-late" in rec.keys("add")
    assert len(watched.calls("watch")) == 1 and informer.stats.lists == 1
    assert await cache_matches(informer, writer)


@pytest.fixture(scope="module")
def no_watchlist_cluster() -> Iterator[LocalCluster]:
    """A private control plane whose apiserver lacks streaming lists (WatchList off): it answers a
    watch with sendInitialEvents 422 Invalid, as apiservers 1.19-1.31 and 1.33 do by default."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("needs a control plane started by the tests (unset KUBECONFIG)")
    with tempfile.TemporaryDirectory(prefix="pko-nowatchlist-") as d:
        c = LocalCluster(
            d, extra_apiserver_args=["--feature-gates=WatchList=false"], with_controller_manager=False
        )
        try:
            c.start()
            yield c
        finally:
            c.stop()


async def drain(client: ResourceClient, **watch: Any) -> None:
    async with client.watch(timeout_seconds=5, **watch) as events:
        async for _ in events:
            pass


@pytest.mark.cluster
async def test_a_server_without_streaming_lists_is_listed_and_watched(
    no_watchlist_cluster: LocalCluster, make_client: Any, informers: list[SharedInformer]
) -> None:
    api = await make_client(no_watchlist_cluster.kubeconfig)
    namespace = await create_namespace(api)
    writer = ResourceClient(api, CONFIGMAPS, namespace)
    with pytest.raises(ApiException) as refused:
        await drain(writer, resource_version="", send_initial_events=True)
    assert refused.value.status == 422 and "sendInitialEvents" in str(refused.value.body)

    for name in ("a", "b"):
        await writer.create(configmap(name, {"v": "0"}))
    watched = RecordingClient(api, CONFIGMAPS, namespace)
    informer = SharedInformer(watched, label_selector=SELECTOR, backoff_initial=0.2, backoff_max=1.0)
    informers.append(informer)
    rec = Recorder()
    informer.add_event_handler(rec)
    informer.start()
    assert await informer.wait_for_sync(60)
    assert sorted(rec.keys("add")) == [f"{namespace}/a", f"{namespace}/b"]
    assert informer.stats.streaming_refusals == 1 and informer.stats.streamed_lists == 0
    assert informer.stats.lists == 1 and informer.stats.errors == 0 and not informer.streaming_list
    await wait_until("the plain watch after the list", lambda: len(watched.calls("watch")) == 2)
    assert [kind for kind, _ in watched.requests] == ["watch", "list", "watch"]
    first, second = watched.calls("watch")
    assert first["send_initial_events"] is True
    assert second.get("send_initial_events", False) is False
    assert watched.calls("list")[0]["resource_version"] is None  # a consistent LIST...
    assert second["resource_version"]  # ...and a watch from its resourceVersion
    assert await cache_matches(informer, writer)

    await writer.create(configmap("c", {"v": "0"}))
    await wait_until("the add of c through the plain watch", lambda: f"{namespace}/c" in rec.keys("add"))
    assert informer.stats.streaming_refusals == 1 and len(watched.calls("list")) == 1
    await delete_namespace(api, namespace)


# ----- disconnection, 410 Gone, apiserver restart ------------------------------------------------


@pytest.fixture(scope="module")
def nocache_cluster() -> Iterator[LocalCluster]:
    """A private control plane without the watch cache, so a watch from a compacted
    resourceVersion reaches etcd and is answered with 410 Gone (see local-cluster notes)."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("needs a control plane started by the tests (unset KUBECONFIG)")
    with tempfile.TemporaryDirectory(prefix="pko-nocache-") as d:
        c = LocalCluster(d, extra_apiserver_args=["--watch-cache=false"], with_controller_manager=False)
        try:
            c.start()
            yield c
        finally:
            c.stop()


async def etcd_compact(etcd_url: str) -> int:
    """Compact etcd at its current revision; returns that revision."""
    async with aiohttp.ClientSession() as http:
        key = base64.b64encode(b"/registry").decode()
        async with http.post(f"{etcd_url}/v3/kv/range", json={"key": key, "limit": 1}) as r:
            revision = int((await r.json())["header"]["revision"])
        body = {"revision": revision, "physical": True}
        async with http.post(f"{etcd_url}/v3/kv/compaction", json=body) as r:
            assert r.status == 200, await r.text()
    return revision


async def seed(writer: ResourceClient) -> None:
    for name in ("keep-1", "keep-2", "change-1", "change-2", "gone-1", "gone-2"):
        await writer.create(configmap(name, {"v": "0"}))


async def start_recorded_informer(
    client: ResourceClient, informers: list[SharedInformer]
) -> tuple[SharedInformer, Recorder]:
    """A synced informer (fast reconnect backoff) whose events from now on are recorded."""
    informer = SharedInformer(client, label_selector=SELECTOR, backoff_initial=0.2, backoff_max=1.0)
    informers.append(informer)
    rec = Recorder()
    informer.start()
    assert await informer.wait_for_sync(60)
    informer.add_event_handler(rec)
    rec.clear()
    return informer, rec


async def change_while_disconnected(writer: ResourceClient) -> None:
    for name in ("change-1", "change-2"):
        obj = await writer.get(name)
        obj["data"] = {"v": "1"}
        await writer.replace(obj)
    for name in ("gone-1", "gone-2"):
        await writer.delete(name)
    await writer.create(configmap("new-1", {"v": "1"}))


def assert_missed_changes_delivered(rec: Recorder, namespace: str, *, tombstones: bool) -> None:
    assert len(rec.events) == 5, rec.events  # each missed change exactly once
    keys = {kind: set(rec.keys(kind)) for kind in ("add", "update", "delete")}
    assert keys["add"] == {f"{namespace}/new-1"}
    assert keys["update"] == {f"{namespace}/change-1", f"{namespace}/change-2"}  # keep-* are unchanged
    assert keys["delete"] == {f"{namespace}/gone-1", f"{namespace}/gone-2"}
    for kind, _, payload in rec.events:
        if kind == "delete" and tombstones:
            assert isinstance(payload, DeletedFinalStateUnknown)
            assert payload.obj["data"] == {"v": "0"}  # the last state the cache saw


@pytest.mark.cluster
async def test_informer_relists_after_410_gone_and_reports_missed_deletes_as_tombstones(
    nocache_cluster: LocalCluster, make_client: Any, make_proxy: Any, informers: list[SharedInformer]
) -> None:
    direct = await make_client(nocache_cluster.kubeconfig)
    proxy = await make_proxy(nocache_cluster.server)
    via_proxy = await make_client(nocache_cluster.kubeconfig, server=proxy.url)
    namespace = await create_namespace(direct)
    writer = ResourceClient(direct, CONFIGMAPS, namespace)
    await seed(writer)

    watched = RecordingClient(via_proxy, CONFIGMAPS, namespace)
    informer, rec = await start_recorded_informer(watched, informers)
    rv_before = informer.last_sync_resource_version
    assert informer.stats.streamed_lists == 1, "etcd-backed watches serve streaming lists too"

    await proxy.cut()
    await wait_until("the informer noticing the cut", lambda: informer.stats.errors >= 1)
    await change_while_disconnected(writer)
    revision = await etcd_compact(nocache_cluster.etcd_url)
    assert revision > int(rv_before)
    # The server really answers a watch from the informer's version with 410 Gone.
    with pytest.raises(ApiException) as gone:
        await drain(writer, resource_version=rv_before)
    assert gone.value.status == 410
    await proxy.restore()

    await wait_until("a relist caused by 410 Gone", lambda: informer.stats.relists_gone >= 1)
    await wait_until("cache equal to a fresh list", lambda: cache_matches(informer, writer))
    assert informer.stats.relists_gone == 1
    assert informer.stats.lists == 2 and informer.stats.streamed_lists == 2
    # Every watch after the cut resumed from the old version until the 410; then one consistent
    # streaming list (resourceVersion unset), not a LIST.
    watches = watched.calls("watch")
    relist = next(i for i, w in enumerate(watches) if i > 0 and w.get("send_initial_events"))
    assert watches[relist]["resource_version"] == ""
    assert all(w["resource_version"] == rv_before for w in watches[1:relist])
    assert watched.calls("list") == []
    assert_missed_changes_delivered(rec, namespace, tombstones=True)
    await delete_namespace(direct, namespace)


@pytest.mark.cluster
async def test_informer_survives_apiserver_restart(
    cluster: Any, make_client: Any, make_proxy: Any, namespace: str, informers: list[SharedInformer]
) -> None:
    direct = await make_client(cluster.kubeconfig)
    proxy = await make_proxy(cluster.server)
    via_proxy = await make_client(cluster.kubeconfig, server=proxy.url)
    writer = ResourceClient(direct, CONFIGMAPS, namespace)
    await seed(writer)
    informer, rec = await start_recorded_informer(ResourceClient(via_proxy, CONFIGMAPS, namespace), informers)

    await asyncio.to_thread(cluster.stop_apiserver)
    await wait_until("the informer noticing the apiserver is gone", lambda: informer.stats.errors >= 1)
    await proxy.cut()  # keep it away until the changes below are made
    await asyncio.to_thread(cluster.start_apiserver)
    after = await make_client(cluster.kubeconfig)  # fresh connections to the new apiserver
    writer = ResourceClient(after, CONFIGMAPS, namespace)
    await change_while_disconnected(writer)
    await proxy.restore()

    await wait_until("cache equal to a fresh list", lambda: cache_matches(informer, writer), within=120)
    # Whether the new apiserver's watch cache could replay the changes or answered 410 (then we
    # relisted), every missed change arrives exactly once.
    assert_missed_changes_delivered(rec, namespace, tombstones=informer.stats.relists_gone > 0)


async def test_factory_bounds_list_requests_with_the_kube_api_timeout() -> None:
    from kubernetes_asyncio.client import ApiClient, Configuration

    async with ApiClient(Configuration()) as api:
        factory = InformerFactory(api, request_timeout=7.5)
        assert factory.informer(CONFIGMAPS).client.request_timeout == 7.5


@pytest.mark.parametrize("ignored_by", ["a plain bookmark", "the end of the stream"])
async def test_a_server_that_ignores_streaming_list_parameters_is_listed_and_watched(ignored_by: str) -> None:
    """A server that knows neither sendInitialEvents nor resourceVersionMatch for watches (older
    than 1.19: unknown parameters are ignored) answers a plain watch from "now": ADDED events for
    what exists, then a bookmark without the end annotation, or the end of the stream. No such
    apiserver is at hand: this one is a stub, speaking the watch protocol over real HTTP."""
    from aiohttp import web
    from kubernetes_asyncio.client import ApiClient, Configuration

    items = [{"metadata": {"name": n, "namespace": "ns", "resourceVersion": "5"}, "data": {}} for n in "ab"]
    queries: list[dict[str, str]] = []

    def line(etype: str, obj: Obj) -> bytes:
        return json.dumps({"type": etype, "object": obj}).encode() + b"\n"

    async def configmaps(request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        queries.append(query)
        if query.get("watch") != "true":
            body = {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": "10"}}
            return web.json_response({**body, "items": items})
        resp = web.StreamResponse()
        await resp.prepare(request)
        if not query.get("resourceVersion"):  # "now": synthetic ADDED events first
            for item in items:
                await resp.write(line("ADDED", item))
            if ignored_by == "the end of the stream":
                return resp
            await resp.write(line("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "10"}}))
        await asyncio.sleep(3600)  # until the client goes
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/configmaps", configmaps)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    informer = None
    try:
        async with ApiClient(Configuration(host=f"http://127.0.0.1:{port}")) as api:
            informer = SharedInformer(ResourceClient(api, CONFIGMAPS, "ns"), backoff_initial=0.1)
            rec = Recorder()
            informer.add_event_handler(rec)
            informer.start()
            assert await informer.wait_for_sync(10)
            assert informer.stats.streaming_refusals == 1 and not informer.streaming_list
            assert informer.stats.lists == 1 and informer.stats.streamed_lists == 0
            assert sorted(rec.keys("add")) == ["ns/a", "ns/b"], "the ignored stream's events are dropped"
            await wait_until("the plain watch after the list", lambda: len(queries) == 3, within=10)
            first, listed, watched = queries
            assert first["sendInitialEvents"] == "true" and first["resourceVersionMatch"] == "NotOlderThan"
            assert listed.get("watch") is None
            assert watched["resourceVersion"] == "10" and "sendInitialEvents" not in watched
            await informer.stop()
    finally:
        if informer is not None:
            await informer.stop()
        await runner.cleanup()

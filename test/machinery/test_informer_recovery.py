"""Informers through disconnection: 410 Gone (a relist, missed deletes as tombstones) and an
apiserver restart, each missed change delivered exactly once.

A watch from a compacted resourceVersion is answered 410 Gone only when it reaches etcd: the watch
cache keeps its own window of events (at least 75 s of them, growing with the load), so the 410 test
runs on a private control plane with ``--watch-cache=false`` and checks, with a raw watch, that the
server really answers 410.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kube_helpers import (
    SELECTOR,
    Recorder,
    RecordingClient,
    cache_matches,
    configmap,
    create_namespace,
    delete_namespace,
    drain,
    etcd_compact,
)
from kubernetes_asyncio.client import ApiException

from pko.devtools.localcluster import LocalCluster
from pko.devtools.waiting import wait_until
from pko.machinery.informer import SharedInformer
from pko.machinery.resource import CONFIGMAPS, ResourceClient
from pko.machinery.store import DeletedFinalStateUnknown


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

"""Informers and the watch protocol's newer parts: bookmarks, streaming lists (and the fallback to
list+watch).

Notes for a current apiserver (1.37): the watch cache sends a watch a BOOKMARK 2 s before its
``timeoutSeconds`` and about every minute, so a short ``min_watch_timeout`` shows one within
seconds. The WatchList feature (streaming lists) is on by default since 1.34 (etcd-backed watches
serve it too); the fallback is shown on a private apiserver with ``--feature-gates=WatchList=false``,
which answers 422 as 1.19-1.31 and 1.33 do, and on a stub that ignores the parameters as servers
older than 1.19 do.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
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
)
from kubernetes_asyncio.client import ApiException

from pko.devtools.localcluster import LocalCluster, private_cluster
from pko.devtools.waiting import wait_until
from pko.machinery.informer import SharedInformer
from pko.machinery.resource import CONFIGMAPS, ResourceClient
from pko.machinery.store import Obj


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
    with private_cluster("pko-nowatchlist-", "--feature-gates=WatchList=false") as c:
        yield c


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


@pytest.mark.parametrize("ignored_by", ["a plain bookmark", "the end of the stream"])
async def test_a_server_that_ignores_streaming_list_parameters_is_listed_and_watched(ignored_by: str) -> None:
    """A server that knows neither sendInitialEvents nor resourceVersionMatch for watches (older
    than 1.19: unknown parameters are ignored) answers a plain watch from "now": ADDED events for
    what exists, then a bookmark without the end annotation, or the end of the stream. No such
    apiserver is at hand: this one is a stub, speaking the watch protocol over real HTTP."""
    from aiohttp import web
    from kubernetes_asyncio.client import Configuration

    from pko.devtools.apiclient import stock_api_client

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
        async with stock_api_client(Configuration(host=f"http://127.0.0.1:{port}")) as api:
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

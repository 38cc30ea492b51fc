"""Informers against a real kube-apiserver: events, handlers, indexes, custom resources through a
shared factory, resyncs (and, pure, the default transform and the reconnect backoff). Bookmarks and
streaming lists are in test_informer_streaming.py; 410 Gone and apiserver restarts in
test_informer_recovery.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kube_helpers import SELECTOR, Recorder, cache_matches, configmap
from prometheus_client import CollectorRegistry

from pko.devtools.crds import namespaced_crd
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
from pko.machinery.store import Obj, index_by_field, index_by_owner

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
WIDGETS = Resource("machinery.pko.test", "v1", "widgets", "Widget")


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
        any_spec = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        await crds.create(namespaced_crd(WIDGETS.group, WIDGETS.kind, any_spec))
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


async def test_factory_bounds_list_requests_with_the_kube_api_timeout() -> None:
    from kubernetes_asyncio.client import Configuration

    from pko.devtools.apiclient import stock_api_client

    async with stock_api_client(Configuration()) as api:
        factory = InformerFactory(api, request_timeout=7.5)
        assert factory.informer(CONFIGMAPS).client.request_timeout == 7.5

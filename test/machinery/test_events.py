"""The event recorder against a real kube-apiserver: fields, counting repeats, combining similar
events and the per-object rate limit, as client-go's recorder does."""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry

from pko.machinery.events import COMBINED_PREFIX, EventRecorder, FakeRecorder
from pko.machinery.resource import CONFIGMAPS, EVENTS, Obj, ResourceClient

COMPONENT = "pulumi-kubernetes-operator"


async def _object(api: Any, ns: str, name: str) -> Obj:
    return await ResourceClient(api, CONFIGMAPS, ns).create({"metadata": {"name": name, "namespace": ns}})


async def _events_about(api: Any, ns: str, obj: Obj) -> list[Obj]:
    items = (await ResourceClient(api, EVENTS, ns).list()).items
    return [e for e in items if e["involvedObject"].get("uid") == obj["metadata"]["uid"]]


async def test_an_event_has_client_gos_fields(api_client: Any, namespace: str) -> None:
    registry = CollectorRegistry()
    recorder = EventRecorder(api_client, COMPONENT, registry=registry)
    cm = await _object(api_client, namespace, "cm")
    recorder.event(cm, "Warning", "UpdateFailed", "the program failed")  # queued before start()
    recorder.start()
    await recorder.stop()
    recorder.event(cm, "Normal", "Late", "after stop: dropped, never raised")

    [event] = await _events_about(api_client, namespace, cm)
    assert re.fullmatch(r"cm\.[0-9a-f]+", event["metadata"]["name"])
    assert event["metadata"]["namespace"] == namespace
    ref = event["involvedObject"]
    assert (ref["kind"], ref["apiVersion"], ref["name"], ref["namespace"]) == (
        "ConfigMap",
        "v1",
        "cm",
        namespace,
    )
    assert ref["resourceVersion"] == cm["metadata"]["resourceVersion"]
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "UpdateFailed",
        "the program failed",
    )
    assert event["source"] == {"component": COMPONENT}
    assert event["reportingComponent"] == COMPONENT
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"]


async def test_repeats_are_counted_until_the_rate_limit_drops_them(api_client: Any, namespace: str) -> None:
    registry = CollectorRegistry()
    recorder = EventRecorder(api_client, COMPONENT, registry=registry)
    recorder.start()
    cm, other = await _object(api_client, namespace, "busy"), await _object(api_client, namespace, "quiet")
    for _ in range(30):
        recorder.event(cm, "Normal", "Reconciled", "same again")
    recorder.event(other, "Normal", "Reconciled", "same again")  # another object, its own bucket
    await recorder.stop(drain_timeout=30)

    # One Event; the burst of 25 passed and was counted, the 5 beyond it were dropped.
    [event] = await _events_about(api_client, namespace, cm)
    assert event["count"] == 25
    assert registry.get_sample_value("pko_events_dropped_total", {"reason": "spam"}) == 5
    [event] = await _events_about(api_client, namespace, other)
    assert event["count"] == 1


async def test_many_messages_for_one_reason_are_combined(api_client: Any, namespace: str) -> None:
    recorder = EventRecorder(api_client, COMPONENT, registry=CollectorRegistry())
    recorder.start()
    cm = await _object(api_client, namespace, "chatty")
    for i in range(13):
        recorder.event(cm, "Warning", "Failed", f"attempt {i}")
    await recorder.stop(drain_timeout=30)

    events = await _events_about(api_client, namespace, cm)
    single = sorted(e["message"] for e in events if e["count"] == 1)
    assert single == sorted(f"attempt {i}" for i in range(10))
    [combined] = [e for e in events if e["message"].startswith(COMBINED_PREFIX)]
    assert combined["message"] == COMBINED_PREFIX + "attempt 12" and combined["count"] == 3


def test_the_fake_recorder_keeps_client_gos_strings() -> None:
    fake = FakeRecorder()
    fake.event({"metadata": {"name": "x"}}, "Normal", "Created", "made it")
    assert fake.events == ["Normal Created made it"]

"""The manager against a real kube-apiserver: its readiness probe, its metrics, and both answering while
the event loop is stuck."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from kubernetes_asyncio import client
from manager_helpers import (
    CRDS,
    RecordingReconciler,
    StartManager,
    create_configmaps,
    gizmo_crd,
    http_get,
    lease_config,
    options,
    ours,
    url,
)
from prometheus_client.parser import text_string_to_metric_families

from pko.devtools.waiting import wait_until
from pko.machinery.manager import Manager
from pko.machinery.resource import CONFIGMAPS, Resource, ResourceClient

# ----- probes and metrics ------------------------------------------------------------------------


@pytest.mark.cluster
async def test_readyz_fails_until_every_cache_has_synced(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    # A custom resource whose CRD does not exist yet: its informer cannot list, so it cannot sync.
    group = f"m{uuid.uuid4().hex[:8]}.pko.test"
    gizmos = Resource(group, "v1", "gizmos", "Gizmo")
    manager = Manager(api_client, options(namespace))
    manager.controller("gizmo-controller", RecordingReconciler()).for_(gizmos)
    await start_manager(manager)

    assert await http_get(url(manager, "probes", "/healthz")) == (200, "ok")
    await asyncio.sleep(1.0)  # the informer has tried (and failed) to list by now
    status, body = await http_get(url(manager, "probes", "/readyz"))
    assert status == 500
    assert f"[-]informer-sync failed: not synced: gizmos.{group}" in body

    crds = ResourceClient(api_client, CRDS)
    await crds.create(gizmo_crd(group))
    try:

        async def ready() -> bool:
            return (await http_get(url(manager, "probes", "/readyz")))[0] == 200

        await wait_until("readyz to pass once the CRD exists", ready, within=120, interval=0.5)
        assert manager.is_ready()
        status, body = await http_get(url(manager, "probes", "/readyz?verbose"))
        assert (status, body) == (200, "[+]informer-sync ok\ncheck passed\n")
    finally:
        await crds.delete(f"gizmos.{group}")


@pytest.mark.cluster
async def test_metrics_serve_controller_runtime_series_labelled_by_controller(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    reconciler = RecordingReconciler()
    lease = f"metrics-{uuid.uuid4().hex[:6]}"
    manager = Manager(
        api_client, options(namespace, leader_election=lease_config(namespace, lease, "only-candidate"))
    )
    manager.controller("configmap-controller", reconciler, workers=3).for_(CONFIGMAPS)
    await start_manager(manager)
    names = ["a", "b", "c"]
    await create_configmaps(api_client, namespace, names)
    await wait_until("the ConfigMaps reconciled", lambda: ours(reconciler.finished, namespace, names))

    status, text = await http_get(url(manager, "metrics", "/metrics"))
    assert status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(metric: str, /, **labels: str) -> float:
        return samples[(metric, tuple(sorted(labels.items())))]

    ctrl = {"controller": "configmap-controller"}
    queue = {"controller": "configmap-controller", "name": "configmap-controller"}
    assert value("controller_runtime_reconcile_total", result="success", **ctrl) >= len(names)
    assert value("controller_runtime_reconcile_total", result="error", **ctrl) == 0
    assert value("controller_runtime_reconcile_errors_total", **ctrl) == 0
    assert value("controller_runtime_reconcile_time_seconds_count", **ctrl) >= len(names)
    assert value("controller_runtime_max_concurrent_reconciles", **ctrl) == 3
    assert value("controller_runtime_active_workers", **ctrl) == 0
    assert value("workqueue_adds_total", **queue) >= len(names)
    assert value("workqueue_depth", **queue) == 0
    assert value("workqueue_retries_total", **queue) == 0
    assert value("workqueue_queue_duration_seconds_count", **queue) >= len(names)
    assert value("workqueue_work_duration_seconds_count", **queue) >= len(names)
    assert value("workqueue_unfinished_work_seconds", **queue) == 0
    assert value("workqueue_longest_running_processor_seconds", **queue) == 0
    assert value("leader_election_master_status", name=lease) == 1
    assert value("pko_reflector_lists_total", resource="configmaps") >= 1
    assert any(name == "process_resident_memory_bytes" for name, _ in samples)


def blocking_get(target: str) -> tuple[int, str, float]:
    """A GET from a plain thread (the test's event loop may be stuck): status, body, seconds."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(target, timeout=10) as resp:
            status, body = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    return status, body, time.monotonic() - started


async def get_while_the_loop_sleeps(
    seconds: float, targets: list[str], after: float
) -> list[tuple[int, str, float]]:
    """GET ``targets`` from a thread ``after`` s into a ``time.sleep(seconds)`` on the event loop."""
    answers: list[tuple[int, str, float]] = []

    def probe() -> None:
        time.sleep(after)
        answers.extend(blocking_get(t) for t in targets)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(seconds)  # noqa: ASYNC251 - stalling the (manager's) event loop is the point
    await asyncio.to_thread(thread.join)  # (answers served by the loop come only now)
    return answers


@pytest.mark.cluster
async def test_probes_and_metrics_answer_while_the_event_loop_is_stuck(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    manager = Manager(api_client, options(namespace, liveness_stall_threshold=2.5))
    manager.controller("configmap-controller", RecordingReconciler()).for_(CONFIGMAPS)
    await start_manager(manager)
    await wait_until("caches to sync", manager.is_ready)
    targets = [url(manager, "probes", "/healthz"), url(manager, "probes", "/readyz")]
    targets.append(url(manager, "metrics", "/metrics"))

    # Stuck for less than the threshold: every answer within the kubelet's 1 s, and healthy.
    answers = await get_while_the_loop_sleeps(2.0, targets, after=0.2)
    assert max(a[2] for a in answers) < 1.0
    assert [a[:2] for a in answers[:2]] == [(200, "ok"), (200, "ok")]
    assert answers[2][0] == 200 and "pko_event_loop_heartbeat_age_seconds" in answers[2][1]

    # Stuck past the threshold: liveness fails (readiness is about caches and still passes).
    answers = await get_while_the_loop_sleeps(4.5, targets[:2], after=3.5)
    assert max(a[2] for a in answers) < 1.0
    assert answers[0][0] == 500 and "[-]ping failed: event loop stalled" in answers[0][1]
    assert answers[1][:2] == (200, "ok")
    await asyncio.sleep(0.5)
    assert (await http_get(url(manager, "probes", "/healthz"))) == (200, "ok")

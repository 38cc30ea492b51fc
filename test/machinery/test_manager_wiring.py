"""The manager against a real kube-apiserver: watches wiring (owned objects, index fan-out, the
generation predicate), runnables, scoped and optional informers, and its event recorder."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from manager_helpers import (
    CRDS,
    RecordingReconciler,
    StartManager,
    create_configmaps,
    gizmo_crd,
    http_get,
    options,
    ours,
    url,
)

from pko.devtools.waiting import wait_until
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.manager import EVENT_COMPONENT, ControllerBuilder, Manager, generation_changed
from pko.machinery.resource import CONFIGMAPS, EVENTS, LEASES, SECRETS, Resource, ResourceClient
from pko.machinery.store import index_by_field

REPO = Path(__file__).resolve().parents[2]


def test_generation_changed_passes_adds_deletes_and_spec_changes_only() -> None:
    gen1: dict[str, Any] = {"metadata": {"generation": 1}}
    gen2: dict[str, Any] = {"metadata": {"generation": 2}}
    assert generation_changed(None, gen1) and generation_changed(gen1, None)
    assert generation_changed(gen1, gen2)
    assert not generation_changed(gen1, {"metadata": {"generation": 1}, "status": {"x": 1}})


# ----- wiring ------------------------------------------------------------------------------------


@pytest.mark.cluster
async def test_owned_objects_and_index_fan_out_enqueue_primary_keys(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    """Primary: ConfigMaps. Owned: Secrets controlled by a ConfigMap. Fan-out: a Secret named X
    enqueues every ConfigMap whose ``data.source`` is X."""
    reconciler = RecordingReconciler()
    manager = Manager(api_client, options(namespace))
    by_source = index_by_field("data.source", namespaced=True)
    (
        manager.controller("configmap-controller", reconciler, workers=2)
        .for_(CONFIGMAPS)
        .owns(SECRETS)
        .watches_by_index(SECRETS, "source", by_source)
    )
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    owner = await cms.create({"metadata": {"name": "owner"}})
    await cms.create({"metadata": {"name": "user-1"}, "data": {"source": "src"}})
    await cms.create({"metadata": {"name": "user-2"}, "data": {"source": "src"}})
    await cms.create({"metadata": {"name": "bystander"}, "data": {"source": "other"}})
    await start_manager(manager)
    everything = ["owner", "user-1", "user-2", "bystander"]
    await wait_until("the initial reconciles", lambda: ours(reconciler.finished, namespace, everything))

    secrets = ResourceClient(api_client, SECRETS, namespace)
    reconciler.keys.clear()
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
           "controller": True}  # fmt: skip
    await secrets.create({"metadata": {"name": "owned", "ownerReferences": [ref]}})
    await wait_until("the owner enqueued by its Secret", lambda: f"{namespace}/owner" in reconciler.keys)

    reconciler.keys.clear()
    await secrets.create({"metadata": {"name": "src"}})
    await wait_until("fan-out to users", lambda: ours(reconciler.keys, namespace, ["user-1", "user-2"]))
    await asyncio.sleep(0.5)
    assert f"{namespace}/bystander" not in reconciler.keys
    assert f"{namespace}/src" not in reconciler.keys  # a Secret's own key is not a ConfigMap key
    informer = manager.informer(SECRETS)
    owner_index, _ = ControllerBuilder.owner_index(CONFIGMAPS)
    assert informer.indexer.index_keys(owner_index, f"{namespace}/owner") == [f"{namespace}/owned"]


@pytest.mark.cluster
async def test_without_leader_election_controllers_run_and_no_lease_is_written(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    reconciler = RecordingReconciler()
    manager = Manager(api_client, options(namespace))
    manager.controller("configmap-controller", reconciler).for_(CONFIGMAPS)
    await create_configmaps(api_client, namespace, ["x"])
    await start_manager(manager)
    await wait_until("x reconciled", lambda: ours(reconciler.finished, namespace, ["x"]))
    assert manager.is_leader() and [c.name for c in manager.controllers] == ["configmap-controller"]
    page = await ResourceClient(api_client, LEASES, namespace).list()
    assert page.items == []


# ----- runnables, scoped and optional informers, events ------------------------------------------


class RunnableLog:
    """Runnables that record when they start and when they are cancelled."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []

    def runnable(self, name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.started.append(name)
            try:
                await asyncio.Future()
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise

        return run


@pytest.mark.cluster
async def test_leader_only_runnables_run_while_leading_and_others_everywhere(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    lease = f"runnables-{uuid.uuid4().hex[:6]}"
    log = RunnableLog()
    managers: dict[str, Manager] = {}
    tasks: dict[str, asyncio.Task[None]] = {}
    for who in ("first", "second"):
        cfg = LeaderElectionConfig(
            lease, namespace, who, lease_duration=60.0, renew_deadline=4.0, retry_period=1.0
        )
        m = Manager(api_client, options(namespace, leader_election=cfg))
        m.controller("configmap-controller", RecordingReconciler()).for_(CONFIGMAPS)
        m.add_runnable("watcher", log.runnable(f"{who}:watcher"))
        m.add_runnable("server", log.runnable(f"{who}:server"), leader_only=False)
        with pytest.raises(ValueError):
            m.add_runnable("server", log.runnable("dup"))
        managers[who] = m
        tasks[who] = await start_manager(m)
        if who == "first":
            await wait_until("the leader's runnable to start", lambda: "first:watcher" in log.started)

    await wait_until("the follower's every-replica runnable", lambda: "second:server" in log.started)
    await wait_until("the follower's caches to sync", managers["second"].is_ready)
    await asyncio.sleep(2.5)
    assert "second:watcher" not in log.started

    # A runnable added while leading starts at once.
    managers["first"].add_runnable("late", log.runnable("first:late"))
    await wait_until("a late runnable to start", lambda: "first:late" in log.started)

    managers["first"].stop()
    await asyncio.wait_for(tasks["first"], 30)
    assert {"first:watcher", "first:late", "first:server"} <= set(log.cancelled)
    await wait_until("the successor's runnable", lambda: "second:watcher" in log.started, within=20)
    assert log.started.count("second:watcher") == 1


@pytest.mark.cluster
async def test_a_failing_runnable_is_restarted_with_backoff(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    calls: list[float] = []

    async def flaky() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) < 3:
            raise RuntimeError("boom")
        await asyncio.Future()

    manager = Manager(api_client, options(namespace))
    manager.add_runnable("flaky", flaky)
    await start_manager(manager)
    await wait_until("two restarts", lambda: len(calls) == 3, within=20)
    assert calls[1] - calls[0] >= 0.9 and calls[2] - calls[1] >= 1.9  # 1 s, then 2 s


@pytest.mark.cluster
async def test_scoped_informers_cache_only_what_their_selector_selects(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    writer = ResourceClient(api_client, CONFIGMAPS, namespace)
    await writer.create({"metadata": {"name": "mine", "labels": {"app": "pko"}}})
    await writer.create({"metadata": {"name": "theirs", "labels": {"app": "other"}}})
    await writer.create({"metadata": {"name": "named"}})
    manager = Manager(api_client, options(namespace))
    labelled = manager.informer(CONFIGMAPS, label_selector="app=pko")
    assert manager.informer(CONFIGMAPS) is labelled  # omitting the selector: whatever exists
    with pytest.raises(ValueError, match="selector"):
        manager.informer(CONFIGMAPS, label_selector="app=other")
    by_field = manager.informer(SECRETS, field_selector="metadata.name=wanted")
    await ResourceClient(api_client, SECRETS, namespace).create({"metadata": {"name": "wanted"}})
    await ResourceClient(api_client, SECRETS, namespace).create({"metadata": {"name": "unwanted"}})
    await start_manager(manager)
    await wait_until("caches to sync", manager.is_ready)
    assert labelled.indexer.list_keys() == [f"{namespace}/mine"]
    assert by_field.indexer.list_keys() == [f"{namespace}/wanted"]


@pytest.mark.cluster
async def test_an_optional_watch_waits_for_its_crd_without_blocking_readiness(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    group = f"m{uuid.uuid4().hex[:8]}.pko.test"
    gizmos = Resource(group, "v1", "gizmos", "Gizmo")
    reconciler = RecordingReconciler()
    manager = Manager(api_client, options(namespace, discovery_interval=0.5, optional_sync_timeout=30.0))
    (
        manager.controller("configmap-controller", reconciler)
        .for_(CONFIGMAPS)
        .watches(gizmos, lambda g: [f"{namespace}/{g['spec']['target']}"], optional=True)
    )
    await create_configmaps(api_client, namespace, ["x"])
    await start_manager(manager)

    # Ready and reconciling although the Gizmo kind does not exist.
    await wait_until("x reconciled", lambda: ours(reconciler.finished, namespace, ["x"]), within=30)
    assert manager.is_ready() and (await http_get(url(manager, "probes", "/readyz")))[0] == 200
    assert manager.optional_cache_status(gizmos) == "absent"
    assert manager.optional_cache_status(CONFIGMAPS) == "synced"

    crds = ResourceClient(api_client, CRDS)
    await crds.create(gizmo_crd(group))
    try:
        await wait_until(
            "the gizmo cache", lambda: manager.optional_cache_status(gizmos) == "synced", within=60
        )
        gizmo = {
            "apiVersion": f"{group}/v1",
            "kind": "Gizmo",
            "metadata": {"name": "g"},
            "spec": {"target": "y"},
        }
        await ResourceClient(api_client, gizmos, namespace).create(gizmo)
        await wait_until("the gizmo's key reconciled", lambda: ours(reconciler.finished, namespace, ["y"]))
    finally:
        await crds.delete(f"gizmos.{group}")


@pytest.mark.cluster
async def test_the_managers_event_recorder_runs_with_it(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    manager = Manager(api_client, options(namespace))
    await start_manager(manager)
    cm = await ResourceClient(api_client, CONFIGMAPS, namespace).create({"metadata": {"name": "ev"}})
    manager.events.event(cm, "Normal", "Tested", "hello")

    async def recorded() -> bool:
        items = (await ResourceClient(api_client, EVENTS, namespace).list()).items
        return any(e["reason"] == "Tested" and e["source"]["component"] == EVENT_COMPONENT for e in items)

    await wait_until("the event", recorded)

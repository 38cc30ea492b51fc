"""What the manager tests share: a reconciler that records (and can hold) its keys, a Manager's options
on loopback ports, short leader-election timings, and small API moves (ConfigMaps, Leases)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from pko.machinery.controller import Result
from pko.machinery.leaderelection import LeaderElectionConfig, micro_time
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import CONFIGMAPS, LEASES, Resource, ResourceClient

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
# Short but valid (lease > renew > 1.2 * retry): handovers in seconds, not minutes.
LEASE_S, RENEW_S, RETRY_S = 6.0, 4.0, 1.0
LOOPBACK = "127.0.0.1:0"


class RecordingReconciler:
    """Records the keys it reconciles; ``gate`` (when set) holds every reconcile until opened.

    Ignores the ``kube-root-ca.crt`` ConfigMap the controller-manager adds to every namespace.
    """

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.keys: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.gate = gate

    async def reconcile(self, key: str) -> Result:
        if key.endswith("/kube-root-ca.crt"):
            return Result.done()
        self.keys.append(key)
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(key)
            raise
        self.finished.append(key)
        return Result.done()


StartManager = Callable[[Manager], Awaitable["asyncio.Task[None]"]]


def options(namespace: str, **kw: Any) -> ManagerOptions:
    return ManagerOptions(
        metrics_bind_address=LOOPBACK,
        metrics_secure=False,  # plain HTTP: test_metrics_auth.py scrapes the secure server
        health_probe_bind_address=LOOPBACK,
        namespace=namespace,
        shutdown_grace_period=kw.pop("shutdown_grace_period", 10.0),
        **kw,
    )


def lease_config(namespace: str, name: str, identity: str) -> LeaderElectionConfig:
    return LeaderElectionConfig(
        name, namespace, identity, lease_duration=LEASE_S, renew_deadline=RENEW_S, retry_period=RETRY_S
    )


def url(manager: Manager, server: str, path: str) -> str:
    address = manager.address(server)
    assert address is not None
    return f"http://127.0.0.1:{address[1]}{path}"


async def http_get(target: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(target) as resp:
        return resp.status, await resp.text()


async def create_configmaps(api: client.ApiClient, namespace: str, names: list[str]) -> None:
    writer = ResourceClient(api, CONFIGMAPS, namespace)
    for name in names:
        await writer.create({"metadata": {"name": name}, "data": {"k": "v"}})


async def lease_holder(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """The Lease's holder ("" when released), or None if there is no Lease."""
    try:
        lease = await ResourceClient(api, LEASES, namespace).get(name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def steal_lease(api: client.ApiClient, namespace: str, name: str, seconds: int = 600) -> None:
    leases = ResourceClient(api, LEASES, namespace)
    lease = await leases.get(name)
    now = micro_time(datetime.now(UTC))
    lease["spec"].update(
        holderIdentity="intruder", renewTime=now, acquireTime=now, leaseDurationSeconds=seconds
    )
    await leases.replace(lease)


def ours(keys: list[str], namespace: str, names: list[str]) -> bool:
    return all(f"{namespace}/{n}" in keys for n in names)


def gizmo_crd(group: str) -> dict[str, Any]:
    """A namespaced CRD of kind Gizmo in ``group``, any fields: an informer waits for it to exist."""
    return {
        "metadata": {"name": f"gizmos.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }

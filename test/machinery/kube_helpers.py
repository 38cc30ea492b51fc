"""Helpers for tests against a real apiserver: a cuttable loopback proxy, namespaces, waiting, and
what the informer tests share (a recording handler, their ConfigMaps, the cache compared with a list)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from pko.machinery.informer import SharedInformer, strip_managed_fields
from pko.machinery.resource import NAMESPACES, ObjectList, ResourceClient, WatchStream
from pko.machinery.store import DeletedFinalStateUnknown, Obj, deletion_handling_key, meta_namespace_key

# Only the informer tests' objects: the controller-manager adds a kube-root-ca.crt ConfigMap to every
# namespace.
SELECTOR = "pko-test=informer"


class TcpProxy:
    """A loopback TCP proxy to ``target``. ``cut()`` refuses new connections and drops live ones,
    as if the network to the apiserver failed; ``restore()`` listens again on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._conns.update((writer, up_writer))
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._pumps.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._pumps.difference_update(pumps)
        for w in (writer, up_writer):
            self._conns.discard(w)
            w.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for pump in list(self._pumps):
            pump.cancel()
        for w in list(self._conns):
            w.close()
        self._conns.clear()
        await asyncio.sleep(0)

    async def restore(self) -> None:
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()
        pumps = list(self._pumps)
        await asyncio.gather(*pumps, return_exceptions=True)


class RecordingClient(ResourceClient):
    """A ResourceClient that records the arguments of every list and watch request it makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def list(self, **kwargs: Any) -> ObjectList:
        self.requests.append(("list", kwargs))
        return await super().list(**kwargs)

    def watch(self, **kwargs: Any) -> WatchStream:
        self.requests.append(("watch", kwargs))
        return super().watch(**kwargs)

    def calls(self, kind: str) -> list[dict[str, Any]]:
        return [kwargs for k, kwargs in self.requests if k == kind]


async def create_namespace(api: client.ApiClient, prefix: str = "mach") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await ResourceClient(api, NAMESPACES).create({"metadata": {"name": name}})
    return name


async def delete_namespace(api: client.ApiClient, name: str) -> None:
    with contextlib.suppress(Exception):
        await ResourceClient(api, NAMESPACES).delete(name)


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


async def drain(client: ResourceClient, **watch: Any) -> None:
    """A raw watch read to its end (5 s at most): what the server answers, an error included."""
    async with client.watch(timeout_seconds=5, **watch) as events:
        async for _ in events:
            pass


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

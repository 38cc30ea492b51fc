"""Fixtures for machinery tests: API clients (optionally through a cuttable loopback proxy),
throw-away namespaces, a Manager started for the length of a test, and informers stopped after it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import TcpProxy, create_namespace, delete_namespace
from kubernetes_asyncio import client, config
from manager_helpers import StartManager

from pko.devtools.apiclient import stock_api_client
from pko.devtools.localcluster import LocalCluster, private_cluster
from pko.machinery.informer import SharedInformer
from pko.machinery.manager import Manager

ClientFactory = Callable[..., Awaitable[client.ApiClient]]


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """``await make_client(kubeconfig, server=None)``: an ApiClient, closed after the test."""
    made: list[client.ApiClient] = []

    async def make(kubeconfig: Path, server: str | None = None) -> client.ApiClient:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        if server:
            cfg.host = server
        api = stock_api_client(cfg)
        made.append(api)
        return api

    yield make
    for api in made:
        await api.close()


@pytest.fixture
async def make_proxy() -> AsyncIterator[Callable[[str], Awaitable[TcpProxy]]]:
    """``await make_proxy(server_url)``: a started :class:`TcpProxy` to that apiserver."""
    proxies: list[TcpProxy] = []

    async def make(server: str) -> TcpProxy:
        host_port = server.split("://", 1)[1].rstrip("/")
        host, _, port = host_port.rpartition(":")
        proxy = await TcpProxy(host, int(port)).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        await proxy.close()


@pytest.fixture
async def namespace(api_client: Any) -> AsyncIterator[str]:
    """A fresh namespace in the shared test cluster, deleted afterwards."""
    name = await create_namespace(api_client)
    yield name
    await delete_namespace(api_client, name)


@pytest.fixture
async def start_manager() -> AsyncIterator[StartManager]:
    """``await start_manager(m)``: run ``m`` in a task until its servers listen; stopped afterwards."""
    running: list[tuple[Manager, asyncio.Task[None]]] = []

    async def start(manager: Manager) -> asyncio.Task[None]:
        task = asyncio.create_task(manager.run())
        running.append((manager, task))
        serving = asyncio.create_task(manager.wait_serving())
        await asyncio.wait({task, serving}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raise what failed
        assert serving.done(), "manager did not start serving"
        return task

    yield start
    for manager, task in running:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)


@pytest.fixture
async def informers() -> AsyncIterator[list[SharedInformer]]:
    """Informers appended here are stopped after the test even when it fails."""
    made: list[SharedInformer] = []
    yield made
    for informer in made:
        await informer.stop()


@pytest.fixture(scope="module")
def nocache_cluster() -> Iterator[LocalCluster]:
    """A module's own control plane without the watch cache, so a request from a compacted
    resourceVersion reaches etcd and is answered 410 Gone (see local-cluster notes); its own, since
    the shared one must not be compacted under other tests' informers."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("needs a control plane started by the tests (unset KUBECONFIG)")
    with private_cluster("pko-nocache-", "--watch-cache=false") as c:
        yield c

"""Clients from the manager: every request carries ``--kube-api-timeout`` (``kube_api_timeout``)
and the reconcilers take theirs from it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from pko.controllers.options import ControllerOptions
from pko.controllers.program.reconciler import ProgramReconciler
from pko.controllers.stack.reconciler import StackReconciler
from pko.controllers.update.reconciler import UpdateReconciler
from pko.controllers.workspace.reconciler import WorkspaceReconciler
from pko.devtools.apiclient import stock_api_client
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import CONFIGMAPS, ResourceClient

OFF = "0"  # no probe or metrics server: these managers never run


def manager_with_timeout(api: client.ApiClient, seconds: float) -> Manager:
    opts = ManagerOptions(metrics_bind_address=OFF, health_probe_bind_address=OFF, kube_api_timeout=seconds)
    return Manager(api, opts)


async def api_client_for(kubeconfig: Path, server: str | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    if server:
        cfg.host = server
    return stock_api_client(cfg)


@pytest.fixture
async def own_api(cluster: Any) -> AsyncIterator[client.ApiClient]:
    """An ApiClient of this test's own (its aiohttp session is spied on)."""
    api = await api_client_for(cluster.kubeconfig)
    yield api
    await api.close()


@pytest.mark.cluster
async def test_a_client_from_the_manager_sends_the_configured_timeout_to_aiohttp(
    own_api: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = own_api.session()  # the KubeClient's: every request of pko's goes through it
    seen: list[Any] = []
    request = session.request

    def spy(**kwargs: Any) -> Any:
        seen.append(kwargs.get("timeout"))
        return request(**kwargs)

    monkeypatch.setattr(session, "request", spy)
    manager = manager_with_timeout(own_api, 7.5)
    configmaps = manager.client(CONFIGMAPS, "kube-system")
    assert isinstance(configmaps, ResourceClient) and configmaps.namespace == "kube-system"
    page = await configmaps.list(limit=1)
    assert page.resource_version
    assert seen and all(isinstance(t, aiohttp.ClientTimeout) and t.total == 7.5 for t in seen), seen


async def test_a_stalled_apiserver_fails_a_managers_request_after_the_configured_time(tmp_path: Path) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    api = await api_client_for(kubeconfig)
    try:
        manager = manager_with_timeout(api, 0.3)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await manager.client(CONFIGMAPS).get("anything", "default")
        elapsed = time.monotonic() - started
        assert 0.25 < elapsed < 5.0, elapsed
        assert accepted, "the request never reached the server"
    finally:
        await api.close()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_every_client_the_reconcilers_hold_carries_the_managers_timeout(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    api = await api_client_for(kubeconfig)
    try:
        manager = manager_with_timeout(api, 12.5)
        options = ControllerOptions(program_fs_addr="127.0.0.1:0")
        reconcilers = [
            WorkspaceReconciler(manager, options),
            UpdateReconciler(manager, options),
            ProgramReconciler(manager, options),
            StackReconciler(manager, options),
        ]
        for reconciler in reconcilers:
            clients = [v for v in vars(reconciler).values() if isinstance(v, ResourceClient)]
            assert clients, type(reconciler).__name__
            assert {c.request_timeout for c in clients} == {12.5}, (type(reconciler).__name__, clients)
        stack = reconcilers[3]
        assert isinstance(stack, StackReconciler)
        assert stack.workspace_applier.client.request_timeout == 12.5
        assert manager.events._client.request_timeout == 12.5
        assert reconcilers[0].request_timeout == 12.5  # the one generated-API call: the pod dry run
    finally:
        await api.close()

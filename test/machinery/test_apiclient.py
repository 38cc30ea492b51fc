"""The operator's client for tests and tools (pko.devtools.apiclient): proxies from the
environment resolved once, no per-request look-ups, on both its sides (pko's KubeClient and
kubernetes-asyncio's ApiClient); its errors are either library's ApiException."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client, config

from pko.devtools.apiclient import environment_proxy, new_api_client
from pko.machinery.kubeclient import ApiException
from pko.machinery.resource import NAMESPACES, ResourceClient


def test_environment_proxy_honours_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert environment_proxy("https://10.0.0.1:443") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert environment_proxy("https://10.0.0.1:443") == "http://proxy.internal:3128"
    assert environment_proxy("http://10.0.0.1:80") is None  # only HTTPS_PROXY is set
    monkeypatch.setenv("NO_PROXY", "10.0.0.1,.svc")
    assert environment_proxy("https://10.0.0.1:443") is None
    assert environment_proxy("https://kubernetes.default.svc") is None
    assert environment_proxy("https://example.com") == "http://proxy.internal:3128"


async def test_an_explicit_proxy_is_kept_and_the_session_ignores_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://from-env:3128")
    cfg = client.Configuration(host="https://127.0.0.1:6443")
    cfg.proxy = "http://explicit:8080"
    async with new_api_client(cfg) as api:
        assert api.rest_client.proxy == "http://explicit:8080"
        assert api.rest_client.pool_manager.trust_env is False
        assert api.config.proxy == "http://explicit:8080"
        assert api.session().trust_env is False
    cfg = client.Configuration(host="https://127.0.0.1:6443")
    async with new_api_client(cfg) as api:
        assert api.rest_client.proxy == "http://from-env:3128"
        assert api.config.proxy == "http://from-env:3128"


@pytest.mark.cluster
async def test_it_talks_to_the_apiserver_and_closes_its_connections(cluster: Any) -> None:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    api = new_api_client(cfg)
    async with api:
        page = await ResourceClient(api, NAMESPACES).list()
        assert "default" in [ns["metadata"]["name"] for ns in page.items]
        assert (await client.CoreV1Api(api).read_namespace("default")).metadata.name == "default"
        connector = api.rest_client.pool_manager.connector
        session = api.session()
        with pytest.raises(client.ApiException) as missing:  # pko's request, kubernetes-asyncio's type
            await ResourceClient(api, NAMESPACES).get("absent-namespace")
        assert isinstance(missing.value, ApiException) and missing.value.status == 404
    assert connector is not None and connector.closed
    assert session.closed

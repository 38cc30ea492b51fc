"""The operator's client for tests and tools that speak kubernetes-asyncio too (never the operator, so
it lives here: the shipped package does not carry kubernetes-asyncio's bridge).

The operator loads its configuration with :mod:`pko.machinery.kubeconfig` and talks through
:class:`~pko.machinery.kubeclient.KubeClient`, without importing kubernetes-asyncio (issue 44).
Tests and ``hack/bench`` load a kubernetes-asyncio ``Configuration``, make their own typed calls
(``CoreV1Api(api)``) and hand the same client to machinery code; :class:`BridgeClient` is both:

* a :class:`KubeClient` for everything pko sends, raising :class:`ApiError`, which is pko's
  :class:`~pko.machinery.kubeclient.ApiException` and kubernetes-asyncio's at once, so an
  ``except`` of either catches it;
* a kubernetes-asyncio ``ApiClient`` for the generated APIs: from :func:`new_api_client` as the
  operator would send them (pko's ``User-Agent``; its session skips the stock one's two blocking
  look-ups per request, ``~/.netrc`` and the ``*_PROXY`` variables, with the environment's proxy
  resolved once by :func:`environment_proxy`); from :func:`stock_api_client` as a stock client
  sends them (a test acting as a user or as another controller).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from pko.machinery.kubeclient import (
    OPERATOR_USER_AGENT,
    READ_BUFSIZE,
    ApiException,
    KubeClient,
    config_of,
    environment_proxy,
)

__all__ = [
    "OPERATOR_USER_AGENT",
    "ApiError",
    "BridgeClient",
    "environment_proxy",
    "new_api_client",
    "stock_api_client",
]


class ApiError(ApiException, client.ApiException):  # type: ignore[misc]
    """A failed request of the operator's client, catchable as either library's ``ApiException``."""


class BridgeClient(client.ApiClient, KubeClient):
    """kubernetes-asyncio's ``ApiClient`` and pko's :class:`KubeClient` on one ``Configuration``.

    ``operator_typed``: the generated APIs' requests as the operator's client sends its own (pko's
    ``User-Agent``, no environment look-ups); else as a stock ``ApiClient`` sends them (its
    ``OpenAPI-Generator`` agent, which the apiserver names writes without a field manager after).
    """

    def __init__(self, configuration: Any, *, operator_typed: bool = True) -> None:
        client.ApiClient.__init__(self, configuration=configuration)
        KubeClient.__init__(self, config_of(configuration), user_agent=OPERATOR_USER_AGENT)
        if not operator_typed:
            return
        self.user_agent = OPERATOR_USER_AGENT  # the ApiClient's, for the generated APIs
        rest = self.rest_client
        stock: aiohttp.ClientSession = rest.pool_manager
        rest.pool_manager = aiohttp.ClientSession(
            connector=stock.connector, connector_owner=True, trust_env=False, read_bufsize=READ_BUFSIZE
        )
        stock.detach()  # the new session owns (and will close) the connector

    def set_default_header(self, header_name: str, header_value: str) -> None:
        """A header for every request, the generated APIs' and pko's alike."""
        client.ApiClient.set_default_header(self, header_name, header_value)
        self.headers[header_name] = header_value

    def error(
        self, status: int, reason: str, body: str | None = None, headers: Mapping[str, str] | None = None
    ) -> ApiException:
        return ApiError(status, reason, body, headers)

    async def close(self) -> None:
        await KubeClient.close(self)
        await client.ApiClient.close(self)


def new_api_client(configuration: Any) -> BridgeClient:
    """The operator's client for ``configuration``, also for the generated APIs; sets
    ``configuration.proxy`` when the environment names one and it was unset. Close it with
    ``async with`` or ``await api.close()``."""
    if configuration.proxy is None and configuration.host:
        configuration.proxy = environment_proxy(configuration.host)
    return BridgeClient(configuration)


def stock_api_client(configuration: Any) -> BridgeClient:
    """A stock kubernetes-asyncio ``ApiClient`` for ``configuration`` (its session, its
    ``User-Agent``) that machinery code can be handed too: for tests that act as a user or another
    controller with the generated APIs and drive pko's machinery with the same client."""
    return BridgeClient(configuration, operator_typed=False)

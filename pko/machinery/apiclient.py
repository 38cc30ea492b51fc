"""The operator's Kubernetes ``ApiClient``: kubernetes-asyncio's, minus a per-request cost.

kubernetes-asyncio opens its aiohttp session with ``trust_env=True``, so *every* request first
runs two blocking look-ups on the default thread pool: ``~/.netrc`` (read from disk each time)
and the ``*_PROXY`` variables. Two thread hops per request, plus the GIL hand-offs they cause,
cost more CPU than our whole controller machinery (measured: about 0.5 ms per request, 40% of the
client's CPU in the fan-out benchmark; see ``hack/bench``).

:func:`new_api_client` keeps the behaviour and drops the cost: the environment's proxy for the
apiserver (honouring ``NO_PROXY``) is resolved once and set as the configuration's explicit
proxy, which kubernetes-asyncio passes on every request; the session then no longer consults the
environment. netrc credentials are not used (the apiserver authenticates by token or certificate).

It also sends pko's own ``User-Agent`` (:data:`OPERATOR_USER_AGENT`, built by
:func:`pko.version.user_agent`, which says why) instead of kubernetes-asyncio's
``OpenAPI-Generator/<ver>/python``: the apiserver names a write without a ``fieldManager`` after it.
"""

from __future__ import annotations

import urllib.parse
import urllib.request

import aiohttp
import kubernetes_asyncio
from kubernetes_asyncio import client

from pko.version import OPERATOR_PRODUCT, user_agent

__all__ = ["OPERATOR_USER_AGENT", "environment_proxy", "new_api_client"]

OPERATOR_USER_AGENT = user_agent(OPERATOR_PRODUCT, f"kubernetes-asyncio/{kubernetes_asyncio.__version__}")

# kubernetes-asyncio's own read buffer: watch events of large objects exceed aiohttp's default.
_READ_BUFSIZE = 2**21


def environment_proxy(server: str) -> str | None:
    """The proxy ``HTTPS_PROXY``/``HTTP_PROXY`` name for ``server``, unless ``NO_PROXY`` exempts it."""
    url = urllib.parse.urlsplit(server)
    if url.hostname and urllib.request.proxy_bypass(url.hostname):
        return None
    return urllib.request.getproxies().get(url.scheme) or None


def new_api_client(configuration: client.Configuration) -> client.ApiClient:
    """An ``ApiClient`` for ``configuration`` whose requests skip the environment look-ups and carry
    :data:`OPERATOR_USER_AGENT`.

    Call it on the event loop (aiohttp sessions belong to one); close it like any ``ApiClient``
    (``async with`` or ``await api.close()``). Sets ``configuration.proxy`` when the environment
    names one and it was unset.
    """
    if configuration.proxy is None and configuration.host:
        configuration.proxy = environment_proxy(configuration.host)
    api = client.ApiClient(configuration=configuration)
    api.user_agent = OPERATOR_USER_AGENT
    rest = api.rest_client
    stock: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=stock.connector, connector_owner=True, trust_env=False, read_bufsize=_READ_BUFSIZE
    )
    stock.detach()  # the new session owns (and will close) the connector
    return api

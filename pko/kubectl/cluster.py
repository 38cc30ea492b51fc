"""The plugin's one edge to the apiserver: the few reads and the one write its commands make.

Every read is a plain-JSON GET or LIST through :class:`pko.machinery.resource.ResourceClient`
(no generated models: faster to load and to parse). The only write is the merge patch of the
reconciliation-request annotation, filed in ``managedFields`` under :data:`FIELD_MANAGER`, as
``kubectl annotate`` files its own under ``kubectl-annotate``.

A 404 on a single read is ``None``; any other refusal raises ``ApiException`` and the command
exits 5 (:mod:`pko.kubectl.__main__`), except the workspace pod's log, whose absence the caller
works around (:meth:`Cluster.pod_log` says why it is unavailable instead of raising).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient

from pko.machinery.apiclient import new_api_client
from pko.machinery.resource import PODS, Obj, Resource, ResourceClient
from pko.version import user_agent

__all__ = [
    "FIELD_MANAGER",
    "STACKS",
    "UPDATES",
    "USER_AGENT",
    "WORKSPACES",
    "Cluster",
    "LogRead",
    "open_api_client",
]

# Also in pko.controllers.resources, which loads every controller; test_kubectl_cluster.py keeps them equal.
STACKS: Final = Resource("pulumi.com", "v1", "stacks", "Stack")
WORKSPACES: Final = Resource("auto.pulumi.com", "v1alpha1", "workspaces", "Workspace")
UPDATES: Final = Resource("auto.pulumi.com", "v1alpha1", "updates", "Update")

FIELD_MANAGER: Final = "kubectl-pko"
USER_AGENT: Final = user_agent(FIELD_MANAGER)
"""The apiserver's audit log tells the plugin's requests from kubectl's and the operator's."""

REQUEST_TIMEOUT: Final = 30.0
_LIST_PAGE: Final = 500


def open_api_client(configuration: Any) -> ApiClient:
    """An ``ApiClient`` for ``configuration`` with the plugin's ``User-Agent`` (close it after use)."""
    api = new_api_client(configuration)
    api.user_agent = USER_AGENT
    return api


@dataclass(frozen=True, slots=True)
class LogRead:
    """A container's log, or (``text`` None) why it could not be read."""

    text: str | None
    unavailable: str = ""


class Cluster:
    """The reads and the write of the plugin's commands, on one ``ApiClient``."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def _client(self, resource: Resource) -> ResourceClient:
        return ResourceClient(
            self.api, resource, request_timeout=REQUEST_TIMEOUT, field_manager=FIELD_MANAGER
        )

    async def stack(self, namespace: str, name: str) -> Obj | None:
        return await self._client(STACKS).get_or_none(name, namespace)

    async def stacks(self, namespace: str | None) -> list[Obj]:
        """Every Stack of ``namespace`` (None: of all namespaces), page by page."""
        client = ResourceClient(self.api, STACKS, namespace, request_timeout=REQUEST_TIMEOUT)
        items: list[Obj] = []
        token: str | None = None
        while True:
            page = await client.list(limit=_LIST_PAGE, continue_token=token)
            items.extend(page.items)
            token = page.continue_token
            if not token:
                return items

    async def update(self, namespace: str, name: str) -> Obj | None:
        return await self._client(UPDATES).get_or_none(name, namespace)

    async def workspace(self, namespace: str, name: str) -> Obj | None:
        return await self._client(WORKSPACES).get_or_none(name, namespace)

    async def request_reconcile(self, namespace: str, name: str, annotation: str, value: str) -> Obj:
        """Set ``annotation`` to ``value`` on the Stack (a merge patch: other annotations stay)."""
        body: Obj = {"metadata": {"annotations": {annotation: value}}}
        return await self._client(STACKS).patch(name, body, namespace=namespace)

    async def pod_log(self, namespace: str, pod: str, container: str, *, previous: bool = False) -> LogRead:
        """The log of ``container`` (of its previous instance with ``previous``)."""
        path = f"{PODS.object_path(namespace, pod)}/log"
        query = [("container", container)] + ([("previous", "true")] if previous else [])
        # Unread (_preload_content=False), an error status comes back as the response, not raised.
        resp: aiohttp.ClientResponse = await self.api.call_api(
            path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json, */*"},  # as kubectl: a Status on errors
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        )
        try:
            body = (await resp.read()).decode("utf-8", errors="replace")
        finally:
            resp.release()
        if 200 <= resp.status < 300:
            return LogRead(body)
        return LogRead(None, _status_message(resp.status, body))


def _status_message(status: int, body: str) -> str:
    """``<code>: <the apiserver's message>`` from a Status body (or the raw body)."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    message = data.get("message") if isinstance(data, dict) else None
    return f"{status}: {message or body.strip() or 'no message'}"

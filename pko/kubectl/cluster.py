"""The plugin's one edge to the apiserver: the few reads and the one write its commands make.

Every read is a plain-JSON GET or LIST through :class:`pko.machinery.resource.ResourceClient`
(no generated models: faster to load and to parse). The only write is a merge patch of one
annotation of a Stack (a request, or an approval), filed in ``managedFields`` under
:data:`FIELD_MANAGER`, as ``kubectl annotate`` files its own under ``kubectl-annotate``. Waiting for
the operator to carry out a request is a watch of that one Stack (:meth:`Cluster.wait_stack`).

A 404 on a single read is ``None``; any other refusal raises ``ApiException`` and the command
exits 6 (403) or 5 (:mod:`pko.kubectl.__main__`), except the workspace pod's log, whose absence the
caller works around (:meth:`Cluster.pod_log` says why it is unavailable instead of raising).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException

from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.machinery.apiclient import new_api_client
from pko.machinery.resource import PODS, Obj, Resource, ResourceClient, api_error_status
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

    async def annotate(self, namespace: str, name: str, annotation: str, value: str) -> Obj:
        """Set ``annotation`` to ``value`` on the Stack (a merge patch: other annotations stay)."""
        body: Obj = {"metadata": {"annotations": {annotation: value}}}
        return await self._client(STACKS).patch(name, body, namespace=namespace)

    async def wait_stack(self, start: Obj, done: Callable[[Obj], bool], within: float) -> tuple[Obj, bool]:
        """Watch the Stack ``start`` (as last read) until ``done`` holds for it or ``within``
        seconds pass: (the Stack as last seen, whether ``done``). A Stack deleted meanwhile raises
        404; a watch the server ends or expires (410) is resumed from a fresh read."""
        meta = start.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        client = ResourceClient(self.api, STACKS, namespace, request_timeout=REQUEST_TIMEOUT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        current, version = start, str(meta.get("resourceVersion") or "")
        while not done(current):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return current, False
            limit = asyncio.timeout(remaining)
            try:
                async with limit:
                    stream = client.watch(
                        resource_version=version,
                        timeout_seconds=max(1, math.ceil(remaining)),
                        field_selector=f"metadata.name={name}",
                    )
                    async with stream as events:
                        async for event in events:
                            version = str(
                                (event.object.get("metadata") or {}).get("resourceVersion") or version
                            )
                            if event.type == "DELETED":
                                raise PluginError(ExitCode.NOT_FOUND, f"stack {namespace}/{name} was deleted")
                            if event.type in ("ADDED", "MODIFIED"):
                                current = event.object
                                if done(current):
                                    return current, True
            except TimeoutError:
                if limit.expired():
                    return current, False
                raise
            except ApiException as exc:
                if api_error_status(exc) != 410:
                    raise
                fresh = await client.get_or_none(name)
                if fresh is None:
                    raise PluginError(ExitCode.NOT_FOUND, f"stack {namespace}/{name} was deleted") from None
                current, version = fresh, str(fresh["metadata"].get("resourceVersion") or "")
        return current, True

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

"""One shared informer per resource type, however many controllers ask for it.

Why: each informer is a watch connection and a full cache; two controllers watching Stacks must
share one (client-go's ``SharedInformerFactory``). Indexers requested by different controllers
are merged into the one informer; two different functions under one index name are a bug and
raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from pko.machinery.informer import SharedInformer, Transform, strip_managed_fields
from pko.machinery.resource import Resource, ResourceClient
from pko.machinery.store import IndexFunc


class InformerFactory:
    """Creates, starts and stops shared informers. Options apply to every informer it makes.

    Informers requested after :meth:`start` are started at once.
    """

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str | None = None,
        resync_period: float = 0.0,
        transform: Transform | None = strip_managed_fields,
        label_selector: str | None = None,
        metrics_registry: CollectorRegistry | None = None,
        page_size: int = 500,
        min_watch_timeout: int = 300,
        request_timeout: float = 60.0,
    ) -> None:
        self._api = api
        # Bounds each list page (watches have their own server-side timeout): --kube-api-timeout.
        self._request_timeout = request_timeout
        self._namespace = namespace
        self._resync_period = resync_period
        self._transform = transform
        self._label_selector = label_selector
        self._metrics_registry = metrics_registry
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self._informers: dict[tuple[str, str, str], SharedInformer] = {}
        self._started = False

    def informer(
        self, resource: Resource, *, indexers: Mapping[str, IndexFunc] | None = None
    ) -> SharedInformer:
        """The shared informer for ``resource``, created on first use, with ``indexers`` added."""
        key = (resource.group, resource.version, resource.plural)
        informer = self._informers.get(key)
        if informer is None:
            client = ResourceClient(
                self._api,
                resource,
                self._namespace if resource.namespaced else None,
                request_timeout=self._request_timeout,
            )
            informer = SharedInformer(
                client,
                indexers=indexers,
                resync_period=self._resync_period,
                transform=self._transform,
                label_selector=self._label_selector,
                page_size=self._page_size,
                min_watch_timeout=self._min_watch_timeout,
                metrics_registry=self._metrics_registry,
            )
            self._informers[key] = informer
            if self._started:
                informer.start()
            return informer
        if indexers:
            existing = set(informer.indexer.indexer_names())
            new: dict[str, IndexFunc] = {}
            for name, func in indexers.items():
                if name not in existing:
                    new[name] = func
                elif informer.indexer.indexer_func(name) is not func:
                    raise ValueError(f"index {name!r} on {resource.name} exists with another function")
            if new:
                informer.add_indexers(new)
        return informer

    @property
    def informers(self) -> list[SharedInformer]:
        return list(self._informers.values())

    def start(self) -> None:
        """Start every informer (needs a running event loop)."""
        self._started = True
        for informer in self._informers.values():
            informer.start()

    async def wait_for_cache_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """True when every informer has synced within ``timeout`` seconds."""
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for i in self._informers.values()))
        return all(results)

    async def stop(self) -> None:
        """Stop every informer and wait until their watch connections are closed."""
        self._started = False
        await asyncio.gather(*(i.stop() for i in self._informers.values()))

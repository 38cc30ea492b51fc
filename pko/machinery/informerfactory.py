"""One shared informer per resource type, however many controllers ask for it.

Why: each informer is a watch connection and a full cache; two controllers watching Stacks must
share one (client-go's ``SharedInformerFactory``). Indexers requested by different controllers
are merged into the one informer; two different functions under one index name are a bug and
raise.

Selectors are per informer and fixed when it is created: a cache of Pods is either every Pod or
the workspace Pods, never a mix, so a later request for a different selector raises.

Scope: every namespaced informer watches ``namespaces`` (each apart: one reflector per namespace
into one cache, as client-go's ``MultiNamespacedCacheBuilder``; none: all namespaces), and
``label_selectors`` gives some resources a selector of their own (by ``Resource.name``): the list
and watch carry it, so the cache never holds what it leaves out (``--watch-label-selector``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence

from prometheus_client import CollectorRegistry

from pko.machinery.informer import SharedInformer, Transform, strip_managed_fields
from pko.machinery.kubeclient import KubeClient
from pko.machinery.resource import Resource, ResourceClient
from pko.machinery.store import IndexFunc


class InformerFactory:
    """Creates, starts and stops shared informers. Options apply to every informer it makes.

    Informers requested after :meth:`start` are started at once.
    """

    def __init__(
        self,
        api: KubeClient,
        *,
        namespace: str | None = None,
        namespaces: Sequence[str] = (),
        label_selectors: Mapping[str, str] | None = None,
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
        # One namespace is the client's own scope (as before); several are one reflector each.
        watched = list(dict.fromkeys([*([namespace] if namespace else []), *namespaces]))
        self._namespace = watched[0] if len(watched) == 1 else None
        self._namespaces = tuple(watched) if len(watched) > 1 else ()
        self._label_selectors = dict(label_selectors or {})
        self._resync_period = resync_period
        self._transform = transform
        self._label_selector = label_selector
        self._metrics_registry = metrics_registry
        self._page_size = page_size
        self._min_watch_timeout = min_watch_timeout
        self._informers: dict[tuple[str, str, str], SharedInformer] = {}
        self._selectors: dict[tuple[str, str, str], tuple[str | None, str | None]] = {}
        self._started = False

    @staticmethod
    def _key(resource: Resource) -> tuple[str, str, str]:
        return (resource.group, resource.version, resource.plural)

    def informer(
        self,
        resource: Resource,
        *,
        indexers: Mapping[str, IndexFunc] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> SharedInformer:
        """The shared informer for ``resource``, created on first use, with ``indexers`` added.

        ``label_selector``/``field_selector`` limit what the informer caches; they take effect at
        creation. Later calls may omit them (meaning "whatever the cache holds"); a different
        selector raises ``ValueError``.
        """
        key = self._key(resource)
        informer = self._informers.get(key)
        if informer is not None:
            self._check_selectors(resource, label_selector, field_selector)
        else:
            label_selector = label_selector if label_selector is not None else self._label_selector
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
                label_selector=self._with_own(resource, label_selector),
                field_selector=field_selector,
                page_size=self._page_size,
                min_watch_timeout=self._min_watch_timeout,
                metrics_registry=self._metrics_registry,
                namespaces=self._namespaces if resource.namespaced else (),
            )
            self._informers[key] = informer
            self._selectors[key] = (label_selector, field_selector)
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

    def _with_own(self, resource: Resource, asked: str | None) -> str | None:
        """What the caller asked, and the resource's own selector (both must match)."""
        return ",".join(s for s in (asked, self._label_selectors.get(resource.name)) if s) or None

    def _check_selectors(self, resource: Resource, label: str | None, field: str | None) -> None:
        have_label, have_field = self._selectors[self._key(resource)]
        for what, wanted, have in (("label", label, have_label), ("field", field, have_field)):
            if wanted is not None and wanted != have:
                raise ValueError(
                    f"the {resource.name} informer exists with {what} selector {have!r}, not {wanted!r}"
                )

    def get(self, resource: Resource) -> SharedInformer | None:
        """The informer of ``resource`` if one was created."""
        return self._informers.get(self._key(resource))

    @property
    def informers(self) -> list[SharedInformer]:
        return list(self._informers.values())

    def _excluding(self, exclude: Collection[Resource]) -> list[SharedInformer]:
        skip = {self._key(r) for r in exclude}
        return [i for k, i in self._informers.items() if k not in skip]

    def start(self, exclude: Collection[Resource] = ()) -> None:
        """Start every informer but those of ``exclude`` (needs a running event loop).

        Informers created later are started at once; excluded ones wait for :meth:`start_informer`.
        """
        self._started = True
        for informer in self._excluding(exclude):
            informer.start()

    def start_informer(self, resource: Resource) -> SharedInformer:
        """Start the (existing) informer of ``resource``, e.g. once its CRD exists."""
        informer = self._informers[self._key(resource)]
        informer.start()
        return informer

    async def wait_for_cache_sync(
        self,
        timeout: float | None = None,  # noqa: ASYNC109
        exclude: Collection[Resource] = (),
    ) -> bool:
        """True when every informer but those of ``exclude`` has synced within ``timeout`` seconds."""
        results = await asyncio.gather(*(i.wait_for_sync(timeout) for i in self._excluding(exclude)))
        return all(results)

    async def stop(self) -> None:
        """Stop every informer and wait until their watch connections are closed."""
        self._started = False
        await asyncio.gather(*(i.stop() for i in self._informers.values()))

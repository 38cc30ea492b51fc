"""Declaring a controller (controller-runtime's ``pkg/builder``): what it reconciles and what wakes it.

:meth:`pko.machinery.manager.Manager.controller` returns a :class:`ControllerBuilder`; its
``for_``/``owns``/``watches``/``watches_by_index``/``watches_channel`` record the controller's
event sources (:class:`~pko.machinery.handler.Watch`, :class:`~pko.machinery.source.KeyChannel`).
Nothing runs here: the manager builds the queue, workers and handlers from the record when it
leads. The builder asks the manager only for informers, through :class:`WatchRegistry`, so this
module does not import the manager.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from pko.machinery.controller import Reconciler
from pko.machinery.handler import MapKeys, Watch
from pko.machinery.informer import SharedInformer
from pko.machinery.predicates import Predicate
from pko.machinery.ratelimit import RateLimiter
from pko.machinery.resource import Resource
from pko.machinery.source import KeyChannel
from pko.machinery.store import IndexFunc, Obj, index_by_owner, meta_namespace_key

__all__ = ["ControllerBuilder", "WatchRegistry"]


class WatchRegistry(Protocol):
    """What a builder needs from the manager: shared informers, and a record of each watched kind."""

    def informer(
        self,
        resource: Resource,
        *,
        indexers: Mapping[str, IndexFunc] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> SharedInformer: ...

    def declare_watch(self, resource: Resource, *, optional: bool) -> None: ...


class ControllerBuilder:
    """Declares one controller's event sources. Every method returns the builder, for chaining.

    Informers (and the indexes a watch needs) are created at declaration time, so reconcilers
    can take them from :meth:`Manager.informer` before the manager starts.
    """

    def __init__(
        self,
        registry: WatchRegistry,
        name: str,
        reconciler: Reconciler,
        workers: int,
        rate_limiter: Callable[[], RateLimiter] | None,
    ) -> None:
        self._registry = registry
        self.name = name
        self.reconciler = reconciler
        self.workers = workers
        self.rate_limiter = rate_limiter
        self.primary: Resource | None = None
        self.sources: list[Watch] = []
        self.channels: list[KeyChannel] = []

    def _add(
        self,
        resource: Resource,
        map_keys: MapKeys | None,
        predicate: Predicate | None,
        indexers: Mapping[str, IndexFunc] | None = None,
        *,
        optional: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> SharedInformer:
        informer = self._registry.informer(
            resource, indexers=indexers, label_selector=label_selector, field_selector=field_selector
        )
        self._registry.declare_watch(resource, optional=optional)
        self.sources.append(Watch(informer, map_keys, predicate))
        return informer

    def for_(
        self,
        resource: Resource,
        *,
        predicate: Predicate | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ControllerBuilder:
        """Reconcile objects of ``resource``: each event enqueues the object's own key."""
        if self.primary is not None:
            raise ValueError(f"controller {self.name!r} already reconciles {self.primary.name}")
        self.primary = resource
        self._add(resource, None, predicate, label_selector=label_selector, field_selector=field_selector)
        return self

    def owns(
        self,
        resource: Resource,
        *,
        controller_only: bool = True,
        predicate: Predicate | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ControllerBuilder:
        """Events on ``resource`` enqueue the owner's key (an owner of the primary kind).

        The owned informer also gets the owner index (see :meth:`owner_index`), so a reconciler
        can list what an object owns from the cache. A selector scopes the owned informer's
        cache (see :meth:`Manager.informer`).
        """
        owner = self._require_primary("owns")
        index_name, func = self.owner_index(owner, controller_only=controller_only)
        self._add(
            resource,
            func,
            predicate,
            {index_name: func},
            label_selector=label_selector,
            field_selector=field_selector,
        )
        return self

    @staticmethod
    def owner_index(owner: Resource, *, controller_only: bool = True) -> tuple[str, IndexFunc]:
        """The index (name, function) of owned objects by their owner's key."""
        func = index_by_owner(owner.kind, api_group=owner.group, controller_only=controller_only)
        prefix = "controller-owner" if controller_only else "owner"
        return f"{prefix}:{owner.kind}.{owner.group}", func

    def watches(
        self,
        resource: Resource,
        map_keys: MapKeys,
        *,
        predicate: Predicate | None = None,
        optional: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ControllerBuilder:
        """Events on ``resource`` enqueue whatever keys ``map_keys(obj)`` returns.

        ``optional``: ``resource`` may not be served (a CRD not installed, e.g. Flux sources);
        its informer starts once it is and never blocks readiness or the controllers' start. A
        kind watched by any non-optional declaration is required.
        """
        self._add(
            resource,
            map_keys,
            predicate,
            optional=optional,
            label_selector=label_selector,
            field_selector=field_selector,
        )
        return self

    def watches_by_index(
        self,
        resource: Resource,
        index_name: str,
        index_func: IndexFunc,
        *,
        value: Callable[[Obj], str] = meta_namespace_key,
        predicate: Predicate | None = None,
    ) -> ControllerBuilder:
        """Fan-out: an event on a ``resource`` object ``o`` enqueues every primary object whose
        index ``index_name`` holds ``value(o)``.

        E.g. Stacks indexed by ``index_by_field("spec.programRef.name", namespaced=True)`` and a
        Program's ``namespace/name`` as the value: a Program change enqueues the Stacks using it.
        The index is added to the primary informer (same function under the same name is shared).
        """
        primary = self._require_primary("watches_by_index")
        target = self._registry.informer(primary, indexers={index_name: index_func})
        store = target.indexer

        def fan_out(obj: Obj) -> list[str]:
            return store.index_keys(index_name, value(obj))

        self._add(resource, fan_out, predicate)
        return self

    def watches_channel(self, channel: KeyChannel) -> ControllerBuilder:
        """Keys sent on ``channel`` are enqueued as they are."""
        self.channels.append(channel)
        return self

    def _require_primary(self, what: str) -> Resource:
        if self.primary is None:
            raise ValueError(f"controller {self.name!r}: call for_() before {what}()")
        return self.primary

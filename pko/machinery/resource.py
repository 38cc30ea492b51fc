"""Raw JSON access to one Kubernetes resource type: list pages, watch streams, and every write.

Writes are what controllers need, with the apiserver doing the merging: ``patch`` (merge, JSON or
strategic), ``apply`` (server-side apply with a field manager, also on ``/status``) and ``delete``
with preconditions. Optimistic concurrency is the caller's: put ``metadata.resourceVersion`` in a
merge patch or a replaced body, or a precondition on a delete, and a stale write fails with 409.

Why not the generated ``*Api`` classes: they deserialize into model objects (a second copy of
every object, and slow) and their watch helper re-encodes each event. Informers and leader
election need plain dicts, page-wise lists and full control over a watch connection's lifetime;
one small client works for core, apps and custom resources alike. Requests go through
:class:`~pko.machinery.kubeclient.KubeClient` (authentication, TLS, token re-reads, the proxy).

Every create, replace and patch names a field manager (the ``fieldManager`` query parameter): the
caller's, else the client's (:data:`DEFAULT_FIELD_MANAGER`, the Go operator's
``pulumi-kubernetes-operator``). Without one the apiserver files the write in ``managedFields``
under a name derived from the ``User-Agent``.
Server-side apply always takes the caller's, explicitly: users' scripts depend on those names.

Errors are raised as :class:`pko.machinery.kubeclient.ApiException` (``status``, ``reason``,
``body``, ``headers``), the attributes of kubernetes-asyncio's exception of that name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import quote

import aiohttp

from pko import defaults
from pko.machinery.kubeclient import ApiException, KubeClient
from pko.machinery.resourcetype import Resource as Resource  # the one definition, re-exported

Obj = dict[str, Any]

# The Go operator's field manager (FIELD_MANAGER in pko/controllers/resources.py, which machinery
# does not import): every write without a manager of its own is filed under it.
DEFAULT_FIELD_MANAGER: Final = "pulumi-kubernetes-operator"

PatchType = Literal["merge", "json", "strategic"]
# A merge or strategic patch is an object; a JSON patch a list of operations.
PatchBody = Obj | list[Obj]
PropagationPolicy = Literal["Foreground", "Background", "Orphan"]
_Query = list[tuple[str, str]]  # (ResourceClient.list hides the builtin inside the class)

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
# Server-side apply takes YAML, and JSON is YAML: the body is sent as JSON under this type.
_APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


# A few built-in types, for convenience and tests.
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICES = Resource("", "v1", "services", "Service")
PODS = Resource("", "v1", "pods", "Pod")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
EVENTS = Resource("", "v1", "events", "Event")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")


@dataclass(slots=True)
class ObjectList:
    """One page of a list: ``items`` are plain dicts with ``apiVersion``/``kind`` filled in."""

    items: list[Obj]
    resource_version: str
    continue_token: str | None


def api_error_status(exc: BaseException) -> int | None:
    """The HTTP status of an ``ApiException`` (``None`` for anything else, e.g. a broken socket)."""
    if isinstance(exc, ApiException):
        status = exc.status
        return int(status) if status else None
    return None


def _selectors(label_selector: str | None, field_selector: str | None) -> list[tuple[str, str]]:
    query: list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


async def served(
    api: KubeClient, resource: Resource, *, request_timeout: float = defaults.KUBE_API_TIMEOUT
) -> bool:
    """Whether the apiserver serves ``resource`` (discovery of its group/version), e.g. whether a
    CRD is installed and established. Errors other than 404 are raised."""
    prefix = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    client = ResourceClient(api, resource, request_timeout=request_timeout)
    try:
        data = await client._json("GET", prefix)
    except ApiException as exc:
        if api_error_status(exc) == 404:
            return False
        raise
    return any(r.get("name") == resource.plural for r in data.get("resources") or [])


class ResourceClient:
    """Requests for one resource type, optionally limited to one namespace.

    ``namespace=None`` means all namespaces for list/watch; single-object calls then need an
    explicit namespace (or take it from the body). ``field_manager`` is what :meth:`create`,
    :meth:`replace` and :meth:`patch` send unless the call names another.
    """

    def __init__(
        self,
        api: KubeClient,
        resource: Resource,
        namespace: str | None = None,
        *,
        request_timeout: float = defaults.KUBE_API_TIMEOUT,
        field_manager: str = DEFAULT_FIELD_MANAGER,
    ) -> None:
        if not field_manager:
            raise ValueError("a field manager is required: the apiserver would name the write by user agent")
        if namespace and not resource.namespaced:
            raise ValueError(f"{resource.name} is cluster-scoped; it has no namespace")
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self.request_timeout = request_timeout
        self.field_manager = field_manager

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: PatchBody | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
        content_type: str | None = None,
    ) -> aiohttp.ClientResponse:
        return await self.api.call(
            method,
            path,
            query=query,
            body=body,
            content_type=content_type or "application/json",
            client_timeout=client_timeout or aiohttp.ClientTimeout(total=self.request_timeout),
        )

    async def _json(self, method: str, path: str, **kw: Any) -> Obj:
        resp = await self._request(method, path, **kw)
        try:
            data: Obj = json.loads(await resp.read())
        finally:
            resp.release()
        return data

    # --- collections

    async def list(
        self,
        *,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> ObjectList:
        """One list request (one page when ``limit`` is set)."""
        query = _selectors(label_selector, field_selector)
        if limit:
            query.append(("limit", str(limit)))
        if continue_token:
            query.append(("continue", continue_token))
        if resource_version is not None:
            query.append(("resourceVersion", resource_version))
        if resource_version_match:
            query.append(("resourceVersionMatch", resource_version_match))
        data = await self._json("GET", self.resource.collection_path(self.namespace), query=query)
        items: list[Obj] = data.get("items") or []
        # Lists of built-in types omit each item's apiVersion/kind; custom resources carry them.
        api_version, kind = self.resource.api_version, self.resource.kind
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        meta = data.get("metadata") or {}
        return ObjectList(items, str(meta.get("resourceVersion", "")), meta.get("continue") or None)

    def watch(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        allow_bookmarks: bool = True,
        send_initial_events: bool = False,
        label_selector: str | None = None,
        field_selector: str | None = None,
        read_timeout: float | None = None,
    ) -> WatchStream:
        """A watch from ``resource_version``; use as ``async with client.watch(...) as events``.

        The server ends the stream after ``timeout_seconds``; ``read_timeout`` (default that plus
        30 s) bounds silence on the socket so a vanished server is noticed.

        ``send_initial_events`` asks for a streaming list (the WatchList feature, served by default
        in 1.32 and since 1.34): the stream starts with an ADDED event per object, state at least as
        new as ``resource_version`` (a consistent read when it is ``""``), then a BOOKMARK annotated
        :data:`INITIAL_EVENTS_END_ANNOTATION`, then changes as any watch. It implies
        ``resourceVersionMatch=NotOlderThan`` and bookmarks, as the apiserver requires. A server
        without the feature answers 422 Invalid (``sendInitialEvents``, or before 1.27
        ``resourceVersionMatch``, ``is forbidden for watch``).
        """
        query = [
            *_selectors(label_selector, field_selector),
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if send_initial_events:
            query += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
            allow_bookmarks = True
        if allow_bookmarks:
            query.append(("allowWatchBookmarks", "true"))
        client_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=30, sock_read=read_timeout or timeout_seconds + 30
        )
        return WatchStream(self, self.resource.collection_path(self.namespace), query, client_timeout)

    # --- single objects

    def _ns(self, namespace: str | None, body: Obj | None = None) -> str | None:
        if not self.resource.namespaced:
            return None
        if namespace:
            return namespace
        if body is not None and (body.get("metadata") or {}).get("namespace"):
            return str(body["metadata"]["namespace"])
        return self.namespace

    async def get(self, name: str, namespace: str | None = None) -> Obj:
        return await self._json("GET", self.resource.object_path(self._ns(namespace), name))

    async def get_or_none(self, name: str, namespace: str | None = None) -> Obj | None:
        """:meth:`get`, with None for 404 (a direct read of what a cache may not hold)."""
        try:
            return await self.get(name, namespace)
        except ApiException as exc:
            if api_error_status(exc) == 404:
                return None
            raise

    def _manager(self, field_manager: str | None) -> _Query:
        return [("fieldManager", field_manager or self.field_manager)]

    async def create(
        self, body: Obj, namespace: str | None = None, *, field_manager: str | None = None
    ) -> Obj:
        """POST ``body`` as ``field_manager`` (default: the client's)."""
        path = self.resource.collection_path(self._ns(namespace, body))
        return await self._json("POST", path, query=self._manager(field_manager), body=body)

    async def replace(self, body: Obj, *, field_manager: str | None = None) -> Obj:
        """PUT ``body`` as ``field_manager`` (default: the client's); with
        ``metadata.resourceVersion`` set this is an optimistic-concurrency write (409 Conflict when
        the object changed since it was read)."""
        meta = body.get("metadata") or {}
        path = self.resource.object_path(self._ns(None, body), str(meta["name"]))
        return await self._json("PUT", path, query=self._manager(field_manager), body=body)

    async def delete(
        self,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        grace_period_seconds: int | None = None,
    ) -> Obj:
        """DELETE; ``uid``/``resource_version`` are preconditions (409 when the object is another
        incarnation or changed since it was read), ``propagation_policy`` how dependents go,
        ``grace_period_seconds`` overrides a pod's termination grace (0: force, as ``--force``).

        Returns what the server returns: the object (still there while finalizers or foreground
        deletion hold it) or a Status.
        """
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        body = options if len(options) > 2 else None
        return await self._json("DELETE", self.resource.object_path(self._ns(namespace), name), body=body)

    async def patch(
        self,
        name: str,
        body: PatchBody,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        """PATCH ``name`` (or its ``subresource``, e.g. ``"status"``) as ``field_manager`` (default:
        the client's).

        ``merge`` is RFC 7386 (lists are replaced whole; ``None`` deletes a key; put
        ``metadata.resourceVersion`` in the body for an optimistic-concurrency write), ``json`` is
        RFC 6902 (``body`` is the list of operations), ``strategic`` is Kubernetes' merge by list
        keys (built-in types only; custom resources answer 415).
        """
        path = self._subresource_path(name, self._ns(namespace), subresource)
        return await self._json(
            "PATCH",
            path,
            query=self._manager(field_manager),
            body=body,
            content_type=_PATCH_CONTENT_TYPES[patch_type],
        )

    async def apply(
        self, body: Obj, *, field_manager: str, force: bool = True, subresource: str | None = None
    ) -> Obj:
        """Server-side apply ``body`` (``apiVersion``, ``kind``, ``metadata.name``, what this
        manager owns) as ``field_manager``: fields it applied before and leaves out now are removed.

        ``force`` takes over fields another manager owns instead of failing with 409, which is
        what a controller wants for the fields it is the authority on (controller-runtime's
        ``client.ForceOwnership``). Creates the object if it does not exist (not for subresources).
        """
        meta = body.get("metadata") or {}
        path = self._subresource_path(str(meta["name"]), self._ns(None, body), subresource)
        query = [("fieldManager", field_manager)]
        if force:
            query.append(("force", "true"))
        return await self._json("PATCH", path, query=query, body=body, content_type=_APPLY_CONTENT_TYPE)

    async def apply_status(self, body: Obj, *, field_manager: str, force: bool = True) -> Obj:
        """Server-side apply of the ``/status`` subresource (only ``status`` is taken from ``body``)."""
        return await self.apply(body, field_manager=field_manager, force=force, subresource="status")

    def _subresource_path(self, name: str, namespace: str | None, subresource: str | None) -> str:
        path = self.resource.object_path(namespace, name)
        return f"{path}/{quote(subresource, safe='')}" if subresource else path


# Marks the BOOKMARK that ends a streaming list's initial events (metav1.InitialEventsAnnotationKey).
INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end"


@dataclass(slots=True)
class WatchEvent:
    """``type`` is ADDED, MODIFIED, DELETED or BOOKMARK; ``object`` the decoded object."""

    type: str
    object: Obj

    @property
    def ends_initial_events(self) -> bool:
        """Whether this is the BOOKMARK that ends a streaming list's initial events."""
        if self.type != "BOOKMARK":
            return False
        annotations = (self.object.get("metadata") or {}).get("annotations") or {}
        return annotations.get(INITIAL_EVENTS_END_ANNOTATION) == "true"


class WatchStream:
    """One watch connection. Iterating yields events until the server ends the stream.

    An ERROR event (e.g. 410 Gone: the resourceVersion was compacted) is raised as an
    ``ApiException`` carrying the Status code. Leaving the ``async with`` block always closes the
    connection, also when the iteration was cancelled.
    """

    def __init__(
        self, client: ResourceClient, path: str, query: list[tuple[str, str]], timeout: aiohttp.ClientTimeout
    ) -> None:
        self._client = client
        self._path = path
        self._query = query
        self._timeout = timeout
        self._resp: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> WatchStream:
        self._resp = await self._client._request(
            "GET", self._path, query=self._query, client_timeout=self._timeout
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._resp is not None:
            # close(), not release(): an unfinished stream must not go back to the pool.
            self._resp.close()
            self._resp = None

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._resp is None:
            raise RuntimeError("use the watch inside `async with`")
        while True:
            line = await self._resp.content.readline()
            if not line:
                raise StopAsyncIteration
            if not line.isspace():
                break
        event = json.loads(line)
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            reason = f"{obj.get('reason')}: {obj.get('message')}"
            raise self._client.api.error(int(obj.get("code") or 500), reason, line.decode(errors="replace"))
        if etype != "BOOKMARK":
            resource = self._client.resource
            obj.setdefault("apiVersion", resource.api_version)
            obj.setdefault("kind", resource.kind)
        return WatchEvent(str(etype), obj)

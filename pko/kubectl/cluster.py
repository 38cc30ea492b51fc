"""The plugin's one edge to the apiserver: the few reads and the one write its commands make.

Every read is a plain-JSON GET or LIST through :class:`pko.kubectl.apiserver.ApiServer` (the
standard library's HTTP: the plugin ships as one file, see hack/build_plugin.py). The only write
is a merge patch of one annotation of a Stack (a request, or an approval), filed in
``managedFields`` under :data:`FIELD_MANAGER`, as ``kubectl annotate`` files its own under
``kubectl-annotate``. Waiting for the operator to carry out a request is a watch of that one Stack
(:meth:`Cluster.wait_stack`).

A 404 on a single read is ``None``; any other refusal raises :class:`ApiError` and the command
exits 6 (403) or 5 (:mod:`pko.kubectl.__main__`), except the workspace pod's log, whose absence the
caller works around (:meth:`Cluster.pod_log` says why it is unavailable instead of raising).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from typing import Final

from pko.kubectl.apiserver import MERGE_PATCH, ApiError, ApiServer, Obj, Resource, status_message
from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.version import user_agent

__all__ = [
    "DEPLOYMENTS",
    "FIELD_MANAGER",
    "PODS",
    "STACKS",
    "UPDATES",
    "USER_AGENT",
    "WORKSPACES",
    "Cluster",
    "LogRead",
]

# Also in pko.controllers.resources, which loads every controller; test_kubectl_cluster.py keeps them equal.
STACKS: Final = Resource("pulumi.com", "v1", "stacks", "Stack")
WORKSPACES: Final = Resource("auto.pulumi.com", "v1alpha1", "workspaces", "Workspace")
UPDATES: Final = Resource("auto.pulumi.com", "v1alpha1", "updates", "Update")
PODS: Final = Resource("", "v1", "pods", "Pod")
DEPLOYMENTS: Final = Resource("apps", "v1", "deployments", "Deployment")

FIELD_MANAGER: Final = "kubectl-pko"
USER_AGENT: Final = user_agent(FIELD_MANAGER)
"""The apiserver's audit log tells the plugin's requests from kubectl's and the operator's."""

REQUEST_TIMEOUT: Final = 30.0
_LIST_PAGE: Final = 500
_WATCH_GRACE: Final = 10.0
"""How much longer than the watch's ``timeoutSeconds`` a read may wait before the plugin gives up."""


@dataclass(frozen=True, slots=True)
class LogRead:
    """A container's log, or (``text`` None) why it could not be read."""

    text: str | None
    unavailable: str = ""


class Cluster:
    """The reads and the write of the plugin's commands, on one :class:`ApiServer`."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def _get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        try:
            return self.api.json("GET", resource.object_path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _list(self, resource: Resource, namespace: str | None, *query: tuple[str, str]) -> list[Obj]:
        """Every object of ``resource`` in ``namespace`` (None: in all), page by page."""
        items: list[Obj] = []
        token = ""
        while True:
            paging = [("limit", str(_LIST_PAGE))] + ([("continue", token)] if token else [])
            page = self.api.json("GET", resource.collection_path(namespace), query=[*query, *paging])
            items.extend(page.get("items") or [])
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    def stack(self, namespace: str, name: str) -> Obj | None:
        return self._get(STACKS, namespace, name)

    def stacks(self, namespace: str | None) -> list[Obj]:
        """Every Stack of ``namespace`` (None: of all namespaces)."""
        return self._list(STACKS, namespace)

    def update(self, namespace: str, name: str) -> Obj | None:
        return self._get(UPDATES, namespace, name)

    def workspace(self, namespace: str, name: str) -> Obj | None:
        return self._get(WORKSPACES, namespace, name)

    def deployments(self, namespace: str | None, label_selector: str) -> list[Obj]:
        """The Deployments matching ``label_selector`` in ``namespace`` (None: in all)."""
        return self._list(DEPLOYMENTS, namespace, ("labelSelector", label_selector))

    def annotate(self, namespace: str, name: str, annotation: str, value: str) -> Obj:
        """Set ``annotation`` to ``value`` on the Stack (a merge patch: other annotations stay)."""
        body: Obj = {"metadata": {"annotations": {annotation: value}}}
        return self.api.json(
            "PATCH",
            STACKS.object_path(namespace, name),
            query=[("fieldManager", FIELD_MANAGER)],
            body=body,
            content_type=MERGE_PATCH,
        )

    def wait_stack(self, start: Obj, done: Callable[[Obj], bool], within: float) -> tuple[Obj, bool]:
        """Watch the Stack ``start`` (as last read) until ``done`` holds for it or ``within``
        seconds pass: (the Stack as last seen, whether ``done``). A Stack deleted meanwhile raises
        404; a watch the server ends is resumed, one that expired (410) from a fresh read."""
        meta = start.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        path = STACKS.collection_path(namespace)
        deadline = time.monotonic() + within
        current, version = start, str(meta.get("resourceVersion") or "")
        while not done(current):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return current, False
            query = [
                ("fieldSelector", f"metadata.name={name}"),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", str(max(1, math.ceil(remaining)))),
            ] + ([("resourceVersion", version)] if version else [])
            try:
                with closing(self.api.watch(path, query, read_timeout=remaining + _WATCH_GRACE)) as events:
                    for event in events:
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            if obj.get("code") == 410:
                                raise ApiError(410, "Expired", "")
                            code, reason = int(obj.get("code") or 500), str(obj.get("reason") or "")
                            raise ApiError(code, reason, json.dumps(obj))
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if kind == "DELETED":
                            raise PluginError(ExitCode.NOT_FOUND, f"stack {namespace}/{name} was deleted")
                        if kind in ("ADDED", "MODIFIED"):
                            current = obj
                            if done(current):
                                return current, True
            except TimeoutError:
                if time.monotonic() >= deadline:
                    return current, False
                raise
            except ApiError as exc:
                if exc.status != 410:
                    raise
                fresh = self.stack(namespace, name)
                if fresh is None:
                    raise PluginError(ExitCode.NOT_FOUND, f"stack {namespace}/{name} was deleted") from None
                current, version = fresh, str(fresh["metadata"].get("resourceVersion") or "")
        return current, True

    def pod_log(self, namespace: str, pod: str, container: str, *, previous: bool = False) -> LogRead:
        """The log of ``container`` (of its previous instance with ``previous``)."""
        path = f"{PODS.object_path(namespace, pod)}/log"
        query = [("container", container)] + ([("previous", "true")] if previous else [])
        # As kubectl: a Status body on errors.
        status, data = self.api.response("GET", path, query=query, accept="application/json, */*")
        body = data.decode("utf-8", errors="replace")
        if 200 <= status < 300:
            return LogRead(body)
        return LogRead(None, f"{status}: {status_message(body) or body.strip() or 'no message'}")

"""A Kubernetes resource type and its API paths, with nothing but the standard library: the operator's
client (:mod:`pko.machinery.resource`) and the kubectl plugin's (:mod:`pko.kubectl.apiserver`, which
ships as one file without aiohttp) spell the same paths with this one class."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["Resource"]


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource type: ``group`` is ``""`` for the core API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """``plural.group`` (or ``plural`` for core), as kubectl names it; used in logs and metrics."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def collection_path(self, namespace: str | None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            return f"{prefix}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{prefix}/{self.plural}"

    def object_path(self, namespace: str | None, name: str) -> str:
        if self.namespaced and not namespace:
            raise ValueError(f"{self.name} is namespaced: a namespace is required")
        return f"{self.collection_path(namespace)}/{quote(name, safe='')}"

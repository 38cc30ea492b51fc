"""The two write rules every reconciler follows: write a status only if it changed, apply an object
only if its digest changed.

Why: an idle operator must cost the API server nothing. A reconcile runs on every resync and every
watched change of anything it owns, and almost all of them find the world as it should be; each
write they skipped not is a request, an etcd revision and a watch event fanned out to every
informer (which wakes the reconciler again).

* :class:`StatusWriter`: server-side apply of the status fields one controller owns, skipped when
  the object as read (the cache, or this process's own later write) already says it.
* :class:`DigestApplier`: server-side apply of a built object stamped with the digest of what was
  built (:func:`stamp`), skipped when the cached object carries that digest and nobody changed its
  spec since this process applied it (its generation is the one that apply left).

Both record what they wrote with the informer (:meth:`SharedInformer.wrote`), the one stale-read
guard: the next reconcile reads through it until the watch delivers the write.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pko.machinery.informer import SharedInformer
from pko.machinery.resource import ResourceClient
from pko.machinery.store import Obj, meta_namespace_key

__all__ = ["ANNOTATION_APPLIED_DIGEST", "DigestApplier", "StatusWriter", "digest", "owned", "stamp"]

# Where an applied object carries the digest of what its controller built (the Go operator's name).
ANNOTATION_APPLIED_DIGEST: Final = "auto.pulumi.com/applied-digest"
MEMORY_ENTRIES: Final = 8192  # generations remembered per applier; a forgotten one costs one apply


def owned(status: Mapping[str, Any], fields: Iterable[str]) -> Obj:
    """The fields of ``status`` one controller writes, without those it leaves unset (None)."""
    return {k: status[k] for k in fields if status.get(k) is not None}


class StatusWriter:
    """Write if changed: the ``fields`` of ``/status`` that ``field_manager`` owns."""

    def __init__(
        self,
        informer: SharedInformer,
        field_manager: str,
        fields: Iterable[str],
        *,
        client: ResourceClient | None = None,
        force: bool = False,
    ) -> None:
        self.informer = informer
        self.client = client or informer.client
        self.field_manager = field_manager
        self.fields = tuple(fields)
        self.force = force

    def changed(self, obj: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """Whether writing ``status`` would change what ``obj`` says in the owned fields."""
        return owned(obj.get("status") or {}, self.fields) != owned(status, self.fields)

    async def write(self, obj: Obj, status: Mapping[str, Any], *, precondition: bool = False) -> Obj | None:
        """Apply ``status`` (its owned fields) unless ``obj`` already says it; the written object,
        or None when nothing was written. With ``precondition`` the write carries ``obj``'s
        resourceVersion, so it fails with 409 if the object changed since it was read."""
        if not self.changed(obj, status):
            return None
        meta = obj.get("metadata") or {}
        metadata: Obj = {"name": meta.get("name")}
        if meta.get("namespace"):
            metadata["namespace"] = meta["namespace"]
        if precondition and meta.get("resourceVersion"):
            metadata["resourceVersion"] = meta["resourceVersion"]
        resource = self.client.resource
        body = {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": metadata,
            "status": owned(status, self.fields),
        }
        written = await self.client.apply_status(body, field_manager=self.field_manager, force=self.force)
        return self.informer.wrote(written)


def digest(body: Mapping[str, Any]) -> str:
    """The digest of a built object, without its own digest annotation (key order does not matter)."""
    stripped = dict(body)  # only the annotations differ: no deep copy (json.dumps reads, never writes)
    if meta := stripped.get("metadata"):
        meta = stripped["metadata"] = {**meta}
        annotations = {**(meta.get("annotations") or {})}
        annotations.pop(ANNOTATION_APPLIED_DIGEST, None)
        if annotations:
            meta["annotations"] = annotations
        else:
            meta.pop("annotations", None)
    text = json.dumps(stripped, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def stamp(body: Obj) -> Obj:
    """Put ``body``'s digest in its digest annotation; returns ``body``."""
    value = digest(body)
    body.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_APPLIED_DIGEST] = value
    return body


def _generation(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


class DigestApplier:
    """Apply if the digest changed: server-side apply of stamped objects of one informer's type."""

    def __init__(
        self,
        informer: SharedInformer,
        field_manager: str,
        *,
        client: ResourceClient | None = None,
        force: bool = False,
    ) -> None:
        self.informer = informer
        self.client = client or informer.client
        self.field_manager = field_manager
        self.force = force
        # key -> (digest, generation) this process's last apply left: a later generation with
        # the same digest means someone else changed the spec, and the apply restores it.
        self._applied: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def current(self, body: Mapping[str, Any]) -> Obj | None:
        """The object ``body`` would replace, as read (cache or this process's own later write)."""
        return self.informer.latest(meta_namespace_key(dict(body)))

    def needed(self, body: Mapping[str, Any], current: Mapping[str, Any] | None = None) -> bool:
        """Whether applying stamped ``body`` would change anything (``current``: what is there,
        read from the informer when not given)."""
        key = meta_namespace_key(dict(body))
        cached = current if current is not None else self.current(body)
        if cached is None or (cached.get("metadata") or {}).get("deletionTimestamp"):
            return True
        wanted = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_APPLIED_DIGEST)
        there = ((cached.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_APPLIED_DIGEST)
        if wanted is None or wanted != there:
            return True
        last = self._applied.get(key)
        return last is not None and (last[0] != wanted or last[1] != _generation(cached))

    async def apply(self, body: Obj) -> Obj:
        """Apply stamped ``body`` (whether or not :meth:`needed`); the object as written."""
        applied = await self.client.apply(body, field_manager=self.field_manager, force=self.force)
        key = meta_namespace_key(applied)
        value = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_APPLIED_DIGEST)
        if value:
            self._applied[key] = (str(value), _generation(applied))
            self._applied.move_to_end(key)
            while len(self._applied) > MEMORY_ENTRIES:
                self._applied.popitem(last=False)
        return self.informer.wrote(applied)

    async def ensure(self, body: Obj) -> tuple[Obj, bool]:
        """Apply ``body`` if :meth:`needed`: the object as it now is, and whether it was applied."""
        current = self.current(body)
        if current is not None and not self.needed(body, current):
            return current, False
        return await self.apply(body), True

    def forget(self, key: str) -> None:
        """The object is gone (or will be): its memory goes too."""
        self._applied.pop(key, None)

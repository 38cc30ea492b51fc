"""The Stack controller's writes to the Updates it created: cancelling the one in flight, releasing a
recorded one from the Stack's finalizer, and pruning the history. Each tolerates an Update already
gone (or replaced: 409 on a uid precondition), since the Update controller and users delete them too.
"""

from __future__ import annotations

from typing import Final

import structlog

from pko.controllers.resources import FIELD_MANAGER_STACK_FINALIZER, STACK_FINALIZER
from pko.controllers.stack.watches import INDEX_UPDATES_BY_STACK, metadata_of, namespace_of, update_complete
from pko.machinery.kubeclient import ApiException
from pko.machinery.objects import has_finalizer, remove_finalizer
from pko.machinery.resource import Obj, ResourceClient, api_error_status
from pko.machinery.store import Indexer, object_key

__all__ = ["HISTORY_LIMIT", "cancel_update", "prune_history", "release_update"]

HISTORY_LIMIT: Final = 5
"""Completed Updates kept per Stack (their outputs Secrets go with them): no pile-up (Go issue 1163)."""

_GONE: Final = (404, 409)
_log = structlog.get_logger("pko.controllers.stack.updatewrites")


async def cancel_update(client: ResourceClient, namespace: str | None, name: str, uid: str | None) -> None:
    """Delete the running Update: the Update reconciler cancels its operation (gone: nothing runs)."""
    try:
        await client.delete(name, namespace, uid=uid)
    except ApiException as exc:
        if api_error_status(exc) not in _GONE:
            raise


async def prune_history(
    client: ResourceClient, updates: Indexer, obj: Obj, keep: frozenset[str], limit: int
) -> None:
    """Delete a Stack's completed Updates beyond ``limit`` (never ``keep``: the current and the last)."""
    stack_key = object_key(namespace_of(obj), str(metadata_of(obj).get("name")))
    done = [
        u
        for u in updates.by_index(INDEX_UPDATES_BY_STACK, stack_key)
        if update_complete(u)
        and not metadata_of(u).get("deletionTimestamp")
        and metadata_of(u).get("name") not in keep
    ]
    done.sort(
        key=lambda u: (str(metadata_of(u).get("creationTimestamp") or ""), str(metadata_of(u).get("name")))
    )
    excess = len(done) + len(keep) - limit
    for update in done[: max(excess, 0)]:
        meta = metadata_of(update)
        await cancel_update(client, namespace_of(update), str(meta["name"]), meta.get("uid"))


async def release_update(client: ResourceClient, update: Obj | None) -> None:
    """Drop the Stack's finalizer from a recorded Update (best effort: the Update controller also
    drops it from a recorded Update that is being deleted)."""
    if update is None or not has_finalizer(update, STACK_FINALIZER):
        return
    try:
        await remove_finalizer(client, update, STACK_FINALIZER, field_manager=FIELD_MANAGER_STACK_FINALIZER)
    except ApiException as exc:
        _log.info(
            "could not release update", update=metadata_of(update).get("name"), status=api_error_status(exc)
        )

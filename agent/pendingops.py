"""Which pending operations an operation that succeeded leaves stale, and may be cleared from the state.

A pending operation is the engine's record of a step it started and never saw finish (the CLI was
killed -9, its node lost). What the engine does with them (pulumi v3.274, ``pkg/backend/snapshot.go``
and ``journal.go``; the same seen on the real engine, test/agent/test_pending_operations.py):

* an up, refresh or destroy warns about them, and the state it writes keeps every pending ``creating``
  operation of the state before it, forever ("these must require user intervention"), and drops every
  other kind (an ``updating`` or ``deleting`` op is gone after the next operation);
* ``pulumi refresh --clear-pending-creates`` drops every pending create, but then refreshes every
  resource (reads each back and writes its drift into the state): more than clearing a record;
* ``pulumi stack import`` drops every pending operation (a warning per op) and changes nothing else,
  under the backend's stack lock; the CLI's own state edits (``TotalStateEdit``) are the same
  export-then-import.

So after an up that created a resource again, its pending create says forever that the resource's
creation was interrupted. This module decides when such a record is provably stale; the runner then
clears it with export and import, and reports the URNs (whatever the interrupted attempt created may
still exist outside Pulumi's state). A pending create is stale when:

* its URN is a live resource of the state the operation wrote: the resource was created (again);
* or the operation was an up or a destroy of the whole stack (no ``target``) and the URN is not in
  the state: the program no longer declares it, or everything was destroyed; nothing refers to it.

Never stale: any other kind of pending operation (the engine drops them itself, so none should be
left after a success), a create after a refresh (the program did not decide) or after a targeted
operation whose URN is not in the state (the next full up decides). ``stack import`` cannot keep
some pending operations and drop others, so when any is not stale none is cleared.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pko.api.generated.pko.agent import v1 as pb

CREATING = "creating"
_WRITES_STATE = (pb.OperationType.UP, pb.OperationType.DESTROY, pb.OperationType.REFRESH)


@dataclass(frozen=True)
class Settlement:
    """What to do with the pending operations left after an operation that succeeded."""

    clear: tuple[pb.PendingOperation, ...] = ()
    keep: tuple[pb.PendingOperation, ...] = ()


def live_urns(deployment: Mapping[str, Any] | None) -> set[str]:
    """The URNs of an exported deployment's resources, leaving out old ones pending deletion
    (``delete: true``, a replaced resource whose delete has not run): those were not created again."""
    if not deployment:
        return set()
    return {
        str(r.get("urn"))
        for r in deployment.get("resources") or []
        if isinstance(r, Mapping) and r.get("urn") and not r.get("delete")
    }


def is_stale(
    op: pb.PendingOperation, kind: pb.OperationType, resources: Collection[str], *, targeted: bool
) -> bool:
    """Whether ``op``, left in the state an operation of ``kind`` wrote (``resources``: its live URNs)
    after it succeeded, records nothing a human still has to decide (see the module docstring)."""
    if op.type != CREATING or kind not in _WRITES_STATE:
        return False
    if op.urn in resources:
        return True
    return kind in (pb.OperationType.UP, pb.OperationType.DESTROY) and not targeted


def settle(
    pending: Iterable[pb.PendingOperation],
    kind: pb.OperationType,
    resources: Collection[str],
    *,
    targeted: bool,
) -> Settlement:
    """Clear every pending operation when each is stale, else clear none (``stack import`` drops them
    all or none); ``keep`` lists what stays, for the operator to report."""
    ops = tuple(pending)
    if ops and all(is_stale(op, kind, resources, targeted=targeted) for op in ops):
        return Settlement(clear=ops)
    return Settlement(keep=ops)


def without_pending(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """``deployment`` with no pending operations: what the runner imports (``stack import`` would drop
    them anyway, with a warning; dropping them here says so in what is written)."""
    return {k: v for k, v in deployment.items() if k != "pending_operations"}

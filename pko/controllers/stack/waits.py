"""What a waiting Stack waits for, what wakes it, and whether it also looks again on a timer
(pure data; issue 44).

A Stack that cannot go on (its Program missing, its Flux source without an artifact, a Secret
missing, its Workspace not Ready yet, a prerequisite not Ready) waits. Each kind of wait is a row
of :data:`WAITS`: what it awaits, the watch that wakes the Stack when that changes, and the
timer. **Where a watch covers the wait there is no timer**: the event requeues the Stack, so a
fleet of Stacks waiting on something that does not change costs no reconcile at all (and, as the
status writer skips unchanged statuses, no write). A timer is kept only where no watch would
wake the Stack:

- Secrets are read with a GET and never watched (an operator watching every Secret of the
  cluster would hold them all in memory): a Stack waiting on one looks again every
  ``secret_recheck`` seconds (:data:`SECRET_RECHECK` unless :func:`waits_with` sets another);
- a branch head the git remote did not give (a lookup refused or failed) is asked again;
- a kind whose CRD is not served, or whose cache is not synced yet (Flux's sources, the
  WorkspaceTemplate): the cache syncing brings no event for the Stacks that wait on it;
- a destroy that a terminating namespace blocks (Namespaces are not watched).

The Go operator re-checks each of these every 30 s "as a safety net in case a watch event is
missed" (``sourceUnavailableRequeueWait``); pko's informers relist after a lost watch and deliver
what changed meanwhile, so a covered wait needs no net.

Not waits, and kept as they are: the schedules a Stack runs on (``resyncFrequencySeconds`` branch
polls, :mod:`~pko.controllers.stack.branchpoll`; the retry backoff, ``status.nextRetryTime``; drift
checks, :mod:`~pko.controllers.stack.drift`; a refresh request's retry,
:mod:`~pko.controllers.stack.refresh`), the outputs object's recheck
(:mod:`~pko.controllers.stack.outputs`) and the recheck of an Update another shard runs
(:mod:`pko.controllers.sharding`).

The decisions read the table from :class:`~pko.controllers.stack.steps.Settings` (``waits``), which
the reconciler takes whole (its ``waits``): the Secret row's timer is set in one place,
:func:`waits_with` (``secret_recheck``), which builds the table the reconciler is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "SECRET_RECHECK",
    "SOURCE_UNAVAILABLE_REQUEUE",
    "WAITS",
    "Awaited",
    "Wait",
    "waits_with",
]

# What no watch covers is looked at again this often (the Go operator's sourceUnavailableRequeueWait).
SOURCE_UNAVAILABLE_REQUEUE: Final = 30.0
# Secrets are not watched: a missing one is looked for again this often (the Secret row's timer in
# :data:`WAITS`; :func:`waits_with` sets another), so creating it later un-stalls the Stack without a
# spec change.
SECRET_RECHECK: Final = 120.0
# A Stack that needs a WorkspaceTemplate while their cache is syncing looks again this soon.
TEMPLATES_SYNCING_RECHECK: Final = 2.0


class Awaited(StrEnum):
    """What a waiting Stack waits for (a row of :data:`WAITS`)."""

    SPEC = "spec"
    PROGRAM = "program"
    FLUX_SOURCE = "flux-source"
    FLUX_KIND = "flux-kind"
    PACK_SOURCE = "pack-source"
    SECRET = "secret"
    GIT_REMOTE = "git-remote"
    TEMPLATE = "template"
    TEMPLATE_KIND = "template-kind"
    TEMPLATE_KIND_SYNCING = "template-kind-syncing"
    PREREQUISITE = "prerequisite"
    WORKSPACE = "workspace"
    UPDATE = "update"
    NAMESPACE = "namespace"


@dataclass(frozen=True, slots=True)
class Wait:
    """One kind of wait: what it ``awaits``, the watch that wakes the Stack when that changes
    (``woken_by``; None: no watch does), and ``requeue``: the seconds after which the Stack looks
    again without an event (None: only an event wakes it)."""

    awaits: str
    woken_by: str | None
    requeue: float | None


WAITS: Final[Mapping[Awaited, Wait]] = MappingProxyType(
    {
        Awaited.SPEC: Wait(
            "a change of the Stack's spec (a source refused or not supported as written)",
            "the Stack: a new generation",
            None,
        ),
        Awaited.PROGRAM: Wait(
            "the Program spec.programRef names, and its artifact",
            "Programs, by the Stacks that name them: created, deleted, a new artifact",
            None,
        ),
        Awaited.FLUX_SOURCE: Wait(
            "the Flux source spec.fluxSource names, and its artifact",
            "Flux sources, by the Stacks that name them: created, deleted, a new artifact, "
            "its Ready condition while it has none",
            None,
        ),
        Awaited.FLUX_KIND: Wait(
            "the Flux source's kind served by the cluster, and its cache synced",
            None,
            SOURCE_UNAVAILABLE_REQUEUE,
        ),
        Awaited.PACK_SOURCE: Wait(
            "a policy pack's Flux source, and its artifact (the Stack's own pack, or one its "
            "WorkspaceTemplates enforce)",
            "Flux sources, by the Stacks whose packs read them and by the WorkspaceTemplates that "
            "enforce such packs (then the Stacks built with those): as for spec.fluxSource",
            None,
        ),
        Awaited.SECRET: Wait(
            "a Secret (or a key in it) the Stack's git credentials name",
            None,  # read with a GET, never watched
            SECRET_RECHECK,
        ),
        Awaited.GIT_REMOTE: Wait(
            "a branch head from the git remote, after a lookup that failed",
            None,
            SOURCE_UNAVAILABLE_REQUEUE,
        ),
        Awaited.TEMPLATE: Wait(
            "a WorkspaceTemplate the Stack is built with",
            "WorkspaceTemplates, by the Stacks that name them (every Stack for the default one)",
            None,
        ),
        Awaited.TEMPLATE_KIND: Wait(
            "the WorkspaceTemplate kind served by the cluster",
            None,
            SOURCE_UNAVAILABLE_REQUEUE,
        ),
        Awaited.TEMPLATE_KIND_SYNCING: Wait(
            "the WorkspaceTemplate cache synced",
            None,
            TEMPLATES_SYNCING_RECHECK,
        ),
        Awaited.PREREQUISITE: Wait(
            "each prerequisite Stack Ready (within its succeededWithinDuration)",
            "Stacks, by the Stacks that name them as prerequisites: becoming Ready",
            None,
        ),
        Awaited.WORKSPACE: Wait(
            "the Stack's Workspace Ready for its generation",
            "the Stack's own Workspace: becoming Ready or Stalled, deleted",
            None,
        ),
        Awaited.UPDATE: Wait(
            "the Update in flight completing",
            "the Stack's Updates: becoming Complete, deleted",
            None,
        ),
        Awaited.NAMESPACE: Wait(
            "a terminating namespace gone (a destroy it blocks), or the Stack released by hand",
            None,  # Namespaces are not watched
            SOURCE_UNAVAILABLE_REQUEUE,
        ),
    }
)


def waits_with(
    base: Mapping[Awaited, Wait] = WAITS, *, secret_recheck: float = SECRET_RECHECK
) -> Mapping[Awaited, Wait]:
    """``base`` (:data:`WAITS`), a missing Secret looked for again every ``secret_recheck`` seconds."""
    if secret_recheck == base[Awaited.SECRET].requeue:
        return base
    secret = dataclasses.replace(base[Awaited.SECRET], requeue=secret_recheck)
    return MappingProxyType({**base, Awaited.SECRET: secret})

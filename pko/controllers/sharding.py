"""Shards: several operators in one cluster, each owning the Stacks its label selector matches.

As Flux shards its controllers: every operator gets ``--watch-label-selector``, a shard
``pko.pulumi.com/shard=a`` (or ``pko.pulumi.com/shard in (a,b)``), the default one
``!pko.pulumi.com/shard`` (the unlabelled Stacks). The Stack informer lists and watches with the
whole selector. What a Stack's reconcile creates carries the Stack's shard label
(:func:`shard_labels`): its Workspace and Updates, their StatefulSet and Service; those
informers list and watch with the selector's requirements on that label alone
(:func:`shard_requirements`), so a shard caches and reconciles only its own. Left unscoped, and why:

* Pods: a label in the pod template would restart the workspace pod on every move; a shard caches the
  namespace's workspace Pods and reads only those of the Workspaces it holds (by name);
* Programs: one Program may serve Stacks of several shards; every shard caches it and its artifact
  server serves it (the tarball is built the same from the same body, and its digest is checked),
  so each shard's Workspaces fetch it from their own operator (:func:`own_program_url`), whichever
  shard wrote the Program's ``status.artifact.url`` last;
* Secrets, ConfigMaps: read by name, never cached by label; a Workspace's NetworkPolicy: cached by
  every shard of its namespace, applied by the shard that holds the Workspace.

Each shard holds its own Lease: :func:`lease_name` suffixes ``--leader-election-id`` with a digest of
the selector (Flux's ``GenerateID``), so two shards never elect one leader between them.

A move (the Stack's shard label edited): the old shard's Stack watch reports it deleted, the new
shard's reports it added. Its Workspace and Updates keep the old label until the new shard writes
them: the Workspace when it is next applied (before the next Update, never while one runs), each new
Update with the new label. An Update in flight at the move stays with the old shard's Update
controller, which runs it to its end; the new shard reads it directly by name
(``status.currentUpdate``: its cache lacks it), rechecks it every :data:`FOREIGN_UPDATE_RECHECK`
seconds (:func:`recheck_foreign_update`) and records its result once it ended, and
``currentUpdate`` keeps it from starting another meanwhile: nothing is lost or run twice. (Unless the
move lands between the old shard's creating an Update and recording it: docs/sharding.md.)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

from pko.api.stackterms import SHARD_LABEL
from pko.machinery.resource import SERVICES, STATEFULSETS

__all__ = [
    "FOREIGN_UPDATE_RECHECK",
    "SHARD_LABEL",
    "SHARD_SCOPED",
    "child_selectors",
    "lease_name",
    "own_program_url",
    "recheck_foreign_update",
    "shard_labels",
    "shard_requirements",
    "split_selector",
]

FOREIGN_UPDATE_RECHECK: Final = 10.0
"""Seconds between reads of an Update in flight that the shard's cache does not hold (another shard
runs it): no watch tells when it ends."""

# The kinds (``Resource.name``) whose informers a shard scopes by its shard requirements: what a
# Stack's reconcile creates and its Workspace's reconcile creates, all labelled with its shard.
SHARD_SCOPED: Final = (
    "workspaces.auto.pulumi.com",
    "updates.auto.pulumi.com",
    STATEFULSETS.name,
    SERVICES.name,
)

_KEY = re.compile(r"\s*!?\s*([A-Za-z0-9][-A-Za-z0-9_./]*)")


def split_selector(selector: str) -> list[str]:
    """The requirements of a label selector (commas inside ``in (a,b)`` do not split)."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(selector):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(selector[start:i].strip())
            start = i + 1
    parts.append(selector[start:].strip())
    return [p for p in parts if p]


def _key(requirement: str) -> str | None:
    match = _KEY.match(requirement)
    return match.group(1) if match else None


def shard_requirements(selector: str | None) -> str | None:
    """The requirements of ``selector`` on :data:`SHARD_LABEL`, joined; None when it has none (the
    operator is not a shard: the kinds of :data:`SHARD_SCOPED` are watched by namespace only)."""
    kept = [r for r in split_selector(selector or "") if _key(r) == SHARD_LABEL]
    return ",".join(kept) or None


def child_selectors(selector: str | None) -> dict[str, str]:
    """The label selectors of the :data:`SHARD_SCOPED` informers, by ``Resource.name``."""
    shard = shard_requirements(selector)
    return dict.fromkeys(SHARD_SCOPED, shard) if shard else {}


def shard_labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    """The shard label of ``obj`` (a Stack, or a Workspace it made), to put on what it makes;
    empty when unlabelled (the default shard's)."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(SHARD_LABEL)
    return {SHARD_LABEL: str(value)} if value is not None else {}


def lease_name(base: str, selector: str | None) -> str:
    """The Lease of the operator that watches ``selector``: ``base`` alone without a selector,
    else suffixed with a digest of it, so shards with different selectors hold different Leases
    and the replicas of one shard share one."""
    text = ",".join(split_selector(selector or ""))
    if not text:
        return base
    return f"{base}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def recheck_foreign_update(update: Mapping[str, Any] | None, cached: bool, complete: bool) -> float | None:
    """When to look again at the Stack's Update in flight: never when the cache holds it (its watch
    wakes the Stack) or it is gone or ended; else (another shard's, after a move) in
    :data:`FOREIGN_UPDATE_RECHECK` seconds."""
    if update is None or cached or complete:
        return None
    return FOREIGN_UPDATE_RECHECK


def own_program_url(url: str, advertised: str) -> str:
    """``url`` (a Program's ``status.artifact.url``) at this operator's own artifact server, when its
    address (``--program-fs-adv-addr``) is set: the shard that wrote the status may be another, or
    down. Unchanged otherwise, or for a URL that is not a Program artifact's."""
    _, found, path = url.partition("/programs/")
    if not advertised or not found:
        return url
    base = advertised.rstrip("/")
    return f"{base if '://' in base else 'http://' + base}/programs/{path}"

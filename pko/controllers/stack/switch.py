"""A Workspace that names an artifact by a digest nobody serves: rewritten even under a running Update
(pure, no I/O).

A Stack never changes its Workspace while an Update runs (the operation keeps the source it
started with). One case is an exception: after a switch from the Go operator (or a pko upgrade
that packs a Program differently), the Workspace names its Program artifact by the digest the Go
operator recorded, while pko's artifact server packs the same Program as other bytes (YAML key
order and quoting, tar modes, gzip). Every workspace pod pko rolls for it then fails its fetch
(``digest mismatch``) until the Update in flight ends, which cannot happen before the agent's
unreachable timeout. Such a Workspace cannot serve the Update in flight anyway, so it is
rewritten at once, with a digest that is served now (the source says Ready for its generation),
never with one that would fail the same way.

Stale means: the Workspace's ``spec.flux.digest`` is not the source's served digest, and either
pko did not write the Workspace (no ``auto.pulumi.com/applied-digest`` stamp: the Go operator
did) or it names the same artifact URL (the same address now serves other bytes). A Workspace pko
wrote for another URL (a newer Program generation, a Flux revision) is the normal case: the Update
in flight keeps it.
"""

from __future__ import annotations

from pko.controllers.stack.watches import artifact_of
from pko.controllers.stack.workspaceobject import ArtifactRevision, ResolvedSource
from pko.machinery.conditions import get_condition
from pko.machinery.resource import Obj
from pko.machinery.writes import ANNOTATION_APPLIED_DIGEST

__all__ = ["artifact_served", "may_name_stale_artifact", "stale_artifact"]


def artifact_served(source: Obj | None) -> bool:
    """Whether a Program's or Flux source's ``status.artifact`` is what its server serves now: its
    ``Ready`` condition is True for the object's current generation. pko's Program controller and
    Flux's source-controller write it with the artifact; the Go operator's Program status has no
    conditions, so a digest it recorded does not count as served."""
    status = (source or {}).get("status") or {}
    artifact = artifact_of(source)
    if artifact is None or not artifact.get("digest"):
        return False
    generation = int(((source or {}).get("metadata") or {}).get("generation") or 0)
    ready = get_condition(status.get("conditions"), "Ready")
    if ready is None or ready.get("status") != "True":
        return False
    observed = ready.get("observedGeneration", status.get("observedGeneration"))
    return observed is not None and int(observed) == generation


def may_name_stale_artifact(workspace: Obj | None) -> bool:
    """Whether the Workspace could be stale, so the source is worth resolving under a running
    Update (a Program or Flux source: cache reads only; a git source is never looked up then)."""
    if workspace is None or (workspace.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return bool(((workspace.get("spec") or {}).get("flux") or {}).get("digest"))


def stale_artifact(workspace: Obj | None, source: ResolvedSource | None, *, served: bool) -> bool:
    """Whether ``workspace`` names an artifact digest that is not served while ``source`` (served:
    see :func:`artifact_served`) is: see the module docstring."""
    if not served or not isinstance(source, ArtifactRevision) or not may_name_stale_artifact(workspace):
        return False
    assert workspace is not None
    flux = (workspace.get("spec") or {}).get("flux") or {}
    if flux.get("digest") == source.digest:
        return False
    annotations = (workspace.get("metadata") or {}).get("annotations") or {}
    return ANNOTATION_APPLIED_DIGEST not in annotations or flux.get("url") == source.url

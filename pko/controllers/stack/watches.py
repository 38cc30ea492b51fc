"""What wakes the Stack reconciler, and the gauges kept from Stack events (pure helpers).

The indexes (Stacks by Program, by prerequisite, by Flux source; Updates by Stack) and the
predicates mirror the Go operator's SetupWithManager: a Stack reconciles on a new generation
(not the one its own finalizer causes), a changed reconciliation request or a deletion; on its
Workspace becoming Ready or Stalled; on its Update completing (or vanishing); on its Program or
Flux source getting a new artifact; and on a prerequisite becoming Ready. A policy pack's Flux
source wakes the Stacks whose packs read it, their own or those their WorkspaceTemplates enforce
(:func:`flux_source_stacks`). pko also passes a Flux source's Ready condition changing while it has
no artifact (the Stack's message quotes it): a Stack waiting on its source looks again on these
events only, with no timer (:mod:`~pko.controllers.stack.waits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, NamedTuple

from prometheus_client import Gauge

from pko.controllers.resources import (
    APPROVED_PLAN_ANNOTATION,
    CANCEL_REQUEST_ANNOTATION,
    RECONCILIATION_REQUEST_ANNOTATION,
    REFRESH_REQUEST_ANNOTATION,
    STACK_FINALIZER,
    STACK_NAME_LABEL,
)
from pko.controllers.stack.status import reconcile_request
from pko.machinery.conditions import get_condition, is_true
from pko.machinery.manager import Manager
from pko.machinery.objects import has_finalizer
from pko.machinery.predicates import and_, annotation_changed, deletion_started, not_, or_
from pko.machinery.resource import Obj, Resource
from pko.machinery.store import DeletedFinalStateUnknown, Indexer, object_key, split_key

__all__ = [
    "FLUX_SOURCES",
    "INDEX_FLUX",
    "INDEX_PREREQUISITE",
    "INDEX_PROGRAM",
    "INDEX_TEMPLATE_FLUX",
    "INDEX_UPDATES_BY_STACK",
    "INDEX_WORKSPACE_TEMPLATE",
    "STACK_PREDICATE",
    "StackMetrics",
    "artifact_of",
    "artifact_predicate",
    "flux_key",
    "flux_source_predicate",
    "flux_source_stacks",
    "generation_changed",
    "index_flux",
    "index_prerequisites",
    "index_program",
    "index_template_flux",
    "index_updates_by_stack",
    "metadata_of",
    "namespace_of",
    "stack_became_ready",
    "stack_ready",
    "update_complete",
    "update_predicate",
    "workspace_predicate",
    "workspace_ready",
    "workspace_stalled",
]

FLUX_GROUP: Final = "source.toolkit.fluxcd.io"
FLUX_SOURCES: Final[tuple[Resource, ...]] = (
    Resource(FLUX_GROUP, "v1", "gitrepositories", "GitRepository"),
    Resource(FLUX_GROUP, "v1", "ocirepositories", "OCIRepository"),
    Resource(FLUX_GROUP, "v1beta2", "ocirepositories", "OCIRepository"),
    Resource(FLUX_GROUP, "v1", "buckets", "Bucket"),
    Resource(FLUX_GROUP, "v1beta2", "buckets", "Bucket"),
)

INDEX_PROGRAM: Final = "stack-program"
INDEX_PREREQUISITE: Final = "stack-prerequisite"
INDEX_FLUX: Final = "stack-flux-source"
INDEX_UPDATES_BY_STACK: Final = "update-stack"
INDEX_WORKSPACE_TEMPLATE: Final = "stack-workspace-template"
INDEX_TEMPLATE_FLUX: Final = "workspace-template-flux-source"


# --- indexes ---------------------------------------------------------------------------------


def metadata_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = obj.get("metadata") or {}
    return value


def namespace_of(obj: Mapping[str, Any]) -> str | None:
    value = metadata_of(obj).get("namespace")
    return str(value) if value else None


def index_program(obj: Obj) -> list[str]:
    name = ((obj.get("spec") or {}).get("programRef") or {}).get("name")
    return [object_key(namespace_of(obj), str(name))] if name else []


def index_prerequisites(obj: Obj) -> list[str]:
    prereqs = (obj.get("spec") or {}).get("prerequisites") or []
    return [
        object_key(namespace_of(obj), str(p["name"]))
        for p in prereqs
        if isinstance(p, dict) and p.get("name")
    ]


def flux_key(namespace: str | None, api_version: str, kind: str, name: str) -> str:
    group = api_version.partition("/")[0]
    return f"{namespace or ''}/{group}/{kind}/{name}"


def _flux_refs(sources: list[Any], namespace: str | None) -> list[str]:
    """The :func:`flux_key` of each ``fluxSource`` of ``sources`` that names one, once each."""
    keys: list[str] = []
    for source in sources:
        ref = (source or {}).get("sourceRef") or {}
        if ref.get("name") and ref.get("kind"):
            key = flux_key(namespace, str(ref.get("apiVersion", "")), str(ref["kind"]), str(ref["name"]))
            keys += [] if key in keys else [key]
    return keys


def _pack_sources(packs: Any) -> list[Any]:
    return [p.get("fluxSource") for p in packs or [] if isinstance(p, dict)]


def index_flux(obj: Obj) -> list[str]:
    """The Flux sources a Stack reads: its program's ``spec.fluxSource`` and its policy packs' (its own
    and its ``updateTemplate``'s); the packs a WorkspaceTemplate enforces: :func:`index_template_flux`."""
    spec = obj.get("spec") or {}
    templated = ((spec.get("updateTemplate") or {}).get("spec") or {}).get("policyPacks")
    sources = [spec.get("fluxSource"), *_pack_sources(spec.get("policyPacks")), *_pack_sources(templated)]
    return _flux_refs(sources, namespace_of(obj))


def index_template_flux(obj: Obj) -> list[str]:
    """WorkspaceTemplates by the Flux sources of the packs they enforce (``spec.policyPacks``): a
    :func:`flux_key` with no namespace, as a pack's source is read in each Stack's own namespace."""
    return _flux_refs(_pack_sources((obj.get("spec") or {}).get("policyPacks")), None)


def flux_source_stacks(
    key: str, stacks: Indexer, templates: Indexer | None, default_template: str | None
) -> list[str]:
    """The Stacks a Flux source's event (its :func:`flux_key`) wakes: those that name it
    (:data:`INDEX_FLUX`) and, in its namespace, those built with a WorkspaceTemplate that enforces a
    pack read from it (:data:`INDEX_TEMPLATE_FLUX`): every Stack of the namespace for the operator's
    default template, the Stacks that reference any other (:data:`INDEX_WORKSPACE_TEMPLATE`)."""
    keys = stacks.index_keys(INDEX_FLUX, key)
    namespace, _, rest = key.partition("/")
    enforcing = templates.index_keys(INDEX_TEMPLATE_FLUX, "/" + rest) if templates is not None else []
    if not enforcing:
        return keys
    found = dict.fromkeys(keys)
    for template in enforcing:
        named = (
            stacks.list_keys()
            if template == default_template
            else stacks.index_keys(INDEX_WORKSPACE_TEMPLATE, template)
        )
        found.update(dict.fromkeys(k for k in named if (split_key(k)[0] or "") == namespace))
    return list(found)


def index_updates_by_stack(obj: Obj) -> list[str]:
    name = (metadata_of(obj).get("labels") or {}).get(STACK_NAME_LABEL)
    return [object_key(namespace_of(obj), str(name))] if name else []


def _finalizer_added(old: Obj | None, new: Obj | None) -> bool:
    return (
        old is not None
        and new is not None
        and not has_finalizer(old, STACK_FINALIZER)
        and has_finalizer(new, STACK_FINALIZER)
    )


def generation_changed(old: Obj | None, new: Obj | None) -> bool:
    """A new generation (a spec change), a creation or a deletion."""
    if old is None or new is None:
        return True
    return metadata_of(old).get("generation") != metadata_of(new).get("generation")


STACK_PREDICATE: Final = or_(
    and_(generation_changed, not_(_finalizer_added)),
    annotation_changed(RECONCILIATION_REQUEST_ANNOTATION),
    annotation_changed(APPROVED_PLAN_ANNOTATION),
    annotation_changed(REFRESH_REQUEST_ANNOTATION),
    annotation_changed(CANCEL_REQUEST_ANNOTATION),
    deletion_started,
)


def _observed(obj: Obj) -> bool:
    return metadata_of(obj).get("generation") == (obj.get("status") or {}).get("observedGeneration")


def workspace_ready(ws: Obj | None) -> bool:
    """Ready for this generation and not being deleted (Go: isWorkspaceReady)."""
    if ws is None or metadata_of(ws).get("deletionTimestamp") or not _observed(ws):
        return False
    return is_true((ws.get("status") or {}).get("conditions"), "Ready")


def workspace_stalled(ws: Obj | None) -> bool:
    return ws is not None and is_true((ws.get("status") or {}).get("conditions"), "Stalled")


def workspace_predicate(old: Obj | None, new: Obj | None) -> bool:
    """A Workspace became Ready or Stalled; deletes pass."""
    if new is None:
        return True
    if old is None:
        return workspace_ready(new)
    return (not workspace_ready(old) and workspace_ready(new)) or (
        not workspace_stalled(old) and workspace_stalled(new)
    )


def update_complete(update: Obj | None) -> bool:
    return (
        update is not None
        and _observed(update)
        and is_true((update.get("status") or {}).get("conditions"), "Complete")
    )


def update_predicate(old: Obj | None, new: Obj | None) -> bool:
    """An Update became Complete; deletes pass (a lost Update must not wedge its Stack)."""
    if new is None:
        return True
    if old is None:
        return update_complete(new)
    return not update_complete(old) and update_complete(new)


def artifact_of(obj: Obj | None) -> Obj | None:
    artifact = ((obj or {}).get("status") or {}).get("artifact")
    return artifact if isinstance(artifact, dict) and artifact.get("url") else None


def artifact_predicate(old: Obj | None, new: Obj | None) -> bool:
    """A source got its first artifact or a new revision (Go: SourceRevisionChangePredicate)."""
    if old is None or new is None:
        return True
    before, after = artifact_of(old), artifact_of(new)
    if after is None:
        return False
    return (
        before is None
        or before.get("revision") != after.get("revision")
        or before.get("digest") != after.get("digest")
    )


def _readiness(obj: Obj) -> tuple[object, object, object] | None:
    ready = get_condition((obj.get("status") or {}).get("conditions"), "Ready")
    return (ready.get("status"), ready.get("reason"), ready.get("message")) if ready else None


def flux_source_predicate(old: Obj | None, new: Obj | None) -> bool:
    """:func:`artifact_predicate`, or a Flux source with no artifact whose Ready condition changed
    (why it has none: the waiting Stack's message says so, and no timer looks again)."""
    if artifact_predicate(old, new) or old is None or new is None:
        return True
    return artifact_of(new) is None and _readiness(old) != _readiness(new)


def stack_ready(obj: Obj | None) -> bool:
    """Ready for its generation and reconcile request (Go: isStackReady)."""
    if obj is None or not _observed(obj):
        return False
    status = obj.get("status") or {}
    if (status.get("observedReconcileRequest") or "") != reconcile_request(obj):
        return False
    return is_true(status.get("conditions"), "Ready")


def stack_became_ready(old: Obj | None, new: Obj | None) -> bool:
    if new is None:
        return True
    if old is None:
        return stack_ready(new)
    return not stack_ready(old) and stack_ready(new)


# --- metrics ---------------------------------------------------------------------------------


class StackMetrics:
    """``stacks_active``, ``stacks_failing``, ``stacks_reconciling`` (as upstream names them), the
    next retry time of each failing stack, and (drift detection) each stack's drifted resources
    and last drift check, kept from the Stack informer's events."""

    def __init__(self, manager: Manager) -> None:
        registry = manager.registry
        self.active = Gauge(
            "stacks_active",
            "Number of stacks currently tracked by the Pulumi Kubernetes Operator",
            registry=registry,
        )
        self.failing = Gauge(
            "stacks_failing",
            "Number of stacks currently registered where the last reconcile failed",
            ["namespace", "name"],
            registry=registry,
        )
        self.reconciling = Gauge(
            "stacks_reconciling",
            "Number of stacks currently registered where the last reconcile is in progress",
            ["namespace", "name"],
            registry=registry,
        )
        self.next_retry = Gauge(
            "stacks_next_retry_timestamp_seconds",
            "When a failing stack's update is retried next (unix seconds); absent when none is scheduled",
            ["namespace", "name"],
            registry=registry,
        )
        self.drift_resources = Gauge(
            "pko_stack_drift_resources",
            "Resources the last drift check found differing from the stack's state (absent: no check yet)",
            ["namespace", "name"],
            registry=registry,
        )
        self.last_drift_check = Gauge(
            "pko_stack_last_drift_check_timestamp_seconds",
            "When the stack's last drift check completed (unix seconds); absent before the first",
            ["namespace", "name"],
            registry=registry,
        )
        # What the gauges show of each Stack tracked (its key: namespace/name): an event that changes
        # none of it sets nothing (issue 44: a Stack's first pass brings four, its first event, its
        # finalizer's and its status's, and the status write's answer, which mostly show the same).
        self._shown: dict[str, _Shown] = {}

    def observe(self, obj: Obj) -> None:
        namespace, name = namespace_of(obj), str(metadata_of(obj).get("name"))
        key = object_key(namespace, name)
        status = obj.get("status") or {}
        state = (status.get("lastUpdate") or {}).get("state")
        drift = status.get("drift") or {}
        checked = drift.get("lastCheckTime")
        shown = _Shown(
            state,
            is_true(status.get("conditions"), "Reconciling"),
            status.get("nextRetryTime") if state == "failed" else None,
            # ``count``: all of them (``resources`` lists the first: pko.api.limits).
            (drift.get("count") or len(drift.get("resources") or []), str(checked)) if checked else None,
        )
        last = self._shown.get(key)
        if last == shown:
            return
        labels = (namespace or "", name)
        if last is None or last.state != state:
            if state == "failed":
                self.failing.labels(*labels).set(1)
            elif state == "succeeded":
                self.failing.labels(*labels).set(0)
        if last is None or last.reconciling != shown.reconciling:
            self.reconciling.labels(*labels).set(1 if shown.reconciling else 0)
        if last is None or last.retry != shown.retry:
            if shown.retry:
                when = datetime.fromisoformat(str(shown.retry).replace("Z", "+00:00"))
                self.next_retry.labels(*labels).set(when.timestamp())
            elif last is not None and last.retry:
                self._remove(self.next_retry, labels)
        if last is None or last.drift != shown.drift:
            if shown.drift is not None:
                count, at = shown.drift
                self.drift_resources.labels(*labels).set(count)
                when = datetime.fromisoformat(at.replace("Z", "+00:00"))
                self.last_drift_check.labels(*labels).set(when.timestamp())
            elif last is not None and last.drift is not None:
                self._remove(self.drift_resources, labels)
                self._remove(self.last_drift_check, labels)
        self._shown[key] = shown
        if last is None:
            self.active.set(len(self._shown))

    def forget(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        if isinstance(obj, DeletedFinalStateUnknown):
            namespace, name = split_key(obj.key)
        else:
            namespace, name = namespace_of(obj), str(metadata_of(obj).get("name"))
        self._shown.pop(object_key(namespace, name), None)
        self.active.set(len(self._shown))
        labels = (namespace or "", name)
        self.failing.labels(*labels).set(0)
        self.reconciling.labels(*labels).set(0)
        self._remove(self.next_retry, labels)
        self._remove(self.drift_resources, labels)
        self._remove(self.last_drift_check, labels)

    @staticmethod
    def _remove(gauge: Gauge, labels: tuple[str, str]) -> None:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass


class _Shown(NamedTuple):
    """What :class:`StackMetrics` shows of one Stack: its last update's state, whether it is
    Reconciling, its next retry time (when failed), its drift (resources, last check)."""

    state: object
    reconciling: bool
    retry: object
    drift: tuple[int, str] | None

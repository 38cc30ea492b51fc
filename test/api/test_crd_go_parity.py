"""Field parity with the Go operator's CRDs: every field of theirs is in our schema, and ours beyond
theirs are the listed extensions (test/data/api/go_operator_fields.txt, transcribed from the Go CRDs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pko.api import crdgen

GO_FIELDS = Path(__file__).resolve().parents[1] / "data" / "api" / "go_operator_fields.txt"


def storage_schema(kind: str) -> dict[str, Any]:
    """The kind's schema as the models generate it (its storage version: the first)."""
    (doc,) = [d for d in crdgen.crd_documents() if d["spec"]["names"]["kind"] == kind]
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# Where the Go field list stops descending (embedded Kubernetes types), except where the same
# name is one of our models (the Stack's gitAuth refs, template metadata).
_STOP = {
    "podTemplate",
    "env",
    "envFrom",
    "resources",
    "sshPrivateKey",
    "username",
    "password",
    "token",
    "appID",
    "installationID",
    "privateKey",
    "metadata",
}


def _descends(path: str) -> bool:
    leaf = path.rsplit(".", 1)[-1].rstrip("[]{}")
    if leaf not in _STOP:
        return True
    return path.startswith("spec.gitAuth") or path.endswith(
        ("Template.metadata", "Template.metadata.ownerReferences[]")
    )


def field_paths(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """The same walk that produced test/data/api/go_operator_fields.txt from the Go CRDs."""
    if path:
        yield path
    if path and not _descends(path):
        return
    for name, sub in schema.get("properties", {}).items():
        yield from field_paths(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from field_paths(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from field_paths(schema["additionalProperties"], f"{path}{{}}")


def test_every_go_operator_field_is_in_our_schema() -> None:
    """Field parity with the Go operator's CRDs (transcribed into test/data), plus our extensions only."""
    go = {
        (kind, path)
        for line in GO_FIELDS.read_text().splitlines()
        if line and not line.startswith("#")
        for kind, path in [line.split(" ", 1)]
    }
    ours = {
        (kind, path)
        for kind in ("Stack", "Program", "Workspace", "Update")
        for path in field_paths(storage_schema(kind))
    }
    assert sorted(go - ours) == []
    # spec.config: Go leaves the whole map schemaless; ours is a map of arbitrary JSON values.
    # spec.initOnCreate: removed before Go's v1.0 but still in users' manifests; accepted, ignored.
    # Program status.conditions: ours (issue 9: an invalid Program gets a condition); Go has none.
    # Update spec.savePlan/plan/previewOnly and status.changes: ours (issue 29: update plans, drift);
    # Update status.pendingOperations/clearedPendingOperations: ours (a killed engine's pending
    # operations, reported and cleared once stale); all also in the Stack's updateTemplate, which
    # embeds the Update.
    # Stack spec.approval/driftDetection, status.plan/drift/observed*Request and
    # currentUpdate.kind/cancelRequest: ours (issue 29: approval gate, drift, request annotations);
    # status.lastRefresh: ours (issue 28: a refresh request outlives a transient failure).
    # Stack spec.workspaceTemplateRef: ours (issue 42: shared WorkspaceTemplates).
    # Stack and Update spec.policyPacks, Update status.policyViolations/policyViolationCount: ours
    # (issue 43: policy packs on every preview and up); Stack status.currentUpdate/lastUpdate
    # .policyPacksDigest: ours (issue 43: the packs a WorkspaceTemplate enforced on the update).
    # Stack/Update spec.policyPacks[].git/fluxSource, Workspace spec.policyPackSources: ours (issue 43:
    # a pack from a git repository or a Flux source of its own, fetched by the workspace pod).
    # Stack spec.outputs: ours (issue 42: outputs apps can mount; Go operator #649).
    # Update status.changeCount/changesTruncated/changeSummary and Stack status.drift.count/truncated:
    # ours (issue 44: bounded status, the totals beside the first entries listed).
    assert sorted(ours - go) == [
        ("Program", "status.conditions"),
        ("Program", "status.conditions[]"),
        ("Program", "status.conditions[].lastTransitionTime"),
        ("Program", "status.conditions[].message"),
        ("Program", "status.conditions[].observedGeneration"),
        ("Program", "status.conditions[].reason"),
        ("Program", "status.conditions[].status"),
        ("Program", "status.conditions[].type"),
        ("Stack", "spec.approval"),
        ("Stack", "spec.approval.mode"),
        ("Stack", "spec.config{}"),
        ("Stack", "spec.driftDetection"),
        ("Stack", "spec.driftDetection.intervalSeconds"),
        ("Stack", "spec.driftDetection.remediate"),
        ("Stack", "spec.envRefs{}.configMap"),
        ("Stack", "spec.envRefs{}.configMap.key"),
        ("Stack", "spec.envRefs{}.configMap.name"),
        ("Stack", "spec.initOnCreate"),
        ("Stack", "spec.maxUpdateFailures"),
        ("Stack", "spec.outputs"),
        ("Stack", "spec.outputs.kind"),
        ("Stack", "spec.outputs.name"),
        ("Stack", "spec.policyPacks"),
        ("Stack", "spec.policyPacks[]"),
        ("Stack", "spec.policyPacks[].config"),
        ("Stack", "spec.policyPacks[].config{}"),
        ("Stack", "spec.policyPacks[].fluxSource"),
        ("Stack", "spec.policyPacks[].fluxSource.dir"),
        ("Stack", "spec.policyPacks[].fluxSource.sourceRef"),
        ("Stack", "spec.policyPacks[].fluxSource.sourceRef.apiVersion"),
        ("Stack", "spec.policyPacks[].fluxSource.sourceRef.kind"),
        ("Stack", "spec.policyPacks[].fluxSource.sourceRef.name"),
        ("Stack", "spec.policyPacks[].git"),
        ("Stack", "spec.policyPacks[].git.auth"),
        ("Stack", "spec.policyPacks[].git.auth.githubApp"),
        ("Stack", "spec.policyPacks[].git.auth.githubApp.appID"),
        ("Stack", "spec.policyPacks[].git.auth.githubApp.installationID"),
        ("Stack", "spec.policyPacks[].git.auth.githubApp.privateKey"),
        ("Stack", "spec.policyPacks[].git.auth.password"),
        ("Stack", "spec.policyPacks[].git.auth.sshPrivateKey"),
        ("Stack", "spec.policyPacks[].git.auth.token"),
        ("Stack", "spec.policyPacks[].git.auth.username"),
        ("Stack", "spec.policyPacks[].git.branch"),
        ("Stack", "spec.policyPacks[].git.commit"),
        ("Stack", "spec.policyPacks[].git.url"),
        ("Stack", "spec.policyPacks[].name"),
        ("Stack", "spec.policyPacks[].path"),
        ("Stack", "spec.retryPolicy"),
        ("Stack", "spec.retryPolicy.deterministic"),
        ("Stack", "spec.retryPolicy.deterministic.baseSeconds"),
        ("Stack", "spec.retryPolicy.deterministic.factor"),
        ("Stack", "spec.retryPolicy.transient"),
        ("Stack", "spec.retryPolicy.transient.baseSeconds"),
        ("Stack", "spec.retryPolicy.transient.factor"),
        ("Stack", "spec.retryPolicy.transient.jitter"),
        ("Stack", "spec.retryPolicy.transient.maxSeconds"),
        ("Stack", "spec.suspend"),
        ("Stack", "spec.updateTemplate.spec.plan"),
        ("Stack", "spec.updateTemplate.spec.policyPacks"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[]"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].config"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].config{}"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].fluxSource"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].fluxSource.dir"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].fluxSource.sourceRef"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].fluxSource.sourceRef.apiVersion"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].fluxSource.sourceRef.kind"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].fluxSource.sourceRef.name"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.githubApp"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.githubApp.appID"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.githubApp.installationID"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.githubApp.privateKey"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.password"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.sshPrivateKey"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.token"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.auth.username"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.branch"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.commit"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].git.url"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].name"),
        ("Stack", "spec.updateTemplate.spec.policyPacks[].path"),
        ("Stack", "spec.updateTemplate.spec.previewOnly"),
        ("Stack", "spec.updateTemplate.spec.savePlan"),
        ("Stack", "spec.updateTemplate.status.changeCount"),
        ("Stack", "spec.updateTemplate.status.changeSummary"),
        ("Stack", "spec.updateTemplate.status.changeSummary.create"),
        ("Stack", "spec.updateTemplate.status.changeSummary.delete"),
        ("Stack", "spec.updateTemplate.status.changeSummary.replace"),
        ("Stack", "spec.updateTemplate.status.changeSummary.update"),
        ("Stack", "spec.updateTemplate.status.changes"),
        ("Stack", "spec.updateTemplate.status.changesTruncated"),
        ("Stack", "spec.updateTemplate.status.changes[]"),
        ("Stack", "spec.updateTemplate.status.changes[].op"),
        ("Stack", "spec.updateTemplate.status.changes[].paths"),
        ("Stack", "spec.updateTemplate.status.changes[].paths[]"),
        ("Stack", "spec.updateTemplate.status.changes[].type"),
        ("Stack", "spec.updateTemplate.status.changes[].urn"),
        ("Stack", "spec.updateTemplate.status.clearedPendingOperations"),
        ("Stack", "spec.updateTemplate.status.clearedPendingOperations[]"),
        ("Stack", "spec.updateTemplate.status.clearedPendingOperations[].type"),
        ("Stack", "spec.updateTemplate.status.clearedPendingOperations[].urn"),
        ("Stack", "spec.updateTemplate.status.pendingOperations"),
        ("Stack", "spec.updateTemplate.status.pendingOperations[]"),
        ("Stack", "spec.updateTemplate.status.pendingOperations[].type"),
        ("Stack", "spec.updateTemplate.status.pendingOperations[].urn"),
        ("Stack", "spec.updateTemplate.status.policyViolationCount"),
        ("Stack", "spec.updateTemplate.status.policyViolations"),
        ("Stack", "spec.updateTemplate.status.policyViolations[]"),
        ("Stack", "spec.updateTemplate.status.policyViolations[].enforcementLevel"),
        ("Stack", "spec.updateTemplate.status.policyViolations[].message"),
        ("Stack", "spec.updateTemplate.status.policyViolations[].policy"),
        ("Stack", "spec.updateTemplate.status.policyViolations[].policyPack"),
        ("Stack", "spec.updateTemplate.status.policyViolations[].policyPackVersion"),
        ("Stack", "spec.updateTemplate.status.policyViolations[].urn"),
        ("Stack", "spec.updateTemplate.status.resourceChanges"),
        ("Stack", "spec.updateTemplate.status.resourceChanges{}"),
        ("Stack", "spec.workspaceTemplateRef"),
        ("Stack", "spec.workspaceTemplateRef.name"),
        ("Stack", "spec.workspaceTemplateRef.namespace"),
        ("Stack", "status.currentUpdate.cancelRequest"),
        ("Stack", "status.currentUpdate.kind"),
        ("Stack", "status.currentUpdate.policyPacksDigest"),
        ("Stack", "status.drift"),
        ("Stack", "status.drift.count"),
        ("Stack", "status.drift.detected"),
        ("Stack", "status.drift.lastCheckTime"),
        ("Stack", "status.drift.message"),
        ("Stack", "status.drift.resources"),
        ("Stack", "status.drift.truncated"),
        ("Stack", "status.lastFailure"),
        ("Stack", "status.lastFailure.countedFailures"),
        ("Stack", "status.lastFailure.lockOwner"),
        ("Stack", "status.lastFailure.message"),
        ("Stack", "status.lastFailure.pendingOperations"),
        ("Stack", "status.lastFailure.pendingOperations[]"),
        ("Stack", "status.lastFailure.reason"),
        ("Stack", "status.lastFailure.transient"),
        ("Stack", "status.lastFailure.updateName"),
        ("Stack", "status.lastRefresh"),
        ("Stack", "status.lastRefresh.failures"),
        ("Stack", "status.lastRefresh.lastResyncTime"),
        ("Stack", "status.lastRefresh.message"),
        ("Stack", "status.lastRefresh.name"),
        ("Stack", "status.lastRefresh.reason"),
        ("Stack", "status.lastRefresh.state"),
        ("Stack", "status.lastRefresh.token"),
        ("Stack", "status.lastUpdate.policyPacksDigest"),
        ("Stack", "status.nextRetryTime"),
        ("Stack", "status.observedCancelRequest"),
        ("Stack", "status.observedRefreshRequest"),
        ("Stack", "status.plan"),
        ("Stack", "status.plan.commit"),
        ("Stack", "status.plan.digest"),
        ("Stack", "status.plan.inputs"),
        ("Stack", "status.plan.summary"),
        ("Stack", "status.plan.summary.create"),
        ("Stack", "status.plan.summary.delete"),
        ("Stack", "status.plan.summary.replace"),
        ("Stack", "status.plan.summary.update"),
        ("Stack", "status.plan.time"),
        ("Stack", "status.plan.update"),
        ("Stack", "status.resourceCount"),
        ("Update", "spec.plan"),
        ("Update", "spec.policyPacks"),
        ("Update", "spec.policyPacks[]"),
        ("Update", "spec.policyPacks[].config"),
        ("Update", "spec.policyPacks[].config{}"),
        ("Update", "spec.policyPacks[].fluxSource"),
        ("Update", "spec.policyPacks[].fluxSource.dir"),
        ("Update", "spec.policyPacks[].fluxSource.sourceRef"),
        ("Update", "spec.policyPacks[].fluxSource.sourceRef.apiVersion"),
        ("Update", "spec.policyPacks[].fluxSource.sourceRef.kind"),
        ("Update", "spec.policyPacks[].fluxSource.sourceRef.name"),
        ("Update", "spec.policyPacks[].git"),
        ("Update", "spec.policyPacks[].git.auth"),
        ("Update", "spec.policyPacks[].git.auth.githubApp"),
        ("Update", "spec.policyPacks[].git.auth.githubApp.appID"),
        ("Update", "spec.policyPacks[].git.auth.githubApp.installationID"),
        ("Update", "spec.policyPacks[].git.auth.githubApp.privateKey"),
        ("Update", "spec.policyPacks[].git.auth.password"),
        ("Update", "spec.policyPacks[].git.auth.sshPrivateKey"),
        ("Update", "spec.policyPacks[].git.auth.token"),
        ("Update", "spec.policyPacks[].git.auth.username"),
        ("Update", "spec.policyPacks[].git.branch"),
        ("Update", "spec.policyPacks[].git.commit"),
        ("Update", "spec.policyPacks[].git.url"),
        ("Update", "spec.policyPacks[].name"),
        ("Update", "spec.policyPacks[].path"),
        ("Update", "spec.previewOnly"),
        ("Update", "spec.savePlan"),
        ("Update", "status.changeCount"),
        ("Update", "status.changeSummary"),
        ("Update", "status.changeSummary.create"),
        ("Update", "status.changeSummary.delete"),
        ("Update", "status.changeSummary.replace"),
        ("Update", "status.changeSummary.update"),
        ("Update", "status.changes"),
        ("Update", "status.changesTruncated"),
        ("Update", "status.changes[]"),
        ("Update", "status.changes[].op"),
        ("Update", "status.changes[].paths"),
        ("Update", "status.changes[].paths[]"),
        ("Update", "status.changes[].type"),
        ("Update", "status.changes[].urn"),
        ("Update", "status.clearedPendingOperations"),
        ("Update", "status.clearedPendingOperations[]"),
        ("Update", "status.clearedPendingOperations[].type"),
        ("Update", "status.clearedPendingOperations[].urn"),
        ("Update", "status.pendingOperations"),
        ("Update", "status.pendingOperations[]"),
        ("Update", "status.pendingOperations[].type"),
        ("Update", "status.pendingOperations[].urn"),
        ("Update", "status.policyViolationCount"),
        ("Update", "status.policyViolations"),
        ("Update", "status.policyViolations[]"),
        ("Update", "status.policyViolations[].enforcementLevel"),
        ("Update", "status.policyViolations[].message"),
        ("Update", "status.policyViolations[].policy"),
        ("Update", "status.policyViolations[].policyPack"),
        ("Update", "status.policyViolations[].policyPackVersion"),
        ("Update", "status.policyViolations[].urn"),
        ("Update", "status.resourceChanges"),
        ("Update", "status.resourceChanges{}"),
        ("Workspace", "spec.policyPackSources"),
        ("Workspace", "spec.policyPackSources[]"),
        ("Workspace", "spec.policyPackSources[].flux"),
        ("Workspace", "spec.policyPackSources[].flux.digest"),
        ("Workspace", "spec.policyPackSources[].flux.dir"),
        ("Workspace", "spec.policyPackSources[].flux.url"),
        ("Workspace", "spec.policyPackSources[].git"),
        ("Workspace", "spec.policyPackSources[].git.auth"),
        ("Workspace", "spec.policyPackSources[].git.auth.githubApp"),
        ("Workspace", "spec.policyPackSources[].git.auth.githubApp.appID"),
        ("Workspace", "spec.policyPackSources[].git.auth.githubApp.installationID"),
        ("Workspace", "spec.policyPackSources[].git.auth.githubApp.privateKey"),
        ("Workspace", "spec.policyPackSources[].git.auth.password"),
        ("Workspace", "spec.policyPackSources[].git.auth.sshPrivateKey"),
        ("Workspace", "spec.policyPackSources[].git.auth.token"),
        ("Workspace", "spec.policyPackSources[].git.auth.username"),
        ("Workspace", "spec.policyPackSources[].git.dir"),
        ("Workspace", "spec.policyPackSources[].git.ref"),
        ("Workspace", "spec.policyPackSources[].git.shallow"),
        ("Workspace", "spec.policyPackSources[].git.url"),
        ("Workspace", "spec.policyPackSources[].name"),
    ]

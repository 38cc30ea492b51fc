"""The committed CRDs are exactly what the models generate, and have the shape we promise."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pko.api import crdgen
from pko.api.k8sschema import LIST_MAP_KEY_DEFAULTS, crd_schema_problems

from pko.devtools import gen_crds

REPO = Path(__file__).resolve().parents[2]
BASES = REPO / "config" / "crd" / "bases"
GO_FIELDS = Path(__file__).resolve().parents[1] / "data" / "api" / "go_operator_fields.txt"
ANNOTATION_LIMIT = 256 * 1024  # kubectl's last-applied-configuration must fit in the annotations


def committed() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(BASES.glob("*.yaml"))}


@functools.cache
def by_kind() -> dict[str, dict[str, Any]]:
    """Generated once per test session; tests must not modify it."""
    return {doc["spec"]["names"]["kind"]: doc for doc in crdgen.crd_documents()}


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def storage_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = by_kind()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# --- drift -----------------------------------------------------------------------------------


def test_committed_crds_match_the_models() -> None:
    expected = crdgen.render_all()
    actual = {p.name: p.read_text() for p in sorted(BASES.glob("*.yaml"))}
    assert sorted(actual) == sorted(expected), "run hack/gen_crds.py"
    for name, text in expected.items():
        assert actual[name] == text, f"{name} is out of date: run hack/gen_crds.py"
    assert (REPO / "config" / "crd" / "kustomization.yaml").read_text() == crdgen.KUSTOMIZATION


def test_gen_crds_check_passes_now_and_fails_on_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gen_crds.main(["--check"]) == 0
    original = crdgen.render_all

    def drifted() -> dict[str, str]:
        files = original()
        files["pulumi.com_stacks.yaml"] += "# drift\n"
        return files

    monkeypatch.setattr(crdgen, "render_all", drifted)
    assert gen_crds.main(["--check"]) == 1


def test_files_carry_the_generated_header() -> None:
    for path in BASES.glob("*.yaml"):
        assert path.read_text().startswith(crdgen.HEADER), path.name


# --- shape -----------------------------------------------------------------------------------


def test_five_crds_with_status_subresource_and_pulumi_category() -> None:
    docs = committed()
    assert sorted(docs) == [
        "auto.pulumi.com_updates.yaml",
        "auto.pulumi.com_workspaces.yaml",
        "auto.pulumi.com_workspacetemplates.yaml",
        "pulumi.com_programs.yaml",
        "pulumi.com_stacks.yaml",
    ]
    for doc in docs.values():
        assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
        assert doc["spec"]["names"]["categories"] == ["pulumi"]
        assert doc["spec"]["scope"] == "Namespaced"
        for version in doc["spec"]["versions"]:
            assert version["subresources"] == {"status": {}}
            assert version["served"] is True


def test_stack_serves_legacy_v1alpha1_with_the_same_schema_but_stores_v1() -> None:
    versions = by_kind()["Stack"]["spec"]["versions"]
    assert [(v["name"], v["storage"]) for v in versions] == [("v1", True), ("v1alpha1", False)]
    assert versions[0]["schema"] == versions[1]["schema"]


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        ("Workspace", ["Image", "Ready", "Address"]),
        ("Update", ["Workspace", "Progressing", "Failed", "Complete", "URL"]),
        # The Go operator's columns, and Ready's reason after Ready (pko: docs/differences.md).
        ("Stack", ["Stack", "Last Update", "Age", "Ready", "Reason", "Reconciling", "Stalled", "Permalink"]),
        ("Program", ["Age", "URL"]),
    ],
)
def test_default_printer_columns(kind: str, columns: list[str]) -> None:
    rendered = by_kind()[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in rendered if not c.get("priority")] == columns


def test_status_columns_read_conditions() -> None:
    rendered = {
        c["name"]: c["jsonPath"]
        for c in by_kind()["Stack"]["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert rendered["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert rendered["Stalled"] == '.status.conditions[?(@.type=="Stalled")].reason'
    assert rendered["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'


@pytest.mark.parametrize("kind", ["Stack", "Program", "Workspace", "Update"])
def test_schema_is_structural(kind: str) -> None:
    for version in by_kind()[kind]["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert crd_schema_problems(schema) == []
        assert "$ref" not in json.dumps(schema)


def cel_rules(kind: str) -> dict[str, list[str]]:
    """Schema path -> the CEL rules there, for one kind (storage version)."""
    return {
        path or "<root>": [rule["rule"] for rule in node["x-kubernetes-validations"]]
        for path, node in nodes(storage_schema(kind))
        if "x-kubernetes-validations" in node
    }


def test_cel_rules_are_where_the_models_declare_them_and_nowhere_else() -> None:
    """Templates (workspaceTemplate, updateTemplate) carry no rules: a template is partial."""
    stack = cel_rules("Stack")
    assert stack["<root>"] == ["size(self.metadata.name) <= 42"]  # the Go operator's rule, verbatim
    assert len(stack["spec"]) == 5
    ref_paths = sorted(path for path in stack if path not in ("<root>", "spec", "spec.gitAuth"))
    assert ref_paths == [
        "spec.envRefs{}",
        "spec.gitAuth.accessToken",
        "spec.gitAuth.basicAuth.password",
        "spec.gitAuth.basicAuth.userName",
        "spec.gitAuth.githubApp.appID",
        "spec.gitAuth.githubApp.installationID",
        "spec.gitAuth.githubApp.privateKey",
        "spec.gitAuth.sshAuth.password",
        "spec.gitAuth.sshAuth.sshPrivateKey",
        "spec.policyPacks[]",
        "spec.policyPacks[].git",
        "spec.secretsRef{}",
    ]
    assert "configMap" in stack["spec.envRefs{}"][0] and "configMap" not in stack["spec.secretsRef{}"][0]
    # Program: its rules (get/properties, type/default) are about JSON values, which CEL cannot see.
    # Workspace, Update: the operator creates them from the Stack's templates; it checks them itself.
    # An Update's policy packs carry the pack's own rules (issue 43), as the Stack's do.
    assert cel_rules("Program") == {} and cel_rules("Workspace") == {}
    assert cel_rules("Update") == {k: v for k, v in stack.items() if k.startswith("spec.policyPacks[]")}
    stack_doc = by_kind()["Stack"]
    root = storage_schema("Stack")["x-kubernetes-validations"][0]
    assert root["message"].startswith("Stack name must be no more than 42 characters")
    assert stack_doc["spec"]["versions"][1]["schema"] == stack_doc["spec"]["versions"][0]["schema"]


def test_only_go_operator_defaults_and_list_map_key_defaults_remain() -> None:
    allowed = {json.dumps(v) for v in LIST_MAP_KEY_DEFAULTS.values()}
    found: list[tuple[str, str, Any]] = []
    for kind in ("Stack", "Program", "Workspace", "Update"):
        for path, node in nodes(storage_schema(kind)):
            if "default" in node and json.dumps(node["default"]) not in allowed:
                found.append((kind, path, node["default"]))
    assert found == [
        ("Workspace", "spec.serviceAccountName", "default"),
        ("Workspace", "spec.securityProfile", "restricted"),
    ]


# Subtrees of embedded Kubernetes types: they keep their own required fields (as in Go).
EMBEDDED_K8S = re.compile(
    r"\.podTemplate\.spec|\.env\[\]|\.envFrom\[\]|\.resources\."
    r"|\.git\.auth\.(sshPrivateKey|username|password|token|githubApp\.(appID|installationID|privateKey))\."
)


def test_templates_in_the_stack_have_no_defaults_or_required_fields_of_ours() -> None:
    schema = storage_schema("Stack")["properties"]["spec"]["properties"]
    checked = 0
    for template in ("workspaceTemplate", "updateTemplate"):
        for path, node in nodes(schema[template], template):
            if EMBEDDED_K8S.search(path + "."):
                continue
            checked += 1
            assert "required" not in node, path
            assert "default" not in node, path
            assert node.get("x-kubernetes-list-type") != "map", path
    assert checked > 100
    ws = schema["workspaceTemplate"]["properties"]["spec"]["properties"]
    assert "required" in ws["env"]["items"]  # EnvVar.name stays required, as in Go


def test_crds_fit_in_kubectl_last_applied_annotation() -> None:
    for name, doc in committed().items():
        size = len(json.dumps(doc, separators=(",", ":")))
        assert size < ANNOTATION_LIMIT, f"{name} is {size} bytes"


def test_enums_minimums_and_required_fields() -> None:
    stack = storage_schema("Stack")
    spec = stack["properties"]["spec"]
    assert stack["required"] == ["spec"]
    assert spec["required"] == ["stack"]
    assert spec["properties"]["workspaceReclaimPolicy"]["enum"] == ["Retain", "Delete"]
    assert spec["properties"]["envRefs"]["additionalProperties"]["properties"]["type"]["enum"] == [
        "Env",
        "FS",
        "Secret",
        "Literal",
        "ConfigMap",
    ]
    for field in ("resyncFrequencySeconds", "retryMaxBackoffDurationSeconds"):
        assert spec["properties"][field]["minimum"] == 0
    # The name rule is CEL, at the root, reported at metadata.name (so the schema declares it).
    assert stack["properties"]["metadata"] == {"type": "object", "properties": {"name": {"type": "string"}}}
    ws = storage_schema("Workspace")["properties"]["spec"]["properties"]
    assert ws["securityProfile"]["enum"] == ["baseline", "restricted"]
    assert ws["stacks"]["x-kubernetes-list-map-keys"] == ["name"]
    assert ws["stacks"]["items"]["required"] == ["name"]
    update = storage_schema("Update")["properties"]["spec"]["properties"]
    assert update["type"]["enum"] == ["preview", "up", "destroy", "refresh"]
    assert update["ttlAfterCompleted"]["pattern"].startswith("^")
    conditions = storage_schema("Update")["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == [
        "type"
    ]
    assert conditions["items"]["required"] == ["lastTransitionTime", "message", "reason", "status", "type"]


def test_embedded_pod_spec_comes_from_kubernetes_without_descriptions() -> None:
    pod = storage_schema("Workspace")["properties"]["spec"]["properties"]["podTemplate"]["properties"]["spec"]
    assert pod["required"] == ["containers"]
    container = pod["properties"]["initContainers"]["items"]["properties"]
    assert "restartPolicy" in container  # native sidecars (1.28+)
    assert not any("description" in node for path, node in nodes(pod) if path)  # the field itself has one


def test_top_level_fields_are_described() -> None:
    spec = storage_schema("Stack")["properties"]["spec"]["properties"]
    undocumented = [name for name, node in spec.items() if not node.get("description")]
    assert undocumented == []
    assert (
        "(pko extension)"
        in storage_schema("Stack")["properties"]["status"]["properties"]["nextRetryTime"]["description"]
    )


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
    # Stack/Update spec.policyPacks[].git, Workspace spec.policyPackSources: ours (issue 43: a pack
    # from a git repository of its own, fetched by the workspace pod).
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


# --- the Rule marker -------------------------------------------------------------------------


def test_rule_marker_on_models_and_fields_in_order_and_never_inside_templates() -> None:
    from typing import Annotated

    from pko.api.markers import ApplyConfigurationOf, Rule, rules_of
    from pydantic import BaseModel

    @Rule("has(self.a) || has(self.b)", "one of a or b is required")
    @Rule("!has(self.a) || self.a != 'x'", "a must not be x", field_path=".a", reason="FieldValueForbidden")
    class Toy(BaseModel):
        metadata: dict[str, str] | None = None  # a template is of a whole object
        a: str | None = None
        b: Annotated[int, Rule("self >= 0", "b must not be negative")] | None = None

    class Child(Toy):
        pass

    class Holder(BaseModel):
        toy: Toy
        template: Annotated[dict[str, Any], ApplyConfigurationOf(Toy)] | None = None

    assert [r.message for r in rules_of(Toy)] == ["one of a or b is required", "a must not be x"]
    assert rules_of(Child) == ()  # a model's rules are its own
    schema = crdgen.model_schema(Holder)["properties"]
    assert schema["toy"]["x-kubernetes-validations"] == [
        {"rule": "has(self.a) || has(self.b)", "message": "one of a or b is required"},
        {
            "rule": "!has(self.a) || self.a != 'x'",
            "message": "a must not be x",
            "fieldPath": ".a",
            "reason": "FieldValueForbidden",
        },
    ]
    assert schema["toy"]["properties"]["b"]["x-kubernetes-validations"] == [
        {"rule": "self >= 0", "message": "b must not be negative"}
    ]
    assert "x-kubernetes-validations" not in json.dumps(schema["template"])

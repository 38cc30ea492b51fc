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

"""The conversion of Kubernetes definitions into CRD schemas (pko.api.k8sschema), pure: recent fields
kept, int-or-string and list-map keys as the apiserver wants them, what CRDs refuse dropped or refused,
descriptions on request, and the aliases the API models use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from pko.api import k8sschema
from pko.api.k8sschema import (
    EMBEDDED_METADATA_FIELDS,
    K8sSchemaError,
    K8sType,
    PodTemplateSpec,
    crd_schema_problems,
    inline_definition,
    k8s_schema,
)

from pko.devtools import import_k8s_openapi as importer

from .conftest import CORE, META, POD_TEMPLATE, RECENT_PATHS


def at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """Follow a dotted path of property names; `[]` steps into array items, `{}` into map values."""
    node = schema
    for step in re.findall(r"[^.\[\]{}]+|\[\]|\{\}", path):
        if step == "[]":
            node = node["items"]
        elif step == "{}":
            node = node["additionalProperties"]
        else:
            node = node["properties"][step]
    return node


def all_nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from all_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from all_nodes(value)


def test_pod_template_has_recent_fields() -> None:
    pod = k8s_schema(POD_TEMPLATE)
    for path in RECENT_PATHS:
        assert at(pod, path), path


def test_quantity_and_int_or_string_become_int_or_string_without_type() -> None:
    pod = k8s_schema(POD_TEMPLATE)
    quantity = at(pod, "spec.containers[].resources.limits{}")
    port = at(pod, "spec.containers[].livenessProbe.httpGet.port")
    for node in (quantity, port, at(pod, "spec.volumes[].emptyDir.sizeLimit")):
        assert node["x-kubernetes-int-or-string"] is True
        assert not {"type", "format", "anyOf"} & set(node)
    pattern = re.compile(quantity["pattern"])
    for good in ("1", "500m", "1.5Gi", "2e3", "+.5", "100Ki", "1n"):
        assert pattern.match(good), good
    for bad in ("1 Gi", "Gi", "1GB", "-", "1.2.3"):
        assert not pattern.match(bad), bad
    assert "pattern" not in port
    assert not any(node.get("format") == "int-or-string" for node in all_nodes(pod))


def test_every_committed_definition_converts_to_an_installable_schema() -> None:
    forbidden = re.compile(
        r'"(\$ref|x-kubernetes-(patch-strategy|patch-merge-key|group-version-kind|unions))"'
    )
    for name in importer.closure(json.loads(importer.committed_files()[0].read_text())["definitions"]):
        for descriptions in (False, True):
            schema = k8s_schema(name, descriptions=descriptions)
            assert crd_schema_problems(schema) == [], name
            assert not forbidden.search(json.dumps(schema)), name


def test_structural_checker_reports_what_the_apiserver_refuses() -> None:
    bad = {
        "type": "object",
        "properties": {
            "untyped": {"properties": {"a": {"type": "string"}}},
            "both": {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "additionalProperties": {"type": "string"},
            },
            "ref": {"$ref": "#/definitions/x"},
            "patch": {"type": "array", "items": {"type": "string"}, "x-kubernetes-patch-strategy": "merge"},
            "ports": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "items": {
                    "type": "object",
                    "required": ["port"],
                    "properties": {"port": {"type": "integer"}, "protocol": {"type": "string"}},
                },
            },
            "objset": {
                "type": "array",
                "x-kubernetes-list-type": "set",
                "items": {"type": "object", "properties": {}},
            },
            "maptype": {"type": "string", "x-kubernetes-map-type": "atomic"},
        },
    }
    problems = "\n".join(crd_schema_problems(bad))
    for expected in (
        ".untyped: no type",
        ".both: both properties and additionalProperties",
        ".ref: $ref",
        ".patch: extension x-kubernetes-patch-strategy",
        ".ports: list-map key protocol is neither required nor defaulted",
        ".objset: set of non-atomic objects",
        ".maptype: x-kubernetes-map-type on a non-object",
    ):
        assert expected in problems


def test_list_map_keys_get_the_real_kubernetes_defaults() -> None:
    pod = k8s_schema(POD_TEMPLATE)
    for ports in (at(pod, "spec.containers[].ports"), at(pod, "spec.initContainers[].ports")):
        assert ports["x-kubernetes-list-type"] == "map"
        assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
        assert at(ports, "[].protocol")["default"] == "TCP"
    assert at(k8s_schema(CORE + "ServiceSpec"), "ports[].protocol")["default"] == "TCP"
    # An imagePullSecret's name defaults to "" upstream: a keyed list too.
    pull_secrets = at(pod, "spec.imagePullSecrets")
    assert pull_secrets["x-kubernetes-list-type"] == "map"
    assert pull_secrets["x-kubernetes-list-map-keys"] == ["name"]
    assert at(pull_secrets, "[].name")["default"] == ""
    # Defaults are added only where a list-map key needs one, never elsewhere.
    defaults = [node for node in all_nodes(pod) if "default" in node]
    assert len(defaults) == 4  # the ports of (init, ephemeral) containers, imagePullSecrets' name
    assert "default" not in at(pod, "spec.containers[].env[].valueFrom.secretKeyRef.name")


def test_list_map_key_without_a_known_default_makes_the_list_atomic() -> None:
    definitions = {
        "x.Holder": {
            "type": "object",
            "properties": {
                "rules": {
                    "type": "array",
                    "items": {"$ref": "#/definitions/x.Rule"},
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name", "kind"],
                    "x-kubernetes-patch-merge-key": "name",
                }
            },
        },
        "x.Rule": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
        },
    }
    schema = inline_definition(definitions, "x.Holder")
    assert schema["properties"]["rules"] == {
        "type": "array",
        "x-kubernetes-list-type": "atomic",
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
        },
    }
    definitions["x.Rule"]["required"] = ["name", "kind"]
    assert (
        inline_definition(definitions, "x.Holder")["properties"]["rules"]["x-kubernetes-list-type"] == "map"
    )


def test_recursion_and_unknown_keywords_are_refused() -> None:
    cycle = {
        "x.A": {"type": "object", "properties": {"b": {"$ref": "#/definitions/x.B"}}},
        "x.B": {"type": "object", "properties": {"a": {"$ref": "#/definitions/x.A"}}},
    }
    with pytest.raises(K8sSchemaError, match=r"recursive definition: x\.A -> x\.B -> x\.A"):
        inline_definition(cycle, "x.A")
    with pytest.raises(K8sSchemaError, match="unsupported keyword 'oneOf'"):
        inline_definition({"x.C": {"type": "object", "oneOf": []}}, "x.C")
    with pytest.raises(K8sSchemaError, match="unknown Kubernetes definition"):
        k8s_schema(CORE + "NoSuchThing")
    with pytest.raises(K8sSchemaError):
        K8sType(CORE + "NoSuchThing")


def test_vendor_extensions_crds_refuse_are_dropped_and_cel_rules_kept() -> None:
    definitions = {
        "x.T": {
            "type": "object",
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "T", "version": "v1"}],
            "x-kubernetes-unions": [{"discriminator": "type"}],
            "x-kubernetes-validations": [{"rule": "self.a > 0"}],
            "x-kubernetes-map-type": "atomic",
            "properties": {
                "a": {"type": "integer", "format": "int32"},
                "l": {
                    "type": "array",
                    "items": {"type": "string"},
                    "x-kubernetes-list-type": "set",
                    "x-kubernetes-patch-strategy": "merge",
                },
                "p": {"type": "string", "format": "int-or-string", "description": "old spelling"},
            },
        }
    }
    assert inline_definition(definitions, "x.T") == {
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "x-kubernetes-validations": [{"rule": "self.a > 0"}],
        "properties": {
            "a": {"type": "integer", "format": "int32"},
            "l": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
            "p": {"x-kubernetes-int-or-string": True},
        },
    }


def test_embedded_object_meta_keeps_only_template_fields() -> None:
    pod = k8s_schema(POD_TEMPLATE)
    for metadata in (at(pod, "metadata"), at(pod, "spec.volumes[].ephemeral.volumeClaimTemplate.metadata")):
        assert metadata["type"] == "object"
        assert sorted(metadata["properties"]) == sorted(EMBEDDED_METADATA_FIELDS)
        assert metadata["properties"]["labels"] == {
            "type": "object",
            "additionalProperties": {"type": "string"},
        }
    assert k8s_schema(META + "ObjectMeta") == at(pod, "metadata")


def test_objects_without_declared_fields_preserve_their_content() -> None:
    # FieldsV1 is `type: object` with nothing listed: as a CRD schema it would prune everything.
    assert k8s_schema(META + "FieldsV1") == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_descriptions_are_dropped_by_default_and_kept_on_request() -> None:
    bare = k8s_schema(POD_TEMPLATE)
    assert not any("description" in node for node in all_nodes(bare))
    described = k8s_schema(POD_TEMPLATE, descriptions=True)
    assert described["description"].startswith("PodTemplateSpec")
    # A field's own description wins over its type's (PodSpec's is "PodSpec is a description of a pod.").
    assert at(described, "spec")["description"].startswith("Specification of the desired behavior of the pod")
    assert "sidecar" in at(described, "spec.initContainers[].restartPolicy")["description"].lower()
    strip = json.loads(
        json.dumps(described), object_hook=lambda d: {k: v for k, v in d.items() if k != "description"}
    )
    assert strip == bare


def test_callers_get_independent_copies() -> None:
    first = k8s_schema(POD_TEMPLATE)
    first["properties"]["spec"]["properties"].clear()
    assert at(k8s_schema(POD_TEMPLATE), "spec.containers[].image") == {"type": "string"}


def test_embedding_the_pod_template_keeps_a_crd_within_client_side_apply_limits() -> None:
    # kubectl's last-applied annotation holds at most 256 KiB; the Stack CRD embeds the pod
    # template once per served version (v1, v1alpha1), so two copies must leave ample room.
    assert 2 * len(json.dumps(k8s_schema(POD_TEMPLATE), separators=(",", ":"))) < 200 * 1024


def test_aliases_name_their_kubernetes_types_and_drive_pydantic_json_schema() -> None:
    expected = {
        "PodTemplateSpec": CORE + "PodTemplateSpec",
        "PodSpec": CORE + "PodSpec",
        "ServiceSpec": CORE + "ServiceSpec",
        "ResourceRequirements": CORE + "ResourceRequirements",
        "EnvVar": CORE + "EnvVar",
        "EnvFromSource": CORE + "EnvFromSource",
        "LocalObjectReference": CORE + "LocalObjectReference",
        "SecretKeySelector": CORE + "SecretKeySelector",
        "ConfigMapKeySelector": CORE + "ConfigMapKeySelector",
        "Volume": CORE + "Volume",
        "VolumeMount": CORE + "VolumeMount",
        "Toleration": CORE + "Toleration",
        "Affinity": CORE + "Affinity",
        "LabelSelector": META + "LabelSelector",
        "Condition": META + "Condition",
        "EmbeddedObjectMeta": META + "ObjectMeta",
    }
    for alias, definition in expected.items():
        [marker] = [m for m in getattr(k8sschema, alias).__metadata__ if isinstance(m, K8sType)]
        assert marker.definition == definition
        assert marker.schema() == k8s_schema(definition)

    class Holder(pydantic.BaseModel):
        podTemplate: PodTemplateSpec | None = None

    holder = Holder.model_validate({"podTemplate": {"spec": {"containers": [{"name": "c"}]}}})
    assert holder.podTemplate == {"spec": {"containers": [{"name": "c"}]}}
    json_schema = Holder.model_json_schema()
    options = json_schema["properties"]["podTemplate"]["anyOf"]
    assert k8s_schema(POD_TEMPLATE) in options


def test_closed_kubernetes_value_sets_become_enums() -> None:
    pod = k8s_schema("io.k8s.api.core.v1.PodTemplateSpec")["properties"]["spec"]
    assert pod["properties"]["restartPolicy"]["enum"] == ["Always", "OnFailure", "Never"]
    container = pod["properties"]["containers"]["items"]
    assert container["properties"]["imagePullPolicy"]["enum"] == ["Always", "Never", "IfNotPresent"]
    # Open sets stay open: a sidecar's restartPolicy grows with new Kubernetes releases.
    assert "enum" not in container["properties"]["restartPolicy"]

"""The embedded Kubernetes schemas (pko.api.k8sschema) and their importer (hack/import_k8s_openapi.py).

Pure tests prove the conversion rules and that the committed definitions are exactly what the
importer produces; the cluster tests prove the result installs on the test kube-apiserver, keeps
every pod field it sends, and drives server-side apply (containers merged by name).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from pko.api import k8sschema
from pko.api.k8sschema import (
    EMBEDDED_METADATA_FIELDS,
    K8S_RELEASE,
    K8S_SOURCE,
    K8sSchemaError,
    K8sType,
    PodTemplateSpec,
    crd_schema_problems,
    inline_definition,
    k8s_schema,
)

from pko.devtools import import_k8s_openapi as importer

REPO = Path(__file__).resolve().parents[2]
CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
POD_TEMPLATE = CORE + "PodTemplateSpec"


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


# --- the committed import -------------------------------------------------------------------------


def test_exactly_one_import_is_committed_and_its_source_is_recorded() -> None:
    files = sorted((REPO / "api" / "schemas").glob("k8s-openapi-v*.json"))
    assert [f.name for f in files] == [f"k8s-openapi-v{K8S_RELEASE}.json"]
    assert re.fullmatch(r"1\.\d+\.\d+", K8S_RELEASE)
    assert K8S_RELEASE == importer.pinned_release(), "import the release the tests run (hack/versions.env)"
    assert K8S_SOURCE["repository"] == "https://github.com/kubernetes/kubernetes"
    assert K8S_SOURCE["path"] == "api/openapi-spec/swagger.json"
    assert re.fullmatch(r"h1:[A-Za-z0-9+/]{43}=", K8S_SOURCE["commit"])  # the Go module's go.sum hash


def test_committed_file_is_what_the_importer_writes() -> None:
    assert importer.check() == []


def test_drift_check_catches_stale_extra_and_hand_formatted_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [committed] = importer.committed_files()
    document = json.loads(committed.read_text())
    monkeypatch.setattr(importer, "SCHEMA_DIR", tmp_path)
    target = tmp_path / committed.name

    target.write_text(importer.render(document))
    assert importer.check() == []

    stray = copy.deepcopy(document)
    stray["definitions"][CORE + "Pod"] = {"type": "object"}
    target.write_text(importer.render(stray))
    assert any("not reachable from ROOTS" in p for p in importer.check())

    target.write_text(json.dumps(document, indent=2))
    assert any("canonical form" in p for p in importer.check())

    broken = copy.deepcopy(document)
    del broken["definitions"][CORE + "ContainerPort"]
    target.write_text(importer.render(broken))
    assert any("ContainerPort" in p for p in importer.check())

    target.write_text(importer.render(document))
    monkeypatch.setattr(importer, "ROOTS", (*importer.ROOTS, CORE + "ServicePort", CORE + "Capabilities"))
    assert importer.check() == []  # both already reachable: no change
    monkeypatch.setattr(importer, "ROOTS", (*importer.ROOTS, "io.k8s.api.apps.v1.StatefulSetSpec"))
    assert any("StatefulSetSpec" in p for p in importer.check())


def test_importer_takes_the_closure_records_the_release_and_replaces_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [committed] = importer.committed_files()
    document = json.loads(committed.read_text())
    swagger: dict[str, Any] = {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.99.1"},
        "definitions": {
            **document["definitions"],
            "io.k8s.api.apps.v1.Deployment": {"type": "object", "properties": {}},
        },
    }
    swagger_file = tmp_path / "swagger.json"
    swagger_file.write_text(json.dumps(swagger))
    out = tmp_path / "schemas"
    out.mkdir()
    (out / "k8s-openapi-v1.20.2.json").write_text("{}")
    monkeypatch.setattr(importer, "SCHEMA_DIR", out)
    monkeypatch.setattr(importer, "REPO_ROOT", tmp_path)

    assert importer.main(["--swagger", str(swagger_file), "--commit", "c0ffee"]) == 0

    assert sorted(p.name for p in out.iterdir()) == ["k8s-openapi-v1.99.1.json"]
    written = json.loads((out / "k8s-openapi-v1.99.1.json").read_text())
    assert written["definitions"] == document["definitions"]
    assert written["source"] == {
        "repository": "https://github.com/tomplus/kubernetes_asyncio",
        "commit": "c0ffee",
        "path": "kubernetes_asyncio/swagger.json.unprocessed",
        "kubernetesRelease": "1.99.1",
    }

    swagger["info"]["version"] = "unversioned"
    swagger_file.write_text(json.dumps(swagger))
    assert importer.main(["--swagger", str(swagger_file)]) == 2  # no release anywhere: refuse
    assert importer.main(["--swagger", str(swagger_file), "--release", "v1.99.2"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["k8s-openapi-v1.99.2.json"]


@pytest.mark.skipif(
    not (importer.GOMODCACHE / f"k8s.io/kubernetes@v{K8S_RELEASE}").is_dir(),
    reason="the k8s.io/kubernetes module is cached by hack/build-kubernetes.sh",
)
def test_committed_file_equals_a_fresh_import_from_the_go_module() -> None:
    assert importer.main(["--check", "--from-go-module"]) == 0


# --- the conversion -------------------------------------------------------------------------------


# Pod template fields of recent releases (1.21 to 1.33): the import must be current.
RECENT_PATHS = (
    "spec.initContainers[].restartPolicy",  # native sidecars
    "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[].namespaceSelector",
    "spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[].podAffinityTerm.matchLabelKeys",
    "spec.containers[].resizePolicy[].resourceName",
    "spec.containers[].resources.claims[].name",
    "spec.containers[].securityContext.appArmorProfile.type",
    "spec.containers[].lifecycle.preStop.sleep.seconds",
    "spec.os.name",
    "spec.schedulingGates[].name",
    "spec.hostUsers",
    "spec.volumes[].image.reference",
    "spec.topologySpreadConstraints[].nodeAffinityPolicy",
)


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


# --- on a real kube-apiserver ---------------------------------------------------------------------

GROUP = "schematest.pko.dev"
NAMESPACE = "default"


def _crd(kind: str, pod_template_schema: dict[str, Any]) -> dict[str, Any]:
    """A throwaway namespaced CRD whose spec.podTemplate is the given schema."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "podTemplate": pod_template_schema,
                                        "serviceSpec": k8s_schema(CORE + "ServiceSpec"),
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


class Holders:
    """Custom objects of one installed throwaway CRD."""

    def __init__(self, api_client: Any, crd: dict[str, Any]) -> None:
        from kubernetes_asyncio import client

        self.api_client = api_client
        self.crd = crd
        self.kind: str = crd["spec"]["names"]["kind"]
        self.plural: str = crd["spec"]["names"]["plural"]
        self._ext = client.ApiextensionsV1Api(api_client)
        self._objects = client.CustomObjectsApi(api_client)

    async def install(self) -> None:
        name = self.crd["metadata"]["name"]
        await self._ext.patch_custom_resource_definition(
            name, self.crd, field_manager="pko-test", force=True, _content_type="application/apply-patch+yaml"
        )
        for _ in range(120):
            conditions = {
                c.type: c
                for c in (await self._ext.read_custom_resource_definition(name)).status.conditions or []
            }
            non_structural = conditions.get("NonStructuralSchema")
            if non_structural is not None and non_structural.status == "True":
                pytest.fail(f"the apiserver calls the schema non-structural: {non_structural.message}")
            established = conditions.get("Established")
            if established is not None and established.status == "True":
                return
            await asyncio.sleep(0.5)
        pytest.fail(f"CRD {name} never became Established")

    async def uninstall(self) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        name = self.crd["metadata"]["name"]
        await self._ext.delete_custom_resource_definition(name)
        for _ in range(120):  # gone before a later run re-creates it
            try:
                await self._ext.read_custom_resource_definition(name)
            except ApiException as exc:
                if exc.status == 404:
                    return
                raise
            await asyncio.sleep(0.5)

    def body(self, name: str, pod_template: Any) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/v1",
            "kind": self.kind,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"podTemplate": pod_template},
        }

    async def create(self, name: str, pod_template: Any) -> None:
        await self._objects.create_namespaced_custom_object(
            GROUP, "v1", NAMESPACE, self.plural, self.body(name, pod_template)
        )

    async def apply(self, name: str, pod_template: Any, manager: str) -> None:
        await self._objects.patch_namespaced_custom_object(
            GROUP, "v1", NAMESPACE, self.plural, name, self.body(name, pod_template),
            field_manager=manager, _content_type="application/apply-patch+yaml",
        )  # fmt: skip

    async def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self._objects.get_namespaced_custom_object(
            GROUP, "v1", NAMESPACE, self.plural, name
        )
        return obj


@pytest.fixture(scope="module")
async def holders(cluster: Any, api_client: Any) -> AsyncIterator[Holders]:
    """The PodHolder CRD embedding exactly `k8s_schema(PodTemplateSpec)`, installed once per module."""
    installed = Holders(api_client, _crd("PodHolder", k8s_schema(POD_TEMPLATE)))
    await installed.install()
    yield installed
    await installed.uninstall()


def _realistic_pod_template() -> dict[str, Any]:
    """A pod template using recent fields, plus every int-or-string shape."""
    return {
        "metadata": {"labels": {"app": "ws"}, "annotations": {"note": "x"}},
        "spec": {
            "serviceAccountName": "pulumi",
            "imagePullSecrets": [{"name": "regcred"}],
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [
                {
                    "name": "fetch",
                    "image": "agent:dev",
                    "restartPolicy": "Always",  # a native sidecar (1.28+)
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                    "volumeMounts": [{"name": "share", "mountPath": "/share"}],
                }
            ],
            "containers": [
                {
                    "name": "pulumi",
                    "image": "agent:dev",
                    "args": ["serve"],
                    "ports": [{"name": "grpc", "containerPort": 50051}],
                    "env": [
                        {"name": "A", "value": "1"},
                        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    ],
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "64Mi"},
                        "limits": {"cpu": 2, "memory": "1Gi"},
                    },
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": "grpc"}, "periodSeconds": 10},
                    "readinessProbe": {"tcpSocket": {"port": 50051}},
                    "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "appArmorProfile": {"type": "RuntimeDefault"},
                    },
                }
            ],
            "volumes": [
                {"name": "share", "emptyDir": {"sizeLimit": "1Gi"}},
                {
                    "name": "scratch",
                    "ephemeral": {
                        "volumeClaimTemplate": {
                            "metadata": {"labels": {"tier": "scratch"}},
                            "spec": {
                                "accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}},
                            },
                        }
                    },
                },
            ],
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "db"}},
                            "namespaceSelector": {
                                "matchExpressions": [{"key": "team", "operator": "Exists"}]
                            },
                        }
                    ]
                }
            },
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "nodeAffinityPolicy": "Honor",
                }
            ],
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "pulumi", "effect": "NoSchedule"}
            ],
            "os": {"name": "linux"},
            "schedulingGates": [{"name": "wait"}],
        },
    }


def _with_server_defaults(template: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver stores: the template plus the list-map key defaults we declared."""
    stored = copy.deepcopy(template)
    for port in stored["spec"]["containers"][0]["ports"]:
        port.setdefault("protocol", "TCP")
    return stored


async def _assert_apply_merges_lists_by_key(holders: Holders, name: str) -> None:
    """Two managers' containers (and imagePullSecrets) merge by name, as for a real pod.

    Int-or-string nodes included: kube-apiserver 1.20 failed to build the apply model of a CR
    with them and treated every list as atomic; current releases do not.
    """
    template = _realistic_pod_template()
    await holders.apply(name, template, manager="owner")
    sidecar = {"name": "sidecar", "image": "proxy:1", "ports": [{"containerPort": 8080, "protocol": "UDP"}]}
    injected = {"spec": {"containers": [sidecar], "imagePullSecrets": [{"name": "mirror"}]}}
    await holders.apply(name, injected, manager="injector")
    stored = await holders.get(name)
    pod = stored["spec"]["podTemplate"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["pulumi", "sidecar"]
    assert pod["containers"][0] == _with_server_defaults(template)["spec"]["containers"][0]
    assert pod["containers"][1] == sidecar
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert {entry["manager"] for entry in stored["metadata"]["managedFields"]} == {"owner", "injector"}


def _field_paths(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    for prop, sub in schema.get("properties", {}).items():
        yield f"{path}.{prop}"
        yield from _field_paths(sub, f"{path}.{prop}")
    if isinstance(schema.get("items"), dict):
        yield from _field_paths(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _field_paths(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.cluster
async def test_our_pod_template_knows_every_field_of_the_test_apiserver(api_client: Any) -> None:
    """Cross-check against the test apiserver's own /openapi/v2: the import is at least as recent
    as the Kubernetes we test on, so no pod field it serves is pruned from a podTemplate."""
    published = await api_client.call_api(
        "/openapi/v2", "GET", auth_settings=["BearerToken"], response_types_map={200: "object"},
        _return_http_data_only=True,
    )  # fmt: skip
    theirs = set(_field_paths(inline_definition(published["definitions"], POD_TEMPLATE)))
    ours = set(_field_paths(k8s_schema(POD_TEMPLATE)))
    assert sorted(theirs - ours) == [], "re-import: hack/import_k8s_openapi.py"
    for path in RECENT_PATHS:
        assert "." + path in theirs


@pytest.mark.cluster
async def test_pod_template_schema_installs_and_keeps_recent_fields(holders: Holders) -> None:
    template = _realistic_pod_template()
    await holders.create("created", template)
    stored = await holders.get("created")
    assert stored["spec"]["podTemplate"] == _with_server_defaults(template)


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda t: t["spec"].__setitem__("containers", "pulumi"), "spec.podTemplate.spec.containers"),
        (
            lambda t: t["spec"]["containers"][0]["resources"]["limits"].__setitem__("cpu", "lots"),
            "spec.podTemplate.spec.containers[0].resources.limits.cpu",
        ),
        (
            lambda t: t["spec"]["containers"][0]["livenessProbe"]["httpGet"].__setitem__("port", True),
            "spec.podTemplate.spec.containers[0].livenessProbe.httpGet.port",
        ),
        (lambda t: t["metadata"].__setitem__("labels", ["a"]), "spec.podTemplate.metadata.labels"),
    ],
    ids=["containers-as-string", "bad-quantity", "port-as-bool", "labels-as-list"],
)
async def test_malformed_pod_template_is_rejected_naming_the_field(
    holders: Holders, mutate: Any, field: str
) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    template = _realistic_pod_template()
    mutate(template)
    with pytest.raises(ApiException) as raised:
        await holders.create("bad", template)
    assert raised.value.status == 422
    assert field + ":" in json.loads(raised.value.body or "{}")["message"]


@pytest.mark.cluster
async def test_server_side_apply_merges_lists_by_key(holders: Holders) -> None:
    await _assert_apply_merges_lists_by_key(holders, "applied")


@pytest.mark.cluster
def test_described_schema_installs_too(cluster: Any) -> None:
    """The variant with descriptions (about 340 KB) installs too, applied server-side by kubectl."""
    crd = _crd("DescribedHolder", k8s_schema(POD_TEMPLATE, descriptions=True))
    name = crd["metadata"]["name"]

    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", f"--kubeconfig={cluster.kubeconfig}", *args],
            input=stdin, text=True, capture_output=True, timeout=120,
        )  # fmt: skip

    applied = kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(crd))
    try:
        assert applied.returncode == 0, applied.stderr
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
        for _ in range(120):  # `kubectl wait` races with a CRD that has no conditions yet
            if kubectl("get", f"crd/{name}", "-o", f"jsonpath={jsonpath}").stdout == "True":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"CRD {name} never became Established")
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=true", f"crd/{name}")


def test_closed_kubernetes_value_sets_become_enums() -> None:
    pod = k8s_schema("io.k8s.api.core.v1.PodTemplateSpec")["properties"]["spec"]
    assert pod["properties"]["restartPolicy"]["enum"] == ["Always", "OnFailure", "Never"]
    container = pod["properties"]["containers"]["items"]
    assert container["properties"]["imagePullPolicy"]["enum"] == ["Always", "Never", "IfNotPresent"]
    # Open sets stay open: a sidecar's restartPolicy grows with new Kubernetes releases.
    assert "enum" not in container["properties"]["restartPolicy"]

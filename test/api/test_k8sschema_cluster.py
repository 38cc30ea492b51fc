"""The embedded pod template schema on the test kube-apiserver: a throwaway CRD embedding it installs,
keeps every pod field the apiserver serves, refuses a malformed template naming the field, and drives
server-side apply (containers merged by name)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pko.api.k8sschema import inline_definition, k8s_schema

from pko.devtools.crds import namespaced_crd
from pko.devtools.kubectl import kubectl
from pko.devtools.waiting import until

from .conftest import CORE, POD_TEMPLATE, RECENT_PATHS

GROUP = "schematest.pko.dev"
NAMESPACE = "default"


def _crd(kind: str, pod_template_schema: dict[str, Any]) -> dict[str, Any]:
    """A throwaway namespaced CRD whose spec.podTemplate is the given schema."""
    spec = {
        "type": "object",
        "properties": {"podTemplate": pod_template_schema, "serviceSpec": k8s_schema(CORE + "ServiceSpec")},
    }
    return namespaced_crd(GROUP, kind, spec)


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
    apply = ("apply", "--server-side", "--force-conflicts", "-f", "-")
    applied = kubectl(cluster, *apply, input=json.dumps(crd), check=False)
    try:
        assert applied.returncode == 0, applied.stderr
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
        # Polled: `kubectl wait` races with a CRD that has no conditions yet.
        established = ("get", f"crd/{name}", "-o", f"jsonpath={jsonpath}")
        until(
            f"CRD {name} Established",
            lambda: kubectl(cluster, *established, check=False).stdout == "True",
            within=60,
            interval=0.5,
        )
    finally:
        kubectl(cluster, "delete", "--ignore-not-found", "--wait=true", f"crd/{name}", check=False)

"""The StatefulSet and Service a Workspace becomes (pure: no cluster): the seed's customized workspace
field by field, security profiles and images, the pod template's merge rules, and the hashes that
decide when the pod rolls."""

from __future__ import annotations

import copy

import pytest

from pko.controllers.options import ControllerOptions
from pko.controllers.workspace.workloads import (
    AGENT_API,
    ANNOTATION_AGENT_API,
    ANNOTATION_APPLIED_DIGEST,
    ANNOTATION_REVISION_HASH,
    SpecInvalid,
    applied_digest,
    desired_service,
    immutable_fields_changed,
    parse_spec,
    pod_name,
    revision_hash,
)

from .builders import RESTRICTED_CAPS, build, by_name, env_of, pod_spec, seed_workspace, workspace

LABELS = {"auto.pulumi.com/component": "workspace", "auto.pulumi.com/workspace-name": "my-stack"}


# --- the seed's customized workspace, field by field ------------------------------------------


def test_seed_statefulset_metadata_selector_and_policy() -> None:
    sts = build(seed_workspace())
    assert sts["apiVersion"] == "apps/v1" and sts["kind"] == "StatefulSet"
    assert sts["metadata"]["name"] == "my-stack-workspace"
    assert sts["metadata"]["namespace"] == "ns1"
    assert sts["metadata"]["labels"] == LABELS
    assert sts["spec"]["selector"] == {"matchLabels": LABELS}
    assert sts["spec"]["serviceName"] == "my-stack-workspace"
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert pod_name("my-stack") == "my-stack-workspace-0"


def test_seed_pod_labels_merge_and_revision_annotation() -> None:
    ws = seed_workspace()
    meta = build(ws)["spec"]["template"]["metadata"]
    assert meta["labels"] == {**LABELS, "example.com/mylabel": "bar"}
    assert meta["annotations"] == {
        ANNOTATION_REVISION_HASH: revision_hash(ws["spec"]),
        ANNOTATION_AGENT_API: AGENT_API,
    }


def test_seed_pod_fields_override_and_add() -> None:
    spec = pod_spec(seed_workspace())
    assert spec["terminationGracePeriodSeconds"] == 3600
    assert spec["tolerations"] == [{"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["serviceAccountName"] == "default"
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
    }
    assert [v["name"] for v in spec["volumes"]] == ["share", "cache", "oidc-token"]
    assert by_name(spec["volumes"], "share") == {"name": "share", "emptyDir": {}}
    assert by_name(spec["volumes"], "cache") == {"name": "cache", "emptyDir": {}}
    token = by_name(spec["volumes"], "oidc-token")["projected"]["sources"][0]["serviceAccountToken"]
    assert token == {"audience": "urn:pulumi:org:ORG_NAME", "path": "token", "expirationSeconds": 3600}


def test_seed_init_containers_keep_bootstrap_first_and_add_extra() -> None:
    spec = pod_spec(seed_workspace())
    assert [c["name"] for c in spec["initContainers"]] == ["bootstrap", "extra"]
    bootstrap = spec["initContainers"][0]
    assert bootstrap["image"] == "example/agent:v1"
    assert bootstrap["imagePullPolicy"] == "Always"
    assert bootstrap["args"] == ["cp", "-r", "/agent", "/agent-lib", "/tini", "/share/"]
    assert bootstrap["volumeMounts"] == [{"name": "share", "mountPath": "/share"}]
    assert bootstrap["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": RESTRICTED_CAPS,
    }
    assert bootstrap["env"] == [{"name": "PULUMI_ENV", "value": "/share/.env"}]
    extra = spec["initContainers"][1]
    assert extra["image"] == "busybox"
    assert extra["command"] == ["sh", "-c", "echo 'Hello, extra init container!'"]
    assert extra["volumeMounts"] == [{"name": "share", "mountPath": "/share"}]
    assert extra["securityContext"]["capabilities"] == {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}
    # PULUMI_ENV is on every container, the template's ones included.
    assert extra["env"] == [{"name": "PULUMI_ENV", "value": "/share/.env"}]


def test_seed_pulumi_container() -> None:
    (pulumi,) = pod_spec(seed_workspace())["containers"]
    assert pulumi["name"] == "pulumi"
    assert pulumi["image"] == "example/pulumi-with-dependencies:v3.334"
    assert "imagePullPolicy" not in pulumi
    assert pulumi["workingDir"] == "/share/workspace"
    assert pulumi["command"] == [
        "/share/tini", "/share/agent", "--", "serve",
        "--workspace", "/share/workspace", "--skip-install", "--env-file", "/share/.env",
        "--auth-mode", "kube", "--kube-audience", "my-stack.ns1",
        "--kube-workspace-namespace", "ns1", "--kube-workspace-name", "my-stack",
        "--metrics-bind-address", ":8443",
    ]  # fmt: skip
    assert pulumi["ports"] == [
        {"name": "grpc", "containerPort": 50051, "protocol": "TCP"},
        {"name": "https-metrics", "containerPort": 8443, "protocol": "TCP"},
    ]
    # The template's volume mount is added to the operator's.
    assert pulumi["volumeMounts"] == [
        {"name": "share", "mountPath": "/share"},
        {"name": "cache", "mountPath": "/cache"},
        {"name": "oidc-token", "mountPath": "/var/run/secrets/pulumi"},
    ]
    env = env_of(pulumi)
    assert list(env) == [
        "POD_NAMESPACE",
        "POD_SA_NAME",
        "AGENT_MEMLIMIT",
        "GOCACHE",
        "GOMODCACHE",
        "PULUMI_ENV",
    ]
    assert env["GOCACHE"]["value"] == "/cache/go-build" and env["GOMODCACHE"]["value"] == "/cache/go-mod"
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_SA_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}
    assert env["AGENT_MEMLIMIT"]["valueFrom"] == {
        "resourceFieldRef": {"containerName": "pulumi", "resource": "requests.memory"}
    }
    assert env["PULUMI_ENV"] == {"name": "PULUMI_ENV", "value": "/share/.env"}
    assert pulumi["resources"] == {
        "requests": {"memory": "64Mi", "cpu": "100m", "ephemeral-storage": "1Gi"},
        "limits": {"ephemeral-storage": "4Gi"},
    }
    assert pulumi["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": RESTRICTED_CAPS}


def test_seed_service() -> None:
    ws = seed_workspace()
    svc = desired_service(ws, parse_spec(ws))
    assert svc["apiVersion"] == "v1" and svc["kind"] == "Service"
    assert svc["metadata"]["name"] == "my-stack-workspace"
    assert svc["metadata"]["labels"] == LABELS
    assert svc["spec"] == {
        "clusterIP": "None",
        "selector": LABELS,
        "ports": [{"name": "grpc", "port": 50051, "protocol": "TCP"}],
    }


# --- profiles, images, options --------------------------------------------------------------


def test_baseline_profile_has_no_user_or_capabilities() -> None:
    spec = pod_spec(workspace({"securityProfile": "baseline"}))
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    for container in [*spec["initContainers"], *spec["containers"]]:
        assert "securityContext" not in container
    assert spec["containers"][0]["image"] == "pulumi/pulumi:latest"
    assert spec["terminationGracePeriodSeconds"] == 600


def test_restricted_is_the_default_profile_and_image() -> None:
    spec = pod_spec(workspace({}))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["containers"][0]["image"] == "pulumi/pulumi:latest-nonroot"


def test_operator_default_image_is_used_when_the_spec_names_none() -> None:
    options = ControllerOptions(default_workspace_image="corp/pulumi:1")
    assert pod_spec(workspace({}), options)["containers"][0]["image"] == "corp/pulumi:1"
    spec = pod_spec(workspace({"image": "mine:2"}), options)
    assert spec["containers"][0]["image"] == "mine:2"


def test_spec_fields_reach_the_pulumi_container() -> None:
    ws = workspace(
        {
            "serviceAccountName": "deployer",
            "imagePullPolicy": "Never",
            "pulumiLogLevel": 3,
            "env": [{"name": "A", "value": "1"}, {"name": "POD_NAMESPACE", "value": "mine"}],
            "envFrom": [{"secretRef": {"name": "creds"}}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}},
        }
    )
    spec = pod_spec(ws)
    pulumi = spec["containers"][0]
    assert spec["serviceAccountName"] == "deployer"
    assert pulumi["imagePullPolicy"] == "Never"
    assert pulumi["command"][-2:] == ["--pulumi-log-level", "3"]
    env = env_of(pulumi)
    assert env["A"] == {"name": "A", "value": "1"}
    # The operator's downward-API value replaces a same-named entry: no duplicate names for apply.
    assert [e["name"] for e in pulumi["env"]].count("POD_NAMESPACE") == 1
    assert "fieldRef" in env["POD_NAMESPACE"]["valueFrom"]
    assert pulumi["envFrom"] == [{"secretRef": {"name": "creds"}}]
    assert pulumi["resources"] == {
        "requests": {"cpu": "2", "memory": "64Mi", "ephemeral-storage": "1Gi"},
        "limits": {"memory": "1Gi", "ephemeral-storage": "4Gi"},
    }


# --- merge rules ----------------------------------------------------------------------------


def test_template_overrides_operator_container_fields_and_env_by_name() -> None:
    ws = workspace(
        {
            "git": {"url": "https://git.example/r.git"},
            "podTemplate": {
                "metadata": {"annotations": {"a": "b"}},
                "spec": {
                    "nodeSelector": {"disk": "ssd"},
                    "initContainers": [{"name": "fetch", "env": [{"name": "GIT_URL", "value": "override"}]}],
                    "containers": [
                        {
                            "name": "pulumi",
                            "resources": {"limits": {"cpu": "1"}},
                            "env": [
                                {"name": "EXTRA", "value": "x"},
                                {"name": "PULUMI_ENV", "value": "/other"},
                            ],
                        },
                        {"name": "sidecar", "image": "side:1"},
                    ],
                    "volumes": [{"name": "share", "emptyDir": {"medium": "Memory"}}],
                },
            },
        }
    )
    spec = pod_spec(ws)
    assert spec["nodeSelector"] == {"disk": "ssd"}
    fetch = by_name(spec["initContainers"], "fetch")
    assert env_of(fetch)["GIT_URL"]["value"] == "override"
    assert fetch["image"] == "example/agent:v1"  # untouched fields are kept
    assert [c["name"] for c in spec["containers"]] == ["pulumi", "sidecar"]
    pulumi = by_name(spec["containers"], "pulumi")
    assert pulumi["resources"] == {
        "requests": {"memory": "64Mi", "cpu": "100m", "ephemeral-storage": "1Gi"},
        "limits": {"cpu": "1", "ephemeral-storage": "4Gi"},
    }
    names = [e["name"] for e in pulumi["env"]]
    assert names == [
        "POD_NAMESPACE",
        "POD_SA_NAME",
        "AGENT_MEMLIMIT",
        "GOCACHE",
        "GOMODCACHE",
        "EXTRA",
        "PULUMI_ENV",
    ]
    # As with the Go operator (which appends it last), the operator's PULUMI_ENV wins.
    assert env_of(pulumi)["PULUMI_ENV"]["value"] == "/share/.env"
    assert env_of(by_name(spec["containers"], "sidecar"))["PULUMI_ENV"]["value"] == "/share/.env"
    # Template containers get no security context from the profile (as in Go: merged after it).
    assert "securityContext" not in by_name(spec["containers"], "sidecar")
    assert by_name(spec["volumes"], "share") == {"name": "share", "emptyDir": {"medium": "Memory"}}
    template_meta = build(ws)["spec"]["template"]["metadata"]
    assert template_meta["annotations"]["a"] == "b"


def test_template_cannot_break_the_selector_or_the_revision_hash() -> None:
    ws = workspace(
        {
            "podTemplate": {
                "metadata": {
                    "labels": {"auto.pulumi.com/workspace-name": "other", "x": "y"},
                    "annotations": {ANNOTATION_REVISION_HASH: "mine", ANNOTATION_AGENT_API: "mine"},
                }
            }
        }
    )
    meta = build(ws)["spec"]["template"]["metadata"]
    assert meta["labels"] == {**LABELS, "x": "y"}
    assert meta["annotations"][ANNOTATION_REVISION_HASH] == revision_hash(ws["spec"])
    assert meta["annotations"][ANNOTATION_AGENT_API] == AGENT_API  # only pko's agent claims pko's API


def test_template_security_context_overrides_the_profile() -> None:
    ws = workspace({"podTemplate": {"spec": {"securityContext": {"runAsUser": 2000, "fsGroup": 3}}}})
    context = pod_spec(ws)["securityContext"]
    assert context["runAsUser"] == 2000 and context["fsGroup"] == 3 and context["runAsNonRoot"] is True


def test_service_template_metadata() -> None:
    ws = workspace(
        {
            "serviceTemplate": {
                "metadata": {
                    "labels": {"team": "a", "auto.pulumi.com/component": "nope"},
                    "annotations": {"svc/x": "1"},
                }
            }
        }
    )
    svc = desired_service(ws, parse_spec(ws))
    assert svc["metadata"]["labels"] == {**LABELS, "team": "a"}
    assert svc["metadata"]["annotations"]["svc/x"] == "1"
    assert svc["spec"]["selector"] == LABELS


# --- hashes and immutable fields --------------------------------------------------------------


def test_revision_hash_is_stable_and_order_independent() -> None:
    a = {"image": "x", "env": [{"name": "A", "value": "1"}], "stacks": [{"name": "dev"}]}
    b = {"stacks": [{"name": "dev"}], "env": [{"value": "1", "name": "A"}], "image": "x"}
    assert revision_hash(a) == revision_hash(b) == revision_hash(copy.deepcopy(a))
    assert revision_hash(a) != revision_hash({**a, "image": "pulumi/pulumi:other"})
    # Stacks reach the live agent (the reconciler re-initializes it): no new pod for them.
    assert revision_hash(a) == revision_hash({**a, "stacks": [{"name": "prod"}]})


def test_spec_change_changes_the_template_and_the_digest_only_then() -> None:
    ws = seed_workspace()
    first, again = build(ws), build(copy.deepcopy(ws))
    assert first == again
    assert first["metadata"]["annotations"][ANNOTATION_APPLIED_DIGEST] == applied_digest(first)
    changed = copy.deepcopy(ws)
    changed["spec"]["env"] = [{"name": "ROLL", "value": "1"}]
    rolled = build(changed)
    assert (
        rolled["spec"]["template"]["metadata"]["annotations"]
        != first["spec"]["template"]["metadata"]["annotations"]
    )
    assert rolled["metadata"]["annotations"] != first["metadata"]["annotations"]
    # Stacks reach the running agent: the same StatefulSet, no write, no new pod.
    restacked = copy.deepcopy(ws)
    restacked["spec"]["stacks"] = [{"name": "dev"}]
    assert build(restacked) == first
    bumped = copy.deepcopy(ws)
    bumped["metadata"]["generation"] = 7
    assert build(bumped) == first


def test_options_change_the_digest() -> None:
    ws = seed_workspace()
    other = ControllerOptions(agent_image="example/agent:v2")
    assert build(ws)["metadata"]["annotations"] != build(ws, other)["metadata"]["annotations"]


def test_immutable_fields() -> None:
    desired = build(seed_workspace())
    assert immutable_fields_changed(copy.deepcopy(desired), desired) == []
    current = copy.deepcopy(desired)
    current["spec"]["selector"] = {"matchLabels": {"app": "old"}}
    current["spec"]["serviceName"] = "old"
    current["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}}]
    assert immutable_fields_changed(current, desired) == ["selector", "serviceName", "volumeClaimTemplates"]


def test_invalid_spec_is_reported() -> None:
    with pytest.raises(SpecInvalid, match="securityProfile"):
        parse_spec(workspace({"securityProfile": "privileged"}))

"""The StatefulSet, Service and pod diagnosis of a Workspace (pure: no cluster)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pko.api.stack import Stack
from pko.api.workspace import WorkspaceSpec

from pko.controllers.options import ControllerOptions
from pko.controllers.stack.workspaceobject import ArtifactRevision, build_workspace
from pko.controllers.workspace.workloads import (
    AGENT_API,
    ANNOTATION_AGENT_API,
    ANNOTATION_APPLIED_DIGEST,
    ANNOTATION_REVISION_HASH,
    NODE_LOST_GRACE,
    OUT_OF_SERVICE_TAINT,
    NodeReading,
    SpecInvalid,
    applied_digest,
    desired_service,
    desired_statefulset,
    diagnose_node,
    diagnose_pod,
    immutable_fields_changed,
    parse_spec,
    pod_name,
    revision_hash,
)

from .builders import workspace

Obj = dict[str, Any]
SEED = Path(__file__).parents[1] / "data" / "seeds" / "000-my-stack-customized.yaml"
OPTIONS = ControllerOptions(agent_image="example/agent:v1", agent_image_pull_policy="Always")
LABELS = {"auto.pulumi.com/component": "workspace", "auto.pulumi.com/workspace-name": "my-stack"}
RESTRICTED_CAPS = {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}


def seed_workspace() -> Obj:
    stack = yaml.safe_load(SEED.read_text())
    return workspace(copy.deepcopy(stack["spec"]["workspaceTemplate"]["spec"]))


def build(ws: Obj, options: ControllerOptions = OPTIONS) -> Obj:
    return desired_statefulset(ws, parse_spec(ws), options)


def pod_spec(ws: Obj, options: ControllerOptions = OPTIONS) -> Obj:
    spec: Obj = build(ws, options)["spec"]["template"]["spec"]
    return spec


def by_name(items: list[Obj], name: str) -> Obj:
    (item,) = [i for i in items if i["name"] == name]
    return item


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


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
    ]  # fmt: skip
    assert pulumi["ports"] == [{"name": "grpc", "containerPort": 50051, "protocol": "TCP"}]
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


# --- sources ---------------------------------------------------------------------------------


def fetch_of(ws: Obj, options: ControllerOptions = OPTIONS) -> Obj:
    init = pod_spec(ws, options)["initContainers"]
    assert [c["name"] for c in init][:2] == ["bootstrap", "fetch"]
    fetch: Obj = init[1]
    assert fetch["image"] == "example/agent:v1"
    assert fetch["imagePullPolicy"] == "Always"
    assert fetch["volumeMounts"] == [{"name": "share", "mountPath": "/share"}]
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert env_of(fetch)["PULUMI_ENV"]["value"] == "/share/.env"
    return fetch


def test_no_source_no_fetch_container() -> None:
    assert [c["name"] for c in pod_spec(workspace({}))["initContainers"]] == ["bootstrap"]


def test_git_source_with_secret_references_only() -> None:
    secret = {"name": "git-creds", "key": "token"}
    app = {
        "appID": {"name": "app", "key": "id"},
        "installationID": {"name": "app", "key": "inst"},
        "privateKey": {"name": "app", "key": "pem"},
    }
    ws = workspace(
        {
            "git": {
                "url": "https://example.com/repo.git",
                "ref": "abc123",
                "dir": "infra",
                "shallow": True,
                "auth": {
                    "token": secret,
                    "username": {"name": "git-creds", "key": "user"},
                    "password": {"name": "git-creds", "key": "pw"},
                    "sshPrivateKey": {"name": "git-creds", "key": "ssh"},
                    "githubApp": app,
                },
            }
        }
    )
    fetch = fetch_of(ws)
    assert fetch["args"] == [
        "/share/agent",
        "init",
        "-t",
        "/share/source",
        "--workspace-dir",
        "/share/workspace",
    ]
    env = env_of(fetch)
    assert env["GIT_URL"]["value"] == "https://example.com/repo.git"
    assert env["GIT_REVISION"]["value"] == "abc123"
    assert env["GIT_DIR"]["value"] == "infra"
    assert env["GIT_SHALLOW"]["value"] == "true"
    assert env["GIT_TOKEN"]["valueFrom"] == {"secretKeyRef": secret}
    assert env["GIT_USERNAME"]["valueFrom"] == {"secretKeyRef": {"name": "git-creds", "key": "user"}}
    assert env["GIT_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "git-creds", "key": "pw"}}
    assert env["GIT_SSH_PRIVATE_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "git-creds", "key": "ssh"}}
    assert env["GIT_GITHUB_APP_ID"]["valueFrom"] == {"secretKeyRef": app["appID"]}
    assert env["GIT_GITHUB_APP_INSTALLATION_ID"]["valueFrom"] == {"secretKeyRef": app["installationID"]}
    assert env["GIT_GITHUB_APP_PRIVATE_KEY"]["valueFrom"] == {"secretKeyRef": app["privateKey"]}
    for var in fetch["env"]:
        if var["name"] not in ("GIT_URL", "GIT_REVISION", "GIT_DIR", "GIT_SHALLOW", "PULUMI_ENV"):
            assert "value" not in var, var


def test_the_fetch_container_takes_known_hosts_from_the_pod_template() -> None:
    """How a user trusts an SSH host for the fetch: env on the ``fetch`` init container through the
    pod template, merged by name into the operator's container (which keeps its own env)."""
    known = {"name": "SSH_KNOWN_HOSTS", "value": "/etc/pko/known_hosts"}
    mount = {"name": "known-hosts", "mountPath": "/etc/pko", "readOnly": True}
    ws = workspace(
        {
            "git": {"url": "git@git.example:org/repo.git", "ref": "abc123"},
            "podTemplate": {
                "spec": {
                    "initContainers": [{"name": "fetch", "env": [known], "volumeMounts": [mount]}],
                    "volumes": [{"name": "known-hosts", "configMap": {"name": "known-hosts"}}],
                }
            },
        }
    )
    spec = pod_spec(ws)
    fetch = next(c for c in spec["initContainers"] if c["name"] == "fetch")
    env = env_of(fetch)
    assert env["SSH_KNOWN_HOSTS"] == known and env["GIT_URL"]["value"] == "git@git.example:org/repo.git"
    assert (
        mount in fetch["volumeMounts"] and {"name": "share", "mountPath": "/share"} in fetch["volumeMounts"]
    )
    assert {"name": "known-hosts", "configMap": {"name": "known-hosts"}} in spec["volumes"]


def test_git_source_without_auth_or_shallow() -> None:
    env = env_of(fetch_of(workspace({"git": {"url": "https://h/r.git", "ref": "main"}})))
    assert set(env) == {"GIT_URL", "GIT_REVISION", "GIT_DIR", "PULUMI_ENV"}
    assert env["GIT_DIR"]["value"] == ""


def test_flux_source_and_untar_limit_from_options() -> None:
    ws = workspace({"flux": {"url": "http://src/a.tgz", "digest": "sha256:ff", "dir": "p"}})
    fetch = fetch_of(ws)
    assert fetch["args"] == [
        "/share/agent",
        "init",
        "-t",
        "/share/source",
        "--workspace-dir",
        "/share/workspace",
    ]
    env = env_of(fetch)
    assert (env["FLUX_URL"]["value"], env["FLUX_DIGEST"]["value"], env["FLUX_DIR"]["value"]) == (
        "http://src/a.tgz",
        "sha256:ff",
        "p",
    )
    assert "FLUX_MAX_UNTAR_SIZE_BYTES" not in env
    options = ControllerOptions(
        agent_image="example/agent:v1", agent_image_pull_policy="Always", flux_max_untar_size_bytes=1024
    )
    assert env_of(fetch_of(ws, options))["FLUX_MAX_UNTAR_SIZE_BYTES"]["value"] == "1024"


def test_local_source_links_the_directory() -> None:
    fetch = fetch_of(workspace({"local": {"dir": "/app/prog"}}))
    assert fetch["args"] == ["/bin/busybox", "ln", "-sfn", "/app/prog", "/share/workspace"]
    assert env_of(fetch)["LOCAL_DIR"]["value"] == "/app/prog"


def test_project_info_writes_a_minimal_project() -> None:
    fetch = fetch_of(workspace({"projectInfo": {"name": "proj", "runtime": "yaml"}}))
    assert fetch["args"] == ["/share/agent", "init", "-t", "/share/workspace"]
    env = env_of(fetch)
    assert env["PROJECT_NAME"]["value"] == "proj"
    assert env["PROJECT_RUNTIME"]["value"] == "yaml"


def test_restricted_profile_applies_to_fetch() -> None:
    fetch = fetch_of(workspace({"git": {"url": "https://git.example/r.git"}}))
    assert fetch["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": RESTRICTED_CAPS}


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


# --- ephemeral storage (issue 28) ---------------------------------------------------------------


def storage_of(ws: Obj) -> tuple[Any, Any]:
    """The pulumi container's ephemeral-storage (request, limit)."""
    resources = by_name(pod_spec(ws)["containers"], "pulumi")["resources"]
    return resources["requests"].get("ephemeral-storage"), resources["limits"].get("ephemeral-storage")


def test_the_pulumi_container_requests_and_is_limited_in_ephemeral_storage_by_default() -> None:
    spec = pod_spec(workspace({}))
    assert storage_of(workspace({})) == ("1Gi", "4Gi")
    # Only the container that runs the engine: the init containers copy and fetch, then exit.
    for container in spec["initContainers"]:
        assert "resources" not in container, container["name"]
    # The shared emptyDir has no sizeLimit of its own: the pod's limit counts it already.
    assert by_name(spec["volumes"], "share") == {"name": "share", "emptyDir": {}}


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # Either, or both, from spec.resources replaces the default; the other keeps its default.
        ({"requests": {"ephemeral-storage": "2Gi"}}, ("2Gi", "4Gi")),
        ({"limits": {"ephemeral-storage": "10Gi"}}, ("1Gi", "10Gi")),
        ({"requests": {"ephemeral-storage": "3G"}, "limits": {"ephemeral-storage": "20G"}}, ("3G", "20G")),
        # A default never crosses the user's figure (Kubernetes refuses a request above the limit).
        ({"limits": {"ephemeral-storage": "512Mi"}}, ("512Mi", "512Mi")),
        ({"requests": {"ephemeral-storage": "8Gi"}}, ("8Gi", "8Gi")),
        ({"requests": {"ephemeral-storage": "4Gi"}}, ("4Gi", "4Gi")),
        ({"limits": {"ephemeral-storage": "1Gi"}}, ("1Gi", "1Gi")),
        ({"limits": {"ephemeral-storage": "1073741824"}}, ("1Gi", "1073741824")),
        # Zero is "the default", as for the cpu and memory requests.
        ({"requests": {"ephemeral-storage": "0"}, "limits": {"ephemeral-storage": "0Gi"}}, ("1Gi", "4Gi")),
        # Not a quantity: left as written for the API server to refuse, and no default beside it.
        ({"limits": {"ephemeral-storage": "lots"}}, ("lots", "lots")),
        # Other resources do not count.
        ({"limits": {"memory": "100Mi"}}, ("1Gi", "4Gi")),
    ],
)
def test_spec_resources_override_the_ephemeral_storage_defaults(
    resources: Obj, expected: tuple[str, str]
) -> None:
    assert storage_of(workspace({"resources": resources})) == expected


def test_the_pod_template_overrides_the_ephemeral_storage_defaults() -> None:
    def template(resources: Obj) -> Obj:
        return {"podTemplate": {"spec": {"containers": [{"name": "pulumi", "resources": resources}]}}}

    assert storage_of(workspace(template({"limits": {"ephemeral-storage": "16Gi"}}))) == ("1Gi", "16Gi")
    # A request the template raises above the default limit carries the limit with it: the default
    # is applied to the merged container, never before the template could make it invalid.
    assert storage_of(workspace(template({"requests": {"ephemeral-storage": "6Gi"}}))) == ("6Gi", "6Gi")
    # spec.resources and the template together: the template's field wins, as for cpu and memory.
    both = workspace(
        {
            "resources": {"requests": {"ephemeral-storage": "2Gi"}, "limits": {"ephemeral-storage": "8Gi"}},
            **template({"limits": {"ephemeral-storage": "12Gi"}}),
        }
    )
    assert storage_of(both) == ("2Gi", "12Gi")
    # A sidecar the template adds gets no default: it is the user's container.
    sidecar = workspace({"podTemplate": {"spec": {"containers": [{"name": "sidecar", "image": "s:1"}]}}})
    assert "resources" not in by_name(pod_spec(sidecar)["containers"], "sidecar")


def test_the_stack_workspace_template_overrides_the_ephemeral_storage_defaults() -> None:
    def stack_workspace(template: Obj) -> Obj:
        stack = Stack.model_validate(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": "s", "namespace": "ns", "uid": "u-1", "generation": 1},
                "spec": {"stack": "dev", "programRef": {"name": "p"}, "workspaceTemplate": template},
            }
        )
        ws: Obj = build_workspace(stack, ArtifactRevision("http://a/p/1", "sha256:x", "1"))
        ws["metadata"]["uid"] = "ws-uid"
        return ws

    assert storage_of(stack_workspace({})) == ("1Gi", "4Gi")
    resources = {"spec": {"resources": {"requests": {"ephemeral-storage": "3Gi"}}}}
    assert storage_of(stack_workspace(resources)) == ("3Gi", "4Gi")
    pod = {"containers": [{"name": "pulumi", "resources": {"limits": {"ephemeral-storage": "9Gi"}}}]}
    assert storage_of(stack_workspace({"spec": {"podTemplate": {"spec": pod}}})) == ("1Gi", "9Gi")


def test_the_defaults_are_in_the_pod_template_not_the_workspace_spec() -> None:
    """Upgrading to an operator with these defaults rolls every workspace pod once (the StatefulSet's
    template, hence its controller-revision-hash, changes); the Workspace's revision hash does not
    (it hashes the Workspace spec, which the defaults do not touch)."""
    ws = seed_workspace()
    pod = build(ws)["spec"]["template"]
    assert pod["metadata"]["annotations"][ANNOTATION_REVISION_HASH] == revision_hash(ws["spec"])
    assert "ephemeral-storage" not in str(ws["spec"])


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


# --- pod diagnosis ----------------------------------------------------------------------------


def pod(status: Obj, **meta: Any) -> Obj:
    return {"metadata": {"name": "my-stack-workspace-0", **meta}, "status": status}


def test_ready_pod_has_no_problem() -> None:
    assert (
        diagnose_pod(pod({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})) is None
    )


def test_image_pull_failure_names_container_and_image() -> None:
    status = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "pulumi",
                "image": "nope:1",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}},
            }
        ],
    }
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "ImagePullFailed" and not found.stalled
    assert 'container "pulumi"' in found.message and '"nope:1"' in found.message


def test_init_image_pull_failure() -> None:
    status = {
        "initContainerStatuses": [
            {"name": "bootstrap", "image": "bad/agent", "state": {"waiting": {"reason": "InvalidImageName"}}}
        ]
    }
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "ImagePullFailed" and "init container" in found.message


def failing_init(restarts: int, logs: str) -> Obj:
    return {
        "initContainerStatuses": [
            {"name": "bootstrap", "state": {"terminated": {"exitCode": 0}}},
            {
                "name": "fetch",
                "restartCount": restarts,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": logs}},
            },
        ]
    }


def test_init_failure_carries_the_last_log_lines_and_stalls_after_repeats() -> None:
    logs = "\n".join(f"line {i}" for i in range(100)) + "\nrevision deadbeef not found in https://h/r.git\n"
    found = diagnose_pod(pod(failing_init(1, logs)))
    assert found is not None and found.reason == "InitContainerFailed" and not found.stalled
    assert 'init container "fetch" failed (exit code 1' in found.message
    assert found.message.endswith("revision deadbeef not found in https://h/r.git")
    assert "line 0\n" not in found.message
    stalled = diagnose_pod(pod(failing_init(3, logs)))
    assert stalled is not None and stalled.stalled


def test_running_init_container_is_waiting() -> None:
    status = {"initContainerStatuses": [{"name": "bootstrap", "state": {"running": {}}}]}
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "WaitingForReplicas" and "bootstrap" in found.message


def test_unschedulable() -> None:
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available",
            }
        ],
    }
    found = diagnose_pod(pod(status))
    assert found is not None and found.reason == "Unschedulable" and "0/1 nodes" in found.message


def test_crash_loop_and_config_error() -> None:
    crash = {
        "containerStatuses": [
            {
                "name": "pulumi",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 2, "message": "agent: bad flag"}},
            }
        ]
    }
    found = diagnose_pod(pod(crash))
    assert found is not None and found.reason == "CrashLoopBackOff" and "bad flag" in found.message
    config = {
        "containerStatuses": [
            {
                "name": "pulumi",
                "state": {
                    "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "x" not found'}
                },
            }
        ]
    }
    found = diagnose_pod(pod(config))
    assert found is not None and found.reason == "ContainerConfigError" and 'secret "x"' in found.message


def test_terminating_and_not_ready_pods_wait() -> None:
    found = diagnose_pod(pod({}, deletionTimestamp="2024-01-01T00:00:00Z"))
    assert found is not None and found.reason == "WaitingForReplicas" and "terminating" in found.message
    found = diagnose_pod(pod({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}))
    assert found is not None and found.reason == "WaitingForReplicas"


# --- stack initialization helpers (pure parts of the reconciler) -------------------------------


def test_config_items_and_json_detection() -> None:
    from pko.controllers.workspace.plan import _incompatible, has_json_config
    from pko.controllers.workspace.reconciler import config_items

    spec = parse_spec(
        workspace(
            {
                "stacks": [
                    {
                        "name": "dev",
                        "config": [
                            {"key": "s", "value": "text", "secret": True},
                            {"key": "n", "value": {"a": [1, True]}},
                            {"key": "e", "valueFrom": {"env": "X"}},
                            {"key": "p", "valueFrom": {"path": "/f", "json": True}, "path": False},
                        ],
                    }
                ]
            }
        )
    )
    items = config_items(spec.stacks[0])  # type: ignore[index]
    assert [i.key for i in items] == ["s", "n", "e", "p"]
    assert items[0].value is not None and items[0].value.to_dict() == "text" and items[0].secret is True
    assert items[1].value is not None and items[1].value.to_dict() == {"a": [1, True]}
    assert items[2].value_from is not None and items[2].value_from.env == "X"
    assert items[3].value_from is not None and items[3].value_from.path == "/f" and items[3].value_from.json
    assert has_json_config(spec)
    assert _incompatible(spec, "3.201.9") is not None
    assert _incompatible(spec, "v3.202.0") is None
    plain = parse_spec(workspace({"stacks": [{"name": "dev", "config": [{"key": "k", "value": "v"}]}]}))
    assert not has_json_config(plain) and _incompatible(plain, "3.0.0") is None


def test_path_keys_refuse_structured_values() -> None:
    from pko.controllers.workspace.reconciler import config_items

    body = workspace({"stacks": [{"name": "d", "config": [{"key": "a.b", "path": True, "value": [1]}]}]})
    with pytest.raises(SpecInvalid, match="a path key cannot take a structured value"):
        parse_spec(body)  # the Workspace stalls before any pod is made
    spec = WorkspaceSpec.model_validate(body["spec"])
    with pytest.raises(ValueError, match="path=true"):
        config_items(spec.stacks[0])  # type: ignore[index]  # and the config writer refuses it too


# --- reading the pod's node (issue 28) ----------------------------------------------------------

NODE_NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def node(ready: str, changed: str = "2026-11-28T11:58:00Z", taints: list[str] | None = None) -> Obj:
    """A Node as the API returns it: the node lifecycle controller's Ready condition and taints."""
    return {
        "metadata": {"name": "node-7"},
        "spec": {"taints": [{"key": k, "effect": "NoExecute"} for k in taints or []]},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "Unknown"},
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastTransitionTime": changed,
                },
            ]
        },
    }


def bound_pod() -> Obj:
    return {
        "metadata": {"name": "my-stack-workspace-0", "namespace": "ns1"},
        "spec": {"nodeName": "node-7"},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }


def test_a_node_reading_keeps_only_its_ready_condition_and_taint_keys() -> None:
    reading = NodeReading.of(node("Unknown", taints=["node.kubernetes.io/unreachable"]), NODE_NOW)
    assert reading.exists and reading.now == NODE_NOW
    assert reading.ready is not None and reading.ready["status"] == "Unknown"
    assert reading.taints == frozenset({"node.kubernetes.io/unreachable"})
    assert NodeReading.of(None, NODE_NOW) == NodeReading(NODE_NOW, exists=False)
    assert NodeReading.of({"metadata": {"name": "bare"}}, NODE_NOW) == NodeReading(NODE_NOW)


def test_diagnose_node_by_the_nodes_ready_condition_and_the_grace() -> None:
    pod = bound_pod()
    lost = diagnose_node(pod, NodeReading.of(node("Unknown"), NODE_NOW))
    assert lost is not None and (lost.reason, lost.stalled, lost.recheck_after) == ("NodeLost", True, None)
    assert "since 2026-11-28T11:58:00Z (Kubelet stopped posting node status.)" in lost.message
    assert (
        "kubectl taint nodes node-7 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in lost.message
    )
    early = diagnose_node(pod, NodeReading.of(node("Unknown"), NODE_NOW - timedelta(seconds=90)))
    assert early is not None and not early.stalled
    assert early.recheck_after == NODE_LOST_GRACE - 30.0
    assert early.message == lost.message
    not_ready = diagnose_node(pod, NodeReading.of(node("False"), NODE_NOW))
    assert not_ready is not None and (not_ready.reason, not_ready.stalled) == ("NodeNotReady", True)
    assert diagnose_node(pod, NodeReading.of(node("True"), NODE_NOW)) is None
    # No time on the condition: nothing to wait for.
    untimed = diagnose_node(pod, NodeReading.of(node("Unknown", changed=""), NODE_NOW))
    assert untimed is not None and untimed.stalled and "since an unknown time" in untimed.message
    gone = diagnose_node(pod, NodeReading.of(None, NODE_NOW))
    assert gone is not None and (gone.reason, gone.stalled) == ("NodeLost", False)
    assert "which no longer exists" in gone.message
    fenced = diagnose_node(pod, NodeReading.of(node("Unknown", taints=[OUT_OF_SERVICE_TAINT]), NODE_NOW))
    assert fenced is not None and not fenced.stalled and "marked out of service" in fenced.message

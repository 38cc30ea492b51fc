"""The Workspace a Stack owns and the Updates it creates, built from the spec as the Go operator does."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pko.api.stack import Stack
from pko.api.validation import parse_workspace

from pko.controllers.stack.updateobject import build_update, update_name, update_type_for
from pko.controllers.stack.workspaceobject import (
    ArtifactRevision,
    GitRevision,
    ProjectInfoRevision,
    build_workspace,
)
from pko.controllers.strategicmerge import strategic_merge

UID = "0b7a3c3e-1111-2222-3333-444455556666"


def stack(spec: dict[str, Any], name: str = "my-stack", **meta: Any) -> Stack:
    return Stack.model_validate(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "namespace": "ns", "uid": UID, "generation": 1, **meta},
            "spec": {"stack": "dev", **spec},
        }
    )


def pulumi_container(ws: dict[str, Any]) -> dict[str, Any]:
    containers = ws["spec"]["podTemplate"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "pulumi")


def test_workspace_is_named_labelled_and_controlled_by_the_stack() -> None:
    ws = build_workspace(
        stack({"programRef": {"name": "p"}}), ArtifactRevision("http://a/p/1", "sha256:x", "1")
    )
    assert ws["apiVersion"] == "auto.pulumi.com/v1alpha1" and ws["kind"] == "Workspace"
    assert ws["metadata"]["name"] == "my-stack" and ws["metadata"]["namespace"] == "ns"
    assert ws["metadata"]["labels"] == {"pulumi.com/component": "stack", "pulumi.com/stack-name": "my-stack"}
    assert ws["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "name": "my-stack",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert ws["spec"]["flux"] == {"url": "http://a/p/1", "digest": "sha256:x"}
    assert ws["spec"]["stacks"] == [{"name": "dev", "create": True}]
    ws_model, errors = parse_workspace(ws)
    assert ws_model is not None and errors == []


def test_git_source_pins_the_resolved_commit_and_maps_git_auth_to_secret_keys() -> None:
    s = stack(
        {
            "projectRepo": "https://example.com/repo.git",
            "branch": "main",
            "repoDir": "app",
            "shallow": True,
            "gitAuth": {
                "basicAuth": {
                    "userName": {"type": "Secret", "secret": {"name": "git", "key": "user"}},
                    "password": {"type": "Secret", "secret": {"name": "git", "key": "pass"}},
                },
                "accessToken": {"type": "Secret", "secret": {"name": "tok", "key": "t"}},
            },
        }
    )
    ws = build_workspace(s, GitRevision("https://example.com/repo.git", "abc123", "app", True))
    assert ws["spec"]["git"] == {
        "url": "https://example.com/repo.git",
        "ref": "abc123",
        "dir": "app",
        "shallow": True,
        "auth": {
            "username": {"name": "git", "key": "user"},
            "password": {"name": "git", "key": "pass"},
            "token": {"name": "tok", "key": "t"},
        },
    }


def test_deprecated_git_auth_secret_maps_every_key_as_optional() -> None:
    s = stack({"projectRepo": "https://e/r", "commit": "c" * 40, "gitAuthSecret": "creds"})
    auth = build_workspace(s, GitRevision("https://e/r", "c" * 40))["spec"]["git"]["auth"]
    assert auth == {
        "sshPrivateKey": {"name": "creds", "key": "sshPrivateKey", "optional": True},
        "password": {"name": "creds", "key": "password", "optional": True},
        "username": {"name": "creds", "key": "username", "optional": True},
        "token": {"name": "creds", "key": "accessToken", "optional": True},
    }


def test_env_backend_and_access_token_come_first_then_env_refs_sorted() -> None:
    s = stack(
        {
            "programRef": {"name": "p"},
            "backend": "file:///state",
            "accessTokenSecret": "tok",
            "envRefs": {
                "ZED": {"type": "Literal", "literal": {"value": "z"}},
                "AWS_KEY": {"type": "Secret", "secret": {"name": "aws", "key": "key"}},
                "REGION": {"type": "ConfigMap", "configMap": {"name": "settings", "key": "region"}},
            },
            "serviceAccountName": "pulumi",
        }
    )
    ws = build_workspace(s, None)
    assert ws["spec"]["serviceAccountName"] == "pulumi"
    assert ws["spec"]["env"] == [
        {"name": "PULUMI_BACKEND_URL", "value": "file:///state"},
        {"name": "PULUMI_ACCESS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "accessToken"}}},
        {"name": "AWS_KEY", "valueFrom": {"secretKeyRef": {"name": "aws", "key": "key"}}},
        {"name": "REGION", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "region"}}},
        {"name": "ZED", "value": "z"},
    ]


def test_config_items_in_upstream_order_with_secrets_and_configmaps_mounted_not_copied() -> None:
    s = stack(
        {
            "programRef": {"name": "p"},
            "config": {"b": {"nested": [1, 2]}, "a": "x", "n": 3},
            "configRef": {"fromcm": {"name": "cm", "key": "k", "json": True}},
            "secrets": {"inline": "s3cret"},
            "secretsRef": {
                "pw": {"type": "Secret", "secret": {"name": "creds", "key": "password"}},
                "pw2": {"type": "Secret", "secret": {"name": "creds", "key": "other"}},
                "lit": {"type": "Literal", "literal": {"value": "v"}},
            },
            "secretsProvider": "passphrase",
            "environment": ["org/env"],
            "useLocalStackOnly": True,
        }
    )
    ws = build_workspace(s, ArtifactRevision("u", "d", "1"))
    (wss,) = ws["spec"]["stacks"]
    assert wss["name"] == "dev" and wss["create"] is False
    assert wss["secretsProvider"] == "passphrase" and wss["environment"] == ["org/env"]
    assert wss["config"] == [
        {"key": "a", "value": "x", "secret": False},
        {"key": "b", "value": {"nested": [1, 2]}, "secret": False},
        {"key": "n", "value": 3, "secret": False},
        {
            "key": "fromcm",
            "valueFrom": {"path": "/var/run/configmaps/stacks.pulumi.com/configmaps/cm/k", "json": True},
            "secret": False,
        },
        {"key": "inline", "value": "s3cret", "secret": True},
        {"key": "lit", "value": "v", "secret": True},
        {
            "key": "pw",
            "valueFrom": {"path": "/var/run/secrets/stacks.pulumi.com/secrets/creds/password"},
            "secret": True,
        },
        {
            "key": "pw2",
            "valueFrom": {"path": "/var/run/secrets/stacks.pulumi.com/secrets/creds/other"},
            "secret": True,
        },
    ]
    pod = ws["spec"]["podTemplate"]["spec"]
    assert pod["volumes"] == [
        {"name": "configmap-cm", "configMap": {"name": "cm"}},
        {"name": "secret-creds", "secret": {"secretName": "creds"}},
    ]
    assert pulumi_container(ws)["volumeMounts"] == [
        {"name": "configmap-cm", "mountPath": "/var/run/configmaps/stacks.pulumi.com/configmaps/cm"},
        {"name": "secret-creds", "mountPath": "/var/run/secrets/stacks.pulumi.com/secrets/creds"},
    ]
    assert parse_workspace(ws)[1] == []


def test_secret_values_never_appear_in_the_workspace() -> None:
    s = stack(
        {
            "programRef": {"name": "p"},
            "envRefs": {"TOKEN": {"type": "Secret", "secret": {"name": "tok", "key": "value"}}},
            "secretsRef": {"pw": {"type": "Secret", "secret": {"name": "creds", "key": "password"}}},
        }
    )
    text = json.dumps(build_workspace(s, None))
    # Only names and keys: the operator never reads those Secrets to build the Workspace.
    assert "valueFrom" in text and '"value": "' not in text


def test_workspace_template_merges_containers_by_name_and_keeps_generated_mounts() -> None:
    s = stack(
        {
            "programRef": {"name": "p"},
            "secretsRef": {"pw": {"type": "Secret", "secret": {"name": "creds", "key": "password"}}},
            "workspaceTemplate": {
                "metadata": {"labels": {"team": "a"}, "name": "ignored"},
                "spec": {
                    "image": "example/pulumi:1",
                    "resources": {"requests": {"cpu": "1"}},
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {"name": "pulumi", "volumeMounts": [{"name": "oidc", "mountPath": "/oidc"}]},
                                {"name": "sidecar", "image": "busybox"},
                            ],
                            "volumes": [{"name": "oidc", "emptyDir": {}}],
                            "tolerations": [{"key": "k", "operator": "Exists"}],
                        }
                    },
                },
            },
        }
    )
    ws = build_workspace(s, None)
    assert ws["metadata"]["name"] == "my-stack"
    assert ws["metadata"]["labels"]["team"] == "a"
    assert ws["metadata"]["labels"]["pulumi.com/stack-name"] == "my-stack"
    assert ws["spec"]["image"] == "example/pulumi:1"
    pod = ws["spec"]["podTemplate"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["pulumi", "sidecar"]
    assert [m["name"] for m in pulumi_container(ws)["volumeMounts"]] == ["secret-creds", "oidc"]
    assert [v["name"] for v in pod["volumes"]] == ["secret-creds", "oidc"]
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists"}]


def test_deprecated_envs_and_env_secrets_become_env_from_after_the_template() -> None:
    s = stack(
        {
            "programRef": {"name": "p"},
            "envs": ["cm1"],
            "envSecrets": ["sec1"],
            "workspaceTemplate": {"spec": {"envFrom": [{"configMapRef": {"name": "tmpl"}}]}},
        }
    )
    assert build_workspace(s, None)["spec"]["envFrom"] == [
        {"configMapRef": {"name": "tmpl"}},
        {"configMapRef": {"name": "cm1"}},
        {"secretRef": {"name": "sec1"}},
    ]


def test_project_info_source_replaces_any_fetch_source() -> None:
    s = stack({"programRef": {"name": "p"}, "workspaceTemplate": {"spec": {"local": {"dir": "/x"}}}})
    ws = build_workspace(s, ProjectInfoRevision("proj", "yaml"))
    assert ws["spec"]["projectInfo"] == {"name": "proj", "runtime": "yaml"}
    assert "local" not in ws["spec"] and "flux" not in ws["spec"] and "git" not in ws["spec"]


def test_env_ref_of_a_refused_type_is_an_error() -> None:
    s = stack({"programRef": {"name": "p"}, "envRefs": {"X": {"type": "Env", "env": {"name": "HOME"}}}})
    with pytest.raises(ValueError, match="not supported"):
        build_workspace(s, None)


def test_strategic_merge_deletes_with_null_and_replaces_unkeyed_lists() -> None:
    base = {"a": {"b": 1, "c": 2}, "args": ["x"], "env": [{"name": "A", "value": "1"}]}
    patch = {
        "a": {"b": None},
        "args": ["y"],
        "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
    }
    assert strategic_merge(base, patch) == {
        "a": {"c": 2},
        "args": ["y"],
        "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
    }
    assert base["a"] == {"b": 1, "c": 2}


# --- Updates ---------------------------------------------------------------------------------

WS = {
    "apiVersion": "auto.pulumi.com/v1alpha1",
    "kind": "Workspace",
    "metadata": {"name": "my-stack", "namespace": "ns", "uid": "ws-uid"},
}
NOW = datetime(2024, 10, 17, 20, 41, 49, 123000, tzinfo=UTC)


def test_update_name_is_the_stack_name_and_hex_unix_millis() -> None:
    assert update_name("my-stack", NOW) == f"my-stack-{int(NOW.timestamp() * 1000):x}"
    assert update_name("s", datetime(2024, 1, 1, tzinfo=UTC)) == "s-18cc251f400"


def test_up_update_owner_references_finalizer_and_spec() -> None:
    s = stack({"programRef": {"name": "p"}, "targets": ["urn:a"], "targetDependents": True, "refresh": True})
    upd = build_update(s, WS, "up", "Initial stack update", now=NOW)
    meta = upd["metadata"]
    assert meta["name"] == update_name("my-stack", NOW) and meta["namespace"] == "ns"
    assert meta["labels"] == {"pulumi.com/component": "stack", "pulumi.com/stack-name": "my-stack"}
    assert meta["finalizers"] == ["finalizer.stack.pulumi.com"]
    ws_ref, stack_ref = meta["ownerReferences"]
    assert ws_ref == {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "name": "my-stack",
        "uid": "ws-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert stack_ref["kind"] == "Stack" and stack_ref["uid"] == UID
    assert stack_ref["controller"] is False and stack_ref["blockOwnerDeletion"] is True
    assert upd["spec"] == {
        "workspaceName": "my-stack",
        "stackName": "dev",
        "type": "up",
        "ttlAfterCompleted": "24h0m0s",
        "message": "Initial stack update",
        "target": ["urn:a"],
        "targetDependents": True,
        "refresh": True,
    }


def test_destroy_update_runs_program_only_when_asked() -> None:
    s = stack({"programRef": {"name": "p"}, "runProgram": True, "refresh": True})
    spec = build_update(s, WS, "destroy", "Stack marked for deletion", now=NOW)["spec"]
    assert spec["type"] == "destroy" and spec["runProgram"] is True and "refresh" not in spec


def test_update_template_merges_over_the_update_but_keeps_its_identity() -> None:
    s = stack(
        {
            "programRef": {"name": "p"},
            "updateTemplate": {
                "metadata": {"labels": {"x": "y"}},
                "spec": {"ttlAfterCompleted": "1h", "parallel": 2},
            },
        }
    )
    upd = build_update(s, WS, "up", "m", now=NOW)
    assert upd["spec"]["ttlAfterCompleted"] == "1h" and upd["spec"]["parallel"] == 2
    assert (
        upd["metadata"]["labels"]["x"] == "y"
        and upd["metadata"]["labels"]["pulumi.com/stack-name"] == "my-stack"
    )
    assert upd["metadata"]["finalizers"] == ["finalizer.stack.pulumi.com"]


def test_update_type_is_destroy_when_deleting_preview_for_preview_stacks() -> None:
    assert update_type_for(stack({"programRef": {"name": "p"}}), deleting=False) == "up"
    assert update_type_for(stack({"programRef": {"name": "p"}, "preview": True}), deleting=False) == "preview"
    assert update_type_for(stack({"programRef": {"name": "p"}, "preview": True}), deleting=True) == "destroy"


def test_a_workspace_built_for_a_destroy_never_creates_the_stack() -> None:
    """A destroy needs the state that is there: a stack created empty would be "destroyed" while
    the resources stay (issue 30)."""
    s = stack({"programRef": {"name": "p"}, "destroyOnFinalize": True})
    source = ArtifactRevision("http://a/p/1", "sha256:x", "1")
    assert build_workspace(s, source)["spec"]["stacks"] == [{"name": "dev", "create": True}]
    assert build_workspace(s, source, deleting=True)["spec"]["stacks"] == [{"name": "dev", "create": False}]
    saved = build_workspace(s, ProjectInfoRevision("proj", "yaml"))
    assert saved["spec"]["stacks"] == [{"name": "dev", "create": False}]

"""Complete objects (every field of the API set) shared by the model and cluster tests.

``test_models`` checks that these really set every model field, so "round-trips unpruned" in the
cluster test means every field of the CRD schema.
"""

from __future__ import annotations

import copy
from typing import Any


def full_stack(name: str = "full", namespace: str = "default") -> dict[str, Any]:
    """A Stack with every spec field set, bar the alternatives the CRD's rules make exclusive.

    Its source is git at a commit with gitAuth; ``stack_variants`` adds the other sources (git at a
    branch with gitAuthSecret, a Flux source, a Program), so that together they set every field.
    """
    ref_secret = {"type": "Secret", "secret": {"name": "git", "key": "token"}}
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "infra"}},
        "spec": {
            "accessTokenSecret": "pulumi-token",
            "envs": ["env-configmap"],
            "envRefs": {
                "LITERAL": {"type": "Literal", "literal": {"value": "v"}},
                "FROM_SECRET": {
                    "type": "Secret",
                    "secret": {"name": "s", "key": "k", "namespace": namespace},
                },
                "OLD_ENV": {"type": "Env", "env": {"name": "HOME"}},
                "OLD_FS": {"type": "FS", "filesystem": {"path": "/etc/hostname"}},
                "FROM_CONFIGMAP": {"type": "ConfigMap", "configMap": {"name": "settings", "key": "region"}},
            },
            "envSecrets": ["env-secret"],
            "backend": "s3://bucket",
            "stack": "org/project/dev",
            "config": {"aws:region": "us-east-1", "nested": {"a": [1, 2, {"b": True}]}, "n": 3},
            "secrets": {"password": "hunter2"},
            "configRef": {"fromMap": {"name": "cm", "key": "k", "json": True}},
            "secretsRef": {
                "apiKey": {"type": "Secret", "secret": {"name": "api", "key": "key"}},
                "literal": {"type": "Literal", "literal": {"value": "v"}},
                "oldEnv": {"type": "Env", "env": {"name": "HOME"}},
                "oldFs": {"type": "FS", "filesystem": {"path": "/etc/hostname"}},
            },
            "secretsProvider": "awskms:///arn:aws:kms:us-east-1:111122223333:key/abcd",
            "projectRepo": "https://github.com/pulumi/examples",
            "gitAuth": {
                "accessToken": ref_secret,
                "sshAuth": {"sshPrivateKey": ref_secret, "password": ref_secret},
                "basicAuth": {"userName": ref_secret, "password": ref_secret},
                "githubApp": {"appID": ref_secret, "installationID": ref_secret, "privateKey": ref_secret},
            },
            "repoDir": "random-yaml/",
            "commit": "2b0889718d3e63feeb6079ccd5e4488d8601e353",
            "shallow": True,
            "targets": ["urn:pulumi:dev::project::aws:s3/bucket:Bucket::b"],
            "targetDependents": True,
            "prerequisites": [{"name": "network", "requirement": {"succeededWithinDuration": "1h30m"}}],
            "continueResyncOnCommitMatch": True,
            "refresh": True,
            "expectNoRefreshChanges": True,
            "initOnCreate": True,
            "destroyOnFinalize": True,
            "runProgram": True,
            "retryOnUpdateConflict": True,
            "useLocalStackOnly": True,
            "approval": {"mode": "OnDestructive"},
            "driftDetection": {"intervalSeconds": 600, "remediate": True},
            "policyPacks": [
                {
                    "name": "platform",
                    "path": "/opt/policy/platform",
                    "config": {"no-public-services": "mandatory", "cost-centre": {"label": "team"}},
                },
                {
                    "name": "shared",
                    "path": "packs/shared",
                    "git": {
                        "url": "https://github.com/example/policies",
                        "branch": "main",
                        "auth": _GIT_AUTH,
                    },
                },
                {"name": "pinned", "git": {"url": "https://github.com/example/policies", "commit": "abc123"}},
                {
                    "name": "fluxed",
                    "fluxSource": {
                        "sourceRef": {
                            "apiVersion": "source.toolkit.fluxcd.io/v1",
                            "kind": "GitRepository",
                            "name": "p",
                        },
                        "dir": "packs/fluxed",
                    },
                },
            ],
            "outputs": {"name": "app-outputs", "kind": "ConfigMap"},
            "resyncFrequencySeconds": 300,
            "serviceAccountName": "pulumi",
            "workspaceTemplateRef": {"name": "team-defaults", "namespace": namespace},
            "workspaceTemplate": {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "Workspace",
                "metadata": {"labels": {"a": "b"}, "annotations": {"c": "d"}},
                "spec": {
                    "image": "example/pulumi-with-dependencies:v3.134",
                    "imagePullPolicy": "IfNotPresent",
                    "securityProfile": "baseline",
                    "env": [{"name": "EXTRA", "value": "1"}],
                    "envFrom": [{"secretRef": {"name": "more-env"}}],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                    "pulumiLogLevel": 3,
                    "local": {"dir": "/home/pulumi/project"},
                    "serviceTemplate": {"metadata": {"annotations": {"svc": "x"}}},
                    "stacks": [{"name": "org/project/dev", "environment": ["env1"]}],
                    "podTemplate": {
                        "metadata": {"labels": {"example.com/mylabel": "bar"}},
                        "spec": {
                            "terminationGracePeriodSeconds": 3600,
                            "tolerations": [
                                {"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"}
                            ],
                            "initContainers": [
                                {
                                    "name": "extra",
                                    "image": "busybox",
                                    "command": ["sh", "-c", "echo hello"],
                                    "restartPolicy": "Always",
                                    "securityContext": {
                                        "allowPrivilegeEscalation": False,
                                        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                                    },
                                    "volumeMounts": [{"name": "share", "mountPath": "/share"}],
                                }
                            ],
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "volumeMounts": [
                                        {"name": "oidc-token", "mountPath": "/var/run/secrets/pulumi"}
                                    ],
                                }
                            ],
                            "volumes": [
                                {
                                    "name": "oidc-token",
                                    "projected": {
                                        "sources": [
                                            {
                                                "serviceAccountToken": {
                                                    "audience": "urn:pulumi:org:ORG_NAME",
                                                    "path": "token",
                                                    "expirationSeconds": 3600,
                                                }
                                            }
                                        ]
                                    },
                                }
                            ],
                        },
                    },
                },
            },
            "workspaceReclaimPolicy": "Delete",
            "environment": ["org/project/env"],
            "updateTemplate": {
                "metadata": {"labels": {"kept": "yes"}},
                "spec": {"ttlAfterCompleted": "1h", "parallel": 4, "message": "from template"},
            },
            "retryMaxBackoffDurationSeconds": 600,
            "preview": True,
            "suspend": True,
            "maxUpdateFailures": 5,
            "retryPolicy": {
                "transient": {"baseSeconds": 2, "factor": 1.5, "maxSeconds": 120, "jitter": 0.25},
                "deterministic": {"baseSeconds": 30, "factor": 2.5},
            },
        },
    }


STACK_GIT_FIELDS = ("projectRepo", "gitAuthSecret", "gitAuth", "repoDir", "commit", "branch", "shallow")


def stack_variants(name: str = "full", namespace: str = "default") -> dict[str, dict[str, Any]]:
    """``full_stack`` and the same Stack with each other source: together they set every field."""
    base = full_stack(name, namespace)

    def variant(**source: Any) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        for field in STACK_GIT_FIELDS:
            obj["spec"].pop(field, None)
        obj["spec"].update(shallow=False, **source)  # the model writes its default back
        return obj

    flux = {
        "sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "repo"},
        "dir": "basic/",
    }
    return {
        "git-commit": base,
        "git-branch": variant(
            projectRepo="https://github.com/pulumi/examples",
            branch="refs/heads/master",
            gitAuthSecret="git-credentials",
            repoDir="random-yaml/",
        ),
        "flux": variant(fluxSource=flux),
        "program": variant(programRef={"name": "staticwebsite"}),
    }


def full_stack_status() -> dict[str, Any]:
    """A Stack status with every field set."""
    return {
        "observedGeneration": 2,
        "observedReconcileRequest": "2024-10-17T20:41:00Z",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "ProcessingCompleted",
                "message": "the stack has been processed and is up to date",
                "lastTransitionTime": "2024-10-17T20:41:49Z",
                "observedGeneration": 2,
            }
        ],
        "outputs": {"password": "[secret]", "count": 3, "obj": {"a": ["b"]}},
        "lastUpdate": {
            "generation": 2,
            "reconcileRequest": "2024-10-17T20:41:00Z",
            "name": "random-yaml-sjpw5hm8",
            "type": "up",
            "state": "succeeded",
            "message": "ok",
            "lastAttemptedCommit": "sha256:44d554df",
            "lastSuccessfulCommit": "sha256:44d554df",
            "policyPacksDigest": "sha256:" + "ef" * 32,
            "permalink": "https://app.pulumi.com/org/random/dev/updates/3",
            "lastResyncTime": "2024-10-17T20:41:49Z",
            "failures": 0,
        },
        "currentUpdate": {
            "generation": 3,
            "reconcileRequest": "r",
            "name": "random-yaml-abc",
            "commit": "abc",
            "kind": "apply",
            "cancelRequest": "c1",
            "policyPacksDigest": "sha256:" + "ef" * 32,
        },
        "plan": {
            "digest": "sha256:" + "ab" * 32,
            "update": "random-yaml-18f",
            "summary": {"create": 1, "update": 2, "delete": 0, "replace": 1},
            "time": "2024-10-17T20:40:00Z",
            "inputs": "sha256:" + "cd" * 32,
            "commit": "abc",
        },
        "drift": {
            "lastCheckTime": "2024-10-17T20:45:00Z",
            "detected": True,
            "resources": [
                {
                    "urn": "urn:pulumi:dev::random::kubernetes:core/v1:ConfigMap::cm",
                    "type": "kubernetes:core/v1:ConfigMap",
                    "paths": ["data.greeting"],
                    "firstSeen": "2024-10-17T20:44:00Z",
                }
            ],
            "count": 1,
            "truncated": False,
            "message": "the last check failed",
        },
        "observedRefreshRequest": "r1",
        "lastRefresh": {
            "name": "random-yaml-r2",
            "token": "r2",
            "state": "failed",
            "message": "the agent stopped before the operation finished",
            "reason": "Transient",
            "failures": 1,
            "lastResyncTime": "2024-10-17T20:50:00Z",
        },
        "observedCancelRequest": "c1",
        "projectInfo": {"name": "random", "runtime": "yaml"},
        "nextRetryTime": "2024-10-17T21:00:00Z",
        "lastFailure": {
            "reason": "StackLocked",
            "message": "the stack is locked by alice@host (pid 42)",
            "transient": True,
            "updateName": "random-yaml-abc",
            "countedFailures": 1,
            "lockOwner": "alice@host (pid 42)",
            "pendingOperations": ["urn:pulumi:dev::random::random:index:RandomPet::a"],
        },
        "resourceCount": 3,
    }


def full_workspace(name: str = "full", namespace: str = "default") -> dict[str, Any]:
    """A Workspace with every spec field set."""
    selector = {"name": "git", "key": "k"}
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceAccountName": "pulumi",
            "securityProfile": "baseline",
            "image": "pulumi/pulumi:3.134.1",
            "imagePullPolicy": "Always",
            "git": {
                "url": "https://github.com/pulumi/examples",
                "ref": "master",
                "dir": "random-yaml",
                "shallow": True,
                "auth": {
                    "sshPrivateKey": selector,
                    "username": selector,
                    "password": selector,
                    "token": selector,
                    "githubApp": {"appID": selector, "installationID": selector, "privateKey": selector},
                },
            },
            "flux": {"url": "http://source-controller/a.tar.gz", "digest": "sha256:abc", "dir": "d"},
            "local": {"dir": "/src"},
            "projectInfo": {"name": "p", "runtime": "yaml"},
            "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "X_"}],
            "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"secretKeyRef": selector}}],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            "podTemplate": {
                "metadata": {"labels": {"l": "v"}, "annotations": {"a": "b"}},
                "spec": {"containers": [{"name": "pulumi"}]},
            },
            "serviceTemplate": {"metadata": {"labels": {"l": "v"}, "annotations": {"a": "b"}}},
            "pulumiLogLevel": 9,
            "stacks": [
                {
                    "name": "dev",
                    "create": True,
                    "secretsProvider": "passphrase",
                    "environment": ["e"],
                    "config": [
                        {"key": "a", "value": "x", "secret": False},
                        {"key": "b.c", "path": True, "value": 3},
                        {"key": "d", "value": {"structured": [1, 2]}},
                        {"key": "e", "valueFrom": {"env": "E"}},
                        {"key": "f", "valueFrom": {"path": "/p", "json": True}, "secret": True},
                    ],
                }
            ],
            "policyPackSources": [
                {
                    "name": "shared",
                    "git": {
                        "url": "https://github.com/example/policies",
                        "ref": "abc123",
                        "dir": "packs/shared",
                    },
                },
                {
                    "name": "fluxed",
                    "flux": {
                        "url": "http://source-controller/p.tar.gz",
                        "digest": "sha256:abc",
                        "dir": "packs/fluxed",
                    },
                },
            ],
        },
    }


def full_workspace_status() -> dict[str, Any]:
    return {
        "observedGeneration": 1,
        "address": "full-workspace.default:50051",
        "pulumiVersion": "3.202.0",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "WaitingForReplicas",
                "message": "Waiting for the workspace pod to be available",
                "lastTransitionTime": "2024-10-17T20:41:49Z",
                "observedGeneration": 1,
            }
        ],
    }


_SECRET_KEY = {"name": "git", "key": "token"}
_GIT_AUTH = {
    "sshPrivateKey": _SECRET_KEY,
    "username": _SECRET_KEY,
    "password": _SECRET_KEY,
    "token": _SECRET_KEY,
    "githubApp": {"appID": _SECRET_KEY, "installationID": _SECRET_KEY, "privateKey": _SECRET_KEY},
}


def full_update(name: str = "full", namespace: str = "default") -> dict[str, Any]:
    """An Update with every spec field set."""
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "workspaceName": "ws",
            "stackName": "dev",
            "type": "destroy",
            "ttlAfterCompleted": "24h",
            "parallel": 8,
            "message": "m",
            "expectNoChanges": False,
            "replace": ["urn:a"],
            "target": ["urn:b"],
            "targetDependents": True,
            "refresh": True,
            "continueOnError": True,
            "remove": True,
            "runProgram": True,
            "savePlan": True,
            "plan": "full-preview",
            "previewOnly": True,
            "policyPacks": [
                {"name": "platform", "path": "policies/platform", "config": {"p": "advisory"}},
                {
                    "name": "pinned",
                    "path": "packs/shared",
                    "git": {"url": "https://g/p.git", "commit": "abc123"},
                },
                {"name": "followed", "git": {"url": "https://g/p.git", "branch": "main", "auth": _GIT_AUTH}},
                {
                    "name": "fluxed",
                    "fluxSource": {
                        "sourceRef": {
                            "apiVersion": "source.toolkit.fluxcd.io/v1",
                            "kind": "Bucket",
                            "name": "p",
                        },
                        "dir": "packs",
                    },
                },
            ],
        },
    }


def full_update_status() -> dict[str, Any]:
    return {
        "observedGeneration": 1,
        "startTime": "2024-10-17T20:40:00Z",
        "endTime": "2024-10-17T20:41:00Z",
        "permalink": "https://app.pulumi.com/o/p/dev/updates/1",
        "message": "done",
        "outputs": "full-stack-outputs",
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "Updated",
                "message": "update completed",
                "lastTransitionTime": "2024-10-17T20:41:00Z",
                "observedGeneration": 1,
            }
        ],
        "projectInfo": {"name": "p", "runtime": "yaml"},
        "resourceChanges": {"create": 2, "same": 1},
        "changes": [
            {
                "urn": "urn:pulumi:dev::p::kubernetes:apps/v1:Deployment::web",
                "type": "kubernetes:apps/v1:Deployment",
                "op": "update",
                "paths": ["spec.replicas", 'metadata.annotations["pulumi.com/skipAwait"]'],
            },
            {
                "urn": "urn:pulumi:dev::p::kubernetes:core/v1:ConfigMap::old",
                "type": "kubernetes:core/v1:ConfigMap",
                "op": "delete",
            },
        ],
        "changeCount": 2,
        "changesTruncated": False,
        "changeSummary": {"create": 0, "update": 1, "delete": 1, "replace": 0},
        "pendingOperations": [
            {"urn": "urn:pulumi:dev::p::command:local:Command::slow", "type": "creating"},
        ],
        "clearedPendingOperations": [
            {"urn": "urn:pulumi:dev::p::command:local:Command::step2", "type": "creating"},
        ],
        "policyViolations": [
            {
                "policyPack": "platform",
                "policyPackVersion": "1.0.0",
                "policy": "no-public-services",
                "enforcementLevel": "mandatory",
                "urn": "urn:pulumi:dev::p::kubernetes:core/v1:Service::web",
                "message": "No public LoadBalancer.\nthis Service is a LoadBalancer",
            }
        ],
        "policyViolationCount": 1,
    }


def full_program(name: str = "full", namespace: str = "default") -> dict[str, Any]:
    """A Program with every field of its body set."""
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": name, "namespace": namespace},
        "program": {
            "configuration": {"size": {"type": "Number", "default": 3}, "names": {"type": "List<String>"}},
            "resources": {
                "bucket": {
                    "type": "aws:s3:Bucket",
                    "properties": {"website": {"indexDocument": "index.html"}},
                    "options": {
                        "additionalSecretOutputs": ["arn"],
                        "aliases": ["old"],
                        "customTimeouts": {"create": "5m", "delete": "5m", "update": "5m"},
                        "deleteBeforeReplace": True,
                        "dependsOn": ["${other}"],
                        "ignoreChanges": ["tags"],
                        "import": "bucket-id",
                        "parent": "${parent}",
                        "protect": True,
                        "provider": "${provider}",
                        "providers": {"aws": "${provider}"},
                        "version": "6.0.0",
                    },
                },
                "existing": {"type": "aws:s3:Bucket", "get": {"id": "b-123", "state": {"bucket": "b"}}},
            },
            "variables": {"v": {"fn::invoke": {"function": "aws:index:getRegion"}}},
            "outputs": {"url": "http://${bucket.websiteEndpoint}"},
            "packages": {"random": "github.com/pulumi/pulumi-random@v4"},
        },
    }


def full_program_status() -> dict[str, Any]:
    return {
        "observedGeneration": 1,
        "artifact": {
            "path": "programs/default/full/1.tar.gz",
            "url": "http://pko.pulumi-kubernetes-operator:9090/programs/default/full/1",
            "revision": "1",
            "digest": "sha256:0123abcd",
            "lastUpdateTime": "2024-10-17T20:41:49Z",
            "size": 1024,
            "metadata": {"k": "v"},
        },
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "ArtifactReady",
                "message": "artifact for generation 1 is available",
                "lastTransitionTime": "2024-10-17T20:41:49Z",
                "observedGeneration": 1,
            }
        ],
    }

"""Stacks, Updates and Workspaces with statuses, as the operator writes them, for the plugin's tests.

Shared by the pure tests and the apiserver tests (which create them): one place that knows the
status shapes (docs/stacks.md: Status and conditions; ``pko.controllers.stack.status``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pko.devtools.stacks import stack as build_stack

Obj = dict[str, Any]

NOW = datetime(2025, 1, 20, 10, 45, 0, tzinfo=UTC)
EARLIER = "2025-01-20T10:40:00Z"  # 5m before NOW
SECRET_WIRE = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": "hunter2"}


def cond(type_: str, status: str, reason: str, message: str = "", generation: int = 1) -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": EARLIER,
        "observedGeneration": generation,
    }


def stack(name: str = "web", namespace: str = "ns", *, status: Obj | None = None, **spec: Any) -> Obj:
    return build_stack(
        name,
        namespace,
        status=status,
        meta={"generation": 1},
        **{"stack": "dev", "programRef": {"name": name}, **spec},
    )


def ready_status(update: str = "web-1") -> Obj:
    return {
        "observedGeneration": 1,
        "conditions": [
            cond("Ready", "True", "ProcessingCompleted", "the stack has been processed and is up to date")
        ],
        "lastUpdate": {
            "name": update,
            "type": "up",
            "state": "succeeded",
            "generation": 1,
            "failures": 0,
            "lastResyncTime": EARLIER,
            "permalink": "file:///state/web",
        },
        "outputs": {"petName": "calm-dog", "password": "[secret]"},
        "resourceCount": 3,
    }


def stalled_status(reason: str = "SourceUnavailable", message: str = "branch 'main' not found") -> Obj:
    return {
        "observedGeneration": 1,
        "conditions": [
            cond("Ready", "False", "NotReadyStalled", "reconciliation is stalled"),
            cond("Stalled", "True", reason, message),
        ],
    }


def retrying_status(update: str = "web-2", reason: str = "ProgramError") -> Obj:
    return {
        "observedGeneration": 1,
        "conditions": [
            cond("Ready", "False", "NotReadyInProgress", "reconciliation is in progress"),
            cond("Reconciling", "True", "RetryingAfterFailure", "1 update failure(s)"),
        ],
        "lastUpdate": {
            "name": update,
            "type": "up",
            "state": "failed",
            "generation": 1,
            "failures": 1,
            "lastResyncTime": EARLIER,
            "message": "error: program failed",
        },
        "lastFailure": {
            "reason": reason,
            "message": "error: program failed",
            "transient": False,
            "updateName": update,
            "countedFailures": 2,
        },
        "nextRetryTime": "2025-01-20T10:46:30Z",
    }


def update(
    name: str = "web-2",
    namespace: str = "ns",
    *,
    failed: str | None = "ProgramError",
    message: str = "Updating (dev):\n  pulumi:pulumi:Stack web-dev  **failed**\nerror: program failed",
    running: bool = False,
    uid: str | None = None,
) -> Obj:
    if running:
        conditions = [cond("Progressing", "True", "Progressing"), cond("Complete", "False", "Progressing")]
    elif failed:
        conditions = [
            cond("Progressing", "False", "Failed"),
            cond("Complete", "True", "Failed"),
            cond("Failed", "True", failed, message),
        ]
    else:
        conditions = [cond("Progressing", "False", "Complete"), cond("Complete", "True", "Updated")]
    obj: Obj = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"workspaceName": "web", "stackName": "dev", "type": "up"},
        "status": {
            "startTime": EARLIER,
            "message": "" if running else message,
            "conditions": conditions,
            "resourceChanges": {"create": 2, "same": 1},
        },
    }
    if uid:
        obj["metadata"]["uid"] = uid
    return obj


def workspace(
    name: str = "web", namespace: str = "ns", *, reason: str = "Succeeded", message: str = ""
) -> Obj:
    ready = "True" if reason == "Succeeded" else "False"
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"image": "pulumi/pulumi:latest-nonroot"},
        "status": {"conditions": [cond("Ready", ready, reason, message)]},
    }


DIGEST = "sha256:" + "ab12" * 16


def plan(digest: str = DIGEST, update: str = "web-preview-1") -> Obj:
    return {
        "digest": digest,
        "update": update,
        "summary": {"create": 1, "update": 2, "delete": 0, "replace": 1},
        "time": EARLIER,
        "inputs": "sha256:inputs",
        "commit": "abc123",
    }


def awaiting_status(digest: str = DIGEST, update: str = "web-preview-1") -> Obj:
    """Ready=False AwaitingApproval with the plan recorded, as pko.controllers.stack.approval writes it
    (Reconciling and Stalled removed)."""
    message = (
        f"plan {digest} (1 to create, 2 to update, 0 to delete, 1 to replace) from preview {update} "
        f"awaits approval: kubectl annotate stack web -n ns --overwrite pulumi.com/approved-plan={digest}"
    )
    return {
        "observedGeneration": 1,
        "conditions": [cond("Ready", "False", "AwaitingApproval", message)],
        "plan": plan(digest, update),
    }


def drift_status() -> Obj:
    """Ready, with the last drift check finding two resources changed."""
    status = ready_status()
    status["conditions"].append(cond("Drifted", "True", "DriftDetected", "2 resources drifted"))
    status["drift"] = {
        "lastCheckTime": EARLIER,
        "detected": True,
        "resources": [
            {
                "urn": "urn:pulumi:dev::web::kubernetes:apps/v1:Deployment::web",
                "type": "kubernetes:apps/v1:Deployment",
                "paths": ["spec.replicas", "spec.template.spec.containers[0].image"],
                "firstSeen": "2025-01-20T09:45:00Z",
            },
            {
                "urn": "urn:pulumi:dev::web::kubernetes:core/v1:ConfigMap::page",
                "type": "kubernetes:core/v1:ConfigMap",
                "firstSeen": EARLIER,
            },
        ],
    }
    return status


def preview(name: str = "web-preview-1", namespace: str = "ns") -> Obj:
    """The succeeded savePlan preview Update of a plan, with the change set the agent reported."""
    obj = update(name, namespace, failed=None)
    obj["spec"].update(type="preview", savePlan=True)
    obj["status"]["changes"] = [
        {  # the engine's own rows, which neither the operator's summary nor `approve` counts
            "urn": "urn:pulumi:dev::web::pulumi:pulumi:Stack::web-dev",
            "type": "pulumi:pulumi:Stack",
            "op": "update",
        },
        {
            "urn": "urn:pulumi:dev::web::pulumi:providers:random::default_4_21_1",
            "type": "pulumi:providers:random",
            "op": "create",
        },
        {
            "urn": "urn:pulumi:dev::web::random:index/randomPet:RandomPet::pet",
            "type": "random:index/randomPet:RandomPet",
            "op": "create",
        },
        {
            "urn": "urn:pulumi:dev::web::kubernetes:apps/v1:Deployment::web",
            "type": "kubernetes:apps/v1:Deployment",
            "op": "update",
            "paths": ["spec.replicas"],
        },
        {
            "urn": "urn:pulumi:dev::web::kubernetes:core/v1:ConfigMap::page",
            "type": "kubernetes:core/v1:ConfigMap",
            "op": "update",
            "paths": ["data.index.html"],
        },
        {
            "urn": "urn:pulumi:dev::web::kubernetes:core/v1:Service::web",
            "type": "kubernetes:core/v1:Service",
            "op": "create-replacement",
            "paths": ["spec.clusterIP"],
        },
        {
            "urn": "urn:pulumi:dev::web::kubernetes:core/v1:Service::web",
            "type": "kubernetes:core/v1:Service",
            "op": "delete-replaced",
        },
        {
            "urn": "urn:pulumi:dev::web::kubernetes:core/v1:Secret::ref",
            "type": "kubernetes:core/v1:Secret",
            "op": "read",
        },
    ]
    return obj

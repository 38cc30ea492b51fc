"""Cluster identities for tests: ServiceAccounts, their tokens, and the RBAC a workspace's agent and
its callers need."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from .runtime import Obj


async def create_service_account(api: client.ApiClient, namespace: str, name: str) -> None:
    """Create a ServiceAccount (an existing one is fine)."""
    try:
        body: Any = {"metadata": {"name": name}}
        await client.CoreV1Api(api).create_namespaced_service_account(namespace, body, _preload_content=False)
    except ApiException as exc:
        if exc.status != 409:
            raise


async def mint_token(
    api: client.ApiClient,
    namespace: str,
    service_account: str,
    audience: str | None = None,
    expiration: int = 3600,
) -> str:
    """A TokenRequest token for ``service_account`` (``audience`` None: the apiserver's)."""
    spec: Obj = {"expirationSeconds": expiration}
    if audience:
        spec["audiences"] = [audience]
    body: Any = {"spec": spec}
    resp: Any = await client.CoreV1Api(api).create_namespaced_service_account_token(
        service_account, namespace, body, _preload_content=False
    )
    return str(json.loads(await resp.read())["status"]["token"])


async def _create(call: Callable[..., Awaitable[Any]], *args: Any) -> None:
    try:
        await call(*args, _preload_content=False)
    except ApiException as exc:
        if exc.status != 409:
            raise


async def grant_auth_delegator(api: client.ApiClient, namespace: str, service_account: str) -> str:
    """Bind ``system:auth-delegator`` to a workspace's ServiceAccount (the agent's TokenReview and
    SubjectAccessReview need it, as upstream's docs require); returns the ClusterRoleBinding's name."""
    name = f"pko-auth-delegator-{namespace}-{service_account}"[:253]
    await _create(
        client.RbacAuthorizationV1Api(api).create_cluster_role_binding,
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    )
    return name


async def grant_workspace_rpc(
    api: client.ApiClient, namespace: str, workspace: str, service_account: str
) -> None:
    """Let ``service_account`` (in ``namespace``) ``use`` ``workspaces/rpc`` of ``workspace``: what the
    agent's SubjectAccessReview asks for a caller."""
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"workspace-rpc-{workspace}-{service_account}"[:253]
    await _create(
        rbac.create_namespaced_role,
        namespace,
        {
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": ["auto.pulumi.com"],
                    "resources": ["workspaces/rpc"],
                    "resourceNames": [workspace],
                    "verbs": ["use"],
                }
            ],
        },
    )
    await _create(
        rbac.create_namespaced_role_binding,
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    )

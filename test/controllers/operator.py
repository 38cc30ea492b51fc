"""The operator as the tests (and the deploy benchmark) run it: a real ServiceAccount bound to the
shipped RBAC (config/rbac), so a missing permission fails; in-process (``start()``) or, with the
kubeconfig ``setup()`` writes, as a ``python -m pko`` process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiException

from pko.controllers import register
from pko.controllers.options import ControllerOptions
from pko.machinery.apiclient import new_api_client
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import Resource, ResourceClient

from .kubelet import mint_token

__all__ = ["OPERATOR_SERVICE_ACCOUNT", "Operator"]

REPO = Path(__file__).resolve().parents[2]
RBAC_DIR = REPO / "config" / "rbac"

OPERATOR_SERVICE_ACCOUNT = "controller-manager"
FIELD_MANAGER = "pko-tests"

_KINDS = {
    "ClusterRole": Resource(
        "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
    ),
    "ClusterRoleBinding": Resource(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
    ),
    "Role": Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    "RoleBinding": Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    "ServiceAccount": Resource("", "v1", "serviceaccounts", "ServiceAccount"),
}
# What config/rbac/kustomization.yaml installs for the operator's own identity.
_RBAC_FILES = (
    "service_account.yaml",
    "role.yaml",
    "role_binding.yaml",
    "token_request_role.yaml",
    "token_request_role_binding.yaml",
    "leader_election_role.yaml",
    "leader_election_role_binding.yaml",
)


class Operator:
    """The operator, in-process: ``start()``, ``stop()``, ``restart()`` (a new Manager each time, as a
    restarted pod would be). ``api`` is its ApiClient (its own identity); ``manager`` the running one."""

    def __init__(
        self, admin: client.ApiClient, cluster: Any, options: ControllerOptions, *, rbac: bool
    ) -> None:
        self.admin = admin
        self.cluster = cluster
        self.options = options
        self.rbac = rbac
        self.namespace = options.operator_namespace
        self.service_account = options.operator_service_account
        self.api: client.ApiClient | None = None
        self.manager: Manager | None = None
        self._task: asyncio.Task[None] | None = None
        self._cluster_objects: list[tuple[Resource, str]] = []

    # -- identity

    async def setup(self, workdir: Path) -> None:
        """The operator's namespace, ServiceAccount and (with ``rbac``) the shipped roles bound to it."""
        await client.CoreV1Api(self.admin).create_namespace({"metadata": {"name": self.namespace}})
        for doc in self._rbac_documents():
            kind = doc["kind"]
            if not self.rbac and kind != "ServiceAccount":
                continue
            resource = _KINDS[kind]
            await ResourceClient(self.admin, resource).apply(doc, field_manager=FIELD_MANAGER)
            if not resource.namespaced and kind != "ClusterRole":
                self._cluster_objects.append((resource, doc["metadata"]["name"]))
        if self.rbac:
            token = await mint_token(self.admin, self.namespace, self.service_account, expiration=86400)
            kubeconfig = workdir / "operator.kubeconfig"
            kubeconfig.write_text(json.dumps(_kubeconfig(self.cluster, token)))
            kubeconfig.chmod(0o600)
        else:
            kubeconfig = Path(self.cluster.kubeconfig)
        self.kubeconfig = kubeconfig  # for `python -m pko --kubeconfig` too
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        self.api = new_api_client(cfg)

    def _rbac_documents(self) -> list[dict[str, Any]]:
        docs: list[dict[str, Any]] = []
        for name in _RBAC_FILES:
            for doc in yaml.safe_load_all((RBAC_DIR / name).read_text()):
                if not doc:
                    continue
                meta = doc["metadata"]
                if "namespace" in meta:
                    meta["namespace"] = self.namespace
                if doc["kind"] == "ClusterRoleBinding":
                    meta["name"] = f"{meta['name']}-{self.namespace}"
                if doc["kind"] == "ServiceAccount":
                    meta["name"] = self.service_account
                for subject in doc.get("subjects") or []:
                    if subject.get("kind") == "ServiceAccount":
                        subject["namespace"] = self.namespace
                        subject["name"] = self.service_account
                docs.append(doc)
        return docs

    async def teardown(self) -> None:
        await self.stop()
        if self.api is not None:
            await self.api.close()
            self.api = None
        for resource, name in self._cluster_objects:
            with contextlib.suppress(ApiException):
                await ResourceClient(self.admin, resource).delete(name)
        with contextlib.suppress(ApiException):
            await client.CoreV1Api(self.admin).delete_namespace(self.namespace, _preload_content=False)

    # -- lifecycle

    async def start(self, timeout: float = 60.0) -> Manager:  # noqa: ASYNC109 - a startup deadline
        """A new Manager with every reconciler registered; returns once its caches have synced."""
        if self._task is not None:
            raise RuntimeError("the operator is already running")
        assert self.api is not None, "call setup() first"
        manager = Manager(
            self.api,
            ManagerOptions(
                metrics_bind_address="127.0.0.1:0",
                health_probe_bind_address="127.0.0.1:0",
                leader_election=None,
                shutdown_grace_period=5.0,
            ),
        )
        register(manager, self.options)
        self.manager = manager
        self._task = asyncio.create_task(manager.run(), name="operator")
        deadline = asyncio.get_running_loop().time() + timeout
        while not manager.is_ready():
            if self._task.done():
                self._task.result()
                raise AssertionError("the operator stopped during startup")
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"the operator did not become ready in {timeout}s")
            await asyncio.sleep(0.1)
        return manager

    async def stop(self) -> None:
        """Graceful shutdown, as on SIGTERM; re-raises what the manager died of, if anything."""
        task, self._task = self._task, None
        if task is None:
            return
        if self.manager is not None:
            self.manager.stop()
        try:
            await asyncio.wait_for(task, 60)
        finally:
            self.manager = None

    async def restart(self) -> Manager:
        await self.stop()
        return await self.start()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()


def _kubeconfig(cluster: Any, token: str) -> dict[str, Any]:
    ca = base64.b64encode(Path(cluster.ca_file).read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server, "certificate-authority-data": ca}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "operator"}}],
        "current-context": "c",
    }

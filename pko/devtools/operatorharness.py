"""The operator as the tests (and the deploy benchmark) run it, beside the play-kubelet
(pko.devtools.playkubelet).

* :class:`Operator`: a real ServiceAccount bound to the shipped RBAC (config/rbac), so a missing
  permission fails; in-process (``start()``) or, with the kubeconfig ``setup()`` writes, as a
  ``python -m pko`` process. With ``watch_namespaces`` it runs as the namespaced install does
  (config/namespaced): the overlay's RBAC (Roles in each watched namespace, the cut-down ClusterRole)
  and ``--watch-namespaces``; with ``stack_selector``, ``--watch-label-selector``.
* :class:`OperatorEnv`: a test module's handles on that operator and the play-kubelet (the ``env``
  fixture test/controllers/conftest.py's ``operator_env`` makes).
* :func:`new_manager` and :func:`running`: a Manager of one namespace for tests that set up one
  reconciler themselves, run for the length of an ``async with`` block.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiException

from pko.controllers import register
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import STACKS
from pko.controllers.sharding import child_selectors
from pko.devtools.apiclient import BridgeClient, new_api_client
from pko.devtools.playkubelet import PlayKubelet, mint_token
from pko.devtools.waiting import wait_until
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import EVENTS, Obj, Resource, ResourceClient

__all__ = ["OPERATOR_SERVICE_ACCOUNT", "Operator", "OperatorEnv", "new_manager", "running"]

REPO = Path(__file__).resolve().parents[2]
RBAC_DIR = REPO / "config" / "rbac"
NAMESPACED_DIR = REPO / "config" / "namespaced"
# The names config/namespaced gives the operator's namespace and its watched Role and binding.
_INSTALL_NAMESPACE = "pulumi-kubernetes-operator"
_WATCHED = "pulumi-kubernetes-operator-watched"
_BINDINGS = ("RoleBinding", "ClusterRoleBinding")

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
        self,
        admin: BridgeClient,
        cluster: Any,
        options: ControllerOptions,
        *,
        rbac: bool,
        watch_namespaces: Sequence[str] = (),
        stack_selector: str | None = None,
    ) -> None:
        self.admin = admin
        self.watch_namespaces = tuple(watch_namespaces)
        self.stack_selector = stack_selector
        self.cluster = cluster
        self.options = options
        self.rbac = rbac
        self.namespace = options.operator_namespace
        self.service_account = options.operator_service_account
        self.api: BridgeClient | None = None
        self.manager: Manager | None = None
        self._task: asyncio.Task[None] | None = None
        self._cluster_objects: list[tuple[Resource, str]] = []

    # -- identity

    async def setup(self, workdir: Path) -> None:
        """The operator's namespace, ServiceAccount and (with ``rbac``) the shipped roles bound to it."""
        namespace: Any = {"metadata": {"name": self.namespace}}
        await client.CoreV1Api(self.admin).create_namespace(namespace)
        for doc in self._rbac_documents():
            kind = doc["kind"]
            if not self.rbac and kind != "ServiceAccount":
                continue
            resource = _KINDS[kind]
            await ResourceClient(self.admin, resource).apply(doc, field_manager=FIELD_MANAGER)
            if not resource.namespaced and (kind != "ClusterRole" or self.watch_namespaces):
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
        for doc in self._shipped_rbac():
            meta = doc["metadata"]
            if meta.get("namespace") == _INSTALL_NAMESPACE:  # not a watched namespace's
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

    def _shipped_rbac(self) -> list[dict[str, Any]]:
        """The operator's own RBAC objects as shipped: config/rbac's files, or (``watch_namespaces``)
        what ``kubectl kustomize config/namespaced`` binds to its account, the watched Role and
        binding once per watched namespace and the ClusterRole named apart (others share the
        cluster's full one)."""
        if not self.watch_namespaces:
            return [
                doc
                for name in _RBAC_FILES
                for doc in yaml.safe_load_all((RBAC_DIR / name).read_text())
                if doc
            ]
        built = subprocess.run(
            ["kubectl", "kustomize", str(NAMESPACED_DIR)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        docs: list[dict[str, Any]] = []
        for doc in yaml.safe_load_all(built):
            if not doc or doc["kind"] not in _KINDS or not _binds_operator(doc, built):
                continue
            if doc["metadata"]["name"] == _WATCHED:
                for ns in self.watch_namespaces:
                    copy = yaml.safe_load(yaml.safe_dump(doc))
                    copy["metadata"]["namespace"] = ns
                    docs.append(copy)
                continue
            if doc["kind"] == "ClusterRole":
                doc["metadata"]["name"] += f"-{self.namespace}"
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"]["name"] += f"-{self.namespace}"
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
                namespaces=self.watch_namespaces,
                # As pko.settings does: a shard's selector scopes its Workspaces, Updates and theirs too.
                label_selectors=(
                    {**child_selectors(self.stack_selector), STACKS.name: self.stack_selector}
                    if self.stack_selector
                    else {}
                ),
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


def _binds_operator(doc: dict[str, Any], built: str) -> bool:
    """Whether ``doc`` (from config/namespaced) is the operator's: its account, or a role or
    binding for it (the user-facing roles are not)."""
    if doc["kind"] == "ServiceAccount":
        return bool(doc["metadata"]["name"] == OPERATOR_SERVICE_ACCOUNT)
    if doc["kind"] in _BINDINGS:
        return any(s.get("name") == OPERATOR_SERVICE_ACCOUNT for s in doc.get("subjects") or [])
    bindings = [d for d in yaml.safe_load_all(built) if d and d["kind"] in _BINDINGS]
    return any(
        b["roleRef"]["name"] == doc["metadata"]["name"] and _binds_operator(b, built) for b in bindings
    )


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


# --- a module's env on the operator and the play-kubelet --------------------------------------------


@dataclass(eq=False)
class OperatorEnv:
    """A module's handles: the admin API client, the namespace, the operator and the play-kubelet.
    A module's ``Env`` subclasses it, adding the clients it needs in ``__post_init__``."""

    api: BridgeClient
    ns: str
    operator: Operator
    kubelet: PlayKubelet

    def __post_init__(self) -> None:
        """Called by the dataclass ``__init__`` (only if the base defines it): subclasses add clients."""

    async def events_for(self, name: str, *, reason: str | None = None, within: float = 20.0) -> list[Obj]:
        """The Events about ``name`` once there is one (with ``reason``, if given): the operator sends
        them asynchronously, after the status write the test saw."""

        async def listed() -> list[Obj] | None:
            listing = await ResourceClient(self.api, EVENTS, self.ns).list(
                field_selector=f"involvedObject.name={name}"
            )
            if any(reason is None or e.get("reason") == reason for e in listing.items):
                return listing.items
            return None

        events: list[Obj] = await wait_until(f"events of {name}", listed, within=within)
        return events


# --- a Manager running the reconciler a module sets up ----------------------------------------------


def new_manager(api_client: Any, namespace: str, **options: Any) -> Manager:
    """A Manager limited to ``namespace``, its metrics and probe servers off; ``options``: more
    :class:`ManagerOptions`. Set its reconcilers up, then run it (:func:`running`)."""
    return Manager(
        api_client,
        ManagerOptions(
            metrics_bind_address="0", health_probe_bind_address="0", namespace=namespace, **options
        ),
    )


@contextlib.asynccontextmanager
async def running(manager: Manager) -> AsyncIterator[Manager]:
    """``manager`` running until the block ends, then stopped (within 30 s)."""
    task = asyncio.create_task(manager.run())
    try:
        yield manager
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)

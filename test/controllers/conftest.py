"""Fixtures for the reconciler tests: the play-kubelet and the real operator, both per test module.

* ``kubelet``: a :class:`~controllers.kubelet.PlayKubelet` for the module's ``namespace`` (module
  attributes ``KUBELET_IMAGES`` and ``KUBELET_OPTIONS`` override its known images and options).
* ``operator``: the real :class:`~pko.machinery.manager.Manager` with ``pko.controllers.register``,
  in-process, leader election off, metrics and probes on free ports, running as a real
  ServiceAccount bound to the shipped RBAC (config/rbac) so a missing permission fails the test.
  Module attributes: ``OPERATOR_OPTIONS`` (a dict of :class:`ControllerOptions` overrides),
  ``OPERATOR_RBAC = False`` to run as the cluster admin instead, ``OPERATOR_NAMESPACED = True`` to
  run as the namespaced install (config/namespaced's RBAC, watching the module's namespace only),
  ``OPERATOR_STACK_SELECTOR`` for ``--watch-label-selector``.
* ``auth_delegator``: ``await auth_delegator("sa")`` binds ``system:auth-delegator`` to a workspace
  ServiceAccount of the module's namespace (the agent's TokenReview/SAR need it).

Shared helpers the modules import (``from .conftest import ...``):

* :class:`OperatorEnv` and :func:`operator_env`: a module's ``env`` fixture on the operator and
  play-kubelet above (``env = operator_env(Env)``);
* :func:`new_manager` and :func:`running`: a Manager of the module's namespace for tests that set up
  one reconciler themselves, run for the length of an ``async with`` block;
* :func:`get_or_none` (a GET, ``None`` on 404);
* for the pure Stack status tests (test_stack_status, test_stack_retry, test_stack_sync): the time
  :data:`T0`, the operator's default :data:`SETTINGS`, a Stack's :func:`spec` and object
  (:func:`stack_obj`), a finished Update (:func:`update`) and the Update being run (:func:`current`),
  a status after failures (:func:`failed_status`), and its conditions by type (:func:`types`).

Polling for a condition is ``pko/devtools/waiting.py``'s :func:`wait_until`; HTTP and git servers on loopback
are in ``pko/devtools/gitserver.py`` (both shared with the other test folders).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from pko.api.stack import StackSpec

from pko.controllers.options import ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.status import record_failed
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import format_time
from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.resource import EVENTS, Obj, ResourceClient

from .kubelet import AGENT_IMAGE, IMAGE_CONFIG, KNOWN_IMAGES, PlayKubelet, grant_auth_delegator
from .operator import OPERATOR_SERVICE_ACCOUNT, Operator


@pytest.fixture(scope="module")
async def kubelet(
    request: pytest.FixtureRequest,
    api_client: client.ApiClient,
    cluster: Any,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[PlayKubelet]:
    options: dict[str, Any] = {
        "images": getattr(request.module, "KUBELET_IMAGES", KNOWN_IMAGES),
        "image_config": IMAGE_CONFIG,
        **getattr(request.module, "KUBELET_OPTIONS", {}),
    }
    k = PlayKubelet(
        api_client,
        [namespace],
        root=tmp_path_factory.mktemp("kubelet"),
        server=cluster.server,
        ca_file=cluster.ca_file,
        **options,
    )
    await k.start()
    try:
        yield k
    finally:
        await k.stop()


@pytest.fixture(scope="module")
async def auth_delegator(
    api_client: client.ApiClient, namespace: str
) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    made: list[str] = []

    async def grant(service_account: str = "default", ns: str | None = None) -> str:
        name = await grant_auth_delegator(api_client, ns or namespace, service_account)
        made.append(name)
        return name

    yield grant
    rbac = client.RbacAuthorizationV1Api(api_client)
    for name in made:
        with contextlib.suppress(ApiException):
            await rbac.delete_cluster_role_binding(name, _preload_content=False)


@pytest.fixture(scope="module")
async def operator(
    request: pytest.FixtureRequest,
    api_client: client.ApiClient,
    cluster: Any,
    crds: list[str],
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Operator]:
    options = ControllerOptions(
        operator_namespace=f"pko-system-{uuid.uuid4().hex[:6]}",
        operator_service_account=OPERATOR_SERVICE_ACCOUNT,
        agent_image=AGENT_IMAGE,
        agent_image_pull_policy="IfNotPresent",
        default_workspace_image=None,
        workspace_address_mode="pod-ip",
        # The Program artifact server on a free loopback port (the default :9090 collides between runs).
        program_fs_addr="127.0.0.1:0",
    )
    options = replace(options, **getattr(request.module, "OPERATOR_OPTIONS", {}))
    op = Operator(
        api_client,
        cluster,
        options,
        rbac=getattr(request.module, "OPERATOR_RBAC", True),
        watch_namespaces=[namespace] if getattr(request.module, "OPERATOR_NAMESPACED", False) else [],
        stack_selector=getattr(request.module, "OPERATOR_STACK_SELECTOR", None),
    )
    await op.setup(tmp_path_factory.mktemp("operator"))
    try:
        await op.start()
        yield op
    finally:
        await op.teardown()


# --- a module's env on the operator and the play-kubelet --------------------------------------------


@dataclass(eq=False)
class OperatorEnv:
    """A module's handles: the admin API client, the namespace, the operator and the play-kubelet.
    A module's ``Env`` subclasses it, adding the clients it needs in ``__post_init__``."""

    api: client.ApiClient
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


E = TypeVar("E")


def operator_env(
    make: Callable[[client.ApiClient, str, Operator, PlayKubelet], E],
    *,
    service_account: str = "default",
    prepare: Callable[[client.ApiClient, str], Awaitable[None]] | None = None,
) -> Any:
    """A module-scoped ``env`` fixture: ``make(api_client, namespace, operator, kubelet)`` (the module's
    real operator and play-kubelet), once ``service_account`` of the namespace is bound to
    ``system:auth-delegator`` and then ``prepare(api_client, namespace)``, if given, has run.

    Bind it in the module: ``env = operator_env(Env)``.
    """

    @pytest.fixture(scope="module", name="env")
    async def env(
        api_client: client.ApiClient,
        namespace: str,
        operator: Operator,
        kubelet: PlayKubelet,
        auth_delegator: Callable[..., Awaitable[str]],
    ) -> E:
        await auth_delegator(service_account)
        if prepare is not None:
            await prepare(api_client, namespace)
        return make(api_client, namespace, operator, kubelet)

    return env


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


# --- reading ----------------------------------------------------------------------------------------


async def get_or_none(rc: ResourceClient, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    """The object, or ``None`` if there is none (404)."""
    try:
        return await rc.get(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


# --- a Stack's status as the status rules record it (pure) ------------------------------------------

T0 = datetime(2024, 10, 17, 20, 0, 0, tzinfo=UTC)
SETTINGS = RetrySettings()


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", "programRef": {"name": "p"}, **fields})


def stack_obj(generation: int = 1, request: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "s", "namespace": "ns", "generation": generation}
    if request is not None:
        meta["annotations"] = {"pulumi.com/reconciliation-request": request}
    if deleting:
        meta["deletionTimestamp"] = format_time(T0)
    return {"metadata": meta}


def update(
    name: str, type_: str = "up", failed: str | None = None, message: str = "", **status: Any
) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True", "reason": "Updated"}]
    if failed is not None:
        conditions.append({"type": "Failed", "status": "True", "reason": failed})
    return {
        "metadata": {"name": name},
        "spec": {"type": type_},
        "status": {"message": message, "conditions": conditions, **status},
    }


def current(name: str, generation: int = 1, commit: str = "r1", request: str = "") -> dict[str, Any]:
    return {"name": name, "generation": generation, "commit": commit, "reconcileRequest": request}


def types(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def failed_status(times: int, reason: str = "ProgramError", type_: str = "up") -> dict[str, Any]:
    status: dict[str, Any] = {}
    for i in range(times):
        record_failed(status, current(f"s-{i}"), update(f"s-{i}", type_=type_, failed=reason), T0)
    return status

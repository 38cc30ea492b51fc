"""Fixtures for the reconciler tests: the play-kubelet and the real operator, both per test module
(the harness itself is pko.devtools: :mod:`pko.devtools.playkubelet`, :mod:`pko.devtools.operatorharness`).

* ``kubelet``: a :class:`~pko.devtools.playkubelet.PlayKubelet` for the module's ``namespace`` (module
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
* :func:`operator_env`: a module's ``env`` fixture on the operator and play-kubelet above
  (``env = operator_env(Env)``, ``Env`` a :class:`~pko.devtools.operatorharness.OperatorEnv`).

What the modules import besides: :class:`~pko.devtools.operatorharness.OperatorEnv`,
:func:`~pko.devtools.operatorharness.new_manager` and :func:`~pko.devtools.operatorharness.running`
(a Manager of the module's namespace for tests that set up one reconciler themselves); the pure Stack
status tests' objects are in builders.py. Polling for a condition is ``pko/devtools/waiting.py``'s
:func:`wait_until`; HTTP and git servers on loopback are in ``pko/devtools/gitserver.py``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.controllers.options import ControllerOptions
from pko.devtools.operatorharness import OPERATOR_SERVICE_ACCOUNT, Operator
from pko.devtools.playkubelet import (
    AGENT_IMAGE,
    IMAGE_CONFIG,
    KNOWN_IMAGES,
    PlayKubelet,
    grant_auth_delegator,
)


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


def operator_options(overrides: Mapping[str, Any]) -> ControllerOptions:
    """The suite operator's options (its own namespace, the play-kubelet's agent image), with a
    module's ``OPERATOR_OPTIONS`` over them."""
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
    return replace(options, **overrides)


@pytest.fixture(scope="module")
async def operator(
    request: pytest.FixtureRequest,
    api_client: client.ApiClient,
    cluster: Any,
    crds: list[str],
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Operator]:
    options = operator_options(getattr(request.module, "OPERATOR_OPTIONS", {}))
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

"""Fixtures and helpers for the agent's RPC tests (auth, server, operations, CLI), and the agent client's.

Not a conftest: test/agent/conftest.py belongs to the source-fetching tests, and ``pytest_plugins``
is not allowed below the root conftest. Tests import helpers from here; the session fixtures
(``agent_binary``, ``auth_world``) are registered once, in test/agent/conftest.py: imported into a
test module instead, each importing module would get its own instance (the agent built twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from kubernetes_asyncio import client

from pko.agent.auth import CacheTTLs, KubeAuthorizer
from pko.agent.kubeapi import KubeAPI, load_kubeconfig
from pko.agent.pulumirunner import RunnerSettings
from pko.agent.server import ServeOptions, serve
from pko.api.generated.pko.agent import v1 as pb
from pko.devtools.builds import built

# Re-exported for the agent tests: the one free-port helper.
from pko.devtools.localcluster import free_port  # noqa: F401

WORKSPACE = "ws1"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def agent_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The self-contained agent executable: ``$PKO_AGENT_BINARY``, else built once per session.

    Building (hack/build-agent.sh, PyInstaller) takes minutes; every slow test that needs the
    executable shares this one build.
    """
    prebuilt = os.environ.get("PKO_AGENT_BINARY")
    if prebuilt:
        return Path(prebuilt)
    out = tmp_path_factory.mktemp("agent-bin")
    # The interpreter these tests run with (any virtualenv with the dev extras), not .venv's.
    return built(
        "build-agent.sh", str(out), env={"PYTHON": os.environ.get("PYTHON", sys.executable)}, timeout=1800
    )


# -- Kubernetes identities -------------------------------------------------------------------------
@dataclass
class AuthWorld:
    """A namespace with service accounts, some granted ``use`` on ``workspaces/rpc`` of WORKSPACE.

    ``api`` (kubernetes-asyncio) is the test's hands; ``kube`` is the agent's own client, from the
    cluster's kubeconfig, that authorizers get.
    """

    api: client.ApiClient
    kube: KubeAPI
    namespace: str
    workspace: str
    audience: str

    async def mint(
        self, service_account: str, audience: str | None = None, *, bound_pod: client.V1Pod | None = None
    ) -> str:
        """A bound token from TokenRequest, as the operator gets one; with ``bound_pod``, bound to
        that Pod (as a kubelet's projected token is): valid only while that very Pod exists."""
        bound = None
        if bound_pod is not None:
            bound = client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=bound_pod.metadata.name, uid=bound_pod.metadata.uid
            )
        req = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience or self.audience], expiration_seconds=3600, bound_object_ref=bound
            )
        )
        res = await client.CoreV1Api(self.api).create_namespaced_service_account_token(
            service_account, self.namespace, req
        )
        return str(res.status.token)

    async def review(self, token: str, audiences: list[str] | None = None) -> client.V1TokenReviewStatus:
        """The apiserver's own TokenReview of ``token`` (no agent, no cache); ``audiences`` None: the
        apiserver's own audiences (``--api-audiences``)."""
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=audiences))
        res = await client.AuthenticationV1Api(self.api).create_token_review(review)
        return res.status

    async def create_pod(self, name: str, service_account: str) -> client.V1Pod:
        """A Pod running as ``service_account``; no node takes it (it stays Pending)."""
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                service_account_name=service_account,
                automount_service_account_token=False,
                containers=[client.V1Container(name="main", image="registry.invalid/pause:none")],
            ),
        )
        created: client.V1Pod = await client.CoreV1Api(self.api).create_namespaced_pod(self.namespace, pod)
        return created

    async def delete_pod(self, name: str) -> None:
        """Delete the Pod and wait until it is gone (a Pod no node took goes at once)."""
        core = client.CoreV1Api(self.api)
        await core.delete_namespaced_pod(name, self.namespace)
        for _ in range(300):
            try:
                await core.read_namespaced_pod(name, self.namespace)
            except client.ApiException as exc:
                if exc.status == 404:
                    return
                raise
            await asyncio.sleep(0.2)
        raise AssertionError(f"pod {name} still there a minute after its deletion")

    async def create_service_account(self, name: str) -> None:
        await client.CoreV1Api(self.api).create_namespaced_service_account(
            self.namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
        )

    async def delete_service_account(self, name: str) -> None:
        await client.CoreV1Api(self.api).delete_namespaced_service_account(name, self.namespace)

    async def grant(self, service_account: str) -> str:
        """Bind the workspace-rpc Role to ``service_account``; returns the RoleBinding's name."""
        name = f"rpc-{service_account}"
        await client.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(
            self.namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=name),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="workspace-rpc"
                ),
                subjects=[
                    client.RbacV1Subject(
                        kind="ServiceAccount", name=service_account, namespace=self.namespace
                    )
                ],
            ),
        )
        return name

    async def revoke(self, binding: str) -> None:
        await client.RbacAuthorizationV1Api(self.api).delete_namespaced_role_binding(binding, self.namespace)

    async def sar_allows(self, service_account: str) -> bool:
        """Ask the apiserver directly (no agent cache) whether the account may use the workspace."""
        sar = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=f"system:serviceaccount:{self.namespace}:{service_account}",
                groups=[
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{self.namespace}",
                    "system:authenticated",
                ],
                resource_attributes=client.V1ResourceAttributes(
                    group="auto.pulumi.com",
                    version="v1alpha1",
                    resource="workspaces",
                    subresource="rpc",
                    verb="use",
                    namespace=self.namespace,
                    name=self.workspace,
                ),
            )
        )
        res = await client.AuthorizationV1Api(self.api).create_subject_access_review(sar)
        return bool(res.status.allowed)

    def authorizer(
        self, ttls: CacheTTLs | None = None, clock: Callable[[], float] = time.monotonic
    ) -> KubeAuthorizer:
        return KubeAuthorizer(
            api=self.kube,
            audiences=[self.audience],
            workspace_namespace=self.namespace,
            workspace_name=self.workspace,
            ttls=ttls or CacheTTLs(),
            clock=clock,
        )


@pytest.fixture(scope="session")
async def auth_world(api_client: client.ApiClient, cluster: Any) -> AsyncIterator[AuthWorld]:
    ns = f"agent-auth-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    await client.RbacAuthorizationV1Api(api_client).create_namespaced_role(
        ns,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="workspace-rpc"),
            rules=[
                client.V1PolicyRule(
                    api_groups=["auto.pulumi.com"],
                    resources=["workspaces/rpc"],
                    resource_names=[WORKSPACE],
                    verbs=["use"],
                )
            ],
        ),
    )
    kube = load_kubeconfig([Path(cluster.kubeconfig)])
    world = AuthWorld(
        api=api_client, kube=kube, namespace=ns, workspace=WORKSPACE, audience=f"{WORKSPACE}.{ns}"
    )
    yield world
    await kube.close()
    with contextlib.suppress(Exception):
        await core.delete_namespace(ns)


# -- an agent serving a program ----------------------------------------------------------------------
@dataclass
class RunningAgent:
    """An in-process agent (the real server) on a loopback port."""

    host: str
    port: int
    options: ServeOptions
    task: asyncio.Task[int]

    def channel(self) -> Channel:
        return Channel(self.host, self.port)

    def stub(self, channel: Channel, token: str | None = None) -> pb.AutomationServiceStub:
        metadata = {"authorization": f"Bearer {token}"} if token else None
        return pb.AutomationServiceStub(channel, metadata=metadata)

    async def stop(self) -> int:
        self.options.stop.set()
        return await asyncio.wait_for(self.task, 120)


async def start_agent(
    work_dir: Path,
    journal_dir: Path,
    *,
    env: dict[str, str] | None = None,
    pulumi_root: Path | None = None,
    authorizer: KubeAuthorizer | None = None,
    shutdown_grace: float = 60.0,
    stack: str | None = None,
) -> RunningAgent:
    loop = asyncio.get_running_loop()
    bound: asyncio.Future[tuple[str, int]] = loop.create_future()
    options = ServeOptions(
        runner=RunnerSettings(
            work_dir=work_dir, env_vars=env or {}, pulumi_root=pulumi_root, stack_name=stack
        ),
        host="127.0.0.1",
        port=0,
        journal_dir=journal_dir,
        shutdown_grace=shutdown_grace,
        authorizer=authorizer,
        bound=bound,
    )
    task = asyncio.create_task(serve(options, install_signal_handlers=False))
    waits: set[asyncio.Future[Any]] = {bound, task}
    done, _ = await asyncio.wait(waits, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises the startup error
        raise AssertionError("agent exited during startup")
    if bound not in done:
        task.cancel()
        raise AssertionError("agent did not start listening")
    host, port = bound.result()
    return RunningAgent(host=host, port=port, options=options, task=task)


def agent_env() -> dict[str, str]:
    """Environment for an agent subprocess: no proxies (tests talk to loopback only)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def spawn(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a process (stdout discarded, stderr kept for failure messages)."""
    return subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stderr:
        proc.stderr.close()


T = TypeVar("T")


async def health(channel: Channel) -> HealthCheckResponse | None:
    """The agent's health reply once it says SERVING (``None`` before)."""
    reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=5)
    return reply if reply.status == reply.SERVING else None


async def answers_version(channel: Channel) -> str:
    """The agent's Pulumi CLI version (its first RPC that runs the CLI)."""
    return (await pb.AutomationServiceStub(channel).pulumi_version(timeout=5)).version


async def wait_for_agent(
    proc: subprocess.Popen[bytes],
    port: int,
    ask: Callable[[Channel], Awaitable[T | None]],
    *,
    within: float = 120.0,
    interval: float = 0.3,
) -> tuple[Channel, T]:
    """An open channel to the agent subprocess ``proc`` serving on 127.0.0.1:``port`` and ``ask``'s
    first answer on it that is not ``None`` (e.g. :func:`health`); a refused connection, a timeout or
    an RPC error is asked again. Fails at once, with its stderr, if ``proc`` exits, and after
    ``within`` seconds otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"agent exited with {proc.returncode}:\n{err}")
        channel = Channel("127.0.0.1", port)
        try:
            answer = await ask(channel)
            if answer is not None:
                return channel, answer
        except (TimeoutError, OSError, GRPCError):
            pass
        channel.close()
        if loop.time() > deadline:
            raise AssertionError(f"agent on port {port} never answered within {within}s")
        await asyncio.sleep(interval)


def collect(events: list[pb.OperationEvent]) -> tuple[list[dict[str, Any]], pb.OperationResult | None]:
    """Split a stream into engine events (as dicts) and the result."""
    engine = [e.engine_event.to_dict() for e in events if e.engine_event is not None]
    results = [e.result for e in events if e.result is not None]
    return engine, (results[-1] if results else None)


@contextlib.contextmanager
def chdir(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)

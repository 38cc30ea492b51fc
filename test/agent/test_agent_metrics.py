"""The agent's own /metrics (pko.agent.metricsserver) against the real apiserver: reviewed with the
agent's own client as the operator's is (HTTPS; no token 401, a user without the metrics-reader
ClusterRole 403, one with it 200 and the agent's series), or plain HTTP when not secure; and the
operation series counted when an operation finishes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException
from pko.agent import operations
from pko.agent.journal import Journal
from pko.agent.metricsserver import start_metrics_server
from pko.api.generated.pko.agent import v1 as pb
from prometheus_client import REGISTRY

from pko.devtools.agents import AuthWorld
from pko.machinery.serving import ThreadedHttpServer

REPO = Path(__file__).resolve().parents[2]
READER_ROLE = yaml.safe_load((REPO / "config/rbac/metrics_reader_role.yaml").read_text())


async def token(world: AuthWorld, service_account: str) -> str:
    """A token for the apiserver's own audiences, as a Prometheus pod's mounted one."""
    await world.create_service_account(service_account)
    resp = await client.CoreV1Api(world.api).create_namespaced_service_account_token(
        service_account, world.namespace, {"spec": {"expirationSeconds": 3600}}, _preload_content=False
    )
    return str(json.loads(await resp.read())["status"]["token"])


@pytest.fixture
async def reader(auth_world: AuthWorld) -> AsyncIterator[str]:
    """A ServiceAccount bound to the shipped metrics-reader ClusterRole; its token."""
    rbac = client.RbacAuthorizationV1Api(auth_world.api)
    with contextlib.suppress(ApiException):
        await rbac.create_cluster_role(READER_ROLE)
    name = f"agent-metrics-{uuid.uuid4().hex[:6]}"
    await rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READER_ROLE["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": auth_world.namespace}],
        }
    )
    yield await token(auth_world, name)
    await rbac.delete_cluster_role_binding(name)


@pytest.fixture
async def servers() -> AsyncIterator[list[ThreadedHttpServer]]:
    started: list[ThreadedHttpServer] = []
    yield started
    for server in started:
        await asyncio.to_thread(server.stop)


async def scrape(url: str, bearer: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=False) as resp:
        return resp.status, await resp.text()


@pytest.mark.cluster
async def test_the_agents_metrics_are_served_to_a_metrics_reader_only(
    auth_world: AuthWorld, reader: str, servers: list[ThreadedHttpServer]
) -> None:
    server = start_metrics_server("127.0.0.1:0", api=auth_world.kube)
    assert server is not None
    servers.append(server)
    url = f"https://127.0.0.1:{server.port}/metrics"
    stranger = await token(auth_world, f"stranger-{uuid.uuid4().hex[:6]}")

    assert (await scrape(url))[0] == 401
    assert (await scrape(url, "not-a-token"))[0] == 401
    assert (await scrape(url, stranger))[0] == 403
    status, text = await scrape(url, reader)
    assert status == 200
    for series in ("agent_auth_refusals_total", "agent_operations_total", "agent_operation_duration_seconds"):
        assert f"# TYPE {series}" in text


@pytest.mark.cluster
async def test_plain_metrics_need_no_apiserver(servers: list[ThreadedHttpServer]) -> None:
    assert start_metrics_server("0", api=None) is None
    with pytest.raises(ValueError, match="apiserver client"):
        start_metrics_server("127.0.0.1:0", api=None)
    server = start_metrics_server("127.0.0.1:0", api=None, secure=False)
    assert server is not None
    servers.append(server)
    status, text = await scrape(f"http://127.0.0.1:{server.port}/metrics")
    assert status == 200 and "agent_operations_total" in text


def test_a_finished_operation_is_counted_with_its_duration(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    # _finish reads no runner: the registry's bookkeeping alone, on a real journal.
    registry = operations.OperationRegistry(cast("operations.Runner", object()), journal)
    op = operations.Operation(id="op-1", type=pb.OperationType.UP, created=time.time() - 3)
    journal.create(op.id, op.type, {})
    labels = {"type": "up", "state": "failed"}
    before = REGISTRY.get_sample_value("agent_operations_total", labels) or 0.0
    count = REGISTRY.get_sample_value("agent_operation_duration_seconds_count", labels) or 0.0
    total = REGISTRY.get_sample_value("agent_operation_duration_seconds_sum", labels) or 0.0
    registry._finish(op, pb.OperationResult(state=pb.OperationState.FAILED))
    assert REGISTRY.get_sample_value("agent_operations_total", labels) == before + 1
    assert REGISTRY.get_sample_value("agent_operation_duration_seconds_count", labels) == count + 1
    assert 3 <= (REGISTRY.get_sample_value("agent_operation_duration_seconds_sum", labels) or 0) - total < 60


def test_a_secure_metrics_address_needs_kube_auth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pko.agent.cli import _validate_serve, build_parser

    parser = build_parser()
    args = parser.parse_args(["serve", "-w", str(tmp_path), "--metrics-bind-address=:8080"])
    with pytest.raises(SystemExit) as exit_:
        _validate_serve(parser, args)
    assert exit_.value.code == 2 and "it needs --auth-mode kube" in capsys.readouterr().err
    _validate_serve(parser, parser.parse_args(["serve", "-w", str(tmp_path), "--metrics-secure=false"]))

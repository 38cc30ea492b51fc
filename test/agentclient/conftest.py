"""Fixtures for the operator's agent client: a real agent in kube auth mode, restartable on one port.

The identities and the Role come from pko/devtools/agents.py (``AuthWorld``); the agent is
the real server (in-process) over the stand-in Pulumi CLI. Unlike ``start_agent`` there, an agent
here keeps its port, workspace, journal and Pulumi state across a restart, as a workspace pod's
container restart does.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from agentproc import OPERATOR_SA, PROGRAM, Agent
from kubernetes_asyncio import client

from pko.devtools.agents import AuthWorld, auth_world, free_port
from pko.devtools.apiclient import stock_api_client
from pko.devtools.standin import make_fake_pulumi
from pko.tokens import TokenSource

__all__ = ["auth_world"]


@pytest.fixture(scope="module")
async def operator_sa(auth_world: AuthWorld) -> str:
    """The operator's ServiceAccount, granted ``use`` on ``workspaces/rpc`` of the world's workspace."""
    with contextlib.suppress(client.ApiException):
        await auth_world.create_service_account(OPERATOR_SA)
        await auth_world.grant(OPERATOR_SA)
    return OPERATOR_SA


@pytest.fixture
def tokens(api_client: client.ApiClient, auth_world: AuthWorld, operator_sa: str) -> TokenSource:
    return TokenSource(api_client, auth_world.namespace, operator_sa)


@pytest.fixture
async def agent(tmp_path: Path, auth_world: AuthWorld) -> AsyncIterator[Agent]:
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(PROGRAM)
    home = tmp_path / "pulumi-home"
    home.mkdir()
    a = Agent(
        work_dir=work,
        journal_dir=tmp_path / "journal",
        fake=make_fake_pulumi(tmp_path / "pulumi"),
        world=auth_world,
        port=free_port(),
        pulumi_home=home,
    )
    await a.start()
    yield a
    await a.close()


@pytest.fixture
def client_as(api_client: client.ApiClient) -> Callable[[str], client.ApiClient]:
    """An ApiClient that authenticates with ``token`` instead of the admin's."""

    def make(token: str) -> client.ApiClient:
        cfg = copy.copy(api_client.configuration)
        cfg.api_key = {"BearerToken": f"Bearer {token}"}
        return stock_api_client(cfg)

    return make

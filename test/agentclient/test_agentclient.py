"""AgentClient against a real agent in kube auth mode (real apiserver, stand-in Pulumi CLI)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from agentproc import Agent
from kubernetes_asyncio import client
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb

from pko.agentclient import AgentClient, AgentError
from pko.devtools.agents import AuthWorld, free_port
from pko.tokens import TokenSource

pytestmark = pytest.mark.cluster


def up(op_id: str) -> pb.StartOperationRequest:
    return pb.StartOperationRequest(up=pb.UpRequest(operation_id=op_id))


async def prepare(c: AgentClient, seconds: int = 0) -> None:
    await c.select_stack("dev", create=True)
    await c.set_all_config([pb.ConfigItem(key="seconds", value=Value.from_dict(str(seconds)))])


async def drain(stream: AsyncIterator[pb.OperationEvent]) -> list[pb.OperationEvent]:
    return [e async for e in stream]


def is_pre(event: pb.OperationEvent, resource_type: str) -> bool:
    if event.engine_event is None:
        return False
    meta = (event.engine_event.to_dict().get("resourcePreEvent") or {}).get("metadata") or {}
    return bool(meta.get("type") == resource_type)


async def test_a_token_for_the_workspace_audience_is_accepted(agent: Agent, tokens: TokenSource) -> None:
    async with AgentClient(agent.address, agent.world.audience, tokens) as c:
        assert await c.pulumi_version()
        who = await c.whoami()
        assert who.url.startswith("file://")
        assert (await c.pulumi_version()) and tokens.requests == 1  # one token, reused


async def test_a_wrong_audience_is_unauthenticated(agent: Agent, tokens: TokenSource) -> None:
    async with AgentClient(agent.address, "other.workspace", tokens) as c:
        with pytest.raises(AgentError) as refused:
            await c.pulumi_version()
    assert (refused.value.code, refused.value.reason, refused.value.transient) == (
        "UNAUTHENTICATED",
        "Unauthenticated",
        False,
    )
    assert tokens.requests == 2  # the refused token was dropped and minted once more, then given up


async def test_an_account_without_rbac_use_is_permission_denied(
    agent: Agent, api_client: client.ApiClient, auth_world: AuthWorld
) -> None:
    await auth_world.create_service_account("no-use")
    tokens = TokenSource(api_client, auth_world.namespace, "no-use")
    async with AgentClient(agent.address, auth_world.audience, tokens) as c:
        with pytest.raises(AgentError) as denied:
            await c.pulumi_version()
    assert (denied.value.code, denied.value.reason, denied.value.transient) == (
        "PERMISSION_DENIED",
        "PermissionDenied",
        False,
    )


async def test_start_watch_resume_get_and_cancel(agent: Agent, tokens: TokenSource) -> None:
    async with AgentClient(agent.address, agent.world.audience, tokens) as c:
        await prepare(c)
        started = await c.start_operation(up("u-1"))
        assert started.operation_id == "u-1" and not started.attached
        events = await asyncio.wait_for(drain(c.watch_operation("u-1")), 120)
        assert [e.sequence for e in events] == list(range(1, len(events) + 1))
        assert all(e.engine_event is not None for e in events[:-1])
        result = events[-1].result
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        assert result.outputs["message"].value == b'"hello"'

        tail = await drain(c.watch_operation("u-1", from_sequence=5))
        assert tail == events[4:]
        status = await c.get_operation("u-1")
        assert status.result == result and status.last_sequence == len(events) - 1
        again = await c.start_operation(up("u-1"))
        assert again.attached and again.state == pb.OperationState.SUCCEEDED

        with pytest.raises(AgentError) as unknown:
            await c.get_operation("nope")
        assert (unknown.value.reason, unknown.value.transient) == ("NotFound", False)

        await c.set_all_config([pb.ConfigItem(key="seconds", value=Value.from_dict("600"))])
        await c.start_operation(up("u-2"))
        async for event in c.watch_operation("u-2"):
            if is_pre(event, "test:index:Hang"):
                break
        cancelled = await c.cancel_operation("u-2")
        assert cancelled.operation_id == "u-2"
        events = await asyncio.wait_for(drain(c.watch_operation("u-2")), 120)
        final = events[-1].result
        assert final is not None and final.state == pb.OperationState.CANCELLED
        assert final.failure is not None and final.failure.reason == "Cancelled"


async def test_the_client_reconnects_to_a_restarted_agent_and_reselects_the_stack(
    agent: Agent, tokens: TokenSource
) -> None:
    async with AgentClient(agent.address, agent.world.audience, tokens) as c:
        await prepare(c)
        await c.start_operation(up("r-1"))
        events = await asyncio.wait_for(drain(c.watch_operation("r-1")), 120)

        # Same port, workspace and journal; a fresh PULUMI_HOME forgets the current stack, so the
        # agent answers "no stack is selected" until the client selects it again.
        await agent.stop()
        pending = asyncio.create_task(c.get_operation("r-1"))  # retries while the agent is down
        await asyncio.sleep(1.5)
        assert not pending.done()
        await agent.restart(new_pulumi_home=True)
        status = await asyncio.wait_for(pending, 30)
        assert status.state == pb.OperationState.SUCCEEDED and agent.starts == 2
        assert await drain(c.watch_operation("r-1")) == events
        reselected: list[str] = []
        reselect = c._reselect

        async def counting(req: pb.SelectStackRequest) -> None:
            reselected.append(req.stack_name)
            await reselect(req)

        c._reselect = counting  # type: ignore[method-assign]
        summary = await c.info()
        assert summary.name == "dev" and reselected == ["dev"]


async def test_a_message_over_the_limit_is_resource_exhausted(agent: Agent, tokens: TokenSource) -> None:
    async with AgentClient(agent.address, agent.world.audience, tokens, max_message_size=64) as c:
        await prepare(c)
        await c.start_operation(up("m-1"))
        with pytest.raises(AgentError) as big:
            await drain(c.watch_operation("m-1"))
    assert (big.value.reason, big.value.transient) == ("ResourceExhausted", False)


async def test_a_broken_watch_is_transient_and_resumes_from_the_last_sequence(
    agent: Agent, tokens: TokenSource
) -> None:
    proxy = agent.proxy
    async with AgentClient(agent.address, agent.world.audience, tokens) as c:
        await prepare(c, seconds=3)
        await c.start_operation(up("b-1"))
        seen: list[pb.OperationEvent] = []
        with pytest.raises(AgentError) as broken:
            async for event in c.watch_operation("b-1"):
                seen.append(event)
                if is_pre(event, "test:index:Hang"):
                    proxy.cut()
        assert broken.value.transient and broken.value.reason == "Unavailable"
        rest = await asyncio.wait_for(drain(c.watch_operation("b-1", seen[-1].sequence + 1)), 120)
        assert [e.sequence for e in seen + rest] == list(range(1, len(seen) + len(rest) + 1))
        assert rest[-1].result is not None and rest[-1].result.state == pb.OperationState.SUCCEEDED


async def test_an_unreachable_agent_is_unavailable_within_the_budget(tokens: TokenSource) -> None:
    # Loopback only: tests never send traffic to an address this run did not create.
    for address in (f"127.0.0.1:{free_port()}",):
        c = AgentClient(address, "ws.ns", tokens, connect_timeout=0.5, retry_budget=2.0)
        began = time.monotonic()
        with pytest.raises(AgentError) as unreachable:
            await c.get_operation("x")
        elapsed = time.monotonic() - began
        c.close()
        assert (unreachable.value.code, unreachable.value.reason) == ("UNAVAILABLE", "Unavailable")
        assert unreachable.value.transient and address in unreachable.value.message
        assert elapsed < 2.0 + 0.5 + 0.5, elapsed
        with pytest.raises(AgentError) as watch:
            await drain(c.watch_operation("x"))
        assert watch.value.reason == "Unavailable"

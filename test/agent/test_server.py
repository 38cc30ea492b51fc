"""The agent's gRPC service end to end: a real server, the Automation API, the stand-in Pulumi CLI.

Each test writes a small Pulumi YAML program, starts the agent on a loopback port (in-process, or
as a subprocess where signals are involved) and drives it through the generated client.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb

from pko.devtools.agents import (
    AuthWorld,
    RunningAgent,
    agent_env,
    answers_version,
    collect,
    free_port,
    spawn,
    start_agent,
    stop_process,
    wait_for_agent,
)
from pko.devtools.standin import FakePulumi, make_fake_pulumi

FLOW_PROGRAM = """\
name: agentflow
runtime: yaml
config:
  greeting:
    type: string
  dbPassword:
    type: string
  settings:
    type: object
resources:
  pw:
    type: random:RandomPassword
    properties:
      length: 16
  echo:
    type: test:Echo
    properties:
      message: ${greeting}
      replicas: ${settings.replicas}
outputs:
  greeting: ${echo.message}
  password: ${pw.result}
  db: ${dbPassword}
  settings: ${settings}
  tier: ${agentflow:tier}
"""

HANG_PROGRAM = """\
name: hanger
runtime: yaml
resources:
  before:
    type: test:Echo
    properties:
      n: 1
  slow:
    type: test:Hang
    properties:
      seconds: {seconds}
      after: ${{before.n}}
"""

FOREVER_PROGRAM = """\
name: hanger
runtime: yaml
resources:
  slow:
    type: test:Hang
"""


def write_program(base: Path, text: str) -> Path:
    work = base / "workspace"
    work.mkdir(parents=True, exist_ok=True)
    (work / "Pulumi.yaml").write_text(text)
    return work


def runner_env(fake: FakePulumi) -> dict[str, str]:
    return {
        "PULUMI_HOME": str(fake.home),
        "PULUMI_BACKEND_URL": fake.backend_url,
        "PULUMI_CONFIG_PASSPHRASE": fake.passphrase,
        "DB_PASSWORD": "from-the-env",
    }


def lock_files(fake: FakePulumi) -> list[Path]:
    locks = fake.state_dir / ".pulumi" / "locks"
    return [p for p in locks.rglob("*.json")] if locks.exists() else []


@pytest.fixture
def fake(tmp_path: Path) -> FakePulumi:
    return make_fake_pulumi(tmp_path / "pulumi")


async def _agent(tmp_path: Path, fake: FakePulumi, program: str, **kw: Any) -> RunningAgent:
    work = write_program(tmp_path, program)
    return await start_agent(work, tmp_path / "journal", env=runner_env(fake), pulumi_root=fake.root, **kw)


@pytest.fixture
async def flow_agent(tmp_path: Path, fake: FakePulumi) -> AsyncIterator[RunningAgent]:
    agent = await _agent(tmp_path, fake, FLOW_PROGRAM)
    yield agent
    await agent.stop()


async def drain(stream: AsyncIterator[pb.OperationEvent]) -> list[pb.OperationEvent]:
    return [e async for e in stream]


async def wait_for_event(
    stub: pb.AutomationServiceStub, op_id: str, predicate: Any, within: float = 120
) -> list[pb.OperationEvent]:
    """Watch ``op_id`` until an engine event satisfies ``predicate``; returns what was seen."""
    seen: list[pb.OperationEvent] = []

    async def run() -> None:
        async for ev in stub.watch_operation(pb.WatchOperationRequest(operation_id=op_id, from_sequence=1)):
            seen.append(ev)
            if ev.engine_event is not None and predicate(ev.engine_event.to_dict()):
                return
            if ev.result is not None:
                raise AssertionError(f"operation ended before the awaited event: {ev.result}")

    await asyncio.wait_for(run(), within)
    return seen


def is_pre(resource_type: str) -> Any:
    def check(ev: dict[str, Any]) -> bool:
        meta = (ev.get("resourcePreEvent") or {}).get("metadata") or {}
        return bool(meta.get("type") == resource_type)

    return check


async def test_select_config_preview_up_refresh_destroy(flow_agent: RunningAgent, fake: FakePulumi) -> None:
    channel = flow_agent.channel()
    stub = flow_agent.stub(channel)
    try:
        assert (await stub.pulumi_version()).version
        with pytest.raises(GRPCError) as missing:
            await stub.select_stack(pb.SelectStackRequest(stack_name="dev"))
        assert missing.value.status == Status.NOT_FOUND
        with pytest.raises(GRPCError) as unselected:
            await drain(stub.up(pb.UpRequest(operation_id="too-early")))
        assert (unselected.value.status, unselected.value.message) == (
            Status.FAILED_PRECONDITION,
            "no stack is selected",
        )

        selected = await stub.select_stack(pb.SelectStackRequest(stack_name="dev", create=True))
        assert selected.summary is not None and selected.summary.name == "dev"
        quiet = await stub.select_stack(pb.SelectStackRequest(stack_name="dev", skip_summary=True))
        assert quiet.summary is None

        await stub.set_all_config(
            pb.SetAllConfigRequest(
                config=[
                    pb.ConfigItem(key="greeting", value=Value.from_dict("hello")),
                    pb.ConfigItem(
                        key="dbPassword", value_from=pb.ConfigValueFrom(env="DB_PASSWORD"), secret=True
                    ),
                    pb.ConfigItem(key="tier", value=Value.from_dict("gold")),
                ]
            )
        )
        await stub.set_all_config(
            pb.SetAllConfigRequest(
                config=[
                    pb.ConfigItem(key="settings", value=Value.from_dict({"replicas": 3, "zones": ["a", "b"]}))
                ]
            )
        )

        preview_events, preview = collect(await drain(stub.preview(pb.PreviewRequest(operation_id="p-1"))))
        assert preview is not None and preview.state == pb.OperationState.SUCCEEDED, preview
        assert preview.type == pb.OperationType.PREVIEW
        assert preview.change_summary.get("create", 0) >= 2
        assert any("preludeEvent" in e for e in preview_events)
        assert any("summaryEvent" in e for e in preview_events)

        up_stream = await drain(stub.up(pb.UpRequest(operation_id="u-1", message="first")))
        sequences = [e.sequence for e in up_stream]
        assert sequences == list(range(1, len(up_stream) + 1))
        up_events, up = collect(up_stream)
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        assert up.project_info == pb.ProjectInfo(name="agentflow", runtime="yaml")
        assert up.summary is not None and up.summary.result == "succeeded"
        assert up.change_summary.get("create", 0) >= 3  # what it did, from the update's summary
        created = {e["resOutputsEvent"]["metadata"]["type"] for e in up_events if "resOutputsEvent" in e}
        assert {"random:index/randomPassword:RandomPassword", "test:index:Echo"} <= created
        outputs = {k: (json.loads(v.value), v.secret) for k, v in up.outputs.items()}
        assert outputs["greeting"] == ("hello", False)
        assert outputs["db"] == ("from-the-env", True)
        assert outputs["settings"] == ({"replicas": 3, "zones": ["a", "b"]}, False)
        assert outputs["tier"] == ("gold", False)
        password, password_secret = outputs["password"]
        assert password_secret and isinstance(password, str) and len(password) == 16

        # Starting the same id again attaches: the same journal and result, nothing re-run.
        again = await drain(stub.up(pb.UpRequest(operation_id="u-1")))
        assert again == up_stream
        status = await stub.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id="u-1")))
        assert status.attached and status.state == pb.OperationState.SUCCEEDED
        with pytest.raises(GRPCError) as other_type:
            await stub.start_operation(
                pb.StartOperationRequest(destroy=pb.DestroyRequest(operation_id="u-1"))
            )
        assert other_type.value.status == Status.ALREADY_EXISTS

        info = await stub.info()
        assert info.summary is not None and (info.summary.resource_count or 0) >= 3

        _, refresh = collect(await drain(stub.refresh(pb.RefreshRequest(operation_id="r-1"))))
        assert refresh is not None and refresh.state == pb.OperationState.SUCCEEDED, refresh

        _, destroy = collect(await drain(stub.destroy(pb.DestroyRequest(operation_id="d-1"))))
        assert destroy is not None and destroy.state == pb.OperationState.SUCCEEDED, destroy
        assert destroy.change_summary.get("delete", 0) >= 3
        info = await stub.info()
        assert info.summary is not None and not info.summary.resource_count
    finally:
        channel.close()


async def test_a_crashed_update_reports_the_lock_owner_and_pending_urns(
    tmp_path: Path, fake: FakePulumi
) -> None:
    program = "name: crashy\nruntime: yaml\nresources:\n  c:\n    type: test:Crash\n"
    agent = await _agent(tmp_path, fake, program, stack="dev")
    channel = agent.channel()
    stub = agent.stub(channel)
    try:
        _, crashed = collect(await drain(stub.up(pb.UpRequest(operation_id="k-1"))))
        assert crashed is not None and crashed.state == pb.OperationState.FAILED
        # The CLI died while this agent ran (an OOM kill): its lock is stale, so the next up removes it
        # and runs again in the same operation; that attempt crashes as well (not StackLocked), and the
        # result still names the lock removed and the pending create the first crash left.
        _, again = collect(await drain(stub.up(pb.UpRequest(operation_id="k-2"))))
        assert again is not None and again.state == pb.OperationState.FAILED, again
        assert again.failure is not None and again.failure.reason != "StackLocked", again.failure
        removed = again.removed_lock
        assert removed is not None and removed.lock is not None and "(pid " in removed.lock.owner, again
        assert [p.type for p in removed.pending_operations] == ["creating"]
        assert removed.pending_operations[0].urn.endswith("test:index:Crash::c")
    finally:
        channel.close()
        await agent.stop()


async def test_sigterm_mid_up_interrupts_pulumi_and_records_the_outcome(
    tmp_path: Path, fake: FakePulumi
) -> None:
    work = write_program(tmp_path, FOREVER_PROGRAM)
    journal = tmp_path / "journal"
    port = free_port()
    env = {**agent_env(), **runner_env(fake)}
    proc = spawn(
        [
            sys.executable,
            "-m",
            "pko.agent",
            "--",
            "serve",
            "--workspace",
            str(work),
            "--skip-install",
            "--stack",
            "dev",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--pulumi-root",
            str(fake.root),
            "--journal-dir",
            str(journal),
            "--shutdown-grace",
            "60",
        ],
        env,
    )
    try:
        channel, _ = await wait_for_agent(proc, port, answers_version)
        stub = pb.AutomationServiceStub(channel)
        await stub.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id="t-1")))
        await wait_for_event(stub, "t-1", is_pre("test:index:Hang"))
        watcher = asyncio.create_task(
            drain(stub.watch_operation(pb.WatchOperationRequest(operation_id="t-1")))
        )
        await asyncio.sleep(0.5)  # let the watch attach before the signal
        proc.send_signal(signal.SIGTERM)
        _, result = collect(await asyncio.wait_for(watcher, 120))
        channel.close()
        assert result is not None and result.state == pb.OperationState.CANCELLED, result
        assert result.failure is not None and result.failure.reason == "Terminated"
        assert await asyncio.to_thread(proc.wait, 120) == 0
    finally:
        stop_process(proc)
    assert lock_files(fake) == []
    journaled = json.loads((journal / "t-1" / "result.json").read_text())
    assert journaled["state"] == "OPERATION_STATE_CANCELLED"


@pytest.mark.cluster
async def test_the_real_server_enforces_kube_auth(
    tmp_path: Path, fake: FakePulumi, auth_world: AuthWorld
) -> None:
    await auth_world.create_service_account("controller")
    await auth_world.grant("controller")
    token = await auth_world.mint("controller")
    agent = await _agent(tmp_path, fake, FLOW_PROGRAM, authorizer=auth_world.authorizer())
    channel = agent.channel()
    try:
        with pytest.raises(GRPCError) as refused:
            await agent.stub(channel).who_am_i()
        assert refused.value.status == Status.UNAUTHENTICATED
        who = await agent.stub(channel, token).who_am_i()
        assert who.user == os.environ.get("USER", who.user) and who.url.startswith("file://")
    finally:
        channel.close()
        await agent.stop()

"""One set of assertions, two engines: the real Pulumi engine (hack/build-pulumi.sh) and the stand-in CLI
(test/fakepulumi) that fast tests use. Everything the stand-in claims about Pulumi that these tests
touch must hold for the real engine too, so the stand-in cannot drift from it unnoticed.

Programs here need no provider (config, secrets, outputs, the stack resource), so both engines run
them as they are; the agent drives each through the Automation API over its gRPC service.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest_agent import RunningAgent, collect, start_agent
from fakepulumi.fixtures import FakePulumi, make_fake_pulumi
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from realpulumi import make_real_pulumi
from test_server import drain, lock_files, write_program

pytestmark = pytest.mark.timeout(300)

PROGRAM = """\
name: conform
runtime: yaml
config:
  greeting:
    type: string
  token:
    type: string
outputs:
  greeting: ${greeting}
  token: ${token}
  literal: fixed
  hidden:
    fn::secret: ${greeting}
"""
TOKEN = "conformance-token-value"

ENGINES: dict[str, Callable[[Path], FakePulumi]] = {"real": make_real_pulumi, "standin": make_fake_pulumi}


@pytest.fixture(params=sorted(ENGINES))
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> FakePulumi:
    return ENGINES[request.param](tmp_path / "pulumi")


def _env(engine: FakePulumi, passphrase: str | None = None) -> dict[str, str]:
    return {
        **{k: v for k, v in engine.env.items() if k != "PATH"},
        "PULUMI_CONFIG_PASSPHRASE": passphrase or engine.passphrase,
        "TOKEN": TOKEN,
    }


async def _start(tmp_path: Path, engine: FakePulumi, program: str, **kw: str) -> RunningAgent:
    work = write_program(tmp_path, program)
    return await start_agent(
        work, tmp_path / "journal", env=_env(engine, kw.get("passphrase")), pulumi_root=engine.root,
        stack=kw.get("stack"),
    )  # fmt: skip


@pytest.fixture
async def agent(tmp_path: Path, engine: FakePulumi) -> AsyncIterator[RunningAgent]:
    running = await _start(tmp_path, engine, PROGRAM)
    yield running
    await running.stop()


def _config(greeting: str) -> pb.SetAllConfigRequest:
    return pb.SetAllConfigRequest(
        config=[
            pb.ConfigItem(key="greeting", value=Value.from_dict(greeting)),
            pb.ConfigItem(key="token", value_from=pb.ConfigValueFrom(env="TOKEN"), secret=True),
        ]
    )


async def test_the_lifecycle_of_a_stack(agent: RunningAgent, engine: FakePulumi) -> None:
    """select --create, config (plain and secret), preview, up with outputs, expect-no-changes, refresh,
    destroy: the same results from both engines."""
    channel = agent.channel()
    stub = agent.stub(channel)
    try:
        version = (await stub.pulumi_version()).version
        assert version.lstrip("v").split(".")[0] == "3", version
        selected = await stub.select_stack(pb.SelectStackRequest(stack_name="dev", create=True))
        assert selected.summary is not None and selected.summary.name == "dev"
        await stub.set_all_config(_config("hello"))

        _, preview = collect(await drain(stub.preview(pb.PreviewRequest(operation_id="p-1"))))
        assert preview is not None and preview.state == pb.OperationState.SUCCEEDED, preview
        assert preview.change_summary.get("create", 0) >= 1, preview.change_summary
        assert not preview.outputs or all(v.secret or v.value for v in preview.outputs.values())

        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="u-1"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        assert up.project_info == pb.ProjectInfo(name="conform", runtime="yaml")
        assert up.summary is not None and up.summary.result == "succeeded"
        outputs = {k: (json.loads(v.value), v.secret) for k, v in up.outputs.items()}
        assert outputs == {
            "greeting": ("hello", False),
            "token": (TOKEN, True),
            "literal": ("fixed", False),
            "hidden": ("hello", True),
        }, outputs
        state = "\n".join(p.read_text() for p in (engine.state_dir / ".pulumi").rglob("*.json"))
        assert TOKEN not in state, "a secret was written to the state in plain text"

        _, same = collect(await drain(stub.up(pb.UpRequest(operation_id="u-2", expect_no_changes=True))))
        assert same is not None and same.state == pb.OperationState.SUCCEEDED, same

        # New stack outputs alone are not resource changes: expect-no-changes holds, the outputs move.
        await stub.set_all_config(_config("changed"))
        _, changed = collect(await drain(stub.up(pb.UpRequest(operation_id="u-3", expect_no_changes=True))))
        assert changed is not None and changed.state == pb.OperationState.SUCCEEDED, changed
        assert json.loads(changed.outputs["hidden"].value) == "changed"

        _, refresh = collect(await drain(stub.refresh(pb.RefreshRequest(operation_id="r-1"))))
        assert refresh is not None and refresh.state == pb.OperationState.SUCCEEDED, refresh

        _, destroy = collect(await drain(stub.destroy(pb.DestroyRequest(operation_id="d-1"))))
        assert destroy is not None and destroy.state == pb.OperationState.SUCCEEDED, destroy
        info = await stub.info()
        assert info.summary is not None and not info.summary.resource_count
        assert lock_files(engine) == []
    finally:
        channel.close()


async def test_a_program_error_names_what_is_wrong(tmp_path: Path, engine: FakePulumi) -> None:
    """A program error comes back as a structured ProgramError naming the culprit (was a stand-in-only
    test in test_server.py)."""
    program = "name: broken\nruntime: yaml\noutputs:\n  x: ${nope}\n"
    agent = await _start(tmp_path, engine, program, stack="dev")
    channel = agent.channel()
    try:
        _, result = collect(await drain(agent.stub(channel).up(pb.UpRequest(operation_id="e-1"))))
        assert result is not None and result.state == pb.OperationState.FAILED
        assert result.failure is not None and result.failure.reason == "ProgramError", result.failure
        assert "nope" in result.failure.message
        assert result.summary is not None and result.summary.result == "failed"
        assert lock_files(engine) == []
    finally:
        channel.close()
        await agent.stop()


async def test_a_wrong_passphrase_is_reported_in_the_engines_words(
    tmp_path: Path, engine: FakePulumi
) -> None:
    first = await _start(tmp_path / "a", engine, PROGRAM)
    channel = first.channel()
    try:
        stub = first.stub(channel)
        await stub.select_stack(pb.SelectStackRequest(stack_name="dev", create=True))
        await stub.set_all_config(_config("hello"))
        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="u-1"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
    finally:
        channel.close()
        await first.stop()

    second = await _start(tmp_path / "b", engine, PROGRAM, passphrase="not-the-passphrase")
    channel = second.channel()
    try:
        stub = second.stub(channel)
        await stub.select_stack(pb.SelectStackRequest(stack_name="dev"))
        (tmp_path / "b" / "workspace" / "Pulumi.dev.yaml").write_text(
            (tmp_path / "a" / "workspace" / "Pulumi.dev.yaml").read_text()
        )
        _, result = collect(await drain(stub.up(pb.UpRequest(operation_id="u-2"))))
        assert result is not None and result.state == pb.OperationState.FAILED, result
        assert result.failure is not None
        assert "incorrect passphrase" in result.failure.detail.lower(), result.failure
    finally:
        channel.close()
        await second.stop()


async def test_a_held_lock_is_reported_with_its_owner(tmp_path: Path, engine: FakePulumi) -> None:
    agent = await _start(tmp_path, engine, PROGRAM)
    channel = agent.channel()
    stub = agent.stub(channel)
    try:
        await stub.select_stack(pb.SelectStackRequest(stack_name="dev", create=True))
        await stub.set_all_config(_config("hello"))
        # Another process holds the stack's lock, written where and as a DIY backend writes it.
        lock_dir = engine.state_dir / ".pulumi" / "locks" / "organization" / "conform" / "dev"
        lock_dir.mkdir(parents=True, exist_ok=True)
        lock = {
            "pid": 4242,
            "username": "alice",
            "hostname": socket.gethostname(),
            "timestamp": datetime.now(UTC).isoformat(),
        }
        (lock_dir / "0f7c6a1e-1111-4222-8333-944455556666.json").write_text(json.dumps(lock))
        _, result = collect(await drain(stub.up(pb.UpRequest(operation_id="l-1"))))
        assert result is not None and result.state == pb.OperationState.FAILED, result
        assert result.failure is not None and result.failure.reason == "StackLocked", result.failure
        assert result.failure.lock is not None and "alice@" in result.failure.lock.owner, result.failure
        assert "currently locked" in result.failure.detail, result.failure
        os.remove(lock_dir / "0f7c6a1e-1111-4222-8333-944455556666.json")
        _, after = collect(await drain(stub.up(pb.UpRequest(operation_id="l-2"))))
        assert after is not None and after.state == pb.OperationState.SUCCEEDED, after
    finally:
        channel.close()
        await agent.stop()

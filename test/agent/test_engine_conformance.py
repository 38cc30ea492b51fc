"""One set of assertions, two engines: the real Pulumi engine (hack/build-pulumi.sh) and the stand-in CLI
(test/fakepulumi) that fast tests use. Everything the stand-in claims about Pulumi that these tests
touch must hold for the real engine too, so the stand-in cannot drift from it unnoticed.

Most programs here need no provider (config, secrets, outputs, the stack resource), so both engines
run them as they are; where resources matter, each engine gets a resource it has (the stand-in's
`test:index:Echo`, a Python dynamic provider doing the same for the real one) under the same
assertions. The agent drives each through the Automation API over its gRPC service.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fakepulumi.test_targets_drift_import import TARGETS
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from test_real_engine import PYTHON_PROJECT, SLOW_TYPE
from test_real_engine import _config as slow_config
from test_server import (
    FOREVER_PROGRAM,
    HANG_PROGRAM,
    drain,
    is_pre,
    lock_files,
    wait_for_event,
    write_program,
)

from pko.devtools.agents import RunningAgent, collect, start_agent
from pko.devtools.realpulumi import make_real_pulumi
from pko.devtools.standin import FakePulumi, make_fake_pulumi

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


async def _start_project(
    tmp_path: Path, engine: FakePulumi, files: dict[str, str], **kw: str
) -> RunningAgent:
    """An agent on a project of ``files`` with the engine's PATH (the real Python host needs the SDK's
    python3 on it), the stack ``dev`` selected."""
    work = tmp_path / "workspace"
    work.mkdir(exist_ok=True)
    for name, text in files.items():
        (work / name).write_text(text)
    env = {**_env(engine), "PATH": engine.env["PATH"]}
    return await start_agent(work, tmp_path / "journal", env=env, pulumi_root=engine.root, stack="dev", **kw)


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
        # Another live process of this host holds the stack's lock (this test's own: a dead one's
        # lock would be stale and removed), written where and as a DIY backend writes it.
        lock_dir = engine.state_dir / ".pulumi" / "locks" / "organization" / "conform" / "dev"
        lock_dir.mkdir(parents=True, exist_ok=True)
        lock = {
            "pid": os.getpid(),
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


# -- resources: the same assertions, with a resource each engine has ------------------------------
# The stand-in's `test:index:Echo` (the program of its own --target tests) and, for the real engine,
# a Python dynamic provider doing the same (its output `text` is its input; a changed input is an
# in-place update).
ECHO_PYTHON = """\
import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult


class Echo(ResourceProvider):
    def create(self, props):
        return CreateResult(id_="echo", outs={"text": props["text"]})

    def diff(self, _id, olds, news):
        return DiffResult(changes=olds.get("text") != news.get("text"))

    def update(self, _id, olds, news):
        return UpdateResult(outs={"text": news["text"]})


class EchoResource(Resource):
    text: pulumi.Output[str]

    def __init__(self, name, text):
        super().__init__(Echo(), name, {"text": text})


v = pulumi.Config().get("v") or "one"
a = EchoResource("a", v)
b = EchoResource("b", a.text.apply(lambda t: f"{t}-b"))
c = EchoResource("c", f"{v}-c")
pulumi.export("a", a.text)
pulumi.export("b", b.text)
pulumi.export("c", c.text)
"""
ECHO_PROJECTS: dict[str, tuple[dict[str, str], str]] = {
    "standin": ({"Pulumi.yaml": TARGETS}, "test:index:Echo"),
    "real": ({"Pulumi.yaml": "name: demo\nruntime: python\n", "__main__.py": ECHO_PYTHON}, SLOW_TYPE),
}


async def test_a_targeted_up_changes_only_its_target(
    tmp_path: Path, engine: FakePulumi, request: pytest.FixtureRequest
) -> None:
    """`spec.targets` as the engine applies it: only the targeted resource changes, the others keep
    their old outputs (which the stack outputs still show), and the next full up catches them up."""
    files, type_ = ECHO_PROJECTS[request.node.callspec.params["engine"]]
    agent = await _start_project(tmp_path, engine, files)
    channel = agent.channel()
    stub = agent.stub(channel)

    async def up(op: str, *targets: str) -> pb.OperationResult:
        _, result = collect(await drain(stub.up(pb.UpRequest(operation_id=op, target=list(targets)))))
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        return result

    async def changes(op: str, *targets: str) -> dict[str, int]:
        _, result = collect(
            await drain(stub.preview(pb.PreviewRequest(operation_id=op, target=list(targets))))
        )
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        return dict(result.change_summary)

    def outputs(result: pb.OperationResult) -> dict[str, str]:
        return {k: json.loads(v.value) for k, v in result.outputs.items()}

    a = f"urn:pulumi:dev::demo::{type_}::a"
    try:
        assert outputs(await up("t-1")) == {"a": "one", "b": "one-b", "c": "one-c"}
        await stub.set_all_config(
            pb.SetAllConfigRequest(config=[pb.ConfigItem(key="v", value=Value.from_dict("two"))])
        )
        # The stack, b and c stay as they are; b's input would change only after a's output did.
        assert await changes("p-1", a) == {"same": 3, "update": 1}
        assert outputs(await up("t-2", a)) == {"a": "two", "b": "one-b", "c": "one-c"}
        assert await changes("p-2") == {"same": 2, "update": 2}
        assert outputs(await up("t-3")) == {"a": "two", "b": "two-b", "c": "two-c"}
        assert await changes("p-3") == {"same": 4}
    finally:
        channel.close()
        await agent.stop()


DRIFT_YAML = """\
name: demo
runtime: yaml
config:
  path:
    type: string
resources:
  d:
    type: test:index:Drift
    properties:
      path: ${path}
outputs:
  value: ${d.value}
"""
DRIFT_PYTHON = """\
import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider


def _read(path):
    with open(path) as f:
        return f.read()


class Drift(ResourceProvider):
    \"\"\"A resource whose real value lives in a file outside Pulumi (the stand-in's test:index:Drift).\"\"\"

    def create(self, props):
        return CreateResult(id_=props["path"], outs={"path": props["path"], "value": _read(props["path"])})

    def read(self, id_, props):
        return ReadResult(id_=id_, outs={"path": id_, "value": _read(id_)})

    def diff(self, _id, olds, news):
        return DiffResult(changes=olds.get("path") != news.get("path"))


class DriftResource(Resource):
    value: pulumi.Output[str]

    def __init__(self, name, path):
        super().__init__(Drift(), name, {"path": path, "value": None})


d = DriftResource("d", pulumi.Config().require("path"))
pulumi.export("value", d.value)
"""
DRIFT_PROJECTS: dict[str, dict[str, str]] = {
    "standin": {"Pulumi.yaml": DRIFT_YAML},
    "real": {"Pulumi.yaml": "name: demo\nruntime: python\n", "__main__.py": DRIFT_PYTHON},
}


async def test_refresh_reads_back_a_change_made_outside_pulumi(
    tmp_path: Path, engine: FakePulumi, request: pytest.FixtureRequest
) -> None:
    """Drift: `up` believes the state; `refresh` (or `up --refresh`, the Stack's `refresh: true`) reads
    the real value back, and the next `up` keeps it.

    Not asserted, because the engines differ: whether that refresh counts as a change (and so fails
    `--expect-no-changes`). The real engine (3.274) reports a Python dynamic resource whose read
    value moved as unchanged (its provider's diff, on inputs, sees none), while the stand-in reports
    an update. Drift of a Kubernetes object put right by `refresh: true` is shown on the real engine in
    test/controllers/test_real_engine.py."""
    cloud = tmp_path / "cloud.txt"
    cloud.write_text("one")
    agent = await _start_project(tmp_path, engine, DRIFT_PROJECTS[request.node.callspec.params["engine"]])
    channel = agent.channel()
    stub = agent.stub(channel)

    async def up(op: str, refresh: bool = False) -> str:
        _, result = collect(await drain(stub.up(pb.UpRequest(operation_id=op, refresh=refresh))))
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        return str(json.loads(result.outputs["value"].value))

    async def refresh(op: str, expect_no_changes: bool = False) -> pb.OperationResult:
        request = pb.RefreshRequest(operation_id=op, expect_no_changes=expect_no_changes)
        _, result = collect(await drain(stub.refresh(request)))
        assert result is not None
        return result

    try:
        await stub.set_all_config(
            pb.SetAllConfigRequest(config=[pb.ConfigItem(key="path", value=Value.from_dict(str(cloud)))])
        )
        assert await up("u-1") == "one"
        assert (await refresh("r-1", expect_no_changes=True)).state == pb.OperationState.SUCCEEDED
        cloud.write_text("two")
        assert await up("u-2") == "one", "without a refresh the state is believed"
        assert (await refresh("r-2")).state == pb.OperationState.SUCCEEDED
        assert await up("u-3") == "two", "the refreshed value is kept: the program did not change"
        cloud.write_text("three")
        assert await up("u-4", refresh=True) == "three"
    finally:
        channel.close()
        await agent.stop()


def _is_real(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.callspec.params["engine"] == "real")


async def _slow_agent(
    tmp_path: Path, engine: FakePulumi, real: bool, seconds: float, **kw: str
) -> tuple[RunningAgent, str]:
    """An agent whose `up` takes ``seconds`` in one resource (forever on the stand-in when 0), with
    the stack selected; and that resource's type."""
    stand_in = HANG_PROGRAM.format(seconds=seconds) if seconds else FOREVER_PROGRAM
    agent = await _start_project(
        tmp_path, engine, PYTHON_PROJECT if real else {"Pulumi.yaml": stand_in}, **kw
    )
    if real:
        channel = agent.channel()
        try:
            await agent.stub(channel).set_all_config(slow_config(seconds or 8))
        finally:
            channel.close()
    return agent, SLOW_TYPE if real else "test:index:Hang"


async def test_cancel_mid_up_is_graceful_and_leaves_no_lock(
    tmp_path: Path, engine: FakePulumi, request: pytest.FixtureRequest
) -> None:
    """While an `up` runs, other operations and config changes are refused; a cancel interrupts Pulumi
    as CTRL-C does, which ends the update cleanly: Cancelled, nothing pending, no lock left."""
    agent, slow_type = await _slow_agent(tmp_path, engine, _is_real(request), 0)
    channel = agent.channel()
    stub = agent.stub(channel)
    try:
        started = await stub.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id="c-1")))
        assert not started.attached and started.state == pb.OperationState.RUNNING
        await wait_for_event(stub, "c-1", is_pre(slow_type))

        with pytest.raises(GRPCError) as busy:
            await stub.start_operation(
                pb.StartOperationRequest(preview=pb.PreviewRequest(operation_id="c-2"))
            )
        assert busy.value.status == Status.ABORTED
        with pytest.raises(GRPCError) as config_busy:
            await stub.set_all_config(
                pb.SetAllConfigRequest(config=[pb.ConfigItem(key="k", value=Value.from_dict("v"))])
            )
        assert config_busy.value.status == Status.FAILED_PRECONDITION

        await stub.cancel_operation(pb.CancelOperationRequest(operation_id="c-1"))
        watch = stub.watch_operation(pb.WatchOperationRequest(operation_id="c-1"))
        events, result = collect(await asyncio.wait_for(drain(watch), 120))
        assert result is not None and result.state == pb.OperationState.CANCELLED, result
        assert result.failure is not None and result.failure.reason == "Cancelled", result.failure
        assert not result.failure.pending_operations
        assert lock_files(engine) == []
        assert any("cancelEvent" in e for e in events)
    finally:
        channel.close()
        await agent.stop()


async def test_a_caller_that_disconnects_reattaches_and_gets_the_whole_journal(
    tmp_path: Path, engine: FakePulumi, request: pytest.FixtureRequest
) -> None:
    """The operator may lose its stream mid-`up` (its own restart, a network blip): the operation runs
    on, and watching it again replays every event from the start, then the result, also after the
    agent itself restarted on the same /share."""
    agent, slow_type = await _slow_agent(tmp_path, engine, _is_real(request), 3)
    first = agent.channel()
    seen: list[pb.OperationEvent] = []
    try:
        async for ev in agent.stub(first).up(pb.UpRequest(operation_id="d-1")):
            seen.append(ev)
            if ev.engine_event is not None and is_pre(slow_type)(ev.engine_event.to_dict()):
                break
    finally:
        first.close()  # the caller goes away mid-up

    second = agent.channel()
    try:
        stub = agent.stub(second)
        replay = await asyncio.wait_for(
            drain(stub.watch_operation(pb.WatchOperationRequest(operation_id="d-1"))), 120
        )
        assert replay[: len(seen)] == seen
        _, result = collect(replay)
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        tail = await drain(
            stub.watch_operation(pb.WatchOperationRequest(operation_id="d-1", from_sequence=len(seen) + 1))
        )
        assert tail == replay[len(seen) :]
        status = await stub.get_operation(pb.GetOperationRequest(operation_id="d-1"))
        assert status.result == result and status.last_sequence == len(replay) - 1
    finally:
        second.close()
    await agent.stop()

    # A new agent process (same /share) still serves the journal.
    env = {**_env(engine), "PATH": engine.env["PATH"]}
    again = await start_agent(tmp_path / "workspace", tmp_path / "journal", env=env, pulumi_root=engine.root)
    channel = again.channel()
    try:
        replay_after_restart = await drain(
            again.stub(channel).watch_operation(pb.WatchOperationRequest(operation_id="d-1"))
        )
        assert replay_after_restart == replay
    finally:
        channel.close()
        await again.stop()


FAILING_PYTHON = """\
from pulumi.dynamic import Resource, ResourceProvider


class Failing(ResourceProvider):
    def create(self, props):
        raise Exception("no capacity")


class FailingResource(Resource):
    def __init__(self, name):
        super().__init__(Failing(), name, {})


FailingResource("f")
"""
FAILING_PROJECTS: dict[str, dict[str, str]] = {
    "standin": {
        "Pulumi.yaml": "name: failing\nruntime: yaml\nresources:\n"
        "  f:\n    type: test:Fail\n    properties:\n      message: no capacity\n"
    },
    "real": {"Pulumi.yaml": "name: failing\nruntime: python\n", "__main__.py": FAILING_PYTHON},
}


async def test_a_failing_resource_is_a_resource_failure(
    tmp_path: Path, engine: FakePulumi, request: pytest.FixtureRequest
) -> None:
    """A provider that refuses a create is a ResourceOperationFailed naming the provider's words, not
    a program error; no lock is left."""
    agent = await _start_project(tmp_path, engine, FAILING_PROJECTS[request.node.callspec.params["engine"]])
    channel = agent.channel()
    try:
        _, result = collect(await drain(agent.stub(channel).up(pb.UpRequest(operation_id="f-1"))))
        assert result is not None and result.state == pb.OperationState.FAILED, result
        assert result.failure is not None and result.failure.reason == "ResourceOperationFailed", (
            result.failure
        )
        assert "no capacity" in result.failure.message, result.failure
        assert lock_files(engine) == []
    finally:
        channel.close()
        await agent.stop()

"""What only the real engine can show: a Python project (the Python language host and a dynamic
provider), and the agent's process dying under Pulumi: SIGTERM mid-`up` (Pulumi is interrupted and
leaves no lock) and kill -9 of every process mid-`up`, as when a node loses the pod (the engine leaves
its lock and a pending operation, which the next operation reports with the URNs, never wedging).

The slow resource is a Python dynamic provider whose create sleeps: the engine runs it through the
`pulumi-resource-pulumi-python` shim, so these runs cross every process boundary a workspace has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from test_server import drain, is_pre, lock_files, wait_for_event

from pko.devtools.agents import (
    agent_env,
    answers_version,
    collect,
    free_port,
    spawn,
    start_agent,
    stop_process,
    wait_for_agent,
)
from pko.devtools.realpulumi import RealPulumi, make_real_pulumi

pytestmark = pytest.mark.timeout(600)

PYTHON_PROJECT = {
    "Pulumi.yaml": "name: slowpy\nruntime: python\n",
    "__main__.py": """\
import time

import pulumi
from pulumi.dynamic import CreateResult, Resource, ResourceProvider


class Slow(ResourceProvider):
    def create(self, props):
        time.sleep(float(props["seconds"]))
        return CreateResult(id_="slow-1", outs={"seconds": props["seconds"], "said": props["say"]})


class SlowThing(Resource):
    said: pulumi.Output[str]

    def __init__(self, name, seconds, say, opts=None):
        super().__init__(Slow(), name, {"seconds": seconds, "say": say, "said": None}, opts)


config = pulumi.Config()
thing = SlowThing("slow", config.get_float("seconds") or 0.0, config.get("say") or "hi")
pulumi.export("said", thing.said)
pulumi.export("secret", pulumi.Output.secret("psst"))
""",
}
SLOW_TYPE = "pulumi-python:dynamic:Resource"


@pytest.fixture
def real(tmp_path: Path) -> RealPulumi:
    return make_real_pulumi(tmp_path / "pulumi")


def write_project(base: Path) -> Path:
    work = base / "workspace"
    work.mkdir(parents=True, exist_ok=True)
    for name, text in PYTHON_PROJECT.items():
        (work / name).write_text(text)
    return work


def _config(seconds: float, say: str = "hi") -> pb.SetAllConfigRequest:
    return pb.SetAllConfigRequest(
        config=[
            pb.ConfigItem(key="seconds", value=Value.from_dict(str(seconds))),
            pb.ConfigItem(key="say", value=Value.from_dict(say)),
        ]
    )


async def test_a_python_project_with_a_dynamic_provider_runs(tmp_path: Path, real: RealPulumi) -> None:
    work = write_project(tmp_path)
    agent = await start_agent(work, tmp_path / "journal", env=real.env, pulumi_root=real.root)
    channel = agent.channel()
    stub = agent.stub(channel)
    try:
        await stub.select_stack(pb.SelectStackRequest(stack_name="dev", create=True))
        await stub.set_all_config(_config(0, "hello from python"))
        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="u-1"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        assert up.project_info == pb.ProjectInfo(name="slowpy", runtime="python")
        outputs = {k: (json.loads(v.value), v.secret) for k, v in up.outputs.items()}
        assert outputs == {"said": ("hello from python", False), "secret": ("psst", True)}, outputs
        _, destroy = collect(await drain(stub.destroy(pb.DestroyRequest(operation_id="d-1"))))
        assert destroy is not None and destroy.state == pb.OperationState.SUCCEEDED, destroy
    finally:
        channel.close()
        await agent.stop()


def _serve(work: Path, journal: Path, port: int, real: RealPulumi) -> list[str]:
    return [
        sys.executable, "-m", "pko.agent", "--", "serve", "--workspace", str(work), "--skip-install",
        "--stack", "dev", "--host", "127.0.0.1", "--port", str(port), "--pulumi-root", str(real.root),
        "--journal-dir", str(journal), "--shutdown-grace", "120",
    ]  # fmt: skip


def kill_pod(pid: int) -> None:
    """``kill -9`` ``pid`` and every process below it at once, as a lost pod's processes end; one
    that ended between the listing and its kill (a short-lived plugin call) is gone already."""
    for each in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Pulumi runs in sessions of its own, so a process group
    would miss them); what a pod's cgroup holds."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@contextlib.asynccontextmanager
async def agent_process(
    work: Path, journal: Path, real: RealPulumi, seconds: float, config: pb.SetAllConfigRequest | None = None
) -> AsyncIterator[tuple[subprocess.Popen[bytes], pb.AutomationServiceStub]]:
    """An agent process serving ``work`` with the stack selected and configured to sleep ``seconds``
    (or with ``config``, for programs of other tests)."""
    port = free_port()
    proc = spawn(_serve(work, journal, port, real), {**agent_env(), **real.env})
    try:
        channel, _ = await wait_for_agent(proc, port, answers_version)
        try:
            stub = pb.AutomationServiceStub(channel)
            await stub.select_stack(pb.SelectStackRequest(stack_name="dev", create=True))
            await stub.set_all_config(config or _config(seconds))
            yield proc, stub
        finally:
            channel.close()
    finally:
        stop_process(proc)


async def test_sigterm_mid_up_interrupts_pulumi_and_leaves_no_lock(tmp_path: Path, real: RealPulumi) -> None:
    work = write_project(tmp_path)
    async with agent_process(work, tmp_path / "journal", real, 8) as (proc, stub):
        await stub.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id="t-1")))
        await wait_for_event(stub, "t-1", is_pre(SLOW_TYPE))
        watcher = asyncio.create_task(
            drain(stub.watch_operation(pb.WatchOperationRequest(operation_id="t-1")))
        )
        await asyncio.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, result = collect(await asyncio.wait_for(watcher, 180))
        assert result is not None and result.state == pb.OperationState.CANCELLED, result
        assert result.failure is not None and result.failure.reason == "Terminated", result.failure
        assert await asyncio.to_thread(proc.wait, 180) == 0
    assert lock_files(real) == [], "an interrupted update left its lock"

    # The next agent on the same workspace and backend deploys without help.
    async with agent_process(work, tmp_path / "journal2", real, 0) as (_, stub):
        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="t-2"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up


async def test_kill_9_mid_up_is_reported_with_the_pending_urns_and_never_wedges(
    tmp_path: Path, real: RealPulumi
) -> None:
    work = write_project(tmp_path)
    async with agent_process(work, tmp_path / "journal", real, 300) as (proc, stub):
        await stub.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id="k-1")))
        await wait_for_event(stub, "k-1", is_pre(SLOW_TYPE))
        await asyncio.sleep(2)  # the create is under way in the dynamic provider
        kill_pod(proc.pid)
    assert lock_files(real), "kill -9 leaves the engine no chance to remove its lock"

    async with agent_process(work, tmp_path / "journal2", real, 0) as (_, stub):
        # The lock was this host's, from before this agent started: provably stale, so the up removes it
        # and runs again in the same operation, whose one result names the lock and the URNs to check.
        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="k-2"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        removed = up.removed_lock
        assert removed is not None and removed.lock is not None and "(pid " in removed.lock.owner, up
        pending = [(p.type, p.urn) for p in removed.pending_operations]
        assert pending == [("creating", f"urn:pulumi:dev::slowpy::{SLOW_TYPE}::slow")], pending
        assert lock_files(real) == []


async def test_a_shell_in_the_symlinked_workspace_finds_the_agents_stack(
    tmp_path: Path, real: RealPulumi
) -> None:
    """The pod's /share/workspace is a symlink into the fetched source; `kubectl exec` users `cd` there
    and run `pulumi` (seed 000's `pulumi import`): they must find the stack the agent selected, though
    the agent opened the workspace by the symlink's target (the CLI keys a selection by its project's
    resolved path)."""
    source = write_project(tmp_path / "source")
    link = tmp_path / "workspace"
    link.symlink_to(source, target_is_directory=True)
    async with agent_process(link, tmp_path / "journal", real, 0):
        shown = await asyncio.to_thread(
            subprocess.run,
            ["sh", "-c", f"cd {link} && pulumi stack --show-name"],
            env={**agent_env(), **real.env},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "dev"

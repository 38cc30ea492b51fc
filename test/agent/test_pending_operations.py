"""Pending operations on the real engine (hack/build-pulumi.sh, pulumi-command from hack/build-sources.sh):
the agent killed -9 while ``pulumi up`` creates a ``command:local:Command``, then the next attempts.

The killed agent leaves the stack's lock, taken on this host before the next agent started: that
agent's first attempt meets it, removes it (a dead process of this "pod") and runs the operation once
more within the same operation, whose one result names the lock removed and the pending operations the
interrupted update left (``removed_lock``). A lock of another host is left alone: StackLocked.

What pulumi v3.274 does by itself (seen here, read in pkg/backend/snapshot.go): the up after the kill
warns ("Attempting to deploy or update resources with 1 pending operations from previous deployment"),
creates the resource again, and writes a state that still holds the pending create, forever. The
agent clears it once the up succeeded (the resource exists again: the record is stale) and reports the
cleared URN in the result (agent/pendingops.py decides; the pure rules are in test_pendingops.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from test_real_engine import agent_process, kill_pod
from test_server import drain, lock_files

from pko.devtools.agents import agent_env, collect
from pko.devtools.realpulumi import RealPulumi, install_command_provider, make_real_pulumi

pytestmark = pytest.mark.timeout(900)

COMMAND = "command:local:Command"
# step2 says it started (the witness), then sleeps for the config's `seconds` before it finishes.
PROGRAM = """\
name: pending
runtime: yaml
config:
  seconds:
    type: string
    default: "0"
  witness:
    type: string
resources:
  step1:
    type: command:local:Command
    properties:
      create: "echo step1"
  step2:
    type: command:local:Command
    properties:
      create: "echo started >> ${witness}; sleep ${seconds}; echo step2"
    options:
      dependsOn: ["${step1}"]
"""


def urn(name: str) -> str:
    return f"urn:pulumi:dev::pending::{COMMAND}::{name}"


@pytest.fixture
def real(tmp_path: Path) -> RealPulumi:
    real = make_real_pulumi(tmp_path / "pulumi")
    install_command_provider(real)
    return real


def export(real: RealPulumi, work: Path) -> dict[str, Any]:
    """The stack's checkpoint as the CLI exports it."""
    done = subprocess.run(
        ["pulumi", "stack", "export", "--stack", "dev"],
        cwd=work,
        env={**agent_env(), **real.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    deployment: dict[str, Any] = json.loads(done.stdout)["deployment"]
    return deployment


def pending_in(deployment: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["type"], p["resource"]["urn"]) for p in deployment.get("pending_operations") or []]


def ops(items: list[pb.PendingOperation]) -> list[tuple[str, str]]:
    return [(p.type, p.urn) for p in items]


def witness_config(seconds: int, witness: Path) -> pb.SetAllConfigRequest:
    return pb.SetAllConfigRequest(
        config=[
            pb.ConfigItem(key="seconds", value=Value.from_dict(str(seconds))),
            pb.ConfigItem(key="witness", value=Value.from_dict(str(witness))),
        ]
    )


async def wait_for_file(path: Path, within: float = 180) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(path.exists):
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.2)


async def kill_mid_create(work: Path, journal: Path, real: RealPulumi, witness: Path, op_id: str) -> None:
    """The agent and everything it started killed -9 while step2's create runs (as chaos's kill -9 of
    the pod): the state keeps a pending create and the lock."""
    async with agent_process(work, journal, real, 300, witness_config(300, witness)) as (proc, stub):
        await stub.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id=op_id)))
        await wait_for_file(witness)  # step2's create runs in the command provider
        kill_pod(proc.pid)
    assert lock_files(real), "kill -9 leaves the engine no chance to remove its lock"


def move_lock(real: RealPulumi, hostname: str) -> str:
    """Rewrite the one lock file as if ``hostname`` had taken it; the hostname it named."""
    (path,) = lock_files(real)
    lock = json.loads(path.read_text())
    before = str(lock["hostname"])
    path.write_text(json.dumps({**lock, "hostname": hostname}))
    return before


async def test_a_create_killed_mid_up_is_run_again_in_one_up_that_removes_the_lock_and_clears_it(
    tmp_path: Path, real: RealPulumi
) -> None:
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(PROGRAM)
    witness = tmp_path / "witness"
    await kill_mid_create(work, tmp_path / "journal", real, witness, "k-1")
    assert pending_in(export(real, work)) == [("creating", urn("step2"))]

    async with agent_process(work, tmp_path / "journal2", real, 0, witness_config(0, witness)) as (_, stub):
        # The same lock as another host's: left to its owner, the up fails StackLocked and runs nothing.
        here = move_lock(real, "laptop")
        _, blocked = collect(await drain(stub.up(pb.UpRequest(operation_id="k-2"))))
        assert blocked is not None and blocked.state == pb.OperationState.FAILED, blocked
        assert blocked.failure is not None and blocked.failure.reason == "StackLocked", blocked.failure
        assert blocked.failure.lock is not None and "@laptop (pid " in blocked.failure.lock.owner
        assert "removed" not in blocked.failure.message, blocked.failure
        assert blocked.removed_lock is None
        assert ops(blocked.pending_operations) == [("creating", urn("step2"))]
        assert len(lock_files(real)) == 1
        assert witness.read_text().splitlines() == ["started"]

        # This host's, from before this agent started: removed, and the up runs again in the same
        # operation, which succeeds: one result, naming the lock and what the killed update left.
        move_lock(real, here)
        events, up = collect(await drain(stub.up(pb.UpRequest(operation_id="k-3"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        assert up.failure is None
        assert up.removed_lock is not None and up.removed_lock.lock is not None, up
        assert f"@{here} (pid " in up.removed_lock.lock.owner, up.removed_lock
        assert up.removed_lock.lock.acquired is not None
        assert ops(up.removed_lock.pending_operations) == [("creating", urn("step2"))]
        warned = [
            e["diagnosticEvent"]["message"]
            for e in events
            if (e.get("diagnosticEvent") or {}).get("severity") == "warning"
        ]
        # The engine met the pending create as an up after the failed one did before: it warns, creates
        # step2 again and keeps the record, which the agent clears.
        assert any("1 pending operations from previous deployment" in w for w in warned), warned
        assert ops(up.cleared_pending_operations) == [("creating", urn("step2"))]
        assert up.pending_operations == []

        state = export(real, work)
        assert pending_in(state) == []
        assert urn("step2") in {r["urn"] for r in state["resources"]}
        assert lock_files(real) == []
        assert witness.read_text().splitlines() == ["started", "started"]

        # Nothing left to clear, no lock to remove: the next up reports neither.
        _, again = collect(await drain(stub.up(pb.UpRequest(operation_id="k-4"))))
        assert again is not None and again.state == pb.OperationState.SUCCEEDED, again
        assert again.cleared_pending_operations == [] and again.pending_operations == []
        assert again.removed_lock is None


async def test_a_create_killed_mid_up_stays_pending_after_a_refresh_until_an_up_creates_it(
    tmp_path: Path, real: RealPulumi
) -> None:
    """A refresh does not run the program: the interrupted create is not known stale, so it stays
    (reported in the result, beside the lock the refresh removed); the up after it creates the resource
    and clears it."""
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(PROGRAM)
    witness = tmp_path / "witness"
    await kill_mid_create(work, tmp_path / "journal", real, witness, "r-1")

    async with agent_process(work, tmp_path / "journal2", real, 0, witness_config(0, witness)) as (_, stub):
        _, refreshed = collect(await drain(stub.refresh(pb.RefreshRequest(operation_id="r-2"))))
        assert refreshed is not None and refreshed.state == pb.OperationState.SUCCEEDED, refreshed
        assert refreshed.removed_lock is not None, refreshed
        assert ops(refreshed.removed_lock.pending_operations) == [("creating", urn("step2"))]
        assert refreshed.cleared_pending_operations == []
        assert ops(refreshed.pending_operations) == [("creating", urn("step2"))]
        assert pending_in(export(real, work)) == [("creating", urn("step2"))]
        assert lock_files(real) == []

        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="r-4"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        assert up.removed_lock is None
        assert ops(up.cleared_pending_operations) == [("creating", urn("step2"))]
        assert pending_in(export(real, work)) == []

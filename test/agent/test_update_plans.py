"""Update plans, change sets and drift on the real Pulumi engine (hack/build-pulumi.sh), through the
agent's gRPC service: what the approval gate and drift detection of issue 29 build on.

The program's resources are files, through a Python dynamic provider: creating one writes the file,
reading one reports the file as it is (its content as input and output), so a resource drifts when
the test edits the file, and is gone when the test deletes it; no cluster is needed. The dynamic
provider reports no ``diffs``/``detailedDiff`` (the Kubernetes provider does), so the changed paths
here are the agent's own reading of the old and new state (``engineevents.step_paths``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pko.agent.journal import agent_state_dir
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from test_server import drain

from pko.devtools.agents import RunningAgent, collect, start_agent
from pko.devtools.realpulumi import RealPulumi, make_real_pulumi

pytestmark = pytest.mark.timeout(900)

FILES_PROGRAM = """\
import os

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult


class FileProvider(ResourceProvider):
    def create(self, props):
        with open(props["path"], "w") as f:
            f.write(props["content"])
        return CreateResult(id_=props["path"], outs={"path": props["path"], "content": props["content"]})

    def read(self, id_, props):
        if not os.path.exists(id_):
            return ReadResult(id_=None, outs={})
        with open(id_) as f:
            live = {"path": id_, "content": f.read()}
        return ReadResult(id_=id_, outs=live, inputs=live)

    def diff(self, _id, olds, news):
        changed = [k for k in ("path", "content") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=["path"] if "path" in changed else [])

    def update(self, _id, olds, news):
        with open(news["path"], "w") as f:
            f.write(news["content"])
        return UpdateResult(outs={"path": news["path"], "content": news["content"]})

    def delete(self, id_, props):
        if os.path.exists(id_):
            os.remove(id_)


class File(Resource):
    content: pulumi.Output[str]

    def __init__(self, name, path, content):
        super().__init__(FileProvider(), name, {"path": path, "content": content})


config = pulumi.Config()
folder = config.require("folder")
a = File("a", os.path.join(folder, "a.txt"), config.require("content"))
b = File("b", os.path.join(folder, "b.txt"), "bee")
pulumi.export("content", a.content)
"""
# The program changed after its preview: one more resource.
EXTRA_RESOURCE = 'c = File("c", os.path.join(folder, "c.txt"), "sea")\n'
FILE_TYPE = "pulumi-python:dynamic:Resource"


def urn(name: str) -> str:
    return f"urn:pulumi:dev::files::{FILE_TYPE}::{name}"


@pytest.fixture
def real(tmp_path: Path) -> RealPulumi:
    return make_real_pulumi(tmp_path / "pulumi")


@pytest.fixture
async def agent(tmp_path: Path, real: RealPulumi) -> AsyncIterator[RunningAgent]:
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text("name: files\nruntime: python\n")
    (work / "__main__.py").write_text(FILES_PROGRAM)
    (tmp_path / "cloud").mkdir()
    running = await start_agent(work, tmp_path / "journal", env=real.env, pulumi_root=real.root, stack="dev")
    yield running
    await running.stop()


def changes(result: pb.OperationResult) -> list[tuple[str, str, list[str]]]:
    return [(c.urn, c.op, list(c.paths)) for c in result.changes]


async def test_a_saved_plan_is_applied_once_and_refuses_a_changed_program(
    tmp_path: Path, agent: RunningAgent
) -> None:
    cloud = tmp_path / "cloud"
    plans = agent_state_dir(tmp_path / "workspace") / "plans"
    channel = agent.channel()
    stub = agent.stub(channel)

    async def configure(content: str) -> None:
        items = [
            pb.ConfigItem(key="folder", value=Value.from_dict(str(cloud))),
            pb.ConfigItem(key="content", value=Value.from_dict(content)),
        ]
        await stub.set_all_config(pb.SetAllConfigRequest(config=items))

    async def run(request: pb.PreviewRequest | pb.UpRequest) -> pb.OperationResult:
        stream = stub.preview(request) if isinstance(request, pb.PreviewRequest) else stub.up(request)
        _, result = collect(await drain(stream))
        assert result is not None
        return result

    try:
        await configure("one")
        first = await run(pb.UpRequest(operation_id="u-1"))
        assert first.state == pb.OperationState.SUCCEEDED, first
        assert {(u, op) for u, op, _ in changes(first)} >= {(urn("a"), "create"), (urn("b"), "create")}

        # The preview that would be approved: its plan saved, its change set the one a digest covers.
        await configure("two")
        preview = await run(pb.PreviewRequest(operation_id="p-1", save_plan=True))
        assert preview.state == pb.OperationState.SUCCEEDED, preview
        assert (plans / "p-1.json").is_file() and json.loads((plans / "p-1.json").read_text())[
            "resourcePlans"
        ]
        assert (urn("a"), "update", ["content"]) in changes(preview), changes(preview)
        assert all(u != urn("b") for u, _, _ in changes(preview)), "a `same` step is no change"
        assert [(c.urn, c.op) for c in preview.changes] == sorted((c.urn, c.op) for c in preview.changes)
        plain = await run(pb.PreviewRequest(operation_id="p-0"))
        assert plain.state == pb.OperationState.SUCCEEDED and not (plans / "p-0.json").exists()
        assert changes(plain) == changes(preview), "the same program and state: the same change set"

        # `up --plan`: what was previewed is what runs; the plan is spent and deleted.
        applied = await run(pb.UpRequest(operation_id="u-2", plan="p-1"))
        assert applied.state == pb.OperationState.SUCCEEDED, applied
        assert (cloud / "a.txt").read_text() == "two"
        assert (urn("a"), "update", ["content"]) in changes(applied)
        assert not (plans / "p-1.json").exists()
        again = await run(pb.UpRequest(operation_id="u-3", plan="p-1"))
        assert again.state == pb.OperationState.FAILED and again.failure is not None
        assert again.failure.reason == "PlanNotFound" and "'p-1'" in again.failure.message, again.failure
        never = await run(pb.UpRequest(operation_id="u-4", plan="no-such-preview"))
        assert never.failure is not None and never.failure.reason == "PlanNotFound"

        # The program changed after its preview: the engine refuses the step the plan lacks.
        await configure("three")
        assert (await run(pb.PreviewRequest(operation_id="p-2", save_plan=True))).state == (
            pb.OperationState.SUCCEEDED
        )
        main = tmp_path / "workspace" / "__main__.py"
        main.write_text(FILES_PROGRAM + EXTRA_RESOURCE)
        refused = await run(pb.UpRequest(operation_id="u-5", plan="p-2"))
        assert refused.state == pb.OperationState.FAILED and refused.failure is not None
        assert refused.failure.reason == "PlanMismatch", refused.failure
        assert "create is not allowed by the plan" in refused.failure.message, refused.failure.message
        assert urn("c") in refused.failure.message
        assert not (cloud / "c.txt").exists()
        assert not (plans / "p-2.json").exists(), "a plan the program no longer matches is spent"
    finally:
        channel.close()


async def test_a_preview_only_refresh_reports_drift_and_writes_nothing(
    tmp_path: Path, agent: RunningAgent
) -> None:
    cloud = tmp_path / "cloud"
    channel = agent.channel()
    stub = agent.stub(channel)

    async def refresh(op: str) -> pb.OperationResult:
        _, result = collect(await drain(stub.refresh(pb.RefreshRequest(operation_id=op, preview_only=True))))
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        return result

    try:
        items = [
            pb.ConfigItem(key="folder", value=Value.from_dict(str(cloud))),
            pb.ConfigItem(key="content", value=Value.from_dict("one")),
        ]
        await stub.set_all_config(pb.SetAllConfigRequest(config=items))
        _, up = collect(await drain(stub.up(pb.UpRequest(operation_id="u-1"))))
        assert up is not None and up.state == pb.OperationState.SUCCEEDED, up
        assert changes(await refresh("r-1")) == [], "nothing drifted"

        (cloud / "a.txt").write_text("changed by hand")
        (cloud / "b.txt").unlink()
        drift = await refresh("r-2")
        assert changes(drift) == [(urn("a"), "update", ["content"]), (urn("b"), "delete", [])]
        assert drift.change_summary == {"update": 1, "delete": 1, "same": 1}, drift.change_summary
        # Read-only: the state still holds what the up wrote, so the same drift is found again.
        assert changes(await refresh("r-3")) == changes(drift)
    finally:
        channel.close()

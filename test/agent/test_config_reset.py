"""SelectStack's ``reset_config`` on the real engine: a live agent re-initialized with a smaller config
ends with exactly that config (plus what the program's own stack settings file holds), as a fresh
workspace pod would; also after an agent restart, with ESC environments and with secrets. And the
server refuses it while an operation runs (the stand-in CLI, whose `up` can hang), through the
operator's client.

The runner is driven directly (PulumiRunner over a work dir and a file backend); the stack's config
is read back with the Automation API (`pulumi config --json`), which is what an operation would get.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from pko.agent.pulumirunner import CommandFailed, PulumiRunner, RunnerSettings
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from pulumi import automation as auto
from pulumi.automation import errors as auto_errors
from test_server import FOREVER_PROGRAM, runner_env, wait_for_event, write_program

from pko.agentclient import AgentClient, AgentError
from pko.devtools.agents import start_agent
from pko.devtools.realpulumi import RealPulumi, make_real_pulumi
from pko.devtools.standin import make_fake_pulumi
from pko.tokens import TokenSource

pytestmark = pytest.mark.timeout(600)

PROJECT = "name: resetproj\nruntime: yaml\n"
OWN = "# the program's own settings, from its repository\nconfig:\n  resetproj:own: checkout\n"


@pytest.fixture
def real(tmp_path: Path) -> RealPulumi:
    return make_real_pulumi(tmp_path / "pulumi")


def workspace(tmp_path: Path, project: str = PROJECT, own: str | None = None) -> Path:
    work = tmp_path / "workspace"
    work.mkdir(parents=True, exist_ok=True)
    (work / "Pulumi.yaml").write_text(project)
    if own is not None:
        (work / "Pulumi.dev.yaml").write_text(own)
    return work


def settings(work: Path, real: RealPulumi, stack: str | None = None) -> RunnerSettings:
    return RunnerSettings(work_dir=work, env_vars=real.env, pulumi_root=real.root, stack_name=stack)


def item(key: str, value: str, secret: bool = False) -> pb.ConfigItem:
    return pb.ConfigItem(key=key, value=Value.from_dict(value), secret=secret)


async def config_of(runner: PulumiRunner) -> dict[str, tuple[str, bool]]:
    stack = await runner.require_stack()
    got = await asyncio.to_thread(stack.get_all_config)
    return {key: (v.value, v.secret) for key, v in got.items()}


def settings_doc(work: Path) -> dict[str, Any]:
    path = work / "Pulumi.dev.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


async def test_a_reset_forgets_removed_keys_when_the_program_has_no_settings_file(
    tmp_path: Path, real: RealPulumi
) -> None:
    work = workspace(tmp_path)
    runner = await PulumiRunner.open(settings(work, real))
    await runner.select_stack("dev", create=True)
    await runner.set_all_config([item("a", "1"), item("b", "2")])
    assert await config_of(runner) == {"resetproj:a": ("1", False), "resetproj:b": ("2", False)}
    identity = {k: v for k, v in settings_doc(work).items() if k != "config"}  # what `stack init` wrote

    summary = await runner.select_stack("dev", create=True, reset_config=True)
    assert summary is not None and summary.name == "dev"
    # No config is left; the stack's own secrets-provider settings (its passphrase salt) are kept.
    assert settings_doc(work) == identity
    assert set(identity) <= {"encryptionsalt", "secretsprovider", "encryptedkey"}
    assert await config_of(runner) == {}

    await runner.set_all_config([item("a", "3")])
    assert await config_of(runner) == {"resetproj:a": ("3", False)}


async def test_a_selection_without_its_summary_lists_no_stacks(
    tmp_path: Path, real: RealPulumi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator selects before each operation and never reads the summary: ``summary=False``
    saves the ``pulumi stack ls`` behind it."""
    work = workspace(tmp_path)
    runner = await PulumiRunner.open(settings(work, real))
    await runner.select_stack("dev", create=True)
    listed: list[int] = []
    original = runner._ws.list_stacks

    def counting() -> Any:
        listed.append(1)
        return original()

    monkeypatch.setattr(runner._ws, "list_stacks", counting)
    assert await runner.select_stack("dev", summary=False) is None
    assert await runner.select_stack("dev", reset_config=True, summary=False) is None
    assert listed == []
    summary = await runner.select_stack("dev")
    assert summary is not None and summary.name == "dev" and listed == [1]


async def test_the_selected_stack_is_selected_again_without_the_cli_unless_it_may_not_be_created(
    tmp_path: Path, real: RealPulumi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator selects before each up and each re-initialization: with ``create`` the stack this
    agent already selected costs no ``pulumi stack select``. Without ``create`` (destroy, refresh) the
    CLI always looks; a stack removed behind the agent's back fails the next up, and the selection
    after that asks the CLI again (and creates it, as before)."""
    work = workspace(tmp_path)
    runner = await PulumiRunner.open(settings(work, real))
    await runner.select_stack("dev", create=True)
    looked: list[str] = []
    original = auto.Stack.select

    def counting(name: str, ws: Any) -> Any:
        looked.append(name)
        return original(name, ws)

    monkeypatch.setattr(auto.Stack, "select", counting)
    await runner.select_stack("dev", create=True, summary=False)
    await runner.set_all_config([item("a", "1")])
    await runner.select_stack("dev", create=True, reset_config=True, summary=False)
    assert looked == []
    assert await config_of(runner) == {}  # the reset happened all the same
    await runner.select_stack("dev", summary=False)
    assert looked == ["dev"]

    await asyncio.to_thread(runner._ws.remove_stack, "dev")  # as `pulumi stack rm` through kubectl exec
    await runner.select_stack("dev", create=True, summary=False)
    assert looked == ["dev"]
    events: list[dict[str, Any]] = []
    failed = await runner.run("u-1", pb.UpRequest(operation_id="u-1"), events.append)
    assert failed.state == pb.OperationState.FAILED
    await runner.select_stack("dev", create=True, summary=False)
    assert looked == ["dev", "dev"]
    up = await runner.run("u-2", pb.UpRequest(operation_id="u-2"), events.append)
    assert up.state == pb.OperationState.SUCCEEDED, up.failure


async def test_a_reset_brings_back_the_programs_own_settings_file(tmp_path: Path, real: RealPulumi) -> None:
    work = workspace(tmp_path, own=OWN)
    runner = await PulumiRunner.open(settings(work, real))
    await runner.select_stack("dev", create=True)
    await runner.set_all_config([item("own", "changed"), item("a", "1"), item("b", "2")])
    assert (await config_of(runner))["resetproj:own"] == ("changed", False)

    await runner.select_stack("dev", reset_config=True)
    assert (work / "Pulumi.dev.yaml").read_text().startswith(OWN)  # its text, comment and all
    await runner.set_all_config([item("a", "3")])
    assert await config_of(runner) == {"resetproj:own": ("checkout", False), "resetproj:a": ("3", False)}


async def test_an_agent_restart_keeps_the_first_snapshot(tmp_path: Path, real: RealPulumi) -> None:
    work = workspace(tmp_path, own=OWN)
    snapshots = tmp_path / ".agent" / "stack-settings"  # the default, beside the work dir
    first = await PulumiRunner.open(settings(work, real))
    await first.select_stack("dev", create=True)
    await first.set_all_config([item("own", "changed"), item("a", "1")])
    taken = {p.name: p.read_bytes() for p in snapshots.iterdir()}
    assert len(taken) == 1

    # A new agent process in the same pod: it selects the stack at start (--stack) and again when the
    # operator's client re-selects it; neither records the file config was set in.
    second = await PulumiRunner.open(settings(work, real, stack="dev"))
    await second.select_stack("dev")
    await second.set_all_config([item("b", "2")])
    assert {p.name: p.read_bytes() for p in snapshots.iterdir()} == taken

    await second.select_stack("dev", reset_config=True)
    assert await config_of(second) == {"resetproj:own": ("checkout", False)}


async def test_environments_removed_by_a_reset(tmp_path: Path, real: RealPulumi) -> None:
    work = workspace(tmp_path)
    runner = await PulumiRunner.open(settings(work, real))
    await runner.select_stack("dev", create=True)
    await runner.set_all_config([item("a", "1")])
    # ESC environments need Pulumi Cloud: the file backend refuses AddEnvironments...
    with pytest.raises(CommandFailed, match="environments"):
        await runner.add_environments(["org/env"])
    # ...so the `environment:` list it writes there is written by hand.
    path = work / "Pulumi.dev.yaml"
    doc = settings_doc(work)
    path.write_text(yaml.safe_dump({**doc, "environment": ["org/env", "org/other"]}))
    with pytest.raises(auto_errors.CommandError, match="environments"):
        await config_of(runner)  # importing environments, the stack is unusable on this backend

    await runner.select_stack("dev", reset_config=True)
    assert "environment" not in settings_doc(work) and "config" not in settings_doc(work)
    assert await config_of(runner) == {}


SECRET_PROJECT = """\
name: resetproj
runtime: yaml
outputs:
  tok: ${tok}
  plain: ${a}
"""


async def test_secrets_after_a_reset(tmp_path: Path, real: RealPulumi) -> None:
    """The passphrase salt `stack init` wrote is kept across a reset (the checkout's file has none), so
    config and state secrets stay under one key; a settings file without it, as a fresh pod might
    have, works too: the CLI makes a new salt and still reads the state's secrets."""
    work = workspace(tmp_path, SECRET_PROJECT)
    runner = await PulumiRunner.open(settings(work, real))
    await runner.select_stack("dev", create=True)
    await runner.set_all_config([item("a", "1"), item("tok", "one", secret=True)])
    salt = settings_doc(work)["encryptionsalt"]
    assert "one" not in (work / "Pulumi.dev.yaml").read_text()
    events: list[dict[str, Any]] = []
    up = await runner.run("u-1", pb.UpRequest(operation_id="u-1"), events.append)
    assert up.state == pb.OperationState.SUCCEEDED, up.failure
    assert (up.outputs["tok"].value, up.outputs["tok"].secret) == (b'"one"', True)

    await runner.select_stack("dev", reset_config=True)
    assert settings_doc(work) == {"encryptionsalt": salt}
    assert await config_of(runner) == {}
    await runner.set_all_config([item("a", "2"), item("tok", "two", secret=True)])
    assert await config_of(runner) == {"resetproj:a": ("2", False), "resetproj:tok": ("two", True)}
    assert settings_doc(work)["encryptionsalt"] == salt
    preview = await runner.run("p-1", pb.PreviewRequest(operation_id="p-1"), events.append)
    assert preview.state == pb.OperationState.SUCCEEDED, preview.failure
    up = await runner.run("u-2", pb.UpRequest(operation_id="u-2"), events.append)
    assert up.state == pb.OperationState.SUCCEEDED, up.failure
    assert (up.outputs["tok"].value, up.outputs["tok"].secret) == (b'"two"', True)

    # Without the salt (as in a fresh pod whose checkout has no settings file).
    (work / "Pulumi.dev.yaml").unlink()
    await runner.set_all_config([item("a", "3"), item("tok", "three", secret=True)])
    assert settings_doc(work)["encryptionsalt"] != salt
    up = await runner.run("u-3", pb.UpRequest(operation_id="u-3"), events.append)
    assert up.state == pb.OperationState.SUCCEEDED, up.failure
    assert (up.outputs["tok"].value, up.outputs["plain"].value) == (b'"three"', b"3")  # YAML's number


class _NoTokens:
    """The agent under test runs without auth: any token does."""

    async def token(self, audience: str) -> str:
        return "unused"

    def invalidate(self, audience: str) -> None:
        pass


async def test_a_reset_is_refused_while_an_operation_runs(tmp_path: Path) -> None:
    fake = make_fake_pulumi(tmp_path / "pulumi")
    work = write_program(tmp_path, FOREVER_PROGRAM)
    agent = await start_agent(
        work, tmp_path / "journal", env=runner_env(fake), pulumi_root=fake.root, stack="dev"
    )
    channel = agent.channel()
    stub = agent.stub(channel)
    tokens = cast(TokenSource, _NoTokens())
    try:
        async with AgentClient(f"{agent.host}:{agent.port}", "ws.ns", tokens) as client:
            await client.select_stack("dev", create=True, reset_config=True)
            remembered = pb.SelectStackRequest(stack_name="dev", create=True, skip_summary=True)
            assert client._selection == remembered  # re-sent after an agent restart: never a reset
            await client.set_all_config([item("a", "1")])
            path = work / "Pulumi.dev.yaml"
            before = path.read_bytes()

            await client.start_operation(pb.StartOperationRequest(up=pb.UpRequest(operation_id="r-1")))
            await wait_for_event(stub, "r-1", lambda ev: "resourcePreEvent" in ev)
            with pytest.raises(AgentError) as refused:
                await client.select_stack("dev", reset_config=True)
            assert (refused.value.code, refused.value.transient) == ("FAILED_PRECONDITION", False)
            assert "reset the stack's config" in refused.value.message
            assert path.read_bytes() == before
            await client.select_stack("dev")  # the same stack, no reset: as before, allowed

            await client.cancel_operation("r-1")
            async for _ in client.watch_operation("r-1"):
                pass
            await client.select_stack("dev", reset_config=True)
            assert "config" not in ((yaml.safe_load(path.read_text()) or {}) if path.exists() else {})
    finally:
        channel.close()
        await agent.stop()

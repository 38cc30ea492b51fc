"""Python policy packs on the real engine (hack/build-pulumi.sh) through the agent's gRPC service: a pack
with a mandatory and an advisory policy over the Pulumi YAML program of test_policy_packs.py, its
virtualenv the pinned ``pulumi-policy`` (pko.devtools.policypacks.python_policy_env), launched by the
agent (agent/policypacks.py: the Python host we build cannot run a pack for this engine).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pko.agent import policypacks
from pko.agent.policypacks import REASON_POLICY_PACK_FAILED, REASON_POLICY_VIOLATION
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from test_policy_packs import violations
from test_server import drain

from pko.devtools.agents import RunningAgent, collect, start_agent
from pko.devtools.policypacks import (
    POLICED_PROGRAM,
    POLICED_URN,
    PYTHON_PACK,
    python_policy_env,
    python_policy_wheels,
    write_python_pack,
)
from pko.devtools.realpulumi import RealPulumi, install_command_provider, make_real_pulumi

pytestmark = pytest.mark.timeout(300)

MANDATORY = (
    "pko-commands-py",
    "0.2.0",
    "no-forbidden-commands",
    "mandatory",
    POLICED_URN,
    "this command says 'forbidden'",
)
ADVISORY = ("pko-commands-py", "0.2.0", "commands-have-delete", "advisory", POLICED_URN, "no delete command")


@pytest.fixture(scope="module")
def venv() -> Path:
    return python_policy_env()


@pytest.fixture(scope="module")
def wheels() -> Path:
    return python_policy_wheels()


@pytest.fixture
async def agent(tmp_path: Path, venv: Path, wheels: Path) -> AsyncIterator[RunningAgent]:
    real: RealPulumi = make_real_pulumi(tmp_path / "pulumi")
    install_command_provider(real)
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(POLICED_PROGRAM)
    packs = work / "policies"
    write_python_pack(packs / "commands", PYTHON_PACK, venv, version="0.2.0")
    write_python_pack(packs / "syntax", PYTHON_PACK + "this is not python(\n", venv)
    write_python_pack(packs / "imports", "import pko_no_such_module\n" + PYTHON_PACK, venv)
    write_python_pack(packs / "novenv", PYTHON_PACK, "venv", requirements=None)
    # A pack naming no virtualenv: the image's policy environment (PKO_POLICY_PYTHON) runs it.
    write_python_pack(packs / "bare", PYTHON_PACK, None, version="0.4.0", requirements=None)
    # Virtualenvs the agent makes from the pack's requirements.txt, offline from the pinned wheels.
    write_python_pack(packs / "made", PYTHON_PACK, "venv", version="0.3.0")
    write_python_pack(packs / "unknown", PYTHON_PACK, "venv", requirements="pko-no-such-package==1.0\n")
    env = {**real.env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    env["PKO_POLICY_PYTHON"] = str(venv / "bin" / "python")
    running = await start_agent(work, tmp_path / "journal", env=env, pulumi_root=real.root, stack="dev")
    yield running
    await running.stop()


async def run(
    agent: RunningAgent, create: str, request: pb.PreviewRequest | pb.UpRequest
) -> pb.OperationResult:
    stub = agent.stub(agent.channel())
    config = [pb.ConfigItem(key="create", value=Value.from_dict(create))]
    await stub.set_all_config(pb.SetAllConfigRequest(config=config))
    stream = stub.preview(request) if isinstance(request, pb.PreviewRequest) else stub.up(request)
    _, result = collect(await drain(stream))
    assert result is not None
    return result


async def test_a_mandatory_violation_of_a_python_pack_refuses_the_up_and_an_advisory_one_is_reported(
    tmp_path: Path, agent: RunningAgent
) -> None:
    witness = tmp_path / "witness"
    pack = pb.PolicyPack(name="commands", path="policies/commands")

    preview = await run(
        agent, f"echo forbidden >> {witness}", pb.PreviewRequest(operation_id="p-1", policy_pack=[pack])
    )
    assert preview.failure.reason == REASON_POLICY_VIOLATION, preview.failure

    refused = await run(
        agent, f"echo forbidden >> {witness}", pb.UpRequest(operation_id="u-1", policy_pack=[pack])
    )
    assert refused.state == pb.OperationState.FAILED, refused
    assert refused.failure.reason == REASON_POLICY_VIOLATION, refused.failure
    for said in (
        "pko-commands-py@0.2.0",
        "no-forbidden-commands",
        POLICED_URN,
        "this command says 'forbidden'",
    ):
        assert said in refused.failure.message, refused.failure.message
    assert violations(refused) == [MANDATORY, ADVISORY]
    assert not witness.exists(), "the command ran although a mandatory policy refused it"

    passed = await run(
        agent, f"echo allowed >> {witness}", pb.UpRequest(operation_id="u-2", policy_pack=[pack])
    )
    assert passed.state == pb.OperationState.SUCCEEDED, passed
    assert witness.read_text() == "allowed\n"
    assert violations(passed) == [ADVISORY]

    quiet = pb.PolicyPack(
        name="commands", path="policies/commands", config='{"commands-have-delete": "disabled"}'
    )
    configured = await run(agent, "echo allowed", pb.PreviewRequest(operation_id="p-2", policy_pack=[quiet]))
    assert configured.state == pb.OperationState.SUCCEEDED, configured
    assert violations(configured) == []
    assert not list((agent.options.runner.work_dir.parent / ".agent" / "policy-config").glob("*")), (
        "the launchers and configuration files outlived their operation"
    )


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("syntax", "SyntaxError: '(' was never closed"),
        ("imports", "ModuleNotFoundError: No module named 'pko_no_such_module'"),
    ],
)
async def test_a_python_pack_that_does_not_load_fails_naming_the_pack_in_pythons_words(
    agent: RunningAgent, name: str, said: str
) -> None:
    broken = pb.PolicyPack(name=name, path=f"policies/{name}")
    commands = pb.PolicyPack(name="commands", path="policies/commands")
    result = await run(
        agent, "echo allowed", pb.PreviewRequest(operation_id="p-1", policy_pack=[commands, broken])
    )
    assert result.state == pb.OperationState.FAILED, result
    assert result.failure.reason == REASON_POLICY_PACK_FAILED, result.failure
    assert result.failure.message == f"policy pack {name!r} could not be loaded: {said}", result.failure


async def test_a_python_pack_naming_no_virtualenv_runs_with_the_images_policy_environment(
    agent: RunningAgent,
) -> None:
    bare = pb.PolicyPack(name="bare", path="policies/bare")
    result = await run(agent, "echo forbidden", pb.PreviewRequest(operation_id="p-1", policy_pack=[bare]))
    assert result.failure.reason == REASON_POLICY_VIOLATION, result.failure
    assert violations(result) == [
        ("pko-commands-py", "0.4.0", *MANDATORY[2:]),
        ("pko-commands-py", "0.4.0", *ADVISORY[2:]),
    ]


async def test_a_python_packs_virtualenv_is_made_from_its_requirements_or_refused_in_pips_words(
    agent: RunningAgent,
) -> None:
    packs = agent.options.runner.work_dir / "policies"
    made = pb.PolicyPack(name="made", path="policies/made")
    result = await run(agent, "echo forbidden", pb.PreviewRequest(operation_id="p-1", policy_pack=[made]))
    assert result.failure.reason == REASON_POLICY_VIOLATION, result.failure
    assert "pko-commands-py@0.3.0" in result.failure.message, result.failure
    assert (packs / "made" / "venv" / "pyvenv.cfg").is_file()

    unknown = pb.PolicyPack(name="unknown", path="policies/unknown")
    result = await run(agent, "echo allowed", pb.PreviewRequest(operation_id="p-2", policy_pack=[unknown]))
    assert result.failure.reason == REASON_POLICY_PACK_FAILED, result.failure
    assert result.failure.message == (
        "policy pack 'unknown': installing its requirements.txt failed: "
        "ERROR: Could not find a version that satisfies the requirement pko-no-such-package==1.0 "
        "(from versions: none); "
        "ERROR: No matching distribution found for pko-no-such-package==1.0"
    ), result.failure

    novenv = pb.PolicyPack(name="novenv", path="policies/novenv")
    result = await run(agent, "echo allowed", pb.PreviewRequest(operation_id="p-3", policy_pack=[novenv]))
    assert result.failure.reason == REASON_POLICY_PACK_FAILED, result.failure
    assert result.failure.message == (
        f"policy pack 'novenv': its virtualenv {packs / 'novenv' / 'venv'} (runtime.options.virtualenv in "
        "PulumiPolicy.yaml) is not a virtualenv, and the pack has no requirements.txt to make it from"
    ), result.failure


def test_a_python_pack_goes_to_the_cli_as_a_launcher_of_its_python_and_is_removed_after(
    tmp_path: Path,
) -> None:
    js, py, plain = tmp_path / "js", tmp_path / "py", tmp_path / "plain"
    for directory, runtime in (
        (js, "nodejs"),
        (py, "{name: python, options: {virtualenv: venv}}"),
        (plain, "python"),
    ):
        directory.mkdir()
        (directory / "PulumiPolicy.yaml").write_text(f"runtime: {runtime}\nversion: 1.2.3\n")
    (py / "venv" / "bin").mkdir(parents=True)
    (py / "venv" / "pyvenv.cfg").touch()
    (py / "venv" / "bin" / "python").touch()
    packs = [pb.PolicyPack(name=n, path=n) for n in ("js", "py", "plain")]
    args = policypacks.pack_args(packs, tmp_path, tmp_path / "cfg", "op", {"PULUMI_PYTHON_CMD": "/opt/py3"})

    assert args.paths == [
        str(js),
        str(tmp_path / "cfg" / "op-1-python" / "pack"),
        str(tmp_path / "cfg" / "op-2-python" / "pack"),
    ]
    launcher = Path(args.paths[1])
    assert launcher.read_text() == f'#!/bin/sh\nexec {py}/venv/bin/python -u -m pulumi.policy "$@" {py}\n'
    assert launcher.stat().st_mode & 0o111
    assert (launcher.parent / "PulumiPolicy.yaml").read_text() == (py / "PulumiPolicy.yaml").read_text()
    assert Path(args.paths[2]).read_text() == f'#!/bin/sh\nexec /opt/py3 -u -m pulumi.policy "$@" {plain}\n'
    args.remove()
    assert not list((tmp_path / "cfg").iterdir())

    # The image's policy environment (PKO_POLICY_PYTHON) runs a pack naming no virtualenv; a pack naming
    # one keeps it.
    env = {"PULUMI_PYTHON_CMD": "/opt/py3", "PKO_POLICY_PYTHON": "/opt/pulumi/policy/bin/python"}
    args = policypacks.pack_args(packs, tmp_path, tmp_path / "cfg", "op", env)
    assert Path(args.paths[1]).read_text() == launcher.read_text()
    assert Path(args.paths[2]).read_text() == (
        f'#!/bin/sh\nexec /opt/pulumi/policy/bin/python -u -m pulumi.policy "$@" {plain}\n'
    )
    args.remove()

    # A pack refused (no virtualenv, no requirements.txt) leaves nothing of the others behind.
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "PulumiPolicy.yaml").write_text(
        "runtime: {name: python, options: {virtualenv: venv}}\n"
    )
    with pytest.raises(ValueError, match=r"policy pack 'bad': its virtualenv .* is not a virtualenv"):
        policypacks.pack_args(
            [packs[1], pb.PolicyPack(name="bad", path="bad")], tmp_path, tmp_path / "cfg", "op", {}
        )
    assert not list((tmp_path / "cfg").iterdir())

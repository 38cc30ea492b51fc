"""Policy packs on the real engine (hack/build-pulumi.sh) through the agent's gRPC service: a JavaScript
pack with a mandatory and an advisory policy over a Pulumi YAML program whose one resource is a
``command:local:Command`` (pulumi-command from hack/build-sources.sh), and the same pack in TypeScript,
type-checked by the SDK set's TypeScript (the image's /node_modules).

What this machine provides offline, and how the engine uses it: :mod:`pko.devtools.policypacks`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pko.agent.policypacks import REASON_POLICY_PACK_FAILED, REASON_POLICY_VIOLATION
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb
from test_server import drain

from pko.devtools.agents import RunningAgent, collect, start_agent
from pko.devtools.builds import built
from pko.devtools.policypacks import (
    JS_PACK,
    POLICED_PROGRAM,
    POLICED_URN,
    TS_PACK,
    engine_env,
    policy_sdk,
    write_pack,
    write_typescript_pack,
)
from pko.devtools.realpulumi import RealPulumi, install_command_provider, make_real_pulumi

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runtimes() -> Path:
    return built("build-runtimes.sh")


@pytest.fixture(scope="module")
def sdk(runtimes: Path) -> Path:
    return policy_sdk(runtimes)


@pytest.fixture
def real(tmp_path: Path) -> RealPulumi:
    real = make_real_pulumi(tmp_path / "pulumi")
    install_command_provider(real)
    return real


@pytest.fixture
async def agent(tmp_path: Path, real: RealPulumi, runtimes: Path, sdk: Path) -> AsyncIterator[RunningAgent]:
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(POLICED_PROGRAM)
    write_pack(work / "policies" / "commands", sdk, JS_PACK, "pko-commands")
    write_pack(work / "policies" / "broken", sdk, JS_PACK + "this is not javascript(\n", "pko-commands")
    # A pack as a git repository holds it: no node_modules, @pulumi/policy from the image's SDK set
    # (hack/build-runtimes.sh's node_modules: the image's /node_modules, here on NODE_PATH).
    bare = work / "policies" / "bare"
    bare.mkdir()
    (bare / "PulumiPolicy.yaml").write_text("runtime: nodejs\ndescription: a pack without node_modules\n")
    (bare / "package.json").write_text('{"name": "pko-bare", "version": "0.5.0", "main": "index.js"}')
    (bare / "index.js").write_text(JS_PACK)
    env = {**real.env, **engine_env(real.env["PATH"], runtimes)}
    running = await start_agent(work, tmp_path / "journal", env=env, pulumi_root=real.root, stack="dev")
    yield running
    await running.stop()


def violations(result: pb.OperationResult) -> list[tuple[str, str, str, str, str, str]]:
    return [
        (
            v.policy_pack,
            v.policy_pack_version,
            v.policy,
            v.enforcement_level,
            v.urn,
            v.message.splitlines()[-1],
        )
        for v in result.policy_violations
    ]


MANDATORY = (
    "pko-commands",
    "0.1.0",
    "no-forbidden-commands",
    "mandatory",
    POLICED_URN,
    "this command says 'forbidden'",
)
ADVISORY = ("pko-commands", "0.1.0", "commands-have-delete", "advisory", POLICED_URN, "no delete command")


async def test_a_mandatory_violation_fails_before_anything_is_created_and_an_advisory_one_is_reported(
    tmp_path: Path, agent: RunningAgent
) -> None:
    witness = tmp_path / "witness"
    stub = agent.stub(agent.channel())
    pack = pb.PolicyPack(name="commands", path="policies/commands")

    async def run(create: str, request: pb.PreviewRequest | pb.UpRequest) -> pb.OperationResult:
        config = [pb.ConfigItem(key="create", value=Value.from_dict(f"{create} >> {witness}"))]
        await stub.set_all_config(pb.SetAllConfigRequest(config=config))
        stream = stub.preview(request) if isinstance(request, pb.PreviewRequest) else stub.up(request)
        _, result = collect(await drain(stream))
        assert result is not None
        return result

    preview = await run("echo forbidden", pb.PreviewRequest(operation_id="p-1", policy_pack=[pack]))
    assert preview.state == pb.OperationState.FAILED, preview
    assert preview.failure.reason == REASON_POLICY_VIOLATION, preview.failure

    refused = await run("echo forbidden", pb.UpRequest(operation_id="u-1", policy_pack=[pack]))
    assert refused.state == pb.OperationState.FAILED, refused
    assert refused.failure.reason == REASON_POLICY_VIOLATION, refused.failure
    for said in ("pko-commands@0.1.0", "no-forbidden-commands", POLICED_URN, "this command says 'forbidden'"):
        assert said in refused.failure.message, refused.failure.message
    assert violations(refused) == [MANDATORY, ADVISORY]
    assert not witness.exists(), "the command ran although a mandatory policy refused it"

    passed = await run("echo allowed", pb.UpRequest(operation_id="u-2", policy_pack=[pack]))
    assert passed.state == pb.OperationState.SUCCEEDED, passed
    assert witness.read_text() == "allowed\n"
    assert violations(passed) == [ADVISORY]

    # The pack's configuration (`--policy-pack-config`) turns the advisory policy off.
    quiet = pb.PolicyPack(
        name="commands", path="policies/commands", config='{"commands-have-delete": "disabled"}'
    )
    configured = await run("echo allowed", pb.PreviewRequest(operation_id="p-2", policy_pack=[quiet]))
    assert configured.state == pb.OperationState.SUCCEEDED, configured
    assert violations(configured) == []
    assert not list((agent.options.runner.work_dir.parent / ".agent" / "policy-config").glob("*")), (
        "the configuration files outlived their operation"
    )


async def test_a_pack_that_does_not_load_fails_naming_the_pack_in_its_runtimes_words(
    tmp_path: Path, agent: RunningAgent
) -> None:
    stub = agent.stub(agent.channel())
    config = [pb.ConfigItem(key="create", value=Value.from_dict("echo allowed"))]
    await stub.set_all_config(pb.SetAllConfigRequest(config=config))
    broken = pb.PolicyPack(name="broken", path="policies/broken")
    _, result = collect(
        await drain(stub.preview(pb.PreviewRequest(operation_id="p-1", policy_pack=[broken])))
    )
    assert result is not None and result.state == pb.OperationState.FAILED, result
    assert result.failure.reason == REASON_POLICY_PACK_FAILED, result.failure
    assert "'broken'" in result.failure.message and "SyntaxError" in result.failure.message, result.failure

    bad_config = pb.PolicyPack(name="commands", path="policies/commands", config="[1, 2]")
    _, result = collect(
        await drain(stub.preview(pb.PreviewRequest(operation_id="p-2", policy_pack=[bad_config])))
    )
    assert result is not None and result.failure.reason == REASON_POLICY_PACK_FAILED, result
    assert result.failure.message == "policy pack 'commands': its config must be a JSON object"


async def test_a_pack_without_node_modules_runs_with_the_images_pulumi_policy(
    runtimes: Path, agent: RunningAgent
) -> None:
    assert (runtimes / "node_modules" / "@pulumi" / "policy" / "package.json").is_file()
    stub = agent.stub(agent.channel())
    config = [pb.ConfigItem(key="create", value=Value.from_dict("echo forbidden"))]
    await stub.set_all_config(pb.SetAllConfigRequest(config=config))
    bare = pb.PolicyPack(name="bare", path="policies/bare")
    _, result = collect(await drain(stub.preview(pb.PreviewRequest(operation_id="p-1", policy_pack=[bare]))))
    assert result is not None and result.failure.reason == REASON_POLICY_VIOLATION, result
    assert violations(result) == [
        ("pko-commands", "0.5.0", *MANDATORY[2:]),
        ("pko-commands", "0.5.0", *ADVISORY[2:]),
    ]


async def test_a_typescript_pack_without_node_modules_is_type_checked_by_the_images_typescript(
    tmp_path: Path, runtimes: Path, agent: RunningAgent
) -> None:
    # The image's layout: the SDK set in /node_modules (here a link to it), which Node.js and the
    # TypeScript compiler both search last, and a pack from git somewhere below, with no node_modules.
    root = tmp_path / "image"
    root.mkdir()
    (root / "node_modules").symlink_to(runtimes / "node_modules")
    assert (runtimes / "node_modules" / "typescript" / "package.json").is_file()
    broken = TS_PACK + 'const limit: number = "forbidden";\n'
    for name, source in (("typed", TS_PACK), ("mistyped", broken)):
        write_typescript_pack(root / "share" / "policy" / name, source, "pko-typed", "0.7.0")
    stub = agent.stub(agent.channel())
    config = [pb.ConfigItem(key="create", value=Value.from_dict("echo forbidden"))]
    await stub.set_all_config(pb.SetAllConfigRequest(config=config))

    typed = pb.PolicyPack(name="typed", path=str(root / "share" / "policy" / "typed"))
    _, result = collect(await drain(stub.preview(pb.PreviewRequest(operation_id="p-1", policy_pack=[typed]))))
    assert result is not None and result.failure.reason == REASON_POLICY_VIOLATION, result
    assert violations(result) == [
        ("pko-commands", "0.7.0", *MANDATORY[2:]),
        ("pko-commands", "0.7.0", *ADVISORY[2:]),
    ]

    # A type error stops the pack before it runs, in tsc's words (not an engine exit status).
    mistyped = pb.PolicyPack(name="mistyped", path=str(root / "share" / "policy" / "mistyped"))
    _, result = collect(
        await drain(stub.preview(pb.PreviewRequest(operation_id="p-2", policy_pack=[mistyped])))
    )
    assert result is not None and result.failure.reason == REASON_POLICY_PACK_FAILED, result
    line = len(TS_PACK.splitlines()) + 1
    assert result.failure.message == (
        "policy pack 'mistyped' could not be loaded: TSError: \u2a2f Unable to compile TypeScript: "
        f"index.ts({line},7): error TS2322: Type 'string' is not assignable to type 'number'."
    ), result.failure

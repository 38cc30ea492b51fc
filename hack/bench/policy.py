"""What a policy pack costs (issue 43): a preview and an up with no pack, with a JavaScript pack, with a
TypeScript pack and with a Python pack, side by side in one run, through the agent's gRPC service on the
real engine.

    .venv/bin/python hack/bench/policy.py                  # 7 rounds (~2.5 min on 2 cores)
    .venv/bin/python hack/bench/policy.py --rounds 1       # smoke

No cluster: four agents run in this process (pko.devtools.agents, as test/agent/test_policy_packs*.py run
them), each with a workspace of its own holding the same Pulumi YAML program (one
``command:local:Command``, pulumi-command from hack/build-sources.sh) and its own file backend. One agent
runs its operations with no pack, one with the JavaScript pack, one with the TypeScript pack (as a git
repository holds it: no node_modules, type-checked and run by the SDK set's TypeScript and ts-node, as in
the workspace image), one with the Python pack; the packs hold the same two policies (a mandatory one the
program keeps, an advisory one it breaks, so each operation reports one violation). A round is, for each
agent in turn, a preview then an up of a new command (a replace), so every agent does the same work; the
first round warms the caches and is not counted. Each figure is the time from the request to its result,
as the operator waits for it; the table shows each median and what the pack adds to the no-pack median of
the same run.

Prints a Markdown table; writes every timing with the run's record (pko.devtools.benchrecord: the date, the
git commit, the machine, the load average at start and end, the command) as JSON to ``--json`` (default
``.bench-logs/policy.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO
from pko.api.generated.google.protobuf import Value
from pko.api.generated.pko.agent import v1 as pb

from pko.devtools.agents import RunningAgent, collect, start_agent
from pko.devtools.benchrecord import finish_record, start_record, write_record
from pko.devtools.builds import built
from pko.devtools.policypacks import (
    JS_PACK,
    POLICED_PROGRAM,
    PYTHON_PACK,
    TS_PACK,
    engine_env,
    policy_sdk,
    python_policy_env,
    write_pack,
    write_python_pack,
    write_typescript_pack,
)
from pko.devtools.realpulumi import install_command_provider, make_real_pulumi
from pko.logging import configure_logging

VARIANTS = ("none", "javascript", "typescript", "python")
LABELS = {
    "none": "no pack",
    "javascript": "JavaScript pack",
    "typescript": "TypeScript pack",
    "python": "Python pack",
}
OPERATIONS = ("preview", "up")


async def start(
    base: Path, variant: str, runtimes: Path, venv: Path
) -> tuple[RunningAgent, list[pb.PolicyPack]]:
    """An agent whose workspace holds the program and, for a pack variant, the pack."""
    real = make_real_pulumi(base / "pulumi")
    install_command_provider(real)
    work = base / "workspace"
    work.mkdir(parents=True)
    (work / "Pulumi.yaml").write_text(POLICED_PROGRAM)
    packs: list[pb.PolicyPack] = []
    if variant == "javascript":
        write_pack(work / "policies" / "commands", policy_sdk(runtimes), JS_PACK, "pko-commands")
        packs = [pb.PolicyPack(name="commands", path="policies/commands")]
    elif variant == "typescript":
        # The image's layout: the SDK set in a node_modules above the pack (the image's /node_modules),
        # where ts-node finds TypeScript and tsc finds @pulumi/policy's types.
        (base / "node_modules").symlink_to(runtimes / "node_modules")
        write_typescript_pack(work / "policies" / "commands", TS_PACK, "pko-commands")
        packs = [pb.PolicyPack(name="commands", path="policies/commands")]
    elif variant == "python":
        write_python_pack(work / "policies" / "commands", PYTHON_PACK, venv)
        packs = [pb.PolicyPack(name="commands", path="policies/commands")]
    # Every agent gets the Node.js packs' environment, so only the pack differs.
    env = {**real.env, **engine_env(real.env["PATH"], runtimes)}
    agent = await start_agent(work, base / "journal", env=env, pulumi_root=real.root, stack="dev")
    return agent, packs


async def timed(
    agent: RunningAgent, request: pb.PreviewRequest | pb.UpRequest, create: str
) -> tuple[float, pb.OperationResult]:
    stub = agent.stub(agent.channel())
    config = [pb.ConfigItem(key="create", value=Value.from_dict(create))]
    await stub.set_all_config(pb.SetAllConfigRequest(config=config))
    began = time.perf_counter()
    stream = stub.preview(request) if isinstance(request, pb.PreviewRequest) else stub.up(request)
    _, result = collect([e async for e in stream])
    elapsed = time.perf_counter() - began
    if result is None or result.state != pb.OperationState.SUCCEEDED:
        raise RuntimeError(f"{request.operation_id} did not succeed: {result}")
    return elapsed, result


async def measure(rounds: int, work: Path) -> dict[str, dict[str, list[float]]]:
    runtimes = built("build-runtimes.sh")
    venv = python_policy_env()
    agents = {v: await start(work / v, v, runtimes, venv) for v in VARIANTS}
    times: dict[str, dict[str, list[float]]] = {v: {op: [] for op in OPERATIONS} for v in VARIANTS}
    try:
        for n in range(rounds + 1):  # round 0 warms up
            for variant, (agent, packs) in agents.items():
                create = f"echo round {n}"
                preview, previewed = await timed(
                    agent, pb.PreviewRequest(operation_id=f"p-{n}", policy_pack=packs), create
                )
                up, upped = await timed(agent, pb.UpRequest(operation_id=f"u-{n}", policy_pack=packs), create)
                if packs and not (previewed.policy_violations and upped.policy_violations):
                    raise RuntimeError(f"{variant}: the pack reported no violation: the pack did not run")
                if n:
                    times[variant]["preview"].append(preview)
                    times[variant]["up"].append(up)
                print(f"round {n} {variant}: preview {preview:.2f} s, up {up:.2f} s", file=sys.stderr)
    finally:
        for agent, _ in agents.values():
            await agent.stop()
    return times


def table(times: dict[str, dict[str, list[float]]]) -> str:
    medians = {v: {op: statistics.median(times[v][op]) for op in OPERATIONS} for v in VARIANTS}
    lines = [
        "| pack | preview (median s) | added to a preview | up (median s) | added to an up |",
        "|---|---:|---:|---:|---:|",
    ]
    for v in VARIANTS:
        cells = []
        for op in OPERATIONS:
            added = medians[v][op] - medians["none"][op]
            cells += [f"{medians[v][op]:.2f}", "" if v == "none" else f"{added:+.2f}"]
        lines.append(f"| {LABELS[v]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="counted rounds after a warm-up (default 7)")
    parser.add_argument("--json", type=Path, default=REPO / ".bench-logs" / "policy.json", help="raw timings")
    args = parser.parse_args(argv)
    record = start_record("hack/bench/policy.py", argv)
    log = REPO / ".bench-logs" / "policy-agents.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as agent_log, tempfile.TemporaryDirectory(prefix="pko-bench-policy-") as tmp:
        configure_logging("warning", "console", stream=agent_log)
        times = asyncio.run(measure(args.rounds, Path(tmp)))
    figures = {
        "rounds": args.rounds,
        "seconds": times,
        "medians": {v: {op: statistics.median(times[v][op]) for op in OPERATIONS} for v in VARIANTS},
    }
    write_record(args.json, finish_record(record, figures))
    print(table(times))
    print(f"\nraw timings: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The sample Stack on the real node that ``hack/up.sh`` leaves running: workspace pod created -> agent
serving, and an update from apply to Ready beside the real ``pulumi up`` in the same pod.

    hack/up.sh
    .venv/bin/python hack/bench/node.py                 # 3 pod restarts, 5 updates
    .venv/bin/python hack/bench/node.py --restarts 1 --updates 1

1. **Pod created -> agent serving**: the workspace pod is deleted (as a user or a node drain would);
   from the moment its replacement appears in the API, the times until its agent logs ``server
   listening`` and until the operator has connected and marked the Workspace Ready, with the steps
   the kubelet reports (init containers done, agent container started) and the agent's own
   start-up (process start, as the kernel counts it, to listening).
2. **Apply -> Ready per update**: a new value of the sample's ``greeting`` config is patched into the
   Stack (a new generation, as ``kubectl apply`` of an edited manifest makes); from the patch until the
   Stack is Ready for that generation, beside the ``pulumi up`` itself: the agent's log from the
   operation's start to its end (the CLI process, refresh included as the sample asks). The rest is
   the overhead per update: the workspace pod re-created for the new config (the Workspace's spec
   carries it, as upstream's does), the Update object, RPCs, config, status writes. The median
   update's timeline (timeline.py) shows each of those steps.

The sample is left as found (its config restored, one more update). Everything is read from the node's
API and the agent's log; nothing runs beside the cluster. Figures are medians of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import timeline
from common import REPO, api_client
from driver import exit_on_sigterm, log
from kubernetes_asyncio.client.exceptions import ApiException
from timeline import when

from pko.controllers.resources import STACKS, UPDATES, WORKSPACES
from pko.devtools.benchrecord import recording
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.resource import PODS, ResourceClient

NAMESPACE = "default"
STACK = "hello"
POD = f"{STACK}-workspace-0"
KUBECONFIG = REPO / ".node" / "kubeconfig"
POLL = 0.05


def agent_log(pod: str) -> list[dict[str, Any]]:
    """The workspace agent's JSON log lines (container ``pulumi``)."""
    return timeline.json_log(KUBECONFIG, NAMESPACE, pod, "pulumi")


def _kube_time(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def pod_steps(pod: dict[str, Any]) -> dict[str, float | None]:
    """When the kubelet says each step of the pod's start happened (whole seconds, as the API keeps them)."""
    status = pod.get("status") or {}
    inits = status.get("initContainerStatuses") or []
    mains = [c for c in status.get("containerStatuses") or [] if c.get("name") == "pulumi"]
    done = [((c.get("state") or {}).get("terminated") or {}).get("finishedAt") for c in inits]
    return {
        "created": _kube_time(pod["metadata"].get("creationTimestamp")),
        "init_done": _kube_time(max(done)) if done and all(done) else None,
        "main_started": _kube_time(((mains[0].get("state") or {}).get("running") or {}).get("startedAt"))
        if mains
        else None,
    }


async def restart(pods: ResourceClient, workspaces: ResourceClient) -> dict[str, float]:
    """Delete the workspace pod; time its replacement from creation to agent serving, and until the
    operator has connected to it and marked the Workspace Ready again."""
    old = (await pods.get(POD))["metadata"]["uid"]
    await pods.delete(POD)

    async def replaced() -> dict[str, Any] | None:
        try:
            pod = await pods.get(POD)
        except ApiException as exc:
            if exc.status == 404:  # not there yet
                return None
            raise
        return pod if pod["metadata"]["uid"] != old else None

    await wait_until("the replacement pod", replaced, within=300, interval=POLL)
    seen = time.time()

    async def ready() -> bool:
        cond = get_condition(((await workspaces.get(STACK)).get("status") or {}).get("conditions"), "Ready")
        again = cond is not None and (_kube_time(cond.get("lastTransitionTime")) or 0) >= seen - 1
        return again and cond is not None and cond.get("status") == "True"

    await wait_until("the Workspace to be Ready again", ready, within=300, interval=POLL)
    ready_at = time.time()
    pod = await pods.get(POD)

    async def logged() -> list[dict[str, Any]]:  # the node's log file may trail the probe a little
        return [e for e in agent_log(POD) if e.get("msg") == "server listening"]

    listening = (
        await wait_until("the agent's `server listening` log line", logged, within=30, interval=POLL)
    )[-1]
    served_at = when(listening)
    steps = pod_steps(pod)
    # The API keeps creation to the whole second; the moment this script first saw the pod is
    # within a poll of it, so take the later of the two.
    created = max(seen - POLL, steps["created"] or 0.0)
    row = {
        "serving": served_at - created,
        "ready": ready_at - created,
        "startup": float(listening.get("startup_seconds") or 0.0),
    }
    if steps["init_done"] is not None:
        row["init"] = steps["init_done"] - created
    if steps["main_started"] is not None:
        row["main"] = steps["main_started"] - created
    log("  " + ", ".join(f"{k} {v:.2f}s" for k, v in row.items()))
    return row


async def stack_ready_for(stacks: ResourceClient, generation: int) -> dict[str, Any] | None:
    stack = await stacks.get(STACK)
    status = stack.get("status") or {}
    cond = get_condition(status.get("conditions"), "Ready")
    last = status.get("lastUpdate") or {}
    if cond and cond.get("status") == "True" and last.get("generation") == generation:
        return stack
    return None


async def update(clients: dict[str, ResourceClient], greeting: str | None) -> dict[str, Any]:
    """Patch a new greeting (None: remove it); time apply -> Ready, the `pulumi up` inside, and each
    step between (timeline.py)."""
    stacks, updates = clients["stacks"], clients["updates"]
    old_pod = (await clients["pods"].get(POD))["metadata"]["uid"]
    workspace_generation = int((await clients["workspaces"].get(STACK))["metadata"]["generation"])
    generation: dict[str, int] = {}
    rules = timeline.update_rules(
        clients, STACK, POD, old_pod, workspace_generation, lambda: generation.get("stack")
    )
    async with timeline.watching(rules) as steps:
        t0 = time.time()
        steps.start = t0
        patched = await stacks.patch(STACK, {"spec": {"config": {"greeting": greeting}}})
        generation["stack"] = int(patched["metadata"]["generation"])
        steps.mark("Stack patched (answered)", time.time())
        stack = await wait_until(
            f"generation {generation['stack']} Ready",
            lambda: stack_ready_for(stacks, generation["stack"]),
            within=600,
            interval=POLL,
        )
        wall = time.time() - t0
        await asyncio.sleep(0.5)  # the watches deliver what came with the Ready
    name = stack["status"]["lastUpdate"]["name"]
    op_id = (await updates.get(name))["metadata"]["uid"]  # the agent's operation id
    operator = timeline.json_log(KUBECONFIG, timeline.OPERATOR_NS, "deployment/controller-manager")
    timeline.add_log_steps(steps, agent_log(POD), operator, op_id, f"{NAMESPACE}/{name}")
    up = timeline.engine_seconds(steps)
    if up is None:
        raise RuntimeError(f"the agent's log has no start and end for operation {name}")
    return {"wall": wall, "up": up, "timeline": steps.rows()}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the run, as the tables print them and the JSON records them."""
    api = await api_client(str(KUBECONFIG))
    async with api:
        stacks = ResourceClient(api, STACKS, NAMESPACE)
        pods = ResourceClient(api, PODS, NAMESPACE)
        updates = ResourceClient(api, UPDATES, NAMESPACE)
        workspaces = ResourceClient(api, WORKSPACES, NAMESPACE)
        clients = {"stacks": stacks, "pods": pods, "updates": updates, "workspaces": workspaces}
        first = await stacks.get(STACK)
        if await stack_ready_for(stacks, int(first["metadata"]["generation"])) is None:
            raise RuntimeError("the sample Stack is not Ready; run hack/up.sh first")
        original = ((first.get("spec") or {}).get("config") or {}).get("greeting")

        restarts = []
        for i in range(args.restarts):
            log(f"workspace pod restart {i + 1}/{args.restarts}")
            restarts.append(await restart(pods, workspaces))
        timed = []
        try:
            for i in range(args.updates):
                log(f"update {i + 1}/{args.updates}")
                timed.append(await update(clients, f"Hello from update {i + 1} of the node bench"))
        finally:
            if args.updates:
                log("restoring the sample's config")
                await update(clients, original)
    return {"restarts": restarts, "updates": timed}


def print_tables(figures: dict[str, Any]) -> None:
    """The run's tables, from the figures bench() took (the same dict the JSON records)."""
    restarts, timed = figures["restarts"], figures["updates"]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print("# The sample Stack on the local node, real Pulumi engine\n")
    if restarts:
        print(f"## Workspace pod created -> agent serving ({len(restarts)} restarts, medians)\n")
        print("| figure | s |")
        print("|---|---:|")
        if all("init" in r and "main" in r for r in restarts):
            print(f"| pod created -> init containers done (bootstrap copy, program fetch; whole s) | "
                  f"{med(restarts, 'init'):.1f} |")  # fmt: skip
            print(f"| pod created -> agent container started (whole s) | {med(restarts, 'main'):.1f} |")
        print(f"| pod created -> agent logs `server listening` | {med(restarts, 'serving'):.2f} |")
        startup, ready = med(restarts, "startup"), med(restarts, "ready")
        print(f"| of which the agent process: start -> listening (goal 0.5 s) | {startup:.2f} |")
        print(f"| pod created -> Workspace Ready (the operator connected, stack selected) | {ready:.2f} |\n")
    if timed:
        wall, up = med(timed, "wall"), med(timed, "up")
        print(f"## One update, apply -> Ready ({len(timed)} updates, medians)\n")
        print("| figure | s |")
        print("|---|---:|")
        print(f"| Stack patched -> Ready for the new generation | {wall:.2f} |")
        print(f"| of which `pulumi up` in the workspace pod (agent: operation start -> end) | {up:.2f} |")
        print(f"| the operator's overhead per update | {wall - up:.2f} ({wall / up:.2f}x the up) |")
        typical = sorted(timed, key=lambda row: row["wall"])[len(timed) // 2]
        print(f"\n## The median update's timeline ({typical['wall']:.2f} s, its up {typical['up']:.2f} s)\n")
        print("Each step the first moment it was seen: the watches this script held (API side) and the")
        print("agent's and operator's logs.\n")
        print("| step | s since the patch | s since the step before |")
        print("|---|---:|---:|")
        for step, since, delta in typical["timeline"]:
            print(f"| {step} | {since:.2f} | {delta:.2f} |")


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--restarts", type=int, default=3, help="workspace pod deletions to time")
    p.add_argument("--updates", type=int, default=5, help="config updates to time")
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = p.parse_args()
    if not KUBECONFIG.exists():
        print("bench: no local node; run hack/up.sh first", file=sys.stderr)
        return 2
    with recording("hack/bench/node.py", args.json, vars(args)) as run:
        run.figures.update(asyncio.run(bench(args)))
        print_tables(run.figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())

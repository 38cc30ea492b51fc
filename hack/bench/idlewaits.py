#!/usr/bin/env python3
"""Idle Stacks waiting on a Program that does not exist, on a control plane of its own (no node;
issue 44): what the Stack controller spends on them while nothing changes.

    .venv/bin/python hack/bench/idlewaits.py                                # 1,000 Stacks, 95 s, both modes
    .venv/bin/python hack/bench/idlewaits.py --stacks 200 --window 65 --json out.json

N Stacks name a Program that does not exist (row 4's ``missing-program`` shape of
``hack/bench/peerscale.py``, without the node). For each mode a fresh Stack controller starts in
this process (the Stack reconciler alone in a Manager limited to the namespace, as
``test/controllers/stackenv.py`` runs it) and takes every Stack to its wait (Stalled,
SourceUnavailable; the first mode writes those statuses, the second finds them written); then,
over ``--window`` seconds of nothing changing: the reconciles it ran
(``controller_runtime_reconcile_total``), this process's CPU seconds (the controller's, the
apiserver's not counted) and the timers waiting in its queue at the start. Modes:

- ``watch``: pko as it is: the Program watch wakes a waiting Stack, no timer
  (:mod:`pko.controllers.stack.waits`);
- ``timer30``: the same code with the Program wait's row given a 30 s timer, as before issue 44
  and as the Go operator's ``sourceUnavailableRequeueWait``.

``--json PATH`` writes the figures and the record of the run (pko.devtools.benchrecord).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common import api_client
from driver import bounded, create_namespace, log

from pko.controllers.resources import STACKS
from pko.controllers.stack import reconciler as stack_controller
from pko.controllers.stack.waits import SOURCE_UNAVAILABLE_REQUEUE, WAITS, Awaited, Wait
from pko.devtools.benchrecord import recording
from pko.devtools.kubectl import kubectl
from pko.devtools.localcluster import LocalCluster
from pko.devtools.waiting import wait_until
from pko.logging import configure_logging
from pko.machinery.manager import Manager
from pko.machinery.manageroptions import ManagerOptions
from pko.machinery.resource import ResourceClient

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "idle"
MODES: Mapping[str, Mapping[Awaited, Wait]] = {
    "watch": WAITS,
    "timer30": {
        **WAITS,
        Awaited.PROGRAM: dataclasses.replace(WAITS[Awaited.PROGRAM], requeue=SOURCE_UNAVAILABLE_REQUEUE),
    },
}


def reconciles(manager: Manager) -> float:
    registry = manager.registry
    return sum(
        registry.get_sample_value(
            "controller_runtime_reconcile_total",
            {"controller": stack_controller.CONTROLLER_NAME, "result": result},
        )
        or 0.0
        for result in ("success", "error", "requeue", "requeue_after")
    )


async def create_stacks(api: Any, n: int) -> None:
    stacks = ResourceClient(api, STACKS, namespace=NAMESPACE)

    async def make(i: int) -> None:
        await stacks.create(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": f"idle-{i:05d}", "namespace": NAMESPACE},
                "spec": {"stack": "dev", "programRef": {"name": "absent"}},
            }
        )

    await bounded(n, 8, make)


async def run_mode(api: Any, mode: str, n: int, window: float) -> dict[str, Any]:
    manager = Manager(
        api,
        ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0", namespace=NAMESPACE),
    )
    stack_controller.setup(manager, waits=MODES[mode])
    task = asyncio.create_task(manager.run())
    try:
        started = time.monotonic()
        await wait_until(
            "every Stack reconciled", lambda: manager.controllers and reconciles(manager) >= n, within=1800
        )
        queue = manager.controllers[0].queue
        await wait_until("the queue idle", lambda: not len(queue) and not queue.processing, within=600)
        first_pass = time.monotonic() - started
        timers = queue.waiting()
        before, cpu = reconciles(manager), time.process_time()
        await asyncio.sleep(window)
        figures = {
            "mode": mode,
            "stacks": n,
            "first_pass_s": round(first_pass, 1),
            "timers_at_start": timers,
            "window_s": window,
            "reconciles": int(reconciles(manager) - before),
            "cpu_s": round(time.process_time() - cpu, 2),
        }
        log(f"{mode}: {figures}")
        return figures
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)


async def bench(cluster: LocalCluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    configure_logging("info", "json")  # as the operator runs in a cluster (no line per reconcile)
    api = await api_client(str(cluster.kubeconfig), pko_client=True)
    async with api:
        await create_namespace(api, NAMESPACE)
        log(f"creating {args.stacks} Stacks naming a missing Program")
        await create_stacks(api, args.stacks)
        return [await run_mode(api, mode, args.stacks, args.window) for mode in args.modes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument("--window", type=float, default=95.0, help="seconds of nothing changing")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with (
        recording("hack/bench/idlewaits.py", args.json, vars(args)) as run,
        tempfile.TemporaryDirectory(prefix="pko-idlewaits-") as tmp,
    ):
        cluster = LocalCluster(Path(tmp) / "cluster")
        log("starting a control plane")
        cluster.start()
        try:
            kubectl(cluster, "apply", "--server-side", "-f", str(REPO / "config/crd/bases"))
            kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
            rows = asyncio.run(bench(cluster, args))
        finally:
            cluster.stop()
        run.figures["rows"] = rows
        print("# Stacks waiting on a missing Program, nothing changing" + chr(10))
        print("| mode | Stacks | first pass s | timers at start | window s | reconciles | CPU s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['mode']} | {r['stacks']} | {r['first_pass_s']} | {r['timers_at_start']} "
                f"| {r['window_s']:.0f} | {r['reconciles']} | {r['cpu_s']} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

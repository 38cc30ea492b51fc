"""Row 4 of peerscale.py: N idle Stacks (no workspace pod needed), created while the operator is scaled
to 0, then its first pass and an idle window measured (see peerscale.py's docstring for the shapes)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import procstats
from driver import log
from peer import NS, PROGRAM, get, kubectl, release, wait
from peerscale_busy import as_list
from peerscale_operator import MIB, leader_at, operator_pods, poll, scale, started_pod
from peerscale_requests import SENT, Background, caused, per_minute, scrape
from peerscale_table import fmt_row
from peerscale_watch import StackWatch, has_status
from procstats import PULUMI_GROUPS

from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]
ABSENT = "peerscale-absent"  # the Program (missing-program) or Stack (prerequisite) that never exists
IDLE_PROGRAM = "peerscale-idle"
IDLE_LABEL = "bench.pko.dev/peerscale"
IDLE_SELECTOR = f"{IDLE_LABEL}=idle"
SHAPES = ("missing-program", "prerequisite")
CREATE_CHUNK, CREATE_PARALLEL = 500, 4


# --- row 4: N idle Stacks ------------------------------------------------------------------------


def idle_stack(name: str, shape: str) -> Obj:
    spec: Obj = {"stack": "dev"}
    if shape == "missing-program":
        spec["programRef"] = {"name": ABSENT}
    else:
        spec["programRef"] = {"name": IDLE_PROGRAM}
        spec["prerequisites"] = [{"name": ABSENT}]
    meta = {"name": name, "labels": {IDLE_LABEL: "idle"}}
    return {"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": meta, "spec": spec}


def create_stacks(names: list[str], shape: str) -> None:
    chunks = [names[i : i + CREATE_CHUNK] for i in range(0, len(names), CREATE_CHUNK)]

    def create(chunk: list[str]) -> None:
        kubectl(
            "-n", NS, "create", "-f", "-", input=as_list([idle_stack(n, shape) for n in chunk]), timeout=900
        )

    with ThreadPoolExecutor(CREATE_PARALLEL) as pool:
        list(pool.map(create, chunks))


async def idle_stacks(
    client: ResourceClient, n: int, shape: str, idle_seconds: float, bg: Background, within: float
) -> Obj:
    names = [f"idle-{i:05d}" for i in range(n)]
    if shape == "prerequisite":
        kubectl("-n", NS, "apply", "-f", "-", input=PROGRAM.format(name=IDLE_PROGRAM))
        await wait(
            f"the Program {IDLE_PROGRAM}'s artifact",
            lambda: ((get("program", IDLE_PROGRAM) or {}).get("status") or {}).get("artifact"),
            120,
        )
    log(f"  the operator scaled to 0; creating {n} Stacks ({shape})")
    scale(0)
    await poll("the operator pod gone", lambda: not operator_pods(), 700)
    t = time.time()
    row: Obj = {}
    try:
        await asyncio.to_thread(create_stacks, names, shape)
        row["created"] = time.time() - t
        async with StackWatch(client, names, has_status, IDLE_SELECTOR) as watch:
            before, sent0 = scrape(), SENT.snapshot()
            t0 = time.time()
            await asyncio.to_thread(scale, 1, SENT.kubectl)
            pod = await started_pod(SENT.kubectl)
            leader = await leader_at(pod, SENT.kubectl)
            try:
                row["first_pass"] = await watch.wait(within) - t0
            except TimeoutError as exc:
                log(f"  first pass not done: {exc}")
                row["first_pass"] = float("inf")
            row["rss_mb"] = pod.rss_bytes() / MIB
            row["cpu_first_pass"] = pod.cpu_seconds()
            mid, sent1 = scrape(), SENT.snapshot()
            cpu_mid, throttled0 = pod.cpu_seconds(), pod.throttled_seconds()
            first = caused(before, mid, sent0)
            log(f"  first pass {row['first_pass']:.1f} s; idle for {idle_seconds:.0f} s")
            await asyncio.sleep(idle_seconds)
            end, cpu_end, throttled1 = scrape(), pod.cpu_seconds(), pod.throttled_seconds()
            idle = caused(mid, end, sent1)
            for conditions, count in Counter(watch.conditions.values()).most_common(5):
                log(f"  {count} Stacks: {conditions}")
        span = end.at - mid.at
        pulumi = per_minute(idle, span, PULUMI_GROUPS)
        row |= {
            "lease": (leader - t0) if leader is not None else float("nan"),
            "pulumi_writes_first_pass": procstats.total(first, PULUMI_GROUPS).writes / n,
            "cpu_idle": cpu_end - cpu_mid,
            "cpu_idle_pct": 100 * (cpu_end - cpu_mid) / span,
            "requests_min": per_minute(idle, span).total - per_minute(bg.per_second, 1.0).total,
            "pulumi_requests_min": pulumi.total,
            "pulumi_writes_min": pulumi.writes,
            "throttled": throttled1 - throttled0,
            "workspaces": len(kubectl("-n", NS, "get", "workspaces.auto.pulumi.com", "-o", "name").split()),
            "restarts": pod.restarts(),
        }
        log(f"  {n} idle Stacks: {fmt_row(row)}")
    finally:
        log(f"  deleting the {n} Stacks")
        # Not `kubectl delete --wait`: it waits for each object in turn, about 17 minutes for 10,000 already
        # gone. One list every few seconds sees them go.
        kubectl("-n", NS, "delete", "stacks", "-l", IDLE_SELECTOR, "--wait=false", check=False, timeout=600)

        def left() -> list[str]:
            return kubectl("-n", NS, "get", "stacks", "-l", IDLE_SELECTOR, "-o", "name", check=False).split()

        with contextlib.suppress(RuntimeError):
            await poll(f"the {n} Stacks deleted", lambda: not left(), within, every=5.0)
        for name in left():
            release(name)
        kubectl("-n", NS, "delete", "program", IDLE_PROGRAM, "--ignore-not-found", check=False)
        if not operator_pods():
            scale(1)  # a failure before the scale-up: leave the operator as installed
    return row

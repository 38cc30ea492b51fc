"""Row 3 of peerscale.py: N Program Stacks applied at once, measured until all are Ready, then removed
(see peerscale.py's docstring for the figures and why the Stacks share one claim)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from typing import Any

import procstats
import yaml
from driver import log
from node import KUBECONFIG
from peer import NS, PROGRAM, get, kubectl, release, stack_manifest, wait
from peerscale_operator import MIB, OperatorPod, poll
from peerscale_requests import SENT, Background, caused, scrape
from peerscale_table import fmt_row
from peerscale_watch import StackWatch, ready_now
from procstats import PULUMI_GROUPS, PeakSampler

from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]
SHARED_CLAIM = "peerscale-state"
WORKSPACE_REQUESTS = {"cpu": "10m", "memory": "64Mi"}
DISK_MARGIN_GB = 5.0  # left free for etcd, logs and the operators' images


# --- row 3: N Program Stacks at once -------------------------------------------------------------


def row3_objects(name: str) -> list[Obj]:
    """peer.py's Program and Stack, the state on the shared claim, small CPU requests (see above)."""
    program = yaml.safe_load(PROGRAM.format(name=name))
    _own_claim, stack = yaml.safe_load_all(stack_manifest(name))
    spec = stack["spec"]["workspaceTemplate"]["spec"]
    spec["podTemplate"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = SHARED_CLAIM
    spec["resources"] = {"requests": dict(WORKSPACE_REQUESTS)}
    return [program, stack]


def shared_claim() -> Obj:
    claim: Obj = next(iter(yaml.safe_load_all(stack_manifest("x"))))
    claim["metadata"]["name"] = SHARED_CLAIM
    return claim


def as_list(items: list[Obj]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def snapshotter() -> str:
    """containerd's snapshotter on the node, as hack/localnode.py keeps its choice at ``up`` (in
    ``.node/snapshotter``); a node without the file was started when it always ran ``native``."""
    chosen = KUBECONFIG.parent / "snapshotter"
    return chosen.read_text().strip() if chosen.exists() else "native"


def disk_check(stacks: int, per_workspace_gb: float) -> None:
    """Refuse row 3 when its workspace pods' copies of the image would fill the node's disk (``native``
    only: with ``overlayfs`` a container adds only what it writes)."""
    if snapshotter() != "native":
        return
    free = shutil.disk_usage(KUBECONFIG.parent).free / 1e9
    need = stacks * per_workspace_gb + DISK_MARGIN_GB
    if need > free:
        fits = max(0, int((free - DISK_MARGIN_GB) / per_workspace_gb))
        raise SystemExit(
            f"peerscale: {stacks} workspace pods need about {need:.0f} GB on the node's disk "
            f"({per_workspace_gb} GB each: the native snapshotter copies the image per container; plus "
            f"{DISK_MARGIN_GB:.0f} GB), {free:.0f} GB are free; --stacks {fits} fits"
        )


async def many_stacks(client: ResourceClient, pod: OperatorPod, n: int, bg: Background, within: float) -> Obj:
    names = [f"scale-{i:03d}" for i in range(n)]
    # A claim an aborted run left would hand its stacks' state (and locks) to this run's.
    delete_claim()
    kubectl("-n", NS, "apply", "-f", "-", input=json.dumps(shared_claim()))
    await wait(
        f"the claim {SHARED_CLAIM} Bound (no Available PersistentVolume left? hack/up.sh makes new ones)",
        lambda: ((get("pvc", SHARED_CLAIM) or {}).get("status") or {}).get("phase") == "Bound",
        120,
    )
    body = as_list([obj for name in names for obj in row3_objects(name)])
    restarts0 = pod.restarts()
    row: Obj = {}
    try:
        async with StackWatch(client, names, ready_now, None) as watch:
            with PeakSampler(pod.rss_bytes) as peak:
                before, sent0 = scrape(), SENT.snapshot()
                cpu0, throttled0 = pod.cpu_seconds(), pod.throttled_seconds()
                t0 = time.time()
                await asyncio.to_thread(
                    SENT.kubectl, "-n", NS, "apply", "--server-side", "-f", "-", input=body
                )
                try:
                    row["wall"] = await watch.wait(within) - t0
                except TimeoutError as exc:
                    log(f"  not all Ready: {exc}")
                    row["wall"] = float("inf")
                after = scrape()
                cpu1, throttled1 = pod.cpu_seconds(), pod.throttled_seconds()
                served = caused(before, after, sent0)
            stuck = Counter(c for name, c in watch.conditions.items() if not watch.state.get(name))
        for conditions, count in stuck.most_common(5):
            log(f"  {count} not Ready: {conditions}")
        everything = procstats.total(
            procstats.sub(served, procstats.scaled(bg.per_second, after.at - before.at))
        )
        pulumi = procstats.total(served, PULUMI_GROUPS)
        row |= {
            "cpu_per_stack": (cpu1 - cpu0) / n,
            "requests_per_stack": everything.total / n,
            "writes_per_stack": everything.writes / n,
            "pulumi_requests_per_stack": pulumi.total / n,
            "pulumi_writes_per_stack": pulumi.writes / n,
            "peak_rss_mb": peak.peak / MIB,
            "throttled": throttled1 - throttled0,
            "restarts": pod.restarts() - restarts0,
        }
        log(f"  {n} Stacks: {fmt_row(row)}; {peak.samples} RSS samples, largest process's VmHWM "
            f"{pod.hwm_bytes() / MIB:.0f} MB")  # fmt: skip
    finally:
        await remove_stacks(names, within)
    return row


async def remove_stacks(names: list[str], within: float) -> None:
    """peer.remove_stack for many Stacks at once: all deleted (their destroys run in parallel); those
    still there after ``within`` s released by hand; their Programs, any ConfigMap a destroy left
    (logged: a destroy that deleted nothing) and the shared claim deleted, the claim waited for."""
    wanted = set(names)

    def left() -> list[str]:
        out = kubectl("-n", NS, "get", "stacks", "-o", "name", check=False)
        return [n for n in (line.split("/", 1)[-1] for line in out.split()) if n in wanted]

    kubectl(
        "-n", NS, "delete", "stacks", *names, "--ignore-not-found", "--wait=false", check=False, timeout=300
    )
    try:
        await poll(f"the {len(names)} Stacks deleted (their destroys)", lambda: not left(), within, every=2)
    except (RuntimeError, TimeoutError) as exc:  # a kubectl that failed, or not within the time
        rest = left()
        log(f"  {exc}; releasing {len(rest)}")
        for name in rest:
            release(f"stack/{name}")
    kubectl("-n", NS, "delete", "programs", *names, "--ignore-not-found", check=False, timeout=300)
    maps = {line.split("/", 1)[-1] for line in kubectl("-n", NS, "get", "configmaps", "-o", "name").split()}
    kept = sorted(m for m in (f"{n}-settings" for n in names) if m in maps)
    if kept:
        log(f"  {len(kept)} ConfigMaps outlived their Stack's destroy (deleted now): {', '.join(kept[:5])}")
        kubectl("-n", NS, "delete", "configmaps", *kept, "--ignore-not-found", check=False)
    delete_claim()


def delete_claim() -> None:
    """The shared claim deleted and waited for (its pods must go first: pvc-protection)."""
    kubectl("-n", NS, "delete", "pvc", SHARED_CLAIM, "--ignore-not-found", "--timeout=300s", check=False,
            timeout=320)  # fmt: skip

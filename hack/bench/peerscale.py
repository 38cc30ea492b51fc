"""Issue 26's rows 3 and 4: pko beside the Go Pulumi Kubernetes Operator (v2.9.0) with many Stacks, on the
local node, one operator installed at a time from its own manifests (peer.py's ``Operator``), alternating
in one run. Rows 1, 2, 5 and 6 are peer.py's.

    hack/up.sh
    .venv/bin/python hack/bench/peerscale.py                          # 50 Stacks; 1,000 and 10,000 idle
    .venv/bin/python hack/bench/peerscale.py --stacks 20 --idle 1000 --idle-seconds 120
    .venv/bin/python hack/bench/peerscale.py --stacks 0 --idle 10000 --idle-shape prerequisite

As peer.py: the sample and pko are removed first, each operator is installed, measured and removed with
its CRDs before the other, pko is left installed at the end. Stacks live in peer.py's namespace (its
``SETUP``: a ``pulumi`` ServiceAccount allowed ConfigMaps). Both operators run as their manifests ship
them: the Go operator with a 200m CPU limit and 128 MiB of memory, pko without a CPU limit and 512 MiB;
the CPU time the limit kept the Go operator waiting and any container restart (an OOM kill) are shown.

Row 3, ``--stacks`` N (default 50) Program Stacks applied at once -> all Ready. Each Stack is peer.py's
(``PROGRAM``, ``STACK``: its own Program making one ConfigMap from a config value, the same
``pko-workspace:dev`` image, ``destroyOnFinalize``) with two changes the node needs: the state of all N
is on one claim (``file:///state``, each Stack its own Pulumi project, which the file backend keeps
apart), because the node's 32 static PersistentVolumes are never recycled (``Retain``), so a claim per
Stack would use up N of them (the shared claim takes one per operator and run); and each workspace pod
requests 10m of CPU instead of the default 100m, so that N pods fit the node's 2 CPUs (with the
default, the scheduler leaves all but ~18 Pending for good). On a node whose containerd runs the
``native`` snapshotter (hack/localnode.py's choice where an overlay mount does not work, and every node
started before it chose), every workspace container is a full copy of the 1.3 GB image, about 1.6 GB
per pod with its init containers (as read on the node): the row then refuses to start when the node's
disk has less than N times ``--disk-per-workspace-gb`` free, plus 5 GB. With the 36 GB this machine had
free (2026-11-27, ``native``), about 19 fit: the default of 50 needs ``overlayfs`` or a bigger disk.
All N are applied with one ``kubectl apply --server-side``; a watch on the Stacks notes the first moment
every one is Ready for its current generation (``Ready=True``, ``status.lastUpdate.generation`` equal
to ``metadata.generation``: peer.ready_at's test). Figures over that window, from the apply to all Ready:

- wall time;
- operator CPU seconds per Stack: the pod's ``cpuacct.usage`` (cgroup v1, read on this host), the
  difference over the window divided by N;
- API requests and writes per Stack, from the kube-apiserver's own ``apiserver_request_total``
  (``kubectl get --raw /metrics``, which the apiserver does not count) at both ends: reads are GET and
  LIST, writes POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION (dry runs apart); watches and CONNECT
  are left out (a long-running request is counted when it ends). Subtracted: what this script sent
  (every kubectl call in a window runs with ``-v=6`` and its requests are read from its log; the
  watch's LISTs are counted as they are made) and the idle background (the rate measured, before the
  rows, for ``--background-seconds`` with the operator installed, leader, and no Stacks: the kubelet,
  kube-controller-manager, the scheduler, the node's DNS feeder, the operator's own lease renewals)
  times the window's length. What remains is what the N Stacks caused, whoever sent it: the operator,
  and what its objects made other clients do (the StatefulSet controller's pods, the scheduler's
  bindings, the kubelet's pod statuses, each agent's TokenReviews, pulumi-kubernetes making the
  ConfigMap). So the same figure restricted to the ``pulumi.com`` and ``auto.pulumi.com`` kinds
  (Stacks, Programs, Workspaces, Updates), which only the operator writes, is shown beside it (the
  script's own requests subtracted, no background: it has none there);
- the operator's peak RSS: the pod's processes (every process in the pod's memory cgroup but the
  sandbox's ``pause``), their ``VmRSS`` summed, sampled every second in a thread; the highest sample.

Then all N are deleted at once and their destroys run (peer.remove_stack's steps for many Stacks: a
Stack still there after ``--timeout`` is released by hand; then the Programs, any ConfigMap a destroy
left, and the shared claim, waited for until gone).

Row 4, ``--idle`` N (default 1,000 and 10,000) idle Stacks: Stacks each operator holds but that need no
workspace pod. The shape, the same for both (``--idle-shape``):

- ``missing-program`` (default): ``spec.programRef`` names a Program that does not exist
  (``destroyOnFinalize`` off). Go v2.9.0 (``operator/internal/controller/pulumi/stack_controller.go``,
  ``StackReconciler.Reconcile``): adds its finalizer (an update), finds no Program (``case
  stack.ProgramRef != nil``: ``errProgramNotFound``), marks the Stack ``Stalled``/``SourceUnavailable``
  and saves the status with a server-side apply, ``RequeueAfter: sourceUnavailableRequeueWait`` (30 s);
  it returns before ``sess.CreateWorkspace``, so no Workspace. Every 30 s after, each Stack is reconciled
  again and the same status applied again (an APPLY the apiserver serves, and counts as a write, though
  it stores nothing).
  pko (``pko/controllers/stack/sources.py``, ``SourceResolver.resolve``: ``Stall("SourceUnavailable",
  "unable to retrieve program for stack", SOURCE_UNAVAILABLE_REQUEUE)``; ``plan.py``, ``_decide_stack``:
  status and requeue after 30 s, before any ``ApplyWorkspace``): the same finalizer, conditions and 30 s
  requeue, but its status writer skips a status that did not change, so a requeue writes nothing.
  This is the shape the first out-of-cluster figures used (2026-11-27); it exposes the periodic
  re-check, which is each operator's real idle cost for such Stacks.
- ``prerequisite``: ``spec.programRef`` names one shared Program that exists and has its artifact,
  and ``spec.prerequisites`` names a Stack that does not exist. Go resolves the source (no API call),
  then (step 3) marks ``Reconciling``/``PrerequisiteNotSatisfied`` and returns with no requeue: it waits
  for a watch event (a prerequisite becoming Ready). pko: ``prerequisites_unmet`` in ``stack/ensure.py``, the
  same condition, ``Result.done()``. Neither re-checks on a timer: the pure cost of holding N Stacks.

Per N the operator is scaled to 0 while the N Stacks are created (``kubectl create``, lists of 500, 4 at
a time; the time it took is shown), so that creation does not race the operator and each N starts from
a fresh operator process; then scaled back to 1. Figures:

- first pass: from the scale-up until every Stack has a status condition (the operator's first status
  write; a watch notes when); the operator's start-up (pod, container, leader lease, initial list) is
  in it, and the part until the new pod held the leader Lease (``operator.pulumi.com``) is shown apart;
- operator CPU seconds for start-up and first pass (the new pod's ``cpuacct.usage``), and the writes
  to the Pulumi kinds per Stack in the first pass (apiserver metrics, as above);
- operator RSS right after the first pass (``VmRSS`` summed as above);
- over the ``--idle-seconds`` window that follows (default 300): operator CPU seconds (and % of one
  core), API requests per minute (all clients less the idle background's rate; and on the Pulumi kinds
  alone, where only the operator writes), CPU time throttled by the limit;
- Workspaces that exist in the namespace at the end (0 is right: the shape must need none).

The N Stacks are then deleted while the operator runs (``kubectl delete stacks -l ...`` with
``--timeout``; its finalizers go), any left are released by hand.

The operator pod is found by ``control-plane=controller-manager`` in ``pulumi-kubernetes-operator``;
its cgroup directories by its UID under ``/sys/fs/cgroup/<controller>/kubepods[/<qos>]/pod<uid>``
(procstats.py). Figures are one run's, each operator's own; nothing is averaged. Expect well over an
hour with the defaults on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import procstats
import yaml
from common import api_client
from kubernetes_asyncio.client.exceptions import ApiException
from node import KUBECONFIG
from peer import (
    NS,
    OPERATOR_NS,
    PROGRAM,
    STACK,
    Operator,
    build_peer,
    clear_node,
    condition,
    get,
    kubectl,
    operators,
    release,
    wait,
)
from procstats import PULUMI_GROUPS, PeakSampler, Requests, Tally
from run import exit_on_sigterm, log

from pko.controllers.resources import STACKS
from pko.devtools.waiting import wait_until
from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]

SELECTOR = "control-plane=controller-manager"
DEPLOYMENT = "deployment/controller-manager"
LEASE = "operator.pulumi.com"  # both operators' leader election ID
SHARED_CLAIM = "peerscale-state"
WORKSPACE_REQUESTS = {"cpu": "10m", "memory": "64Mi"}
ABSENT = "peerscale-absent"  # the Program (missing-program) or Stack (prerequisite) that never exists
IDLE_PROGRAM = "peerscale-idle"
IDLE_LABEL = "bench.pko.dev/peerscale"
IDLE_SELECTOR = f"{IDLE_LABEL}=idle"
SHAPES = ("missing-program", "prerequisite")
CREATE_CHUNK, CREATE_PARALLEL = 500, 4
SETTLE = 10.0  # after an install, before the background is measured
DISK_MARGIN_GB = 5.0  # left free for etcd, logs and the operators' images
MIB = 1024 * 1024
KLOG_INFO = re.compile(r"[IW]\d{4} ")  # kubectl's -v log lines, not its errors


# --- what this script sends ----------------------------------------------------------------------


class Sent:
    """The requests this script sent in measured windows: kubectl at ``-v=6`` (read from its log) and
    the Stack watch's LISTs. Thread-safe: kubectl calls run in threads while the watch reads events."""

    def __init__(self) -> None:
        self._tally: Tally = {}
        self._lock = threading.Lock()

    def add(self, tally: Tally) -> None:
        with self._lock:
            self._tally = procstats.add(self._tally, tally)

    def snapshot(self) -> Tally:
        with self._lock:
            return dict(self._tally)

    def since(self, before: Tally) -> Tally:
        return procstats.sub(self.snapshot(), before)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 600) -> str:
        """peer.kubectl, counted."""
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={KUBECONFIG}", "-v=6", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.add(procstats.kubectl_tally(done.stderr))
        if check and done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if not KLOG_INFO.match(line)]
            raise RuntimeError(f"kubectl {' '.join(args)}: {' '.join(errors)[-2000:]}")
        return done.stdout


SENT = Sent()


@dataclass(frozen=True)
class Scrape:
    at: float
    tally: Tally


def scrape() -> Scrape:
    """The apiserver's request counters now (``/metrics`` is not among them)."""
    text = kubectl("get", "--raw", "/metrics")
    return Scrape(time.time(), procstats.parse_request_totals(text))


def caused(before: Scrape, after: Scrape, sent_before: Tally) -> Tally:
    """What the apiserver served between two scrapes, less what this script sent meanwhile."""
    return procstats.sub(procstats.sub(after.tally, before.tally), SENT.since(sent_before))


# --- the operator's pod --------------------------------------------------------------------------


def running(pods: list[Obj]) -> Obj | None:
    """The one pod not being deleted whose containers all run (None while there is none, or more
    than one: a rollout in progress)."""
    live = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("containerStatuses")
        and all("running" in (c.get("state") or {}) for c in p["status"]["containerStatuses"])
    ]
    return live[0] if len(live) == 1 else None


def restarts(pod: Obj) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


@dataclass(frozen=True)
class OperatorPod:
    """The operator's pod as this host sees it: its cgroup directories and processes."""

    name: str
    uid: str
    cpuacct: Path
    cpu: Path | None  # cpu.stat (throttling); absent on a host without the cpu controller
    memory: Path

    @classmethod
    def of(cls, pod: Obj) -> OperatorPod | None:
        uid = pod["metadata"]["uid"]
        cpuacct = procstats.pod_cgroup("cpuacct", uid) or procstats.pod_cgroup("cpu,cpuacct", uid)
        memory = procstats.pod_cgroup("memory", uid)
        if cpuacct is None or memory is None:
            return None
        cpu = procstats.pod_cgroup("cpu", uid) or procstats.pod_cgroup("cpu,cpuacct", uid)
        return cls(pod["metadata"]["name"], uid, cpuacct, cpu, memory)

    def cpu_seconds(self) -> float:
        try:
            return procstats.cpuacct_seconds(self.cpuacct)
        except OSError as exc:
            raise RuntimeError(f"the operator pod {self.name} is gone from this host ({exc})") from exc

    def throttled_seconds(self) -> float:
        try:
            return procstats.throttled_seconds(self.cpu) if self.cpu is not None else 0.0
        except OSError:
            return 0.0

    def rss_bytes(self) -> int:
        """The pod's processes' VmRSS summed (the sandbox's ``pause`` left out)."""
        pids = procstats.cgroup_pids(self.memory)
        if not pids:
            raise RuntimeError(f"no process in {self.memory}")
        return 1024 * sum(procstats.process_kb(pids, "VmRSS").values())

    def hwm_bytes(self) -> int:
        """The largest process's VmHWM (its own peak since it started: a spike between samples)."""
        return 1024 * max(
            procstats.process_kb(procstats.cgroup_pids(self.memory), "VmHWM").values(), default=0
        )

    def restarts(self) -> int:
        pod = get("pod", self.name, OPERATOR_NS)
        return restarts(pod) if pod is not None else -1


def operator_pods(run: Callable[..., str] = kubectl) -> list[Obj]:
    listed = json.loads(run("-n", OPERATOR_NS, "get", "pods", "-l", SELECTOR, "-o", "json"))
    items: list[Obj] = listed["items"]
    return items


async def poll(what: str, check: Callable[[], Any], within: float, every: float = 1.0) -> Any:
    """``check()`` (blocking: run in a thread) until it returns something true; TimeoutError after
    ``within`` seconds. peer.wait polls every 50 ms, too often for waits of minutes."""
    return await wait_until(what, lambda: asyncio.to_thread(check), within=within, interval=every)


async def started_pod(run: Callable[..., str] = kubectl, within: float = 300) -> OperatorPod:
    """The operator's pod once it runs and its cgroups are on this host."""

    def found() -> OperatorPod | None:
        pod = running(operator_pods(run))
        return OperatorPod.of(pod) if pod is not None else None

    found_pod: OperatorPod = await poll("the operator pod running", found, within, every=0.25)
    return found_pod


async def leader_at(pod: OperatorPod, run: Callable[..., str] = kubectl, within: float = 180) -> float | None:
    """When ``pod`` was first seen holding the leader Lease (None: not within ``within`` s)."""

    def holds() -> bool:
        out = run("-n", OPERATOR_NS, "get", "lease", LEASE, "-o", "json", check=False)
        holder = str(((json.loads(out) if out else {}).get("spec") or {}).get("holderIdentity") or "")
        return holder.startswith(f"{pod.name}_")  # both: "<pod name>_<uuid>"

    try:
        await poll(f"{pod.name} to hold the Lease {LEASE}", holds, within, every=0.25)
    except (RuntimeError, TimeoutError) as exc:  # a kubectl that failed, or not within the time
        log(f"  {exc}")
        return None
    return time.time()


# --- the Stacks, watched -------------------------------------------------------------------------


def ready_now(obj: Obj) -> bool:
    """peer.ready_at's test on an object: Ready, its last update for its current generation."""
    last = (obj.get("status") or {}).get("lastUpdate") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    return condition(obj, "Ready").get("status") == "True" and last.get("generation") == generation


def has_status(obj: Obj) -> bool:
    """Whether the operator has written the Stack's status (both write conditions in their first pass)."""
    return bool((obj.get("status") or {}).get("conditions"))


def conditions_of(obj: Obj) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return ", ".join(
        sorted(f"{c.get('type')}={c.get('status')} {c.get('reason') or ''}".strip() for c in conditions)
    )


class StackWatch:
    """A watch on the namespace's Stacks, noting the first moment ``done`` holds for all of ``names``
    (one LIST, then events: polling 10,000 Stacks would load the apiserver the figures measure)."""

    def __init__(
        self, client: ResourceClient, names: Iterable[str], done: Callable[[Obj], bool], selector: str | None
    ) -> None:
        self.client, self.names, self.done, self.selector = client, set(names), done, selector
        self.state: dict[str, bool] = {}
        self.conditions: dict[str, str] = {}
        self.satisfied = 0
        self.done_at: float | None = None
        self._complete = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _see(self, kind: str, obj: Obj, now: float) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if name not in self.names:
            return
        was = self.state.pop(name, False)
        now_done = kind != "DELETED" and self.done(obj)
        if kind != "DELETED":
            self.state[name] = now_done
            self.conditions[name] = conditions_of(obj)
        self.satisfied += int(now_done) - int(was)
        if self.done_at is None and self.satisfied == len(self.names):
            self.done_at = now
            self._complete.set()

    async def _list(self) -> str:
        listing = await self.client.list(label_selector=self.selector)
        SENT.add({STACKS.group: Requests(reads=1)})
        self.state.clear()
        self.satisfied = 0
        now = time.time()
        for item in listing.items:
            self._see("ADDED", item, now)
        return listing.resource_version

    async def _run(self, version: str) -> None:
        while True:
            try:
                async with self.client.watch(
                    resource_version=version, timeout_seconds=300, label_selector=self.selector
                ) as events:
                    async for event in events:
                        version = str((event.object.get("metadata") or {}).get("resourceVersion") or version)
                        if event.type != "BOOKMARK":
                            self._see(event.type, event.object, time.time())
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = await self._list()

    async def __aenter__(self) -> StackWatch:
        self._task = asyncio.create_task(self._run(await self._list()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait(self, within: float) -> float:
        """When ``done`` first held for every Stack; TimeoutError after ``within`` seconds."""
        assert self._task is not None, "use inside `async with`"
        complete = asyncio.create_task(self._complete.wait())
        finished, _ = await asyncio.wait(
            {complete, self._task}, timeout=within, return_when=asyncio.FIRST_COMPLETED
        )
        complete.cancel()
        if self._task in finished:
            self._task.result()  # the watch failed: raise why
        if self.done_at is None:
            raise TimeoutError(f"{self.satisfied} of {len(self.names)} Stacks after {within:.0f}s")
        return self.done_at


# --- the idle background -------------------------------------------------------------------------


@dataclass(frozen=True)
class Background:
    per_second: Tally  # requests per second by group, the operator idle with no Stacks
    cpu: float  # the idle operator's CPU, seconds per second


async def background(pod: OperatorPod, seconds: float) -> Background:
    await asyncio.sleep(SETTLE)
    before, cpu0, sent0 = scrape(), pod.cpu_seconds(), SENT.snapshot()
    await asyncio.sleep(seconds)
    after, cpu1 = scrape(), pod.cpu_seconds()
    span = after.at - before.at
    return Background(procstats.scaled(caused(before, after, sent0), 1 / span), (cpu1 - cpu0) / span)


def per_minute(tally: Tally, seconds: float, groups: Iterable[str] | None = None) -> Requests:
    return procstats.total(tally, groups).scaled(60 / seconds)


# --- row 3: N Program Stacks at once -------------------------------------------------------------


def row3_objects(name: str) -> list[Obj]:
    """peer.py's Program and Stack, the state on the shared claim, small CPU requests (see above)."""
    program = yaml.safe_load(PROGRAM.format(name=name))
    _own_claim, stack = yaml.safe_load_all(STACK.format(name=name))
    spec = stack["spec"]["workspaceTemplate"]["spec"]
    spec["podTemplate"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = SHARED_CLAIM
    spec["resources"] = {"requests": dict(WORKSPACE_REQUESTS)}
    return [program, stack]


def shared_claim() -> Obj:
    claim: Obj = next(iter(yaml.safe_load_all(STACK.format(name="x"))))
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


def scale(replicas: int, run: Callable[..., str] = kubectl) -> None:
    run("-n", OPERATOR_NS, "scale", DEPLOYMENT, f"--replicas={replicas}")


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


# --- one operator, then the table ----------------------------------------------------------------


def fmt_row(row: Obj) -> str:
    return ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())


async def measure(op: Operator, client: ResourceClient, args: argparse.Namespace) -> Obj:
    """Every figure of one operator, flat: ``background_min``, ``row3.wall``, ``idle1000.rss_mb``..."""
    pod = await started_pod()
    await leader_at(pod)
    log(f"  {op.label}: the idle background ({args.background_seconds:.0f} s, no Stacks)")
    bg = await background(pod, args.background_seconds)
    results: Obj = {
        "background_min": per_minute(bg.per_second, 1.0).total,
        "background_cpu_pct": 100 * bg.cpu,
    }
    log(f"  {op.label}: {results['background_min']:.0f} requests/min, operator CPU {100 * bg.cpu:.2f} %")
    if args.stacks:
        log(f"  {op.label}: {args.stacks} Program Stacks at once")
        row = await many_stacks(client, pod, args.stacks, bg, args.timeout)
        results |= {f"row3.{k}": v for k, v in row.items()}
    for n in args.idle:
        log(f"  {op.label}: {n} idle Stacks")
        row = await idle_stacks(client, n, args.idle_shape, args.idle_seconds, bg, args.timeout)
        results |= {f"idle{n}.{k}": v for k, v in row.items()}
    return results


def cell(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def ratio(go: Any, pko: Any) -> str:
    if not isinstance(go, float) or not isinstance(pko, float) or go in (0.0, float("inf")) or go != go:
        return "-"
    return f"{pko / go:.2f}"


# (label, key, digits, compared): the table's rows; {n}, {idle}, {timeout}, {shape} filled in.
BACKGROUND_FIGURES = [
    ("idle background, no Stacks: API requests/min, all clients ({background} s)", "background_min", 0, True),
    ("idle background: operator CPU, % of one core", "background_cpu_pct", 2, True),
]
ROW3_FIGURES = [
    ("{n} Program Stacks applied at once -> all Ready, s (inf: not within {timeout} s)", "wall", 1, True),
    ("operator CPU per Stack, s", "cpu_per_stack", 3, True),
    (
        "API requests per Stack (all clients, less the bench's own and the background)",
        "requests_per_stack",
        1,
        True,
    ),
    ("API writes per Stack (the same)", "writes_per_stack", 1, True),
    (
        "API requests per Stack on the Pulumi kinds (the operator's alone)",
        "pulumi_requests_per_stack",
        1,
        True,
    ),
    ("API writes per Stack on the Pulumi kinds", "pulumi_writes_per_stack", 1, True),
    ("operator peak RSS, MB (1 s samples)", "peak_rss_mb", 0, True),
    ("operator CPU throttled by its limit, s", "throttled", 1, True),
    ("operator container restarts (0 is right)", "restarts", 0, False),
]
IDLE_FIGURES = [
    ("{n} idle Stacks ({shape}): operator scaled up -> every Stack has a status, s", "first_pass", 1, True),
    ("{n} idle: of which until the new pod held the leader Lease, s", "lease", 1, True),
    ("{n} idle: operator CPU, start-up and first pass, s", "cpu_first_pass", 1, True),
    ("{n} idle: writes to the Pulumi kinds per Stack, first pass", "pulumi_writes_first_pass", 2, True),
    ("{n} idle: operator RSS after the first pass, MB", "rss_mb", 0, True),
    ("{n} idle: operator CPU over the {idle} s idle window, s", "cpu_idle", 1, True),
    ("{n} idle: the same, % of one core", "cpu_idle_pct", 2, True),
    ("{n} idle: API requests/min, idle (all clients, less the background)", "requests_min", 0, True),
    (
        "{n} idle: API requests/min on the Pulumi kinds, idle (the operator's alone)",
        "pulumi_requests_min",
        0,
        True,
    ),
    ("{n} idle: API writes/min on the Pulumi kinds, idle", "pulumi_writes_min", 0, True),
    ("{n} idle: operator CPU throttled by its limit, idle window, s", "throttled", 1, True),
    ("{n} idle: Workspaces in the namespace (0 is right)", "workspaces", 0, False),
    ("{n} idle: operator container restarts (0 is right)", "restarts", 0, False),
    ("{n} idle: creating the Stacks (the operator scaled to 0; the bench's time), s", "created", 1, False),
]


def print_table(results: dict[str, Obj], args: argparse.Namespace) -> None:
    go, pko = results.get("go") or {}, results.get("pko") or {}

    def rows(figures: list[tuple[str, str, int, bool]], prefix: str, **fill: Any) -> None:
        for label, key, digits, compared in figures:
            g, p = go.get(prefix + key), pko.get(prefix + key)
            shown = ratio(g, p) if compared else ""
            print(f"| {label.format(**fill)} | {cell(g, digits)} | {cell(p, digits)} | {shown} |")

    print("# pko beside the Go operator v2.9.0 with many Stacks, local node (one run)\n")
    print("| figure | Go operator | pko | pko / Go |")
    print("|---|---:|---:|---:|")
    rows(BACKGROUND_FIGURES, "", background=f"{args.background_seconds:.0f}")
    if args.stacks:
        rows(ROW3_FIGURES, "row3.", n=args.stacks, timeout=f"{args.timeout:.0f}")
    for n in args.idle:
        rows(IDLE_FIGURES, f"idle{n}.", n=f"{n:,}", shape=args.idle_shape, idle=f"{args.idle_seconds:.0f}")


async def bench(args: argparse.Namespace, peer_dist: Path) -> None:
    go, pko = operators(peer_dist)
    clear_node(pko)
    results: dict[str, Obj] = {}
    api = await api_client(str(KUBECONFIG))
    async with api:
        client = ResourceClient(api, STACKS, NS)
        try:
            for op in (o for o in (go, pko) if o.label in args.operators):
                log(f"{op.label}")
                op.install()
                try:
                    results[op.label] = await measure(op, client, args)
                finally:
                    op.remove()
        finally:
            pko.install()
    print_table(results, args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Rows 3 and 4's options (sidebyside.py takes them too)."""
    p.add_argument("--stacks", type=int, default=50, help="row 3: Program Stacks applied at once (0 skips)")
    p.add_argument(
        "--idle", default="1000,10000", help="row 4: idle Stack counts, comma-separated ('' skips)"
    )
    p.add_argument(
        "--idle-seconds", type=float, default=300, help="row 4: the idle window after the first pass"
    )
    p.add_argument("--idle-shape", choices=SHAPES, default=SHAPES[0], help="row 4: what makes a Stack idle")
    p.add_argument("--background-seconds", type=float, default=60, help="the idle background's window")
    p.add_argument("--timeout", type=float, default=1800, help="for all Ready, a first pass, a deletion")
    p.add_argument("--disk-per-workspace-gb", type=float, default=1.6, help="row 3's disk check, per pod")


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    args = p.parse_args()
    args.idle = [int(n) for n in args.idle.split(",") if n.strip()]
    return args


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--operators", default="go,pko", help="which to measure (Go first when both)")
    args = parse(p)
    args.operators = {o for o in args.operators.split(",") if o}
    if not KUBECONFIG.exists():
        print("bench: no local node; run hack/up.sh first", file=sys.stderr)
        return 2
    if args.stacks:
        disk_check(args.stacks, args.disk_per_workspace_gb)
    asyncio.run(bench(args, build_peer()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

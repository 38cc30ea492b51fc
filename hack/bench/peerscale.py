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
(``PROGRAM``, ``stack_manifest``: its own Program making one ConfigMap from a config value, the same
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
  pko (``pko/controllers/stack/sources.py``, ``SourceResolver.resolve``: ``Unresolved("SourceUnavailable",
  "unable to retrieve program for stack", Awaited.PROGRAM)``; ``nextrun.py``, ``next_run``: the status,
  before any ``ApplyWorkspace``): the same finalizer and conditions. Until issue 44 (2026-12-07) a 30 s
  requeue too, whose reconciles wrote nothing (its status writer skips a status that did not change);
  since then no timer: the Program watch wakes the Stack (``pko/controllers/stack/waits.py``; without a
  node: ``hack/bench/idlewaits.py``). This is the shape the first out-of-cluster figures used
  (2026-11-27); it exposes the periodic re-check, which was each operator's real idle cost for such
  Stacks.
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

The code: peerscale_requests.py (what the apiserver served and this script sent), peerscale_operator.py
(the operator's pod), peerscale_watch.py (the Stacks watched), peerscale_busy.py (row 3),
peerscale_idle.py (row 4), peerscale_table.py (the table).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from common import api_client
from driver import exit_on_sigterm, log
from node import KUBECONFIG
from peer import NS, Operator, build_peer, clear_node, operators
from peerscale_busy import disk_check, many_stacks
from peerscale_idle import SHAPES, idle_stacks
from peerscale_operator import leader_at, started_pod
from peerscale_requests import background, per_minute
from peerscale_table import figure_rows, print_table

from pko.controllers.resources import STACKS
from pko.devtools.benchrecord import recording
from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]


# --- one operator, then the table ----------------------------------------------------------------


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


async def bench(args: argparse.Namespace, peer_dist: Path) -> dict[str, Obj]:
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
    return results


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
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = parse(p)
    args.operators = {o for o in args.operators.split(",") if o}
    if not KUBECONFIG.exists():
        print("bench: no local node; run hack/up.sh first", file=sys.stderr)
        return 2
    if args.stacks:
        disk_check(args.stacks, args.disk_per_workspace_gb)
    with recording("hack/bench/peerscale.py", args.json, vars(args)) as run:
        run.figures["operators"] = asyncio.run(bench(args, build_peer()))
        run.figures["rows"] = figure_rows(run.figures["operators"], args)
        print_table(run.figures["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

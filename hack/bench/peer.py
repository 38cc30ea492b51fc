"""pko beside the Go Pulumi Kubernetes Operator (v2.9.0, hack/build-peer.sh) on the local node, one
operator installed at a time from its own manifests, alternating in one run, the same Stack for both.

    hack/up.sh                                  # the node (this script removes the sample and pko first)
    .venv/bin/python hack/bench/peer.py          # 1 round: Go operator, then pko; 2 updates, 2 pod restarts
    .venv/bin/python hack/bench/peer.py --rounds 2

Both operators serve the same CRD groups, so each is installed (`kubectl apply --server-side -k`: the Go
operator's `config/quickstart`, pko's `config/local`), measured and removed with its CRDs before the
other; pko is left installed at the end (without the sample). Both run the same workspace image
(`pko-workspace:dev`: the same CLI, hosts and providers), their own agents, in a namespace of the
bench's own (no Pod Security label; both operators' workspace pods satisfy `restricted`, as the
conformance lane shows: docs/differences.md), with a ServiceAccount bound to `system:auth-delegator` and
allowed ConfigMaps.

The Stack: a Program (Pulumi YAML) creating one ConfigMap from a config value, state on a claim.
Rows, from the same run (median of each operator's rounds):
1. Program Stack applied -> Ready (the first deploy, workspace pod included);
2. a config change -> Ready, beside the bare `pulumi up` the engine takes in the same pod for the same
   kind of change (`pulumi config set` + `pulumi up --yes --skip-preview`, run by this script through
   `kubectl exec` after the operator's update): the operator's overhead per update;
3. workspace pod deleted -> Workspace Ready again (their agent vs ours);
4. the operator pod deleted 3 s into an update that runs a 30 s command (pulumi-command): the time from
   the deletion until the Stack is Ready for that change, how many Updates the change made and how many
   runs the engine recorded in the stack's history (1 and 1 are right).
Rows 3 and 4 of issue 26 (many Stacks at once, idle Stacks) are peerscale.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import REPO
from driver import exit_on_sigterm, log
from node import KUBECONFIG, POLL

from pko.devtools.benchrecord import recording
from pko.devtools.builds import built
from pko.devtools.kubectl import run
from pko.devtools.localnode.images import import_images
from pko.devtools.stacks import claimed_stack
from pko.devtools.waiting import wait_until

NS = "bench-peer"
NAME = "peer"
OPERATOR_NS = "pulumi-kubernetes-operator"

SETUP = """\
apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: pulumi
  namespace: {ns}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {ns}:pulumi:system:auth-delegator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:auth-delegator
subjects:
  - kind: ServiceAccount
    name: pulumi
    namespace: {ns}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: pulumi-configmaps
  namespace: {ns}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: pulumi-configmaps
  namespace: {ns}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: pulumi-configmaps
subjects:
  - kind: ServiceAccount
    name: pulumi
"""

# A Program with a `greeting` config value; {resources} and {output} complete it.
PROGRAM_OF = """\
apiVersion: pulumi.com/v1
kind: Program
metadata:
  name: {{name}}
program:
  configuration:
    greeting:
      type: String
  resources:
{resources}
  outputs:
    greeting: {output}
"""

PROGRAM = PROGRAM_OF.format(
    resources="""\
    settings:
      type: kubernetes:core/v1:ConfigMap
      properties:
        metadata:
          name: {name}-settings
        data:
          greeting: ${{greeting}}""",
    output="${{settings.data.greeting}}",
)

# Row 6's program: each new greeting runs a command for SLOW_SECONDS (pulumi-command, in the image), so
# the operator pod can be deleted while the update runs.
SLOW_SECONDS = 30
RECOVERY = 300.0  # how long row 6 waits for the Stack to be Ready again
SLOW_PROGRAM = PROGRAM_OF.format(
    resources="""\
    wait:
      type: command:local:Command
      properties:
        create: sleep {seconds}
        triggers:
          - ${{greeting}}""",
    output="${{greeting}}",
)



def stack_manifest(name: str) -> str:
    """The Stack ``name`` of the Program ``name``, its state on a claim of its own, a ``greeting`` config
    value, pko's workspace image: the e2e suite's Stack (claimed_stack), after a ``---``."""
    return "---\n" + claimed_stack(
        name,
        f"programRef:\n    name: {name}",
        passphrase="bench",
        config={"greeting": "hello"},
        workspace={"image": "pko-workspace:dev", "imagePullPolicy": "IfNotPresent"},
    )


def kubectl(*args: str, input: str | None = None, check: bool = True, timeout: float = 600) -> str:
    return run(*args, kubeconfig=KUBECONFIG, input=input, check=check, timeout=timeout).stdout


def get(kind: str, name: str, ns: str = NS) -> dict[str, Any] | None:
    out = kubectl("-n", ns, "get", kind, name, "-o", "json", check=False)
    return json.loads(out) if out else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") == type_), {}
    )


def release(stack: str) -> None:
    """Drop a Stack's finalizers (``stack/NAME``): its operator could not finish it."""
    kubectl("-n", NS, "patch", stack, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}', check=False)


class Operator:
    """One operator's install and removal, from its own manifests."""

    def __init__(self, label: str, kustomization: Path, images: list[Path]) -> None:
        self.label, self.kustomization, self.images = label, kustomization, images

    def install(self) -> None:
        import_images(self.images)
        kubectl("apply", "--server-side", "--force-conflicts", "-k", str(self.kustomization), timeout=300)
        kubectl("-n", OPERATOR_NS, "rollout", "status", "deployment/controller-manager", "--timeout=300s")

    def remove(self) -> None:
        """Stacks first, while the operator runs their finalizers (a failed run may leave one); a Stack
        still there after that is released by hand, so the CRDs can go."""
        kubectl("-n", NS, "delete", "stacks", "--all", "--timeout=300s", check=False, timeout=320)
        for name in kubectl("-n", NS, "get", "stacks", "-o", "name", check=False).split():
            release(name)
        kubectl("delete", "--ignore-not-found", "--wait=true", "-k", str(self.kustomization), timeout=600)


async def wait(what: str, check: Any, within: float = 600) -> Any:
    async def probe() -> Any:
        return check()

    return await wait_until(what, probe, within=within, interval=POLL)


def ready_at(generation: int | None, name: str = NAME) -> dict[str, Any] | None:
    """The Stack, once Ready with its last update at ``generation`` (None: whatever its generation is now;
    the Go operator writes defaults into a new Stack's spec, so its first generation is 2)."""
    stack = get("stack", name)
    if stack is None:
        return None
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    want = stack["metadata"]["generation"] if generation is None else generation
    if condition(stack, "Ready").get("status") == "True" and last.get("generation") == want:
        return stack
    return None


def bare_up(greeting: str) -> float:
    """The engine alone, in the workspace pod: the same config change and `pulumi up` the agent runs."""
    script = (
        "export PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file:///state}; "
        f"cd /share/workspace && pulumi config set greeting '{greeting}' -s dev >/dev/null "
        "&& start=$(date +%s.%N) && pulumi up --yes --skip-preview -s dev >/dev/null "
        '&& end=$(date +%s.%N) && echo "$start $end"'
    )
    out = kubectl(
        "-n", NS, "exec", f"{NAME}-workspace-0", "-c", "pulumi", "--", "sh", "-c", script, timeout=600
    )
    start, end = (float(x) for x in out.split())
    return end - start


async def measure(op: Operator, updates: int, restarts: int) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {"first": [], "update": [], "bare": [], "restart": []}
    t0 = time.time()
    kubectl("-n", NS, "apply", "-f", "-", input=PROGRAM.format(name=NAME) + stack_manifest(NAME))
    await wait("the first deploy", lambda: ready_at(None), 900)
    rows["first"].append(time.time() - t0)
    for i in range(updates):
        t0 = time.time()
        change = json.dumps({"spec": {"config": {"greeting": f"{op.label} {i}"}}})
        patched = json.loads(
            kubectl("-n", NS, "patch", "stack", NAME, "--type=merge", "-o", "json", "-p", change)
        )
        await wait(f"update {i}", lambda g=int(patched["metadata"]["generation"]): ready_at(g))  # type: ignore[misc]
        rows["update"].append(time.time() - t0)
        rows["bare"].append(bare_up(f"bare {op.label} {i}"))
    for _ in range(restarts):
        old = (get("pod", f"{NAME}-workspace-0") or {})["metadata"]["uid"]
        kubectl("-n", NS, "delete", "pod", f"{NAME}-workspace-0", "--wait=false")

        def replaced(old: str = old) -> bool:
            return (get("pod", f"{NAME}-workspace-0") or {}).get("metadata", {}).get("uid") not in (None, old)

        await wait("the replacement pod", replaced)
        t0 = time.time()

        def ready_again() -> bool:
            cond = condition(get("workspace", NAME), "Ready")
            pod = get("pod", f"{NAME}-workspace-0") or {}
            running = all(c.get("ready") for c in (pod.get("status") or {}).get("containerStatuses") or [{}])
            return cond.get("status") == "True" and running

        await wait("the Workspace Ready again", ready_again, 300)
        rows["restart"].append(time.time() - t0)
    await remove_stack(NAME)
    rows.update(await operator_restart_mid_update(op))
    log(f"  {op.label}: " + ", ".join(f"{k} {[round(v, 1) for v in vs]}" for k, vs in rows.items()))
    return rows


async def remove_stack(name: str) -> None:
    """Delete the Stack (its destroy runs); one whose destroy cannot finish is released by hand."""
    kubectl("-n", NS, "delete", "stack", name, "--wait=false")
    try:
        await wait(f"the Stack {name} deleted", lambda: get("stack", name) is None, RECOVERY)
    except (RuntimeError, TimeoutError):  # a kubectl that failed, or not within the time
        log(f"  the Stack {name} is still there after {RECOVERY:.0f} s; releasing it")
        release(f"stack/{name}")
    kubectl("-n", NS, "delete", "program", name, "--ignore-not-found", check=False)
    # Waited for: a claim still terminating would be re-used by the next apply, state and locks included.
    kubectl("-n", NS, "delete", "pvc", f"{name}-state", "--ignore-not-found", "--timeout=120s", check=False)


def updates_of(stack: str) -> list[dict[str, Any]]:
    """The Stack's Update objects (both operators make them owned by the Stack)."""
    items = json.loads(kubectl("-n", NS, "get", "updates.auto.pulumi.com", "-o", "json"))["items"]
    return [
        u for u in items if any(o.get("name") == stack for o in u["metadata"].get("ownerReferences") or [])
    ]


def engine_runs(stack: str) -> int:
    """How many updates the engine recorded in the stack's history (its state on the claim)."""
    script = "export PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file:///state}; cd /share/workspace && " \
        "pulumi stack history --json -s dev"  # fmt: skip
    out = kubectl("-n", NS, "exec", f"{stack}-workspace-0", "-c", "pulumi", "--", "sh", "-c", script)
    return len(json.loads(out))


async def operator_restart_mid_update(op: Operator) -> dict[str, list[float]]:
    """Row 6: the operator pod deleted while an update runs; the time from the deletion until the Stack
    is Ready for that change, how many Updates the change made, and how many runs the engine recorded."""
    name = f"{NAME}-slow"
    program = SLOW_PROGRAM.format(name=name, seconds=SLOW_SECONDS)
    kubectl("-n", NS, "apply", "-f", "-", input=program + stack_manifest(name))
    await wait("the slow Stack's first deploy", lambda: ready_at(None, name), 900)
    runs_before = engine_runs(name)
    known = {u["metadata"]["uid"] for u in updates_of(name)}
    change = json.dumps({"spec": {"config": {"greeting": f"{op.label} slow"}}})
    patched = json.loads(
        kubectl("-n", NS, "patch", "stack", name, "--type=merge", "-o", "json", "-p", change)
    )
    generation = int(patched["metadata"]["generation"])

    def running() -> bool:
        fresh = [u for u in updates_of(name) if u["metadata"]["uid"] not in known]
        return any(condition(u, "Progressing").get("status") == "True" for u in fresh)

    await wait("the slow update running", running, 300)
    await asyncio.sleep(3.0)  # well inside the engine's run
    t0 = time.time()
    kubectl("-n", OPERATOR_NS, "delete", "pod", "-l", "control-plane=controller-manager", "--wait=false")
    try:
        await wait(
            "the Stack Ready after the operator's restart", lambda: ready_at(generation, name), RECOVERY
        )
        recovered = time.time() - t0
    except (RuntimeError, TimeoutError):  # a kubectl that failed, or not within the time
        recovered = float("inf")
        last = ((get("stack", name) or {}).get("status") or {}).get("lastUpdate") or {}
        log(f"  {op.label}: not Ready {RECOVERY:.0f} s after the operator's restart: {last.get('message')!r}")
    made = len([u for u in updates_of(name) if u["metadata"]["uid"] not in known])
    runs = engine_runs(name) - runs_before
    await remove_stack(name)
    return {"operator_restart": [recovered], "updates_made": [float(made)], "engine_runs": [float(runs)]}


def build_peer() -> Path:
    """The Go operator's build (hack/build-peer.sh, cached: instant once built): its ``dist`` folder."""
    return built("build-peer.sh")


def operators(peer_dist: Path) -> tuple[Operator, Operator]:
    """The Go operator (its quickstart manifests and image, from hack/build-peer.sh's ``peer_dist``) and
    pko (config/local), in the order the benches measure them."""
    go = Operator(
        "go", peer_dist / "config" / "quickstart", [peer_dist / "pulumi-kubernetes-operator.oci.tar"]
    )
    return go, Operator("pko", REPO / "config" / "local", [])


def clear_node(pko: Operator) -> None:
    """Remove the sample and pko (a bench installs each operator in turn), then set up the bench's
    namespace (``SETUP``)."""
    log("removing the sample and pko (the bench installs each operator in turn)")
    # The Stack first (its destroy needs the sample's RBAC), then the rest of the sample.
    kubectl("-n", "default", "delete", "stack", "hello", "--ignore-not-found", timeout=600)
    kubectl("delete", "--ignore-not-found", "-k", str(REPO / "config" / "samples"), check=False, timeout=600)
    pko.remove()
    kubectl("apply", "-f", "-", input=SETUP.format(ns=NS))


Results = dict[str, dict[str, list[float]]]  # operator label -> figure -> one value per round


async def bench(args: argparse.Namespace, peer_dist: Path) -> Results:
    go, pko = operators(peer_dist)
    clear_node(pko)
    results: Results = {"go": {}, "pko": {}}
    try:
        for r in range(args.rounds):
            for op in (go, pko):
                log(f"round {r + 1}: {op.label}")
                op.install()
                try:
                    rows = await measure(op, args.updates, args.restarts)
                finally:
                    op.remove()
                for key, values in rows.items():
                    results[op.label].setdefault(key, []).extend(values)
    finally:
        pko.install()
    return results


def median(results: Results, label: str, key: str) -> float:
    return statistics.median(results[label][key])


def overhead(results: Results, label: str) -> float:
    """Config change -> Ready, less the bare ``pulumi up`` for such a change in the same pod."""
    return median(results, label, "update") - median(results, label, "bare")


def figure_rows(results: Results) -> list[dict[str, Any]]:
    """The table's rows: each figure's label, the Go operator's and pko's value (the median of the rounds;
    the per-round lists for the counts) and pko / Go (None where there is none to take)."""

    def med(label: str, key: str) -> float:
        return median(results, label, key)

    def ratio(g: float, p: float) -> float | None:
        return p / g if g not in (0.0, float("inf")) else None

    rows: list[dict[str, Any]] = []
    for key, label in (
        ("first", "Program Stack applied -> Ready (first deploy, workspace pod included)"),
        ("update", "config change -> Ready"),
        ("bare", "the bare `pulumi up` for such a change, same pod"),
        ("restart", "workspace pod deleted -> Workspace Ready again"),
    ):
        g, p = med("go", key), med("pko", key)
        rows.append({"figure": label, "go": g, "pko": p, "ratio": ratio(g, p)})
    g, p = overhead(results, "go"), overhead(results, "pko")
    label = "operator overhead per update (config change -> Ready minus the bare up)"
    rows.append({"figure": label, "go": g, "pko": p, "ratio": ratio(g, p)})
    g, p = med("go", "operator_restart"), med("pko", "operator_restart")
    label = f"operator pod deleted 3 s into a {SLOW_SECONDS} s update -> Stack Ready"
    label += f" (inf: not within {RECOVERY:.0f} s)"
    rows.append({"figure": label, "go": g, "pko": p, "ratio": ratio(g, p)})
    for key, label in (("updates_made", "Updates that change made"), ("engine_runs", "engine runs recorded")):
        label += " (each round; 1 is right)"
        rows.append({"figure": label, "go": results["go"][key], "pko": results["pko"][key], "ratio": None})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """figure_rows() as a Markdown table (seconds to one decimal, ratios to two)."""

    def cell(value: Any) -> str:
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    print("| figure | Go operator | pko | pko / Go |")
    print("|---|---:|---:|---:|")
    for row in rows:
        if isinstance(row["go"], list):  # the counts per round: no ratio
            shown = ""
        else:
            shown = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"| {row['figure']} | {cell(row['go'])} | {cell(row['pko'])} | {shown} |")


def main() -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1, help="install/measure/remove rounds per operator")
    p.add_argument("--updates", type=int, default=2, help="config changes per round")
    p.add_argument("--restarts", type=int, default=2, help="workspace pod deletions per round")
    p.add_argument("--json", type=Path, help="write every printed figure and the run's record here")
    args = p.parse_args()
    if not KUBECONFIG.exists():
        print("bench: no local node; run hack/up.sh first", file=sys.stderr)
        return 2
    with recording("hack/bench/peer.py", args.json, vars(args)) as run:
        run.figures["rounds"] = asyncio.run(bench(args, build_peer()))
        run.figures["rows"] = figure_rows(run.figures["rounds"])
        print(f"# pko beside the Go operator v2.9.0, local node ({args.rounds} round(s); medians, seconds)\n")
        print_table(run.figures["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

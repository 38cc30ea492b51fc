"""A deployed fleet for the steady-state benchmark: N Ready Stacks tracking branches on a loopback git
server, each with the Workspace, StatefulSet, Service and completed Update the operator would have
made, seeded directly so the operator starts with all of them in its caches.

The objects are built with the operator's own builders (``build_workspace``, ``desired_statefulset``,
``desired_service``, ``desired_network_policy``, ``build_update``, ``result_status``) and written with
its field managers, so the operator finds them as it left them. What others would have added is seeded
too, as they write it: the StatefulSet's status and its Ready pod (kube-controller-manager and a
kubelet; the pod carries the operator's "initialized" and stacks-hash annotations), and the
Workspace's Ready status (the operator, once the agent answered). Nothing runs in the pods: a steady
fleet needs no agent call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from common import stack_spec
from driver import bounded
from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import MemoryRepo
from dulwich.server import DictBackend
from dulwich.web import make_wsgi_chain
from pko.api.generated.pko.agent import v1 as pb
from pko.api.validation import parse_stack

from pko.agentclient import service_address
from pko.controllers.options import ControllerOptions
from pko.controllers.resources import (
    FIELD_MANAGER,
    FIELD_MANAGER_STACK_FINALIZER,
    FIELD_MANAGER_STACK_STATUS,
    FIELD_MANAGER_UPDATE_STATUS,
    FIELD_MANAGER_WORKSPACE_STATUS,
    STACK_FINALIZER,
    STACKS,
    UPDATES,
    WORKSPACES,
)
from pko.controllers.stack.status import mark_ready
from pko.controllers.stack.updateobject import build_update
from pko.controllers.stack.workspaceobject import GitRevision, build_workspace
from pko.controllers.update.status import result_status
from pko.controllers.workspace.networkpolicy import NETWORK_POLICIES, desired_network_policy
from pko.controllers.workspace.workloads import (
    ANNOTATION_INITIALIZED,
    ANNOTATION_STACKS_HASH,
    REVISION_LABEL,
    desired_service,
    desired_statefulset,
    parse_spec,
    stacks_hash,
)
from pko.machinery.conditions import set_condition
from pko.machinery.resource import PODS, SERVICEACCOUNTS, SERVICES, STATEFULSETS, Obj, ResourceClient

CONCURRENCY = 32
KUBECTL = "kubectl"
KCM = "kube-controller-manager"
KUBELET = "kubelet"
PULUMI_VERSION = "3.140.0"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


@dataclass
class GitServer:
    base: str
    commits: dict[int, str]  # team -> head of main
    requests: list[int]  # [count], shared with the serving threads

    def url(self, team: int) -> str:
        return f"{self.base}/team-{team}-infrastructure.git"


def _repo(team: int) -> tuple[MemoryRepo, str]:
    repo = MemoryRepo()
    blob = Blob.from_string(f"name: team-{team}\nruntime: yaml\n".encode())
    tree = Tree()
    tree.add(b"Pulumi.yaml", 0o100644, blob.id)
    commit = Commit()
    commit.tree = tree.id
    commit.author = commit.committer = b"bench <bench@localhost>"
    commit.commit_time = commit.author_time = 1_700_000_000 + team
    commit.commit_timezone = commit.author_timezone = 0
    commit.message = f"team {team}\n".encode()
    repo.object_store.add_objects([(blob, None), (tree, None), (commit, None)])
    repo.refs[b"refs/heads/main"] = commit.id
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    return repo, commit.id.decode()


@contextmanager
def git_server(teams: int) -> Iterator[GitServer]:
    """One smart-HTTP repository per team on loopback; counts the requests it serves."""
    repos: dict[str, Any] = {}
    commits: dict[int, str] = {}
    for team in range(teams):
        repo, commit = _repo(team)
        repos[f"/team-{team}-infrastructure.git"] = repo
        commits[team] = commit
    app = make_wsgi_chain(DictBackend(repos))
    count = [0]
    lock = threading.Lock()

    def counting(environ: Any, start_response: Any) -> Any:
        with lock:
            count[0] += 1
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, server_class=_ThreadingWSGIServer, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield GitServer(f"http://127.0.0.1:{server.server_port}", commits, count)
    finally:
        server.shutdown()
        server.server_close()


def fleet_stack_spec(i: int, git: GitServer, teams: int, resync: int) -> dict[str, Any]:
    body = stack_spec(i)
    spec = body["spec"]
    spec["projectRepo"] = git.url(i % teams)
    spec["branch"] = "refs/heads/main"
    spec["resyncFrequencySeconds"] = resync
    return body


def fleet_stack_status(i: int, commit: str, update_name: str, generation: int) -> dict[str, Any]:
    """A Ready status for a Stack whose last Update deployed ``commit``."""
    now = datetime.now(UTC)
    marked: dict[str, Any] = {}
    mark_ready(marked, generation, now)  # the operator's own conditions, so it has nothing to rewrite
    conditions = marked["conditions"]
    now_text = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "observedGeneration": generation,
        "observedReconcileRequest": "",
        "conditions": conditions,
        "outputs": {"url": f"https://service-{i}.example.com", "replicas": i % 5 + 1},
        "lastUpdate": {
            "name": update_name,
            "type": "up",
            "state": "succeeded",
            "generation": generation,
            "reconcileRequest": "",
            "lastAttemptedCommit": commit,
            "lastSuccessfulCommit": commit,
            "lastResyncTime": now_text,
            "message": "",
            "failures": 0,
        },
    }


@dataclass
class Seeded:
    stacks: int = 0
    workspaces: int = 0
    statefulsets: int = 0
    services: int = 0
    networkpolicies: int = 0
    updates: int = 0
    pods: int = 0


def _revision(sts: Obj) -> str:
    return f"{sts['metadata']['name']}-{str(sts['metadata']['uid'])[:10]}"


def sts_status(sts: Obj) -> Obj:
    """What the StatefulSet controller reports for a rolled-out, ready single replica."""
    revision = _revision(sts)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": sts["metadata"]["name"], "namespace": sts["metadata"]["namespace"]},
        "status": {
            "observedGeneration": int(sts["metadata"].get("generation") or 1),
            "replicas": 1,
            "readyReplicas": 1,
            "currentReplicas": 1,
            "updatedReplicas": 1,
            "currentRevision": revision,
            "updateRevision": revision,
        },
    }


def ready_pod(sts: Obj, index: int, stacks: str) -> tuple[Obj, Obj]:
    """The StatefulSet's pod as the StatefulSet controller creates it, and the status a kubelet reports;
    annotated as the operator leaves a pod whose agent it initialized with the Workspace's ``stacks``
    (their hash: workloads.stacks_hash), else its first pass would try to initialize every agent."""
    template = sts["spec"]["template"]
    meta = sts["metadata"]
    labels = {**(template["metadata"].get("labels") or {}), REVISION_LABEL: _revision(sts)}
    labels["statefulset.kubernetes.io/pod-name"] = f"{meta['name']}-0"
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-0",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {
                **(template["metadata"].get("annotations") or {}),
                ANNOTATION_INITIALIZED: "true",
                ANNOTATION_STACKS_HASH: stacks,
            },
            "ownerReferences": [owner],
        },
        "spec": {**template["spec"], "hostname": f"{meta['name']}-0", "subdomain": meta["name"]},
    }
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    started = {"running": {"startedAt": now}}
    completed = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
    status = {
        "phase": "Running",
        "conditions": conditions,
        "podIP": f"10.{64 + index // 65536}.{index // 256 % 256}.{index % 256}",
        "startTime": now,
        "initContainerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": completed,
            }
            for c in template["spec"].get("initContainers") or []
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": started,
            }
            for c in template["spec"]["containers"]
        ],
    }
    return pod, status


def ready_workspace_status(ws: Obj) -> Obj:
    """The status the Workspace controller writes once the agent answered and the stack was selected."""
    meta = ws["metadata"]
    generation = int(meta.get("generation") or 1)
    conditions = set_condition(None, "Ready", "True", "Succeeded", "", generation)
    return {
        "apiVersion": WORKSPACES.api_version,
        "kind": WORKSPACES.kind,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": {
            "observedGeneration": generation,
            "conditions": conditions,
            "address": service_address(str(meta["name"]), str(meta["namespace"])),
            "pulumiVersion": PULUMI_VERSION,
        },
    }


async def seed_fleet(
    api: Any, namespace: str, n: int, git: GitServer, *, teams: int, resync: int, options: ControllerOptions
) -> Seeded:
    stacks = ResourceClient(api, STACKS)
    workspaces = ResourceClient(api, WORKSPACES)
    statefulsets = ResourceClient(api, STATEFULSETS)
    services = ResourceClient(api, SERVICES)
    policies = ResourceClient(api, NETWORK_POLICIES)
    metrics = options.workspace_metrics != "off"
    updates = ResourceClient(api, UPDATES)
    pods = ResourceClient(api, PODS)
    service_accounts: dict[str, asyncio.Task[None]] = {}
    seeded = Seeded()
    base_time = datetime.now(UTC) - timedelta(hours=1)

    async def make(i: int) -> None:
        body = fleet_stack_spec(i, git, teams, resync)
        body["metadata"]["namespace"] = namespace
        obj = await stacks.apply(body, field_manager=KUBECTL)
        obj = await stacks.apply(
            {
                "apiVersion": body["apiVersion"],
                "kind": "Stack",
                "metadata": {
                    "name": obj["metadata"]["name"],
                    "namespace": namespace,
                    "finalizers": [STACK_FINALIZER],
                },
            },
            field_manager=FIELD_MANAGER_STACK_FINALIZER,
        )
        seeded.stacks += 1
        stack, errors = parse_stack(obj)
        assert stack is not None and not errors, errors
        commit = git.commits[i % teams]
        source = GitRevision(url=body["spec"]["projectRepo"], commit=commit, dir=body["spec"].get("repoDir"))
        ws_body = build_workspace(stack, source)
        ws_body["spec"].setdefault("image", options.workspace_image(ws_body["spec"].get("securityProfile")))
        ws = await workspaces.apply(ws_body, field_manager=FIELD_MANAGER)
        seeded.workspaces += 1
        ws_spec = parse_spec(ws)
        await services.apply(desired_service(ws, ws_spec), field_manager=FIELD_MANAGER, force=True)
        seeded.services += 1
        policy = desired_network_policy(ws, options.operator_namespace, metrics=metrics)
        await policies.apply(policy, field_manager=FIELD_MANAGER, force=True)
        seeded.networkpolicies += 1
        account = ws_spec.service_account_name or "default"
        if account not in service_accounts:  # pods are admitted only with their ServiceAccount
            service_accounts[account] = asyncio.ensure_future(_service_account(api, namespace, account))
        await service_accounts[account]
        sts = await statefulsets.apply(
            desired_statefulset(ws, ws_spec, options), field_manager=FIELD_MANAGER, force=True
        )
        await statefulsets.apply_status(sts_status(sts), field_manager=KCM)
        seeded.statefulsets += 1
        pod, pod_status = ready_pod(sts, i, stacks_hash(ws["spec"]))
        created = await pods.create(pod)
        await pods.apply_status(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": created["metadata"]["name"],
             "namespace": namespace}, "status": pod_status},
            field_manager=KUBELET,
        )  # fmt: skip
        seeded.pods += 1
        await workspaces.apply_status(
            ready_workspace_status(ws), field_manager=FIELD_MANAGER_WORKSPACE_STATUS
        )
        when = base_time + timedelta(seconds=i % 3600)
        update = await updates.create(build_update(stack, ws, "up", "Initial stack update", now=when))
        result = pb.OperationResult(state=pb.OperationState.SUCCEEDED, permalink="")
        status = result_status(update, result, None, now=when)
        await updates.apply_status(
            {"apiVersion": update["apiVersion"], "kind": update["kind"],
             "metadata": {"name": update["metadata"]["name"], "namespace": namespace}, "status": status},
            field_manager=FIELD_MANAGER_UPDATE_STATUS,
        )  # fmt: skip
        seeded.updates += 1
        generation = int(obj["metadata"].get("generation") or 1)
        await stacks.apply_status(
            {
                "apiVersion": body["apiVersion"],
                "kind": "Stack",
                "metadata": {"name": obj["metadata"]["name"], "namespace": namespace},
                "status": fleet_stack_status(i, commit, update["metadata"]["name"], generation),
            },
            field_manager=FIELD_MANAGER_STACK_STATUS,
        )

    await bounded(n, CONCURRENCY, make)
    return seeded


async def _service_account(api: Any, namespace: str, name: str) -> None:
    """The workspace pods' ServiceAccount (ServiceAccount admission refuses a pod whose account is
    missing). A current cluster gives it no token Secret: pods get projected, bound tokens."""
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
    await ResourceClient(api, SERVICEACCOUNTS).apply(body, field_manager="kubectl")

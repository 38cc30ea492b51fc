"""The play-kubelet itself: a hand-written workspace StatefulSet, run by the real StatefulSet controller
and this harness, gets a Ready pod whose real agent answers authenticated RPCs on its pod IP."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status
from kubernetes_asyncio import client
from pko.api.generated.pko.agent import v1 as pb

from pko.devtools.playkubelet import (
    AGENT_IMAGE,
    IMAGE_CONFIG,
    KNOWN_IMAGES,
    PlayKubelet,
    create_service_account,
    grant_workspace_rpc,
    mint_token,
    normalize_image,
    rewrite_paths,
)
from pko.devtools.playkubelet.programs import tail, translate_argv
from pko.machinery.quantity import parse_quantity
from pko.machinery.resource import PODS, STATEFULSETS, ResourceClient

pytestmark = pytest.mark.cluster

WS = "ws1"
POD_SA = "workspace-sa"
CALLER_SA = "caller"
LABELS = {"auto.pulumi.com/component": "workspace", "auto.pulumi.com/workspace-name": WS}
PROGRAM = "name: hello\nruntime: yaml\noutputs:\n  greeting: hi\n"


def workspace_statefulset(
    ns: str, ws: str = WS, *, image: str = "pulumi/pulumi:latest-nonroot"
) -> dict[str, Any]:
    """The Go operator's workspace StatefulSet shape, with a user init container writing the program."""
    labels = {**LABELS, "auto.pulumi.com/workspace-name": ws}
    share = [{"name": "share", "mountPath": "/share"}]
    pulumi_env = {"name": "PULUMI_ENV", "value": "/share/.env"}
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": f"{ws}-workspace", "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "podManagementPolicy": "Parallel",
            "serviceName": f"{ws}-workspace",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": POD_SA,
                    "terminationGracePeriodSeconds": 600,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "initContainers": [
                        {
                            "name": "bootstrap",
                            "image": AGENT_IMAGE,
                            "args": ["cp", "-r", "/agent", "/agent-lib", "/tini", "/share/"],
                            "volumeMounts": share,
                            "env": [pulumi_env],
                            "securityContext": restricted,
                        },
                        {
                            "name": "program",
                            "image": "busybox",
                            "command": [
                                "sh",
                                "-c",
                                "mkdir -p /share/workspace && "
                                f"printf '{PROGRAM}' > /share/workspace/Pulumi.yaml",
                            ],
                            "volumeMounts": share,
                            "env": [pulumi_env],
                        },
                    ],
                    "containers": [
                        {
                            "name": "pulumi",
                            "image": image,
                            "workingDir": "/share/workspace",
                            "command": [
                                "/share/tini",
                                "/share/agent",
                                "--",
                                "serve",
                                "--workspace",
                                "/share/workspace",
                                "--skip-install",
                                "--env-file",
                                "/share/.env",
                                "--auth-mode",
                                "kube",
                                "--kube-audience",
                                f"{ws}.{ns}",
                                "--kube-workspace-namespace",
                                ns,
                                "--kube-workspace-name",
                                ws,
                            ],
                            "ports": [{"name": "grpc", "containerPort": 50051}],
                            "env": [
                                {
                                    "name": "POD_NAMESPACE",
                                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                                },
                                {
                                    "name": "POD_SA_NAME",
                                    "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}},
                                },
                                {
                                    "name": "AGENT_MEMLIMIT",
                                    "valueFrom": {
                                        "resourceFieldRef": {
                                            "containerName": "pulumi",
                                            "resource": "requests.memory",
                                        }
                                    },
                                },
                                pulumi_env,
                            ],
                            "resources": {"requests": {"memory": "64Mi", "cpu": "100m"}},
                            "volumeMounts": share,
                            "securityContext": restricted,
                        }
                    ],
                    "volumes": [{"name": "share", "emptyDir": {}}],
                },
            },
        },
    }


def simple_statefulset(
    ns: str, name: str, init: list[dict[str, Any]], main: dict[str, Any]
) -> dict[str, Any]:
    labels = {"auto.pulumi.com/component": "workspace", "auto.pulumi.com/workspace-name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": f"{name}-workspace", "namespace": ns, "labels": labels},
        "spec": {
            "replicas": 1,
            "podManagementPolicy": "Parallel",
            "serviceName": f"{name}-workspace",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "initContainers": init,
                    "containers": [main],
                    "volumes": [{"name": "share", "emptyDir": {}}],
                },
            },
        },
    }


def condition(pod: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


async def pulumi_version(ip: str, token: str | None, timeout: float = 60.0) -> str:  # noqa: ASYNC109
    """PulumiVersion on ip:50051, retrying while the agent is still starting."""
    deadline = time.monotonic() + timeout
    while True:
        channel = Channel(ip, 50051)
        try:
            metadata = {"authorization": f"Bearer {token}"} if token else None
            stub = pb.AutomationServiceStub(channel, metadata=metadata)
            res = await asyncio.wait_for(stub.pulumi_version(pb.PulumiVersionRequest()), 30)
            return str(res.version)
        except (OSError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)
        finally:
            channel.close()


# -- pure helpers ----------------------------------------------------------------------------------


def test_rewrite_paths_matches_whole_paths_only() -> None:
    mounts = [("/share", Path("/h/share")), ("/share/deep", Path("/h/deep"))]
    assert rewrite_paths("cp /agent /tini /share/", mounts) == "cp /agent /tini /h/share/"
    assert rewrite_paths("--env-file=/share/.env", mounts) == "--env-file=/h/share/.env"
    assert rewrite_paths("/share/deep/x /shared /a/share file:///share/s", mounts) == (
        "/h/deep/x /shared /a/share file:///h/share/s"
    )
    assert rewrite_paths("echo hi > /share/x", mounts) == "echo hi > /h/share/x"


def test_translate_argv_maps_the_agent_image_programs() -> None:
    py = translate_argv(
        ["/share/tini", "/share/agent", "--", "serve", "--host", "0.0.0.0", "-w", "/w"], "127.9.0.1"
    )
    assert py[1:] == ["-m", "pko.agent", "serve", "--host", "127.9.0.1", "-w", "/w"]
    assert translate_argv(["/tini", "--", "/agent", "init", "-t", "/x"], "ip")[1:] == [
        "-m",
        "pko.agent",
        "init",
        "-t",
        "/x",
    ]
    assert translate_argv(["/tini", "--", "cp", "/agent", "/tini", "/p/share/"], "ip") == [
        "<bootstrap-copy>",
        "/p/share/",
    ]
    assert translate_argv(["sh", "-c", "true"], "ip") == ["sh", "-c", "true"]


def test_small_helpers() -> None:
    assert parse_quantity("64Mi") == 64 * 2**20
    assert parse_quantity("100m") * 1000 == 100
    assert parse_quantity("1e3") == 1000
    assert normalize_image("busybox") == "docker.io/library/busybox:latest"
    assert normalize_image("pulumi/pulumi:3") == "docker.io/pulumi/pulumi:3"
    assert normalize_image("ghcr.io/x/y@sha256:ab") == "ghcr.io/x/y@sha256:ab"
    text = "\n".join(f"line {i}" for i in range(1, 201))
    assert tail(text).splitlines()[0] == "line 121"
    assert len(tail("x" * 5000).encode()) == 2048


# -- against the cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def workspace_pod(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet, auth_delegator: Any
) -> str:
    """The hand-written workspace StatefulSet, created once; returns the pod key."""
    await create_service_account(api_client, namespace, POD_SA)
    await auth_delegator(POD_SA)
    await create_service_account(api_client, namespace, CALLER_SA)
    await grant_workspace_rpc(api_client, namespace, WS, CALLER_SA)
    await ResourceClient(api_client, STATEFULSETS, namespace).create(workspace_statefulset(namespace))
    return f"{namespace}/{WS}-workspace-0"


async def test_workspace_pod_runs_with_a_ready_agent_on_its_pod_ip(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet, workspace_pod: str
) -> None:
    pod = await kubelet.wait_ready(workspace_pod, timeout=120)
    status = pod["status"]
    ip = status["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    assert status["podIPs"] == [{"ip": ip}]
    assert status["hostIP"] == "127.0.0.1"
    assert status["phase"] == "Running"
    assert pod["spec"]["nodeName"] == "play-kubelet"
    for type_ in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert condition(pod, type_)["status"] == "True", type_
    inits = {s["name"]: s for s in status["initContainerStatuses"]}
    assert inits["bootstrap"]["state"]["terminated"]["reason"] == "Completed"
    assert inits["program"]["state"]["terminated"]["exitCode"] == 0
    (main,) = status["containerStatuses"]
    assert main["name"] == "pulumi" and main["ready"] and main["restartCount"] == 0
    assert "running" in main["state"] and main["containerID"].startswith("containerd://")
    assert main["imageID"].startswith("docker.io/pulumi/pulumi@sha256:")

    # The real agent, with --auth-mode kube: a token of an account granted workspaces/rpc works ...
    token = await mint_token(api_client, namespace, CALLER_SA, f"{WS}.{namespace}")
    version = await pulumi_version(ip, token)
    assert version, kubelet.describe()
    # ... no token, or one for another audience, does not.
    with pytest.raises(GRPCError) as err:
        await pulumi_version(ip, None)
    assert err.value.status == Status.UNAUTHENTICATED
    wrong = await mint_token(api_client, namespace, CALLER_SA, f"other.{namespace}")
    with pytest.raises(GRPCError) as err:
        await pulumi_version(ip, wrong)
    assert err.value.status == Status.UNAUTHENTICATED
    # The downward API and the emptyDir made it into the agent's environment.
    pid = kubelet.processes[workspace_pod]["pulumi"]
    environ = _environ(pid)
    assert environ["POD_NAMESPACE"] == namespace
    assert environ["POD_SA_NAME"] == POD_SA
    assert environ["AGENT_MEMLIMIT"] == str(64 * 2**20)
    assert environ["PULUMI_ENV"].endswith("/volumes/share/.env")
    assert _is_file(environ["KUBECONFIG"])


async def test_a_killed_container_restarts_with_a_growing_restart_count(
    kubelet: PlayKubelet, workspace_pod: str
) -> None:
    pod = await kubelet.wait_ready(workspace_pod, timeout=120)
    assert kubelet.kill(workspace_pod, "pulumi")

    def restarted(p: dict[str, Any]) -> bool:
        (main,) = p["status"]["containerStatuses"]
        return main["restartCount"] == 1 and main["ready"]

    pod = await kubelet.wait_for(workspace_pod, restarted, timeout=60, what="restart")
    (main,) = pod["status"]["containerStatuses"]
    assert main["lastState"]["terminated"]["exitCode"] == 137
    assert main["lastState"]["terminated"]["reason"] == "Error"


async def test_deleted_pod_is_replaced_by_the_statefulset_controller_and_run_again(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet, workspace_pod: str
) -> None:
    pod = await kubelet.wait_ready(workspace_pod, timeout=120)
    old_uid, old_ip = pod["metadata"]["uid"], pod["status"]["podIP"]
    old_pid = kubelet.processes[workspace_pod]["pulumi"]
    await ResourceClient(api_client, PODS, namespace).delete(workspace_pod.split("/")[1])

    def replaced(p: dict[str, Any]) -> bool:
        return p["metadata"]["uid"] != old_uid and condition(p, "Ready").get("status") == "True"

    pod = await kubelet.wait_for(workspace_pod, replaced, timeout=120, what="replacement Ready")
    assert pod["status"]["podIP"] != old_ip
    assert not _alive(old_pid)
    token = await mint_token(api_client, namespace, CALLER_SA, f"{WS}.{namespace}")
    assert await pulumi_version(pod["status"]["podIP"], token)


async def test_failing_init_container_reports_its_log_tail_and_keeps_initialized_false(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet
) -> None:
    script = "i=1; while [ $i -le 100 ]; do echo line $i; i=$((i+1)); done; echo boom >&2; exit 3"
    init = [
        {
            "name": "fetch",
            "image": "busybox",
            "command": ["sh", "-c", script],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    main = {"name": "pulumi", "image": "busybox", "command": ["sleep", "1000"]}
    await ResourceClient(api_client, STATEFULSETS, namespace).create(
        simple_statefulset(namespace, "badinit", init, main)
    )
    key = f"{namespace}/badinit-workspace-0"

    def failed_twice(p: dict[str, Any]) -> bool:
        (s,) = (p.get("status") or {}).get("initContainerStatuses") or [{}]
        return s.get("restartCount", 0) >= 1 and "terminated" in (s.get("lastState") or {})

    pod = await kubelet.wait_for(key, failed_twice, timeout=60, what="init container restarted")
    (s,) = pod["status"]["initContainerStatuses"]
    term = s["lastState"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    lines = term["message"].splitlines()
    assert len(lines) == 80 and lines[0] == "line 22" and lines[-1] == "boom"
    initialized = condition(pod, "Initialized")
    assert initialized["status"] == "False" and initialized["reason"] == "ContainersNotInitialized"
    assert "fetch" in initialized["message"]
    assert pod["status"]["phase"] == "Pending"
    (m,) = pod["status"]["containerStatuses"]
    assert m["state"]["waiting"]["reason"] == "PodInitializing"


async def test_exiting_main_container_goes_into_crash_loop_back_off(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet
) -> None:
    main = {"name": "pulumi", "image": "busybox", "command": ["sh", "-c", "echo oops; exit 2"]}
    await ResourceClient(api_client, STATEFULSETS, namespace).create(
        simple_statefulset(namespace, "crash", [], main)
    )
    key = f"{namespace}/crash-workspace-0"

    def crash_looping(p: dict[str, Any]) -> bool:
        (s,) = (p.get("status") or {}).get("containerStatuses") or [{}]
        waiting = (s.get("state") or {}).get("waiting") or {}
        return waiting.get("reason") == "CrashLoopBackOff" and s.get("restartCount", 0) >= 2

    pod = await kubelet.wait_for(key, crash_looping, timeout=60, what="CrashLoopBackOff")
    (s,) = pod["status"]["containerStatuses"]
    assert s["lastState"]["terminated"]["exitCode"] == 2 and not s["ready"]
    assert "back-off" in s["state"]["waiting"]["message"]
    assert pod["status"]["phase"] == "Running"
    assert condition(pod, "Ready")["reason"] == "ContainersNotReady"
    assert kubelet.output(key, "pulumi") == "oops"


async def test_unknown_image_is_never_run_until_the_pod_is_replaced_with_a_known_one(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet
) -> None:
    main = {"name": "pulumi", "image": "example.invalid/no-such-image:1", "command": ["sleep", "1000"]}
    sts = ResourceClient(api_client, STATEFULSETS, namespace)
    await sts.create(simple_statefulset(namespace, "badimage", [], main))
    key = f"{namespace}/badimage-workspace-0"

    def backoff(p: dict[str, Any]) -> bool:
        (s,) = (p.get("status") or {}).get("containerStatuses") or [{}]
        return (s.get("state") or {}).get("waiting", {}).get("reason") == "ImagePullBackOff"

    pod = await kubelet.wait_for(key, backoff, timeout=30, what="ImagePullBackOff")
    assert key not in kubelet.processes
    assert condition(pod, "Ready")["status"] == "False"
    # The fix: a known image in the template, and the broken pod deleted (a StatefulSet does not replace
    # a never-ready pod by itself; that is the Workspace controller's job).
    await sts.patch(
        "badimage-workspace",
        {"spec": {"template": {"spec": {"containers": [{**main, "image": "busybox"}]}}}},
        patch_type="strategic",
    )
    await ResourceClient(api_client, PODS, namespace).delete("badimage-workspace-0")
    pod = await kubelet.wait_for(
        key,
        lambda p: (
            p["metadata"]["uid"] != pod["metadata"]["uid"] and condition(p, "Ready").get("status") == "True"
        ),
        timeout=60,
        what="replacement Ready",
    )
    assert pod["spec"]["containers"][0]["image"] == "busybox"


async def test_unschedulable_pod_stays_pending_until_schedulable(
    api_client: client.ApiClient, namespace: str, kubelet: PlayKubelet
) -> None:
    key = f"{namespace}/nosched-workspace-0"
    kubelet.unschedulable(key, "0/1 nodes are available: 1 Insufficient memory.")
    main = {"name": "pulumi", "image": "busybox", "command": ["sleep", "1000"]}
    await ResourceClient(api_client, STATEFULSETS, namespace).create(
        simple_statefulset(namespace, "nosched", [], main)
    )

    def unschedulable(p: dict[str, Any]) -> bool:
        return condition(p, "PodScheduled").get("reason") == "Unschedulable"

    pod = await kubelet.wait_for(key, unschedulable, timeout=30, what="Unschedulable")
    assert condition(pod, "PodScheduled")["message"] == "0/1 nodes are available: 1 Insufficient memory."
    assert pod["status"]["phase"] == "Pending" and "podIP" not in pod["status"]
    kubelet.schedulable(key)
    pod = await kubelet.wait_ready(key, timeout=30)
    assert pod["spec"]["nodeName"] == "play-kubelet"


async def test_stop_kills_every_process_it_started(api_client: client.ApiClient, cluster: Any) -> None:
    ns = f"kubelet-stop-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace({"metadata": {"name": ns}})
    try:
        with tempfile.TemporaryDirectory(prefix="kubelet-") as root:
            async with PlayKubelet(
                api_client,
                [ns],
                root=Path(root),
                server=cluster.server,
                ca_file=cluster.ca_file,
                images=KNOWN_IMAGES,
                image_config=IMAGE_CONFIG,
            ) as k:
                # A container whose process has a child of its own: both must go.
                main = {
                    "name": "pulumi",
                    "image": "busybox",
                    "command": ["sh", "-c", "sleep 1000 & sleep 1000"],
                }
                await ResourceClient(api_client, STATEFULSETS, ns).create(
                    simple_statefulset(ns, "stop", [], main)
                )
                key = f"{ns}/stop-workspace-0"
                await k.wait_ready(key, timeout=60)
                pid = k.processes[key]["pulumi"]
                await asyncio.sleep(0.3)
                group = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pid]
                assert len(group) >= 2
            for _ in range(50):
                if not any(_alive(int(p)) for p in group):
                    break
                await asyncio.sleep(0.1)
            assert not any(_alive(int(p)) for p in group)
    finally:
        await core.delete_namespace(ns, _preload_content=False)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text()
    return dict(line.split("=", 1) for line in raw.split("\0") if "=" in line)


def _is_file(path: str) -> bool:
    return Path(path).is_file()


async def _allowed(api: client.ApiClient, attributes: dict[str, Any]) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    resp = await client.AuthorizationV1Api(api).create_self_subject_access_review(
        review, _preload_content=False
    )
    return bool((await resp.json())["status"].get("allowed"))


async def test_operator_fixture_runs_as_its_service_account_with_the_shipped_rbac(operator: Any) -> None:
    assert operator.running and operator.manager.is_ready()
    api = operator.api
    ns, sa = operator.namespace, operator.service_account
    token_request = {"resource": "serviceaccounts", "subresource": "token", "verb": "create", "namespace": ns}
    assert await _allowed(api, {**token_request, "name": sa})
    assert not await _allowed(api, {**token_request, "name": "default"})
    assert await _allowed(
        api, {"group": "apps", "resource": "statefulsets", "verb": "create", "namespace": "x"}
    )
    assert await _allowed(
        api, {"group": "auto.pulumi.com", "resource": "workspaces", "subresource": "rpc", "verb": "use"}
    )
    assert not await _allowed(api, {"resource": "pods", "verb": "delete", "namespace": "x"})
    # A restart is a new Manager, ready again.
    manager = await operator.restart()
    assert manager is operator.manager and manager.is_ready()

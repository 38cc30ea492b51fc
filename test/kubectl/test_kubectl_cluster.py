"""The plugin against the real kube-apiserver: ``main()`` with a kubeconfig, its output and exit codes.

Stacks, Updates and Workspaces are created with the statuses the operator writes (no operator
runs: nothing changes them). The engine output of ``logs`` comes from a pod's log, which the
apiserver fetches from the pod's node's kubelet: a small HTTPS server on loopback plays that
kubelet (``/containerLogs/...``) for a Node created for it.
"""

from __future__ import annotations

import asyncio
import io
import json
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from pko.kubectl.__main__ import main
from pko.machinery.resource import PODS, Resource, ResourceClient

from . import stacks as fx
from .plugin import Env, kubeconfig_for

pytestmark = [pytest.mark.cluster]

NODES = Resource("", "v1", "nodes", "Node", namespaced=False)


def _self_signed(directory: Path) -> ssl.SSLContext:
    cert, key = directory / "kubelet.crt", directory / "kubelet.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


@pytest.fixture(scope="module")
async def env(
    api_client: ApiClient, cluster: Any, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("kubectl-pko")
    e = Env(api_client, namespace, kubeconfig_for(Path(cluster.kubeconfig), tmp / "kubeconfig", namespace))
    await e.put("stacks", fx.stack("web", status=fx.ready_status("web-1")))
    await e.put("updates", fx.update("web-1", failed=None))
    await e.put("stacks", fx.stack("broken", status=fx.stalled_status()))
    await e.put("stacks", fx.stack("flaky", status=fx.retrying_status("flaky-2")))
    flaky_update = fx.update("flaky-2")
    flaky_update["spec"]["workspaceName"] = "flaky"
    await e.put("updates", flaky_update)
    await e.put("workspaces", fx.workspace("flaky"))
    gone = fx.retrying_status("gone-1")
    gone["lastUpdate"]["message"] = "error: recorded by the Stack"
    await e.put("stacks", fx.stack("gone", status=gone))

    # `logged`: its Update ran in pod logged-workspace-0 on a Node whose kubelet is served here.
    await e.put("stacks", fx.stack("logged", status=fx.retrying_status("logged-1")))
    logged = fx.update("logged-1")
    logged["spec"]["workspaceName"] = "logged"
    uid = (await e.put("updates", logged))["metadata"]["uid"]

    async def container_logs(request: web.Request) -> web.Response:
        key = (request.match_info["pod"], request.query.get("previous") == "true")
        if request.match_info["container"] != "pulumi" or key not in e.kubelet_logs:
            return web.Response(status=404, text="container not found")
        return web.Response(text=e.kubelet_logs[key])

    app = web.Application()
    app.router.add_get("/containerLogs/{ns}/{pod}/{container}", container_logs)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=_self_signed(tmp))
    await site.start()
    port = runner.addresses[0][1]
    node = f"kubectl-pko-{uuid.uuid4().hex[:8]}"
    nodes = ResourceClient(api_client, NODES)
    pods = ResourceClient(api_client, PODS, namespace)
    await nodes.create({"metadata": {"name": node}})
    await nodes.patch(
        node,
        {
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            }
        },
        subresource="status",
    )
    await pods.create(
        {
            "metadata": {"name": "logged-workspace-0"},
            "spec": {"nodeName": node, "containers": [{"name": "pulumi", "image": "pulumi/pulumi"}]},
        }
    )

    def entry(operation: str, line: str, msg: str = "pulumi") -> str:
        return json.dumps({"level": "info", "ts": "t", "msg": msg, "operation": operation, "line": line})

    e.kubelet_logs[("logged-workspace-0", False)] = "\n".join(
        [
            entry(uid, "", msg="operation started"),
            entry(uid, "Updating (dev):"),
            entry("another-uid", "not this one"),
            entry(uid, "error: program failed"),
        ]
    )
    try:
        yield e
    finally:
        await pods.delete("logged-workspace-0", grace_period_seconds=0)
        await nodes.delete(node)
        await runner.cleanup()


async def test_status_of_one_ready_stack(env: Env) -> None:
    result = await env.pko("status", "web")
    assert result.code == 0, result.err
    assert f"Namespace:       {env.ns}\n" in result.out  # the context's namespace
    assert "State:           Ready (ProcessingCompleted)\n" in result.out
    assert "  Changes:       create=2, same=1\n" in result.out  # from the Update web-1
    assert "Outputs:\n  password: [secret]\n  petName: calm-dog\n" in result.out  # stored sorted

    as_json = await env.pko("status", "web", "-o", "json")
    doc = json.loads(as_json.out)
    assert (as_json.code, doc["ready"], doc["state"]) == (0, True, "Ready")
    assert doc["lastUpdate"]["resourceChanges"] == {"create": 2, "same": 1}
    assert doc["outputs"]["password"] == "[secret]"


async def test_status_of_a_stack_not_ready_exits_1(env: Env) -> None:
    result = await env.pko("status", "flaky", "-o", "yaml")
    doc = yaml.safe_load(result.out)
    assert (result.code, doc["state"], doc["reason"]) == (1, "Reconciling", "RetryingAfterFailure")
    assert doc["lastFailure"]["reason"] == "ProgramError"


async def test_status_lists_the_namespace_and_all_namespaces(env: Env) -> None:
    result = await env.pko("status")
    assert result.code == 1  # broken, flaky, ... are not Ready
    lines = result.out.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STACK"]
    assert [line.split()[0] for line in lines[1:]] == ["broken", "flaky", "gone", "logged", "web"]
    assert lines[-1].split()[:4] == ["web", "dev", "Ready", "ProcessingCompleted"]

    everywhere = await env.pko("status", "-A")
    assert everywhere.code == 1 and everywhere.out.startswith("NAMESPACE")
    ours = [line.split()[1] for line in everywhere.out.splitlines() if line.startswith(env.ns + " ")]
    assert ours == ["broken", "flaky", "gone", "logged", "web"]

    listing = await env.pko("status", "-o", "json")
    assert [item["name"] for item in json.loads(listing.out)["items"]] == ours


async def test_why(env: Env) -> None:
    ready = await env.pko("why", "web")
    assert ready.code == 0 and ready.out.startswith("Ready: ProcessingCompleted:")
    stalled = await env.pko("why", "broken")
    assert stalled.code == 1
    assert stalled.out.startswith("Stalled: SourceUnavailable: branch 'main' not found. Fix: ")
    failing = await env.pko("why", "flaky", "-o", "json")
    doc = json.loads(failing.out)
    assert failing.code == 1 and doc["ready"] is False
    assert "The last up (Update flaky-2) failed: ProgramError: " in doc["why"]
    assert f"kubectl pko retry flaky -n {env.ns}" in doc["why"]


async def test_retry_sets_a_fresh_reconciliation_request(env: Env) -> None:
    first = await env.pko("retry", "broken")
    assert first.code == 0, first.err
    stack = await env.client("stacks").get("broken")
    value = stack["metadata"]["annotations"]["pulumi.com/reconciliation-request"]
    assert (
        first.out == f"stack.pulumi.com/broken retry requested (pulumi.com/reconciliation-request={value})\n"
    )
    assert "kubectl-pko" in {m["manager"] for m in stack["metadata"]["managedFields"]}
    second = await env.pko("retry", "broken")
    stack = await env.client("stacks").get("broken")
    assert second.code == 0
    assert stack["metadata"]["annotations"]["pulumi.com/reconciliation-request"] != value


@pytest.mark.parametrize("command", ["status", "why", "logs", "retry", "refresh", "cancel", "approve"])
async def test_a_missing_stack_exits_3(env: Env, command: str) -> None:
    result = await env.pko(command, "nope")
    assert result.code == 3
    assert result.err == f'error: stack "nope" not found in namespace "{env.ns}"\n'


async def test_logs_from_the_workspace_pod(env: Env) -> None:
    result = await env.pko("logs", "logged")
    assert (result.code, result.out, result.err) == (0, "Updating (dev):\nerror: program failed\n", "")

    # The container restarted: the operation's output is in the previous instance's log.
    env.kubelet_logs[("logged-workspace-0", True)] = env.kubelet_logs[("logged-workspace-0", False)]
    env.kubelet_logs[("logged-workspace-0", False)] = '{"msg": "serving"}'
    try:
        result = await env.pko("logs", "logged")
    finally:
        env.kubelet_logs[("logged-workspace-0", False)] = env.kubelet_logs.pop(("logged-workspace-0", True))
    assert (result.code, result.out) == (0, "Updating (dev):\nerror: program failed\n")


async def test_logs_fall_back_to_the_update_message(env: Env) -> None:
    result = await env.pko("logs", "flaky")  # its workspace pod does not exist
    assert result.code == 0
    assert result.out == fx.update()["status"]["message"] + "\n"
    assert result.err.startswith("The log of pod flaky-workspace-0 is unavailable (404: ")

    gone = await env.pko("logs", "gone")  # the Update itself is gone: what the Stack recorded
    assert (gone.code, gone.out) == (0, "error: recorded by the Stack\n")
    assert "Update gone-1 no longer exists" in gone.err

    assert (await env.pko("logs", "broken")).code == 3  # it never ran an Update
    assert (await env.pko("logs", "web", "--update", "web-0")).code == 3


async def test_contexts_namespaces_and_kubeconfig_env(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await env.pko("--context", "elsewhere", "status", "web")).code == 3
    assert (await env.pko("--context", "elsewhere", "status", "web", "-n", env.ns)).code == 0
    unknown = await env.pko("status", "web", "--context", "nope")
    assert unknown.code == 2 and "context 'nope' does not exist" in unknown.err

    monkeypatch.setenv("KUBECONFIG", f"{env.kubeconfig.parent / 'missing'}:{env.kubeconfig}")
    out, err = io.StringIO(), io.StringIO()
    assert await asyncio.to_thread(main, ["why", "web"], stdout=out, stderr=err) == 0, err.getvalue()


async def test_api_errors_exit_5(env: Env, tmp_path: Path) -> None:
    refused = await env.pko(
        "status", kubeconfig=kubeconfig_for(env.kubeconfig, tmp_path / "bad-token", env.ns, token="nope")
    )
    assert refused.code == 5 and "401" in refused.err
    down = await env.pko(
        "status",
        kubeconfig=kubeconfig_for(env.kubeconfig, tmp_path / "down", env.ns, server="https://127.0.0.1:1"),
    )
    assert down.code == 5 and down.err.startswith("error: cannot reach the apiserver")

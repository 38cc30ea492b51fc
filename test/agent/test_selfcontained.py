"""The self-contained agent executable (hack/build-agent.sh) serves without our Python or venv.

Building takes minutes, so the test is marked slow; set PKO_AGENT_BINARY to a prebuilt executable
to skip the build. The executable and its ``agent-lib/`` are copied to an empty directory and run
from there with a minimal environment: no venv on PATH, no PYTHONPATH/PYTHONHOME, only the stand-in
`pulumi` (a test double, never shipped) on PATH.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest
from pko.api.generated.pko.agent import v1 as pb

from pko.devtools.agents import AuthWorld, free_port, spawn, stop_process, wait_for_agent
from pko.devtools.standin import make_fake_pulumi

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _install(agent_binary: Path, tmp_path: Path) -> tuple[Path, Path, dict[str, str], Any]:
    """The executable and its folder copied as the pod's bootstrap copies them, a workspace, and a
    minimal environment: (executable, workspace, env, the stand-in pulumi)."""
    fake = make_fake_pulumi(tmp_path / "pulumi")
    share = tmp_path / "share"
    work = share / "workspace"
    work.mkdir(parents=True)
    (work / "Pulumi.yaml").write_text("name: frozen\nruntime: yaml\n")
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    exe = run_dir / "agent"
    shutil.copy2(agent_binary, exe)
    shutil.copytree(agent_binary.parent / "agent-lib", run_dir / "agent-lib")
    venv_bin = str(Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin")
    env = {
        "PATH": os.pathsep.join([str(fake.bin_dir), "/usr/bin", "/bin"]),
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "PULUMI_HOME": str(fake.home),
        "PULUMI_BACKEND_URL": fake.backend_url,
        "PULUMI_CONFIG_PASSPHRASE": fake.passphrase,
    }
    assert venv_bin not in env["PATH"]
    return exe, work, env, fake


async def _until_serving(
    proc: subprocess.Popen[bytes], port: int, token: str | None = None
) -> tuple[Any, Any]:
    """Health and PulumiVersion (with ``token``, if any) once the agent answers."""
    metadata = {"authorization": f"Bearer {token}"} if token else None

    async def ask(channel: Channel) -> tuple[Any, Any]:
        reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=5)
        version = await pb.AutomationServiceStub(channel, metadata=metadata).pulumi_version(timeout=30)
        return reply, version

    channel, answer = await wait_for_agent(proc, port, ask, within=180, interval=0.5)
    channel.close()
    return answer


async def test_the_executable_serves_health_without_the_venv(agent_binary: Path, tmp_path: Path) -> None:
    exe, work, env, _ = _install(agent_binary, tmp_path)
    port = free_port()
    proc = spawn(
        [str(exe), "--", "serve", "--workspace", str(work), "--skip-install", "--host", "127.0.0.1",
         "--port", str(port)],
        env,
        cwd=exe.parent,
    )  # fmt: skip
    try:
        reply, version = await _until_serving(proc, port)
        assert reply.status == reply.SERVING
        assert version.version
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 120) == 0
    finally:
        stop_process(proc)


@pytest.mark.cluster
async def test_the_executable_checks_tokens_with_the_apiserver(
    agent_binary: Path, tmp_path: Path, auth_world: AuthWorld, cluster: Any
) -> None:
    """--auth-mode kube in the bundle (no kubernetes_asyncio, no aiohttp in it): the agent's own
    client reads the kubeconfig, and TLS to the apiserver works with the bundled ssl."""
    exe, work, env, _ = _install(agent_binary, tmp_path)
    await auth_world.create_service_account("bundle-caller")
    await auth_world.grant("bundle-caller")
    token = await auth_world.mint("bundle-caller")
    port, metrics_port = free_port(), free_port()
    proc = spawn(
        [str(exe), "--", "serve", "--workspace", str(work), "--skip-install", "--host", "127.0.0.1",
         "--port", str(port), "--auth-mode", "kube", "--kube-audience", auth_world.audience,
         "--kube-workspace-namespace", auth_world.namespace, "--kube-workspace-name", auth_world.workspace,
         "--kubeconfig", str(cluster.kubeconfig), "--metrics-bind-address", f"127.0.0.1:{metrics_port}"],
        env,
        cwd=exe.parent,
    )  # fmt: skip
    try:
        _, version = await _until_serving(proc, port, token)
        assert version.version
        # Its /metrics from the bundle: HTTPS (a certificate made with the bundled cryptography), and a
        # scrape without a token refused by the reviewing authorizer.
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with pytest.raises(urllib.error.HTTPError) as unauthorized:
            await asyncio.to_thread(
                urllib.request.urlopen,
                f"https://127.0.0.1:{metrics_port}/metrics",
                timeout=30,
                context=context,
            )
        assert unauthorized.value.code == 401
        channel = Channel("127.0.0.1", port)
        try:
            with pytest.raises(GRPCError) as refused:
                await pb.AutomationServiceStub(channel).pulumi_version(timeout=30)
            assert refused.value.status == Status.UNAUTHENTICATED
            stranger = await auth_world.mint("bundle-caller", audience=f"other.{auth_world.namespace}")
            with pytest.raises(GRPCError) as refused:
                await pb.AutomationServiceStub(
                    channel, metadata={"authorization": f"Bearer {stranger}"}
                ).pulumi_version(timeout=30)
            assert refused.value.status == Status.UNAUTHENTICATED
        finally:
            channel.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 120) == 0
    finally:
        stop_process(proc)

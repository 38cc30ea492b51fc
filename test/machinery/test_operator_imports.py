"""The operator process never imports kubernetes-asyncio (issue 44): its generated client package
(859 modules, about 50 MB) is loaded by importing any part of it, and the operator needs none of it.
Nor ``cryptography`` (about 16 MB): the metrics server's self-signed certificate is made in a child
process (pko.machinery.servingcert). Nor, while no Stack comes from git, dulwich (about 3 MB): pko.git
and the branch lookups load it when they run.

Proved twice: the modules ``pko.__main__`` imports, in a fresh interpreter; and the operator run as
production runs it (``python -m pko``, here with ``-X importtime``, which logs every import to
stderr; its metrics served over HTTPS with a self-signed certificate, as by default) against the
suite's apiserver, through leading, syncing its caches and a clean shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from manager_helpers import http_get, lease_holder

from pko.devtools.localcluster import free_port
from pko.devtools.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def test_the_operators_modules_do_not_import_kubernetes_asyncio_or_cryptography() -> None:
    script = (
        "import sys, pko.__main__, pko.controllers, pko.machinery.kubeconfig\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'kubernetes_asyncio', 'cryptography'}))\n"
        "print(len(sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    imported, count = out.stdout.splitlines()
    assert imported == "[]"
    assert int(count) > 300  # the operator's whole module graph was loaded


def start(args: list[str], stderr: Path) -> subprocess.Popen[str]:
    with stderr.open("w") as err:
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, text=True)


@pytest.mark.cluster
async def test_the_operator_process_runs_without_kubernetes_asyncio_or_cryptography(
    cluster: Any, crds: list[str], api_client: Any, namespace: str, tmp_path: Path
) -> None:
    lease = f"imports-{uuid.uuid4().hex[:6]}"
    probe_port, metrics_port = free_port(), free_port()
    args = [
        sys.executable, "-X", "importtime", "-m", "pko",
        f"--kubeconfig={cluster.kubeconfig}",
        "--leader-elect",
        f"--leader-election-id={lease}",
        f"--leader-election-namespace={namespace}",
        f"--watch-namespace={namespace}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",  # HTTPS, a self-signed certificate
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--program-fs-addr=127.0.0.1:0",
        "--log-format=json",
    ]  # fmt: skip
    stderr = tmp_path / "stderr"
    proc = start(args, stderr)
    try:

        async def ready() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                return (await http_get(f"http://127.0.0.1:{probe_port}/readyz"))[0] == 200
            return False

        async def leading() -> bool:
            return bool(await lease_holder(api_client, namespace, lease))

        try:
            await wait_until("the process to take its Lease", leading, within=120, interval=0.5)
            await wait_until("the process to be ready (caches synced)", ready, within=60, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{stderr.read_text()[-4000:]}") from None
        served = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", metrics_port))
        assert served.startswith("-----BEGIN CERTIFICATE-----")  # its self-signed one, made apart
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            while proc.poll() is None:  # noqa: ASYNC110 - polls a subprocess
                await asyncio.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = stderr.read_text()
    assert proc.returncode == 0, log[-4000:]
    assert "| pko.machinery.kubeconfig" in log  # -X importtime did log the imports
    imported = [line for line in log.splitlines() if "kubernetes_asyncio" in line or "cryptography" in line]
    assert imported == [], imported[:5]
    # Nor dulwich (about 3 MB) with no Stack from git: pko.git loads it for a lookup or a fetch only.
    git = [line for line in log.splitlines() if line.rpartition("|")[2].strip().split(".")[0] == "dulwich"]
    assert git == [], git[:5]

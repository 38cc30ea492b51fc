"""The manager's leader election against a real kube-apiserver: only the leader reconciles, a stop or a
lost Lease ends reconciles as it should; and the ``pko`` process itself (SIGTERM, a lost Lease)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from manager_helpers import (
    RecordingReconciler,
    StartManager,
    create_configmaps,
    http_get,
    lease_config,
    lease_holder,
    options,
    ours,
    steal_lease,
    url,
)

from pko.devtools.localcluster import free_port
from pko.devtools.waiting import wait_until
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.manager import LeaderElectionLost, Manager
from pko.machinery.resource import CONFIGMAPS

REPO = Path(__file__).resolve().parents[2]


# ----- leader election ---------------------------------------------------------------------------


@pytest.mark.cluster
async def test_only_the_leader_reconciles_and_a_stopped_leader_hands_over_at_once(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    lease = f"handover-{uuid.uuid4().hex[:6]}"
    recs = {"first": RecordingReconciler(), "second": RecordingReconciler()}
    managers: dict[str, Manager] = {}
    tasks: dict[str, asyncio.Task[None]] = {}
    await create_configmaps(api_client, namespace, ["x"])
    for who in ("first", "second"):
        cfg = LeaderElectionConfig(
            lease, namespace, who, lease_duration=60.0, renew_deadline=4.0, retry_period=1.0
        )
        managers[who] = Manager(api_client, options(namespace, leader_election=cfg))
        managers[who].controller("configmap-controller", recs[who]).for_(CONFIGMAPS)
        tasks[who] = await start_manager(managers[who])
        if who == "first":
            await wait_until(
                "the first leader to reconcile", lambda: ours(recs["first"].finished, namespace, ["x"])
            )

    second = managers["second"]
    # The follower's caches sync (it is ready to take over) but it runs no controller.
    await wait_until("the follower's caches to sync", second.is_ready)
    await asyncio.sleep(2.5)  # several retry periods: it keeps campaigning without success
    assert not second.is_leader() and second.controllers == [] and recs["second"].keys == []
    assert await lease_holder(api_client, namespace, lease) == "first"

    # A clean stop releases the Lease: the follower takes over long before the 60 s lease expires.
    managers["first"].stop()
    await asyncio.wait_for(tasks["first"], 30)
    await wait_until(
        "the successor to reconcile", lambda: ours(recs["second"].finished, namespace, ["x"]), within=20
    )
    assert second.is_leader()
    assert await lease_holder(api_client, namespace, lease) == "second"


@pytest.mark.cluster
async def test_stop_lets_in_flight_reconciles_finish_then_releases_the_lease(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    lease = f"graceful-{uuid.uuid4().hex[:6]}"
    gate = asyncio.Event()
    reconciler = RecordingReconciler(gate)
    manager = Manager(
        api_client,
        options(namespace, leader_election=lease_config(namespace, lease, "me"), shutdown_grace_period=60),
    )
    manager.controller("configmap-controller", reconciler, workers=2).for_(CONFIGMAPS)
    await create_configmaps(api_client, namespace, ["slow"])
    task = await start_manager(manager)
    await wait_until("the reconcile to begin", lambda: f"{namespace}/slow" in reconciler.keys)

    manager.stop()
    await asyncio.sleep(1.0)
    assert not task.done(), "stop must wait for the in-flight reconcile"
    assert (await http_get(url(manager, "probes", "/readyz")))[0] == 500  # no longer ready
    assert await lease_holder(api_client, namespace, lease) == "me"  # still held while work runs
    gate.set()
    await asyncio.wait_for(task, 30)
    assert f"{namespace}/slow" in reconciler.finished and reconciler.cancelled == []
    assert await lease_holder(api_client, namespace, lease) == ""


@pytest.mark.cluster
async def test_reconciles_outliving_the_grace_period_are_cancelled(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    reconciler = RecordingReconciler(asyncio.Event())  # never opened
    manager = Manager(api_client, options(namespace, shutdown_grace_period=0.5))
    manager.controller("configmap-controller", reconciler).for_(CONFIGMAPS)
    await create_configmaps(api_client, namespace, ["stuck"])
    task = await start_manager(manager)
    await wait_until("the reconcile to begin", lambda: f"{namespace}/stuck" in reconciler.keys)
    manager.stop()
    await asyncio.wait_for(task, 30)
    assert reconciler.cancelled == [f"{namespace}/stuck"]


@pytest.mark.cluster
async def test_losing_the_lease_cancels_reconciles_and_run_raises(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    lease = f"lost-{uuid.uuid4().hex[:6]}"
    reconciler = RecordingReconciler(asyncio.Event())  # holds its reconcile until cancelled
    manager = Manager(
        api_client,
        options(namespace, leader_election=lease_config(namespace, lease, "me"), shutdown_grace_period=60),
    )
    manager.controller("configmap-controller", reconciler).for_(CONFIGMAPS)
    await create_configmaps(api_client, namespace, ["busy"])
    task = await start_manager(manager)
    await wait_until("the reconcile to begin", lambda: f"{namespace}/busy" in reconciler.keys)

    await steal_lease(api_client, namespace, lease)
    with pytest.raises(LeaderElectionLost):
        await asyncio.wait_for(task, 30)
    # Cancelled at once, not after the 60 s grace period: someone else holds the Lease now.
    assert reconciler.cancelled == [f"{namespace}/busy"]
    assert not manager.is_leader() and manager.controllers == []
    assert await lease_holder(api_client, namespace, lease) == "intruder"  # not "released" by the loser


# ----- the process -------------------------------------------------------------------------------


class PkoProcess:
    def __init__(self, cluster: Any, namespace: str, lease: str, *extra: str) -> None:
        self.probe_port, self.metrics_port = free_port(), free_port()
        args = [
            sys.executable, "-m", "pko",
            f"--kubeconfig={cluster.kubeconfig}",
            "--leader-elect",
            f"--leader-election-id={lease}",
            f"--leader-election-namespace={namespace}",
            "--leader-election-lease-duration=6s",
            "--leader-election-renew-deadline=4s",
            "--leader-election-retry-period=1s",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            "--metrics-secure=false",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
            "--program-fs-addr=127.0.0.1:0",
            "--log-format=json",
            *extra,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    async def wait_exit(self, timeout: float) -> int:  # noqa: ASYNC109 - polls a subprocess
        async with asyncio.timeout(timeout):
            while self.proc.poll() is None:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        return self.proc.returncode

    def output(self) -> str:
        out, _ = self.proc.communicate(timeout=10)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def pko_processes() -> Any:
    procs: list[PkoProcess] = []
    yield procs
    for p in procs:
        p.kill()


@pytest.mark.cluster
async def test_sigterm_stops_the_process_within_the_grace_period_and_releases_its_lease(
    cluster: Any,
    crds: list[str],
    api_client: client.ApiClient,
    namespace: str,
    pko_processes: list[PkoProcess],
) -> None:
    lease = f"proc-{uuid.uuid4().hex[:6]}"
    pko = PkoProcess(cluster, namespace, lease, "--shutdown-grace-period=20s")
    pko_processes.append(pko)

    async def leading() -> bool:
        return bool(await lease_holder(api_client, namespace, lease))

    async def ready() -> bool:
        with contextlib.suppress(aiohttp.ClientError):
            return (await http_get(f"http://127.0.0.1:{pko.probe_port}/readyz"))[0] == 200
        return False

    try:
        await wait_until("the process to take its Lease", leading, within=120, interval=0.5)
        await wait_until("the process to be ready", ready, within=60, interval=0.5)
    except AssertionError as exc:
        pko.kill()
        raise AssertionError(f"{exc}\n{pko.output()}") from None
    status, text = await http_get(f"http://127.0.0.1:{pko.metrics_port}/metrics")
    assert status == 200 and f'leader_election_master_status{{name="{lease}"}} 1.0' in text

    pko.proc.send_signal(signal.SIGTERM)
    code = await pko.wait_exit(timeout=20 + 30)  # the grace period, plus slack for a loaded machine
    out = pko.output()
    assert code == 0, out
    assert await lease_holder(api_client, namespace, lease) == ""
    assert '"msg": "signal received; shutting down"' in out and '"msg": "released lease"' in out


@pytest.mark.cluster
async def test_a_process_that_loses_its_lease_campaigns_again_without_exiting(
    cluster: Any,
    crds: list[str],
    api_client: client.ApiClient,
    namespace: str,
    pko_processes: list[PkoProcess],
) -> None:
    """No exit, so no crash-loop backoff: once the Lease is free the same process leads again."""
    lease = f"proc-{uuid.uuid4().hex[:6]}"
    pko = PkoProcess(cluster, namespace, lease)
    pko_processes.append(pko)

    async def holder() -> str:
        return await lease_holder(api_client, namespace, lease) or ""

    async def leading() -> bool:
        return (await holder()) not in ("", "intruder")

    async def master_status() -> str:
        _, text = await http_get(f"http://127.0.0.1:{pko.metrics_port}/metrics")
        return next(
            (
                line.rsplit(" ", 1)[1]
                for line in text.splitlines()
                if line.startswith(f'leader_election_master_status{{name="{lease}"}}')
            ),
            "",
        )

    await wait_until("the process to take its Lease", leading, within=120, interval=0.5)
    first = await holder()
    await steal_lease(api_client, namespace, lease, seconds=8)
    await wait_until(
        "the process to stop leading", lambda: _is(master_status, "0.0"), within=60, interval=0.5
    )
    assert pko.proc.poll() is None, pko.output()
    await wait_until("the process to lead again", leading, within=120, interval=0.5)
    assert pko.proc.poll() is None, pko.output()
    assert await holder() != first  # a new term: a fresh identity, as a restarted process would have
    await wait_until("the new manager's metrics", lambda: _is(master_status, "1.0"), within=60, interval=0.5)

    pko.proc.send_signal(signal.SIGTERM)
    code = await pko.wait_exit(timeout=60)
    out = pko.output()
    assert code == 0, out
    assert "leader election lost; campaigning again" in out
    assert await holder() == ""


async def _is(probe: Callable[[], Awaitable[str]], value: str) -> bool:
    with contextlib.suppress(aiohttp.ClientError):
        return await probe() == value
    return False

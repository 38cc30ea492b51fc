"""The manager against a real kube-apiserver: probes, metrics, watches wiring, leader election,
graceful shutdown; and the ``pko`` process itself (SIGTERM, a lost Lease)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from pko.__main__ import parse_duration, parse_settings
from pko.controllers.options import ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.devtools.localcluster import free_port
from pko.devtools.waiting import wait_until
from pko.machinery.controller import Result
from pko.machinery.leaderelection import LeaderElectionConfig, micro_time
from pko.machinery.manager import (
    EVENT_COMPONENT,
    ControllerBuilder,
    LeaderElectionLost,
    Manager,
    ManagerOptions,
    generation_changed,
)
from pko.machinery.resource import CONFIGMAPS, EVENTS, LEASES, SECRETS, Resource, ResourceClient
from pko.machinery.serving import parse_bind_address
from pko.machinery.store import index_by_field

REPO = Path(__file__).resolve().parents[2]
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
# Short but valid (lease > renew > 1.2 * retry): handovers in seconds, not minutes.
LEASE_S, RENEW_S, RETRY_S = 6.0, 4.0, 1.0
LOOPBACK = "127.0.0.1:0"


# ----- pure --------------------------------------------------------------------------------------


def test_go_durations_and_plain_seconds_parse() -> None:
    assert parse_duration("60s") == 60.0
    assert parse_duration("1m30s") == 90.0
    assert parse_duration("1h") == 3600.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("45") == 45.0
    for bad in ("", "ten", "5x", "-1s", "1m-"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_the_deployment_flags_parse_to_the_go_operator_defaults() -> None:
    argv = [
        "--leader-elect",
        "--metrics-bind-address=:8383",
        "--health-probe-bind-address=:8081",
        "--program-fs-addr=:9090",
        "--program-fs-adv-addr=pulumi-kubernetes-operator.ns:80",
        "--log-level=info",
        "--log-format=json",
    ]
    s = parse_settings(argv, env={"POD_NAMESPACE": "ops"})
    assert s.leader_elect and s.leader_election_id == "operator.pulumi.com"
    assert s.leader_election_namespace == "ops"
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (60.0, 45.0, 10.0)
    assert s.kube_api_timeout == 30.0 and s.shutdown_grace_period == 30.0
    assert dict(s.max_concurrent_reconciles) == {
        "stack-controller": 25,
        "workspace-controller": 25,
        "update-controller": 25,
        "program-controller": 25,
    }
    assert (s.log_level, s.log_format) == ("info", "json")
    assert s.program_fs_adv_addr == "pulumi-kubernetes-operator.ns:80"
    opts = s.manager_options("me")
    assert opts.leader_election is not None and opts.leader_election.identity == "me"
    assert (opts.metrics_secure, opts.metrics_cert_dir) == (True, None)  # HTTPS and a token, by default
    assert parse_settings([], env={}).leader_election_namespace == "pulumi-kubernetes-operator"
    assert not parse_settings([], env={}).leader_elect


def test_workspace_and_identity_settings_reach_the_controller_options() -> None:
    defaults = parse_settings([], env={})
    assert defaults.controller_options() == ControllerOptions(workspace_address_mode="dns")
    assert defaults.manager_options("me").namespace is None
    env = {
        "POD_NAMESPACE": "ops",
        "POD_SA_NAME": "pko",
        "AGENT_IMAGE": "agent:1",
        "AGENT_IMAGE_PULL_POLICY": "Always",
        "WORKSPACE_IMAGE": "pulumi/pulumi:3",
        "WORKSPACE_LOCALHOST": "localhost:50051",
        "WATCH_NAMESPACE": "team",
        "ENGINE_EVENT_LOG_LEVEL": "info",
        "FLUX_MAX_UNTAR_SIZE_BYTES": "1048576",
        "AGENT_UNREACHABLE_TIMEOUT": "1m30s",
        "STACK_MAX_UPDATE_FAILURES": "0",
        "STACK_TRANSIENT_RETRY_BASE": "2s",
        "STACK_TRANSIENT_RETRY_FACTOR": "1.5",
        "STACK_TRANSIENT_RETRY_CAP": "1m",
        "STACK_TRANSIENT_RETRY_JITTER": "0",
        "STACK_DETERMINISTIC_RETRY_BASE": "1m",
        "STACK_DETERMINISTIC_RETRY_FACTOR": "2",
        "STACK_MAX_RETRY_BACKOFF": "1h",
    }
    s = parse_settings(["--program-fs-adv-addr=pko.ops:80"], env=env)
    assert s.controller_options() == ControllerOptions(
        operator_namespace="ops",
        operator_service_account="pko",
        agent_image="agent:1",
        agent_image_pull_policy="Always",
        default_workspace_image="pulumi/pulumi:3",
        workspace_address_mode="static",  # implied by WORKSPACE_LOCALHOST
        workspace_static_address="localhost:50051",
        engine_event_log_level="info",
        program_fs_addr=":9090",
        program_fs_adv_addr="pko.ops:80",
        flux_max_untar_size_bytes=1048576,
        watch_namespace="team",
        agent_unreachable_timeout=90.0,
        retry=RetrySettings(
            max_update_failures=0,
            deterministic_base=60.0,
            deterministic_factor=2.0,
            transient_base=2.0,
            transient_factor=1.5,
            transient_cap=60.0,
            jitter=0.0,
            max_backoff=3600.0,
        ),
    )
    assert s.manager_options("me").namespace == "team"
    explicit = parse_settings(["--workspace-address-mode=pod-ip", "--watch-namespace=x"], env=env)
    assert explicit.workspace_address_mode == "pod-ip" and explicit.watch_namespace == "x"


def test_settings_defaults_agree_with_the_controller_options() -> None:
    s = parse_settings([], env={})
    d = ControllerOptions()
    assert (s.operator_namespace, s.operator_service_account, s.agent_image) == (
        d.operator_namespace,
        d.operator_service_account,
        d.agent_image,
    )
    assert (s.agent_image_pull_policy, s.engine_event_log_level) == (
        d.agent_image_pull_policy,
        d.engine_event_log_level,
    )


def test_the_command_lines_defaults_are_the_managers_and_the_leases() -> None:
    opts = parse_settings(["--leader-elect"], env={}).manager_options("me")
    d = ManagerOptions()
    assert (
        opts.metrics_bind_address,
        opts.health_probe_bind_address,
        opts.kube_api_timeout,
        opts.shutdown_grace_period,
    ) == (d.metrics_bind_address, d.health_probe_bind_address, d.kube_api_timeout, d.shutdown_grace_period)
    le, dle = opts.leader_election, LeaderElectionConfig("lease", "ns", "me")
    assert le is not None and le.lease_name == "operator.pulumi.com"
    assert (le.lease_duration, le.renew_deadline, le.retry_period) == (
        dle.lease_duration,
        dle.renew_deadline,
        dle.retry_period,
    )


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    env = {
        "LEADER_ELECTION_LEASE_DURATION": "90s",
        "LEADER_ELECTION_RENEW_DEADLINE": "1m",
        "MAX_CONCURRENT_RECONCILES": "7",
        "MAX_CONCURRENT_RECONCILES_UPDATE": "3",
        "LEADER_ELECT": "true",
        "LOG_FORMAT": "console",
    }
    s = parse_settings(["--leader-election-lease-duration=2m", "--leader-elect=false"], env=env)
    assert (s.lease_duration, s.renew_deadline) == (120.0, 60.0)
    assert not s.leader_elect and s.log_format == "console"
    assert s.max_concurrent_reconciles["stack-controller"] == 7
    assert s.max_concurrent_reconciles["update-controller"] == 3


def test_retry_flags_default_to_the_built_in_backoff_and_win_over_the_environment() -> None:
    assert parse_settings([], env={}).controller_options().retry == RetrySettings()
    argv = [
        "--stack-transient-retry-base=1s",
        "--stack-transient-retry-factor=3",
        "--stack-transient-retry-jitter=0.5",
        "--stack-deterministic-retry-base=90",
        "--stack-deterministic-retry-factor=1",
    ]
    env = {"STACK_TRANSIENT_RETRY_BASE": "30s", "STACK_DETERMINISTIC_RETRY_FACTOR": "4"}
    assert parse_settings(argv, env=env).controller_options().retry == RetrySettings(
        transient_base=1.0,
        transient_factor=3.0,
        jitter=0.5,
        deterministic_base=90.0,
        deterministic_factor=1.0,
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("transient-retry-factor", "0.5", "must be at least 1 (1: a fixed wait), got 0.5"),
        ("deterministic-retry-factor", "x", "not a number: 'x'"),
        ("deterministic-retry-factor", "nan", "not a finite number: 'nan'"),
        ("deterministic-retry-base", "-5", "duration '-5' is negative"),
        ("transient-retry-base", "0", "must be at least 1s, got '0'"),
        ("transient-retry-cap", "500ms", "must be at least 1s, got '500ms'"),
        ("max-retry-backoff", "inf", "must be at least 1s, got 'inf'"),
        ("transient-retry-jitter", "1", "must be at least 0 and less than 1 (0.2: +-20%), got 1"),
        ("transient-retry-jitter", "-0.1", "must be at least 0 and less than 1 (0.2: +-20%), got -0.1"),
    ],
)
@pytest.mark.parametrize("source", ["flag", "environment"])
def test_nonsense_retry_settings_exit_with_a_usage_error_naming_the_flag(
    flag: str, value: str, message: str, source: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, env = (
        ([f"--stack-{flag}={value}"], {})
        if source == "flag"
        else ([], {f"STACK_{flag.upper().replace('-', '_')}": value})
    )
    with pytest.raises(SystemExit) as exc:
        parse_settings(argv, env=env)
    assert exc.value.code == 2
    assert f"argument --stack-{flag}: {message}" in capsys.readouterr().err


def test_invalid_flags_and_environment_exit_with_usage_errors() -> None:
    for argv, env in (
        (["--kube-api-timeout=soon"], {}),
        (["--max-concurrent-reconciles-stack=0"], {}),
        ([], {"SHUTDOWN_GRACE_PERIOD": "forever"}),
        # renew deadline not shorter than the lease duration
        (["--leader-elect", "--leader-election-renew-deadline=90s"], {}),
        ([], {"WORKSPACE_ADDRESS_MODE": "carrier-pigeon"}),  # choices hold for the environment too
        ([], {"LOG_LEVEL": "loud"}),
        (["--workspace-address-mode=static"], {}),  # static needs an address
        ([], {"FLUX_MAX_UNTAR_SIZE_BYTES": "-1"}),
    ):
        with pytest.raises(SystemExit) as exc:
            parse_settings(argv, env=env)
        assert exc.value.code == 2


def test_bind_addresses_follow_go_syntax() -> None:
    assert parse_bind_address(":8383") == ("", 8383)
    assert parse_bind_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_bind_address("[::1]:9") == ("::1", 9)
    assert parse_bind_address("0") is None and parse_bind_address("") is None
    for bad in ("8080", "host:port", ":70000"):
        with pytest.raises(ValueError):
            parse_bind_address(bad)


def test_generation_changed_passes_adds_deletes_and_spec_changes_only() -> None:
    gen1: dict[str, Any] = {"metadata": {"generation": 1}}
    gen2: dict[str, Any] = {"metadata": {"generation": 2}}
    assert generation_changed(None, gen1) and generation_changed(gen1, None)
    assert generation_changed(gen1, gen2)
    assert not generation_changed(gen1, {"metadata": {"generation": 1}, "status": {"x": 1}})


# ----- helpers -----------------------------------------------------------------------------------


class RecordingReconciler:
    """Records the keys it reconciles; ``gate`` (when set) holds every reconcile until opened.

    Ignores the ``kube-root-ca.crt`` ConfigMap the controller-manager adds to every namespace.
    """

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.keys: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.gate = gate

    async def reconcile(self, key: str) -> Result:
        if key.endswith("/kube-root-ca.crt"):
            return Result.done()
        self.keys.append(key)
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(key)
            raise
        self.finished.append(key)
        return Result.done()


StartManager = Callable[[Manager], Awaitable["asyncio.Task[None]"]]


@pytest.fixture
async def start_manager() -> AsyncIterator[StartManager]:
    """``await start_manager(m)``: run ``m`` in a task until its servers listen; stopped afterwards."""
    running: list[tuple[Manager, asyncio.Task[None]]] = []

    async def start(manager: Manager) -> asyncio.Task[None]:
        task = asyncio.create_task(manager.run())
        running.append((manager, task))
        serving = asyncio.create_task(manager.wait_serving())
        await asyncio.wait({task, serving}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raise what failed
        assert serving.done(), "manager did not start serving"
        return task

    yield start
    for manager, task in running:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)


def options(namespace: str, **kw: Any) -> ManagerOptions:
    return ManagerOptions(
        metrics_bind_address=LOOPBACK,
        metrics_secure=False,  # plain HTTP: test_metrics_auth.py scrapes the secure server
        health_probe_bind_address=LOOPBACK,
        namespace=namespace,
        shutdown_grace_period=kw.pop("shutdown_grace_period", 10.0),
        **kw,
    )


def lease_config(namespace: str, name: str, identity: str) -> LeaderElectionConfig:
    return LeaderElectionConfig(
        name, namespace, identity, lease_duration=LEASE_S, renew_deadline=RENEW_S, retry_period=RETRY_S
    )


def url(manager: Manager, server: str, path: str) -> str:
    address = manager.address(server)
    assert address is not None
    return f"http://127.0.0.1:{address[1]}{path}"


async def http_get(target: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(target) as resp:
        return resp.status, await resp.text()


async def create_configmaps(api: client.ApiClient, namespace: str, names: list[str]) -> None:
    writer = ResourceClient(api, CONFIGMAPS, namespace)
    for name in names:
        await writer.create({"metadata": {"name": name}, "data": {"k": "v"}})


async def lease_holder(api: client.ApiClient, namespace: str, name: str) -> str | None:
    """The Lease's holder ("" when released), or None if there is no Lease."""
    try:
        lease = await ResourceClient(api, LEASES, namespace).get(name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def steal_lease(api: client.ApiClient, namespace: str, name: str, seconds: int = 600) -> None:
    leases = ResourceClient(api, LEASES, namespace)
    lease = await leases.get(name)
    now = micro_time(datetime.now(UTC))
    lease["spec"].update(
        holderIdentity="intruder", renewTime=now, acquireTime=now, leaseDurationSeconds=seconds
    )
    await leases.replace(lease)


def ours(keys: list[str], namespace: str, names: list[str]) -> bool:
    return all(f"{namespace}/{n}" in keys for n in names)


# ----- probes and metrics ------------------------------------------------------------------------


@pytest.mark.cluster
async def test_readyz_fails_until_every_cache_has_synced(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    # A custom resource whose CRD does not exist yet: its informer cannot list, so it cannot sync.
    group = f"m{uuid.uuid4().hex[:8]}.pko.test"
    gizmos = Resource(group, "v1", "gizmos", "Gizmo")
    manager = Manager(api_client, options(namespace))
    manager.controller("gizmo-controller", RecordingReconciler()).for_(gizmos)
    await start_manager(manager)

    assert await http_get(url(manager, "probes", "/healthz")) == (200, "ok")
    await asyncio.sleep(1.0)  # the informer has tried (and failed) to list by now
    status, body = await http_get(url(manager, "probes", "/readyz"))
    assert status == 500
    assert f"[-]informer-sync failed: not synced: gizmos.{group}" in body

    crds = ResourceClient(api_client, CRDS)
    await crds.create(
        {
            "metadata": {"name": f"gizmos.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
    )
    try:

        async def ready() -> bool:
            return (await http_get(url(manager, "probes", "/readyz")))[0] == 200

        await wait_until("readyz to pass once the CRD exists", ready, within=120, interval=0.5)
        assert manager.is_ready()
        status, body = await http_get(url(manager, "probes", "/readyz?verbose"))
        assert (status, body) == (200, "[+]informer-sync ok\ncheck passed\n")
    finally:
        await crds.delete(f"gizmos.{group}")


@pytest.mark.cluster
async def test_metrics_serve_controller_runtime_series_labelled_by_controller(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    reconciler = RecordingReconciler()
    lease = f"metrics-{uuid.uuid4().hex[:6]}"
    manager = Manager(
        api_client, options(namespace, leader_election=lease_config(namespace, lease, "only-candidate"))
    )
    manager.controller("configmap-controller", reconciler, workers=3).for_(CONFIGMAPS)
    await start_manager(manager)
    names = ["a", "b", "c"]
    await create_configmaps(api_client, namespace, names)
    await wait_until("the ConfigMaps reconciled", lambda: ours(reconciler.finished, namespace, names))

    status, text = await http_get(url(manager, "metrics", "/metrics"))
    assert status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(metric: str, /, **labels: str) -> float:
        return samples[(metric, tuple(sorted(labels.items())))]

    ctrl = {"controller": "configmap-controller"}
    queue = {"controller": "configmap-controller", "name": "configmap-controller"}
    assert value("controller_runtime_reconcile_total", result="success", **ctrl) >= len(names)
    assert value("controller_runtime_reconcile_total", result="error", **ctrl) == 0
    assert value("controller_runtime_reconcile_errors_total", **ctrl) == 0
    assert value("controller_runtime_reconcile_time_seconds_count", **ctrl) >= len(names)
    assert value("controller_runtime_max_concurrent_reconciles", **ctrl) == 3
    assert value("controller_runtime_active_workers", **ctrl) == 0
    assert value("workqueue_adds_total", **queue) >= len(names)
    assert value("workqueue_depth", **queue) == 0
    assert value("workqueue_retries_total", **queue) == 0
    assert value("workqueue_queue_duration_seconds_count", **queue) >= len(names)
    assert value("workqueue_work_duration_seconds_count", **queue) >= len(names)
    assert value("workqueue_unfinished_work_seconds", **queue) == 0
    assert value("workqueue_longest_running_processor_seconds", **queue) == 0
    assert value("leader_election_master_status", name=lease) == 1
    assert value("pko_reflector_lists_total", resource="configmaps") >= 1
    assert any(name == "process_resident_memory_bytes" for name, _ in samples)


def blocking_get(target: str) -> tuple[int, str, float]:
    """A GET from a plain thread (the test's event loop may be stuck): status, body, seconds."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(target, timeout=10) as resp:
            status, body = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read().decode()
    return status, body, time.monotonic() - started


async def get_while_the_loop_sleeps(
    seconds: float, targets: list[str], after: float
) -> list[tuple[int, str, float]]:
    """GET ``targets`` from a thread ``after`` s into a ``time.sleep(seconds)`` on the event loop."""
    answers: list[tuple[int, str, float]] = []

    def probe() -> None:
        time.sleep(after)
        answers.extend(blocking_get(t) for t in targets)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(seconds)  # noqa: ASYNC251 - stalling the (manager's) event loop is the point
    await asyncio.to_thread(thread.join)  # (answers served by the loop come only now)
    return answers


@pytest.mark.cluster
async def test_probes_and_metrics_answer_while_the_event_loop_is_stuck(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    manager = Manager(api_client, options(namespace, liveness_stall_threshold=2.5))
    manager.controller("configmap-controller", RecordingReconciler()).for_(CONFIGMAPS)
    await start_manager(manager)
    await wait_until("caches to sync", manager.is_ready)
    targets = [url(manager, "probes", "/healthz"), url(manager, "probes", "/readyz")]
    targets.append(url(manager, "metrics", "/metrics"))

    # Stuck for less than the threshold: every answer within the kubelet's 1 s, and healthy.
    answers = await get_while_the_loop_sleeps(2.0, targets, after=0.2)
    assert max(a[2] for a in answers) < 1.0
    assert [a[:2] for a in answers[:2]] == [(200, "ok"), (200, "ok")]
    assert answers[2][0] == 200 and "pko_event_loop_heartbeat_age_seconds" in answers[2][1]

    # Stuck past the threshold: liveness fails (readiness is about caches and still passes).
    answers = await get_while_the_loop_sleeps(4.5, targets[:2], after=3.5)
    assert max(a[2] for a in answers) < 1.0
    assert answers[0][0] == 500 and "[-]ping failed: event loop stalled" in answers[0][1]
    assert answers[1][:2] == (200, "ok")
    await asyncio.sleep(0.5)
    assert (await http_get(url(manager, "probes", "/healthz"))) == (200, "ok")


# ----- wiring ------------------------------------------------------------------------------------


@pytest.mark.cluster
async def test_owned_objects_and_index_fan_out_enqueue_primary_keys(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    """Primary: ConfigMaps. Owned: Secrets controlled by a ConfigMap. Fan-out: a Secret named X
    enqueues every ConfigMap whose ``data.source`` is X."""
    reconciler = RecordingReconciler()
    manager = Manager(api_client, options(namespace))
    by_source = index_by_field("data.source", namespaced=True)
    (
        manager.controller("configmap-controller", reconciler, workers=2)
        .for_(CONFIGMAPS)
        .owns(SECRETS)
        .watches_by_index(SECRETS, "source", by_source)
    )
    cms = ResourceClient(api_client, CONFIGMAPS, namespace)
    owner = await cms.create({"metadata": {"name": "owner"}})
    await cms.create({"metadata": {"name": "user-1"}, "data": {"source": "src"}})
    await cms.create({"metadata": {"name": "user-2"}, "data": {"source": "src"}})
    await cms.create({"metadata": {"name": "bystander"}, "data": {"source": "other"}})
    await start_manager(manager)
    everything = ["owner", "user-1", "user-2", "bystander"]
    await wait_until("the initial reconciles", lambda: ours(reconciler.finished, namespace, everything))

    secrets = ResourceClient(api_client, SECRETS, namespace)
    reconciler.keys.clear()
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
           "controller": True}  # fmt: skip
    await secrets.create({"metadata": {"name": "owned", "ownerReferences": [ref]}})
    await wait_until("the owner enqueued by its Secret", lambda: f"{namespace}/owner" in reconciler.keys)

    reconciler.keys.clear()
    await secrets.create({"metadata": {"name": "src"}})
    await wait_until("fan-out to users", lambda: ours(reconciler.keys, namespace, ["user-1", "user-2"]))
    await asyncio.sleep(0.5)
    assert f"{namespace}/bystander" not in reconciler.keys
    assert f"{namespace}/src" not in reconciler.keys  # a Secret's own key is not a ConfigMap key
    informer = manager.informer(SECRETS)
    owner_index, _ = ControllerBuilder.owner_index(CONFIGMAPS)
    assert informer.indexer.index_keys(owner_index, f"{namespace}/owner") == [f"{namespace}/owned"]


@pytest.mark.cluster
async def test_without_leader_election_controllers_run_and_no_lease_is_written(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    reconciler = RecordingReconciler()
    manager = Manager(api_client, options(namespace))
    manager.controller("configmap-controller", reconciler).for_(CONFIGMAPS)
    await create_configmaps(api_client, namespace, ["x"])
    await start_manager(manager)
    await wait_until("x reconciled", lambda: ours(reconciler.finished, namespace, ["x"]))
    assert manager.is_leader() and [c.name for c in manager.controllers] == ["configmap-controller"]
    page = await ResourceClient(api_client, LEASES, namespace).list()
    assert page.items == []


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


# ----- runnables, scoped and optional informers, events ------------------------------------------


def gizmo_crd(group: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"gizmos.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


class RunnableLog:
    """Runnables that record when they start and when they are cancelled."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []

    def runnable(self, name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            self.started.append(name)
            try:
                await asyncio.Future()
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise

        return run


@pytest.mark.cluster
async def test_leader_only_runnables_run_while_leading_and_others_everywhere(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    lease = f"runnables-{uuid.uuid4().hex[:6]}"
    log = RunnableLog()
    managers: dict[str, Manager] = {}
    tasks: dict[str, asyncio.Task[None]] = {}
    for who in ("first", "second"):
        cfg = LeaderElectionConfig(
            lease, namespace, who, lease_duration=60.0, renew_deadline=4.0, retry_period=1.0
        )
        m = Manager(api_client, options(namespace, leader_election=cfg))
        m.controller("configmap-controller", RecordingReconciler()).for_(CONFIGMAPS)
        m.add_runnable("watcher", log.runnable(f"{who}:watcher"))
        m.add_runnable("server", log.runnable(f"{who}:server"), leader_only=False)
        with pytest.raises(ValueError):
            m.add_runnable("server", log.runnable("dup"))
        managers[who] = m
        tasks[who] = await start_manager(m)
        if who == "first":
            await wait_until("the leader's runnable to start", lambda: "first:watcher" in log.started)

    await wait_until("the follower's every-replica runnable", lambda: "second:server" in log.started)
    await wait_until("the follower's caches to sync", managers["second"].is_ready)
    await asyncio.sleep(2.5)
    assert "second:watcher" not in log.started

    # A runnable added while leading starts at once.
    managers["first"].add_runnable("late", log.runnable("first:late"))
    await wait_until("a late runnable to start", lambda: "first:late" in log.started)

    managers["first"].stop()
    await asyncio.wait_for(tasks["first"], 30)
    assert {"first:watcher", "first:late", "first:server"} <= set(log.cancelled)
    await wait_until("the successor's runnable", lambda: "second:watcher" in log.started, within=20)
    assert log.started.count("second:watcher") == 1


@pytest.mark.cluster
async def test_a_failing_runnable_is_restarted_with_backoff(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    calls: list[float] = []

    async def flaky() -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) < 3:
            raise RuntimeError("boom")
        await asyncio.Future()

    manager = Manager(api_client, options(namespace))
    manager.add_runnable("flaky", flaky)
    await start_manager(manager)
    await wait_until("two restarts", lambda: len(calls) == 3, within=20)
    assert calls[1] - calls[0] >= 0.9 and calls[2] - calls[1] >= 1.9  # 1 s, then 2 s


@pytest.mark.cluster
async def test_scoped_informers_cache_only_what_their_selector_selects(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    writer = ResourceClient(api_client, CONFIGMAPS, namespace)
    await writer.create({"metadata": {"name": "mine", "labels": {"app": "pko"}}})
    await writer.create({"metadata": {"name": "theirs", "labels": {"app": "other"}}})
    await writer.create({"metadata": {"name": "named"}})
    manager = Manager(api_client, options(namespace))
    labelled = manager.informer(CONFIGMAPS, label_selector="app=pko")
    assert manager.informer(CONFIGMAPS) is labelled  # omitting the selector: whatever exists
    with pytest.raises(ValueError, match="selector"):
        manager.informer(CONFIGMAPS, label_selector="app=other")
    by_field = manager.informer(SECRETS, field_selector="metadata.name=wanted")
    await ResourceClient(api_client, SECRETS, namespace).create({"metadata": {"name": "wanted"}})
    await ResourceClient(api_client, SECRETS, namespace).create({"metadata": {"name": "unwanted"}})
    await start_manager(manager)
    await wait_until("caches to sync", manager.is_ready)
    assert labelled.indexer.list_keys() == [f"{namespace}/mine"]
    assert by_field.indexer.list_keys() == [f"{namespace}/wanted"]


@pytest.mark.cluster
async def test_an_optional_watch_waits_for_its_crd_without_blocking_readiness(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    group = f"m{uuid.uuid4().hex[:8]}.pko.test"
    gizmos = Resource(group, "v1", "gizmos", "Gizmo")
    reconciler = RecordingReconciler()
    manager = Manager(api_client, options(namespace, discovery_interval=0.5, optional_sync_timeout=30.0))
    (
        manager.controller("configmap-controller", reconciler)
        .for_(CONFIGMAPS)
        .watches(gizmos, lambda g: [f"{namespace}/{g['spec']['target']}"], optional=True)
    )
    await create_configmaps(api_client, namespace, ["x"])
    await start_manager(manager)

    # Ready and reconciling although the Gizmo kind does not exist.
    await wait_until("x reconciled", lambda: ours(reconciler.finished, namespace, ["x"]), within=30)
    assert manager.is_ready() and (await http_get(url(manager, "probes", "/readyz")))[0] == 200
    assert manager.optional_cache_status(gizmos) == "absent"
    assert manager.optional_cache_status(CONFIGMAPS) == "synced"

    crds = ResourceClient(api_client, CRDS)
    await crds.create(gizmo_crd(group))
    try:
        await wait_until(
            "the gizmo cache", lambda: manager.optional_cache_status(gizmos) == "synced", within=60
        )
        gizmo = {
            "apiVersion": f"{group}/v1",
            "kind": "Gizmo",
            "metadata": {"name": "g"},
            "spec": {"target": "y"},
        }
        await ResourceClient(api_client, gizmos, namespace).create(gizmo)
        await wait_until("the gizmo's key reconciled", lambda: ours(reconciler.finished, namespace, ["y"]))
    finally:
        await crds.delete(f"gizmos.{group}")


@pytest.mark.cluster
async def test_the_managers_event_recorder_runs_with_it(
    api_client: client.ApiClient, namespace: str, start_manager: StartManager
) -> None:
    manager = Manager(api_client, options(namespace))
    await start_manager(manager)
    cm = await ResourceClient(api_client, CONFIGMAPS, namespace).create({"metadata": {"name": "ev"}})
    manager.events.event(cm, "Normal", "Tested", "hello")

    async def recorded() -> bool:
        items = (await ResourceClient(api_client, EVENTS, namespace).list()).items
        return any(e["reason"] == "Tested" and e["source"]["component"] == EVENT_COMPONENT for e in items)

    await wait_until("the event", recorded)

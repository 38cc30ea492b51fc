"""Workspace agents serve their own ``/metrics`` (issue 46), secured as the operator's: HTTPS with a
certificate made at start, each scraper's token reviewed (TokenReview, then a SubjectAccessReview for
``get`` on ``/metrics``) by the agent under the workspace ServiceAccount's ``system:auth-delegator``.

First the pod spec and NetworkPolicy each ``--workspace-metrics`` value gives (pure), then a real agent
on the real control plane: the operator deploys a Stack, the play-kubelet runs its pod's agent as a
process on the pod's own loopback IP, and the scrapes go to that process: no token 401, a token
without the metrics-reader role 403, a metrics-reader token 200 with the agent's series (its
refusals, operations and their durations). And an agent whose metrics port is taken still serves its
API: metrics are on in every pod, so they must never cost the agent.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from pko.api.generated.pko.agent import v1 as pb
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from pko.controllers.options import ControllerOptions
from pko.controllers.workspace.networkpolicy import desired_network_policy
from pko.controllers.workspace.podspec import METRICS_PORT, WORKSPACE_PORT
from pko.controllers.workspace.workloads import desired_statefulset, parse_spec
from pko.devtools.agents import agent_env, answers_version, free_port, spawn, stop_process, wait_for_agent
from pko.devtools.playkubelet import create_service_account, mint_token
from pko.devtools.playkubelet.programs import translate_argv
from pko.devtools.standin import make_fake_pulumi
from pko.machinery.resource import PODS, ResourceClient
from pko.settings.cli import parse_settings

from .builders import workspace
from .conftest import operator_env
from .test_alerts import metrics_reader_token
from .test_stack import PROGRAM_BODY, Env

Obj = dict[str, Any]

env = operator_env(Env)


def _pulumi_container(options: ControllerOptions) -> Obj:
    ws = workspace({"image": "pulumi/pulumi:3"})
    (container,) = desired_statefulset(ws, parse_spec(ws), options)["spec"]["template"]["spec"]["containers"]
    return container


def test_workspace_pods_serve_the_agents_metrics_over_https_by_default() -> None:
    pulumi = _pulumi_container(ControllerOptions())
    command = pulumi["command"]
    at = command.index("--metrics-bind-address")
    assert command[at + 1] == f":{METRICS_PORT}"
    assert "--metrics-secure" not in command  # the agent's default: HTTPS, tokens reviewed
    assert pulumi["ports"] == [
        {"name": "grpc", "containerPort": WORKSPACE_PORT, "protocol": "TCP"},
        {"name": "https-metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
    ]


def test_plain_http_only_when_asked_and_nothing_when_off() -> None:
    http = _pulumi_container(ControllerOptions(workspace_metrics="http"))
    assert http["command"][http["command"].index("--metrics-bind-address") :][:4] == [
        "--metrics-bind-address",
        f":{METRICS_PORT}",
        "--metrics-secure",
        "false",
    ]
    assert http["ports"][1] == {"name": "http-metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
    off = _pulumi_container(ControllerOptions(workspace_metrics="off"))
    assert not [a for a in off["command"] if a.startswith("--metrics")]
    assert [p["name"] for p in off["ports"]] == ["grpc"]


def test_the_setting_reaches_the_controllers() -> None:
    assert parse_settings([], {}).controller_options().workspace_metrics == "https"
    assert parse_settings(["--workspace-metrics=off"], {}).controller_options().workspace_metrics == "off"
    assert parse_settings([], {"WORKSPACE_METRICS": "http"}).controller_options().workspace_metrics == "http"
    with pytest.raises(SystemExit):
        parse_settings(["--workspace-metrics=yes"], {})


def test_the_network_policy_opens_the_metrics_port_to_scrapers_only_when_served() -> None:
    ws = workspace({"image": "pulumi/pulumi:3"})
    operator_only, scrapers = desired_network_policy(ws, "pko-system", metrics=True)["spec"]["ingress"]
    assert operator_only["ports"] == [{"protocol": "TCP", "port": WORKSPACE_PORT}]
    assert operator_only["from"]  # the gRPC port stays the operator's alone
    assert scrapers == {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]}  # from anywhere
    (rule,) = desired_network_policy(ws, "pko-system", metrics=False)["spec"]["ingress"]
    assert rule == operator_only


def test_the_play_kubelet_binds_the_agents_metrics_to_its_pod_ip() -> None:
    argv = ["/share/tini", "/share/agent", "--", "serve", "--metrics-bind-address", ":8443", "-w", "/w"]
    assert translate_argv(argv, "127.9.0.1")[3:] == [
        "serve", "--host", "127.9.0.1", "--metrics-bind-address", "127.9.0.1:8443", "-w", "/w"
    ]  # fmt: skip


async def test_an_agent_whose_metrics_port_is_taken_still_serves_its_api(tmp_path: Path) -> None:
    """Metrics are on in every workspace pod: a port a pod template's sidecar already holds costs the
    agent its /metrics (logged), never its gRPC API."""
    fake = make_fake_pulumi(tmp_path / "pulumi")
    work = tmp_path / "workspace"
    work.mkdir()
    (work / "Pulumi.yaml").write_text("name: busy\nruntime: yaml\n")
    port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        proc = spawn(
            [
                sys.executable, "-m", "pko.agent", "serve", "--workspace", str(work), "--skip-install",
                "--host", "127.0.0.1", "--port", str(port), "--pulumi-root", str(fake.root),
                "--metrics-bind-address", f"127.0.0.1:{taken}", "--metrics-secure", "false",
            ],
            agent_env(),
        )  # fmt: skip
        try:
            channel, version = await wait_for_agent(proc, port, answers_version)
            channel.close()
            assert version
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 120) == 0
            assert proc.stderr is not None
            log = proc.stderr.read().decode()
        finally:
            stop_process(proc)
    (line,) = [json.loads(x) for x in log.splitlines() if '"metrics not served"' in x]
    assert line["address"] == f"127.0.0.1:{taken}" and "Address already in use" in line["error"]


# --- a real agent ------------------------------------------------------------------------------------


def _scrape(url: str, token: str | None) -> tuple[int, str]:
    """GET ``url`` over HTTPS (the agent's self-signed certificate: not verified), maybe with a token."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


async def _call_without_token(host: str, port: int) -> str:
    """An RPC with no token: the agent refuses it (and counts the refusal)."""
    channel = Channel(host, port)
    try:
        await pb.AutomationServiceStub(channel).pulumi_version(timeout=30)
        return "OK"
    except GRPCError as exc:
        return exc.status.name
    finally:
        channel.close()


def _samples(body: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(body) for s in family.samples]


@pytest.mark.cluster
@pytest.mark.timeout(600)
async def test_a_real_agent_serves_its_metrics_only_to_a_metrics_reader(env: Env) -> None:
    await env.create_program("scraped", PROGRAM_BODY)
    await env.create_stack("scraped", {"programRef": {"name": "scraped"}})
    await env.condition("scraped", "Ready", "ProcessingCompleted")
    pod = await ResourceClient(env.api, PODS, env.ns).get("scraped-workspace-0")
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []}
    ip = pod["status"]["podIP"]
    url = f"https://{ip}:{ports['https-metrics']}/metrics"

    assert await _call_without_token(ip, ports["grpc"]) == "UNAUTHENTICATED"
    status, body = await asyncio.to_thread(_scrape, url, None)
    assert status == 401, body
    await create_service_account(env.api, env.ns, "nobody")
    nobody = await mint_token(env.api, env.ns, "nobody")
    status, body = await asyncio.to_thread(_scrape, url, nobody)
    assert status == 403, body
    assert f"system:serviceaccount:{env.ns}:nobody may not get /metrics" in body
    reader = await metrics_reader_token(env.api, env.ns)
    status, body = await asyncio.to_thread(_scrape, url, reader)
    assert status == 200, body

    samples = _samples(body)
    counted = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    assert counted[("agent_operations_total", (("state", "succeeded"), ("type", "up")))] >= 1
    assert counted[("agent_operation_duration_seconds_count", (("state", "succeeded"), ("type", "up")))] >= 1
    assert counted[("agent_auth_refusals_total", (("reason", "missing bearer token"),))] >= 1
    assert any(s.name == "process_resident_memory_bytes" for s in samples)

"""The shipped alerts (config/prometheus) on a real Prometheus scraping the real operator: the operator
runs the Stacks of the seed walkthrough (one Program that deploys, one whose program is broken), a
Prometheus built from its module scrapes its /metrics each second and evaluates the shipped rules, their
``for`` shortened to nothing (their durations are promtool's to test: test/test_prometheus_rules.py).
It must see the new series and fire ``PulumiStackFailing`` for the broken Stack only.

Prometheus scrapes as a deployed one does (docs/metrics.md): over HTTPS (the operator's self-signed
certificate, so ``insecure_skip_verify``) with the token of a ServiceAccount bound to the shipped
metrics-reader ClusterRole, which the operator checks with a TokenReview and a SubjectAccessReview
under its shipped RBAC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from pko.devtools.playkubelet import mint_token
from pko.devtools.prometheus import rules_without_waiting, running_prometheus, scrape_pko
from pko.devtools.waiting import wait_until
from pko.machinery.resource import Resource, ResourceClient

from .conftest import operator_env
from .test_stack import BAD_BODY, PROGRAM_BODY, Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

env = operator_env(Env)

REPO = Path(__file__).resolve().parents[2]
READER_ROLE = yaml.safe_load((REPO / "config/rbac/metrics_reader_role.yaml").read_text())
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)


async def metrics_reader_token(api: client.ApiClient, namespace: str) -> str:
    """A token of ServiceAccount ``prometheus`` of ``namespace``, bound to the metrics-reader ClusterRole."""
    await ResourceClient(api, CLUSTER_ROLES).apply(READER_ROLE, field_manager="pko-tests")
    await ResourceClient(api, SERVICE_ACCOUNTS, namespace).create({"metadata": {"name": "prometheus"}})
    await ResourceClient(api, ROLE_BINDINGS).create(
        {
            "metadata": {"name": f"prometheus-metrics-reader-{namespace}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READER_ROLE["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}],
        }
    )
    return await mint_token(api, namespace, "prometheus")


async def test_a_real_prometheus_scrapes_the_new_series_and_fires_the_failing_alert(
    env: Env, tmp_path: Path
) -> None:
    await env.create_program("fine", PROGRAM_BODY)
    await env.create_program("broken", BAD_BODY)
    await env.create_stack("fine", {"programRef": {"name": "fine"}})
    await env.create_stack("broken", {"programRef": {"name": "broken"}})
    manager = env.operator.manager
    assert manager is not None
    await manager.wait_serving()
    address = manager.address("metrics")
    assert address is not None
    target = f"127.0.0.1:{address[1]}"
    token = tmp_path / "token"
    token.write_text(await metrics_reader_token(env.api, env.ns))
    config = scrape_pko(target, token)
    with running_prometheus(tmp_path / "prometheus", config, rules_without_waiting()) as prom:
        await wait_until("Prometheus ready", prom.ready, within=60)
        await env.condition("fine", "Ready", "ProcessingCompleted")
        await env.condition("broken", "Reconciling", "RetryingAfterFailure")

        def firing() -> list[dict[str, Any]]:
            return [a for a in prom.alerts() if a["labels"]["alertname"] == "PulumiStackFailing"]

        try:
            alerts = await wait_until("PulumiStackFailing firing", firing, within=60, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nPrometheus log:\n{prom.logs()}") from None
        assert [(a["labels"]["namespace"], a["labels"]["name"]) for a in alerts] == [(env.ns, "broken")]
        assert "kubectl pko why broken" in alerts[0]["annotations"]["description"]

        # The series the dashboard and the other alerts read, as Prometheus stored them.
        def scraped(expr: str) -> Any:
            return lambda: prom.query(expr)

        await wait_until(
            "an up counted", scraped('pko_updates_total{type="up",result="succeeded"} > 0'), within=30
        )
        await wait_until(
            "a failed up counted", scraped('pko_updates_total{type="up",result="failed"} > 0'), within=30
        )
        durations = await wait_until(
            "durations", scraped('pko_update_duration_seconds_count{type="up"} > 0'), within=30
        )
        assert {d["metric"]["result"] for d in durations} == {"succeeded", "failed"}
        last = await wait_until(
            "fine's last success",
            scraped(f'pko_stack_last_successful_update_timestamp_seconds{{namespace="{env.ns}"}}'),
            within=30,
        )
        assert [s["metric"]["name"] for s in last] == ["fine"]
        ready = await wait_until(
            "Stacks by reason",
            scraped('pko_stacks{condition="Ready",reason="ProcessingCompleted"} >= 1'),
            within=30,
        )
        assert ready
        # This operator runs without leader election (as a single replica may): no Lease is held,
        # so the not-leading alert fires, as the page says it does for --leader-elect=false.
        names = {a["labels"]["alertname"] for a in prom.alerts()}
        assert "PulumiOperatorNotLeading" in names
        assert "PulumiStackDriftDetected" not in names

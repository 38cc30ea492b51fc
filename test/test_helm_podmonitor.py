"""The chart's PodMonitor of the workspace agents' /metrics (charts/pko, rendered with the real helm):
off by default; on, it scrapes every workspace pod's ``https-metrics`` port with the token of a
ServiceAccount bound to the metrics-reader ClusterRole only (a PodMonitor reads tokens from Secrets,
so the chart makes that account's token Secret, unless one is named); ``workspace.metrics`` reaches the
operator as ``WORKSPACE_METRICS`` and the PodMonitor follows it."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from helmtest import CHART, Obj, env_of, helm, manager, refused, template

from pko.controllers.resources import WORKSPACE_COMPONENT, WORKSPACE_COMPONENT_LABEL
from pko.controllers.workspace.podspec import METRICS_PORT_NAMES
from pko.devtools.kubectl import kubectl
from pko.settings.cli import parse_settings

pytestmark = pytest.mark.timeout(900)  # the first helm test may build helm


def _kinds(objs: list[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objs if o["kind"] in kinds]


def test_no_pod_monitor_by_default_and_the_operators_own_workspace_metrics(helm_home: Path) -> None:
    objs = template(helm_home)
    assert not _kinds(objs, "PodMonitor")
    assert not [o for o in objs if "workspace-metrics" in o["metadata"]["name"]]
    _, container = manager(objs)
    assert "WORKSPACE_METRICS" not in env_of(container)  # the operator's default: https


def test_the_pod_monitor_scrapes_the_agents_with_a_metrics_reader_token(helm_home: Path) -> None:
    objs = template(
        helm_home,
        *("--set", "podMonitor.enabled=true", "--set", "podMonitor.interval=30s"),
        *("--set", "podMonitor.labels.release=kube-prometheus"),
        namespace="ops",
    )
    (monitor,) = _kinds(objs, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "ops"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["selector"] == {"matchLabels": {WORKSPACE_COMPONENT_LABEL: WORKSPACE_COMPONENT}}
    (account,) = [
        o for o in _kinds(objs, "ServiceAccount") if o["metadata"]["name"].endswith("workspace-metrics")
    ]
    (secret,) = _kinds(objs, "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": account["metadata"]["name"]
    }
    assert secret["metadata"]["namespace"] == account["metadata"]["namespace"] == "ops"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {
            "port": METRICS_PORT_NAMES["https"],
            "scheme": "https",
            "path": "/metrics",
            "authorization": {
                "type": "Bearer",
                "credentials": {"name": secret["metadata"]["name"], "key": "token"},
            },
            "tlsConfig": {"insecureSkipVerify": True},
            "interval": "30s",
        }
    ]
    # The account may get /metrics and nothing else: bound to the metrics-reader ClusterRole alone.
    (binding,) = [
        o
        for o in _kinds(objs, "ClusterRoleBinding")
        if {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ops"}
        in o.get("subjects", [])
    ]
    (role,) = [o for o in _kinds(objs, "ClusterRole") if o["metadata"]["name"] == binding["roleRef"]["name"]]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    helm(helm_home, "lint", "--strict", str(CHART), "--set", "podMonitor.enabled=true")


def test_a_named_token_secret_or_plain_http_makes_no_account(helm_home: Path) -> None:
    named = template(
        helm_home, "--set", "podMonitor.enabled=true", "--set", "podMonitor.tokenSecret=my-reader"
    )
    (endpoint,) = _kinds(named, "PodMonitor")[0]["spec"]["podMetricsEndpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "my-reader", "key": "token"}
    assert not _kinds(named, "Secret")
    plain = template(helm_home, "--set", "podMonitor.enabled=true", "--set", "workspace.metrics=http")
    (endpoint,) = _kinds(plain, "PodMonitor")[0]["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": METRICS_PORT_NAMES["http"], "scheme": "http", "path": "/metrics"}
    assert not _kinds(plain, "Secret")
    _, container = manager(plain)
    env = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
    assert parse_settings(container["args"], env).workspace_metrics == "http"


def test_workspace_metrics_off_refuses_a_pod_monitor_and_a_wrong_value(helm_home: Path) -> None:
    _, container = manager(template(helm_home, "--set", "workspace.metrics=off"))
    assert env_of(container)["WORKSPACE_METRICS"] == "off"
    error = refused(helm_home, "--set", "workspace.metrics=off", "--set", "podMonitor.enabled=true")
    assert "workspace.metrics is off" in error
    assert refused(helm_home, "--set", "workspace.metrics=yes")


@pytest.mark.cluster
def test_the_charts_scraper_token_is_a_metrics_reader_on_a_real_apiserver(
    cluster: Any, helm_home: Path
) -> None:
    """The ServiceAccount, token Secret and binding the chart renders, applied for real: the token
    controller fills the Secret, the apiserver accepts its token, and its user may get /metrics and
    nothing else (what each agent's TokenReview and SubjectAccessReview will ask)."""
    namespace = "helm-podmonitor"
    objs = template(
        helm_home,
        "--set",
        "podMonitor.enabled=true",
        "--set",
        "fullnameOverride=pko-podmon",
        namespace=namespace,
    )
    wanted = {
        ("ClusterRole", "pko-podmon-metrics-reader"),
        ("ClusterRoleBinding", "pko-podmon-workspace-metrics"),
        ("ServiceAccount", "pko-podmon-workspace-metrics"),
        ("Secret", "pko-podmon-workspace-metrics-token"),
    }
    body = [o for o in objs if (o["kind"], o["metadata"]["name"]) in wanted]
    assert len(body) == len(wanted)
    kubectl(cluster, "create", "namespace", namespace)
    try:
        kubectl(
            cluster, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": body})
        )
        (secret,) = _kinds(objs, "Secret")
        token = ""
        deadline = time.monotonic() + 60
        while not token and time.monotonic() < deadline:
            filled = json.loads(
                kubectl(
                    cluster, "-n", namespace, "get", "secret", secret["metadata"]["name"], "-o", "json"
                ).stdout
            )
            token = base64.b64decode((filled.get("data") or {}).get("token", "")).decode()
            time.sleep(0.5)
        assert token, "the token controller never filled the scraper's Secret"
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        answer = json.loads(
            kubectl(cluster, "create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout
        )
        user = f"system:serviceaccount:{namespace}:pko-podmon-workspace-metrics"
        assert answer["status"]["authenticated"] is True and answer["status"]["user"]["username"] == user
        can = kubectl(cluster, "auth", "can-i", "get", "/metrics", f"--as={user}", check=False).stdout
        assert can.strip() == "yes"
        can = kubectl(
            cluster, "auth", "can-i", "get", "secrets", "-n", namespace, f"--as={user}", check=False
        )
        assert can.stdout.strip() == "no"
    finally:
        for kind, name in (
            ("clusterrolebinding", "pko-podmon-workspace-metrics"),
            ("clusterrole", "pko-podmon-metrics-reader"),
        ):
            kubectl(cluster, "delete", kind, name, "--ignore-not-found", check=False)
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)

"""The chart's values for the operator (charts/pko, rendered with the real helm): each lands where it
belongs (the manager's Deployment, its arguments and environment, the ServiceMonitor, the watched
namespaces and their RBAC), the operator parses what the chart configures, a values file written for
the Go operator's chart carries over, and `helm lint --strict` passes with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtest import (
    CHART,
    REPO,
    Obj,
    app_version,
    by_key,
    config_namespace,
    env_of,
    helm,
    key,
    manager,
    refused,
    template,
)

from pko.devtools.kubectl import run

# The first test that needs helm builds it when the cache has none (about 2 min cold on 2 cores, with an
# empty Go module cache): more than the suite's 300 s default leaves for a slow machine.
pytestmark = pytest.mark.timeout(900)


VALUES = {
    "replicaCount": 3,
    # A numeric tag, as YAML reads 20261127: Helm's float64 must still render the digits.
    "image": {"registry": "registry.example:5000", "repository": "platform/pko", "tag": 20261127},
    "agent": {
        "image": {"repository": "platform/pko-agent", "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"}
    },
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "controller": {"logLevel": "debug", "logFormat": "console"},
    "leaderElection": {"leaseDuration": "120s", "renewDeadline": "90s", "retryPeriod": "20s"},
    "watchNamespace": "stacks",
    "kubeAPI": {"timeout": "45s"},
    "flux": {"maxUntarSizeBytes": 524288000, "eventsAddress": "http://notification-controller.flux-system/"},
    "git": {"allowInsecureCredentials": True},
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
        {"name": "PULUMI_ACCESS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "pulumi", "key": "token"}}},
    ],
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    "terminationGracePeriodSeconds": 300,
    "deploymentAnnotations": {"example.com/owner": "platform"},
    "podAnnotations": {"prometheus.io/scrape": "true"},
    "podLabels": {"team": "platform"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                ]
            }
        }
    },
    "serviceMonitor": {
        "enabled": True,
        "labels": {"release": "kube-prometheus"},
        "interval": "30s",
        "timeout": "10s",
        "targetLabels": ["team"],
    },
}


@pytest.fixture(scope="module")
def values_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("values") / "values.yaml"
    path.write_text(yaml.safe_dump(VALUES))
    return path


@pytest.fixture(scope="module")
def custom(helm_home: Path, values_file: Path) -> list[Obj]:
    return template(helm_home, "--values", str(values_file), namespace="ops")


def test_image_replicas_and_resources_land_on_the_manager(custom: list[Obj]) -> None:
    deploy, container = manager(custom)
    assert deploy["spec"]["replicas"] == 3
    assert container["image"] == "registry.example:5000/platform/pko:20261127"
    assert container["resources"] == VALUES["resources"]
    assert deploy["metadata"]["annotations"] == {"example.com/owner": "platform"}
    pod = deploy["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "manager"
    assert pod["metadata"]["labels"]["team"] == "platform"
    # The selector is config's: pod labels add to the template, never to what the Deployment selects.
    assert deploy["spec"]["selector"] == {"matchLabels": {"control-plane": "controller-manager"}}
    spec = pod["spec"]
    assert spec["terminationGracePeriodSeconds"] == 300
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"] == VALUES["tolerations"]
    assert spec["affinity"] == VALUES["affinity"]


def test_environment_values_reach_the_operators_variables(custom: list[Obj]) -> None:
    _, container = manager(custom)
    env = env_of(container)
    assert env["WATCH_NAMESPACE"] == "stacks"
    assert env["LEADER_ELECTION_LEASE_DURATION"] == "120s"
    assert env["LEADER_ELECTION_RENEW_DEADLINE"] == "90s"
    assert env["LEADER_ELECTION_RETRY_PERIOD"] == "20s"
    assert env["KUBE_API_TIMEOUT"] == "45s"
    assert env["FLUX_MAX_UNTAR_SIZE_BYTES"] == "524288000"
    assert env["EVENTS_ADDRESS"] == "http://notification-controller.flux-system/"
    assert env["ALLOW_INSECURE_GIT_CREDENTIALS"] == "true"
    # An empty tag is the chart's appVersion; a digest is appended to it (NAME:VERSION@sha256:...).
    assert env["AGENT_IMAGE"] == f"platform/pko-agent:{app_version()}@sha256:" + "ab" * 32
    assert env["AGENT_IMAGE_PULL_POLICY"] == "Always"
    assert env["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert env["PULUMI_ACCESS_TOKEN"] == {"secretKeyRef": {"name": "pulumi", "key": "token"}}
    # extraEnv comes last, so a user's variable overrides the chart's of the same name.
    assert [e["name"] for e in container["env"]][-2:] == ["HTTPS_PROXY", "PULUMI_ACCESS_TOKEN"]
    assert "--leader-elect" in container["args"]
    assert "--log-level=debug" in container["args"] and "--log-format=console" in container["args"]


def test_the_operator_accepts_what_the_chart_configures(custom: list[Obj]) -> None:
    """The manager's args and environment, as the chart renders them, parse into the settings meant."""
    from pko.__main__ import parse_settings

    _, container = manager(custom)
    # What the kubelet gives the process: the literal variables, POD_NAMESPACE from the downward API.
    env = {k: v for k, v in env_of(container).items() if isinstance(v, str)}
    settings = parse_settings(container["args"], {**env, "POD_NAMESPACE": "ops"})
    assert settings.leader_elect is True
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (120.0, 90.0, 20.0)
    assert settings.watch_namespace == "stacks"
    assert settings.kube_api_timeout == 45.0
    assert settings.flux_max_untar_size_bytes == 524288000
    assert settings.events_address == "http://notification-controller.flux-system/"
    assert settings.agent_image == f"platform/pko-agent:{app_version()}@sha256:" + "ab" * 32
    assert settings.agent_image_pull_policy == "Always"
    assert (settings.log_level, settings.log_format) == ("debug", "console")


def test_service_monitor_scrapes_the_metrics_service(custom: list[Obj]) -> None:
    monitor = next(o for o in custom if o["kind"] == "ServiceMonitor")
    service = next(
        o
        for o in custom
        if o["kind"] == "Service" and any(p["name"] == "http-metrics" for p in o["spec"]["ports"])
    )
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "ops"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "http-metrics",
            # The operator's default: HTTPS, its self-signed certificate, Prometheus' own token.
            "scheme": "https",
            "path": "/metrics",
            "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "tlsConfig": {"insecureSkipVerify": True},
            "interval": "30s",
            "scrapeTimeout": "10s",
        }
    ]
    assert monitor["spec"]["targetLabels"] == ["team"]


def test_a_values_file_written_for_the_go_operators_chart_carries_over(
    helm_home: Path, tmp_path: Path
) -> None:
    """The Go chart's value names pko shares take effect (its naming, ServiceAccount and RBAC switches
    among them, its empty-string imagePullSecrets and null extra volumes too); a setting pko does not
    have is refused by the schema, naming it, rather than silently ignored."""
    go_values: dict[str, Any] = {
        "replicaCount": 2,
        "image": {"registry": "ghcr.io", "repository": "example/pko", "tag": "", "pullPolicy": "Always"},
        "imagePullSecrets": "",
        "controller": {"logLevel": "error", "logFormat": "console"},
        "leaderElection": {"leaseDuration": "60s", "renewDeadline": "45s", "retryPeriod": "10s"},
        "kubeAPI": {"timeout": "30s"},
        "flux": {"maxUntarSizeBytes": ""},
        "extraEnv": [{"name": "GOMEMLIMIT", "value": "100MiB"}],
        "rbac": {"create": True, "extraRules": []},
        "nameOverride": "",
        "fullnameOverride": "",
        "serviceAccount": {"create": True, "annotations": {}, "name": ""},
        "extraVolumes": None,
        "extraVolumeMounts": None,
        "resources": {
            "limits": {"cpu": "200m", "memory": "128Mi"},
            "requests": {"cpu": "200m", "memory": "128Mi"},
        },
        "serviceMonitor": {"enabled": False},
    }
    path = tmp_path / "go-values.yaml"
    path.write_text(yaml.safe_dump(go_values))
    objs = template(helm_home, "--values", str(path))
    deploy, container = manager(objs)
    assert deploy["spec"]["replicas"] == 2
    assert container["image"] == f"ghcr.io/example/pko:{app_version()}"
    assert container["imagePullPolicy"] == "Always"
    assert "imagePullSecrets" not in deploy["spec"]["template"]["spec"]
    assert "--log-level=error" in container["args"] and "--log-format=console" in container["args"]
    env = env_of(container)
    assert (env["LEADER_ELECTION_LEASE_DURATION"], env["KUBE_API_TIMEOUT"], env["GOMEMLIMIT"]) == (
        "60s",
        "30s",
        "100MiB",
    )
    assert "FLUX_MAX_UNTAR_SIZE_BYTES" not in env
    assert "EVENTS_ADDRESS" not in env  # off unless asked
    assert "ALLOW_INSECURE_GIT_CREDENTIALS" not in env  # off unless asked: Stalled, nothing sent
    assert container["resources"] == go_values["resources"]
    helm(helm_home, "lint", "--strict", str(CHART), "--values", str(path))
    for go_only in ("controller.metricsSecure=true", "rbac.createClusterRole=true", "extraPorts[0].name=x"):
        name = go_only.split("=")[0].split("[")[0].rsplit(".", 1)[-1]
        assert f"'{name}' not allowed" in refused(helm_home, "--values", str(path), "--set", go_only)


def test_no_service_monitor_by_default(helm_home: Path) -> None:
    assert not [o for o in template(helm_home) if o["kind"] == "ServiceMonitor"]


def test_a_service_monitor_for_plain_metrics_or_a_known_ca(helm_home: Path) -> None:
    """``scheme: http`` for an operator run with METRICS_SECURE=false: no token, no TLS; with a mounted
    certificate, its CA verifies it."""
    plain = template(
        helm_home,
        *("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.scheme=http"),
        *("--set", "extraEnv[0].name=METRICS_SECURE", "--set-string", "extraEnv[0].value=false"),
    )
    monitor = next(o for o in plain if o["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [{"port": "http-metrics", "scheme": "http", "path": "/metrics"}]
    _, container = manager(plain)
    assert {"name": "METRICS_SECURE", "value": "false"} in container["env"]
    assert refused(helm_home, "--set", "serviceMonitor.scheme=ftp")
    ca = {
        "ca": {"secret": {"name": "metrics-cert", "key": "ca.crt"}},
        "serverName": "pko-metrics.ops.svc",
        "insecureSkipVerify": False,  # Helm merges maps: the default's true must be turned off
    }
    values = helm_home / "ca-values.yaml"
    values.write_text(json.dumps({"serviceMonitor": {"enabled": True, "tlsConfig": ca}}))
    verified = template(helm_home, "-f", str(values))
    (endpoint,) = next(o for o in verified if o["kind"] == "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"] == ca and endpoint["scheme"] == "https"


def test_metrics_service_can_be_left_out(helm_home: Path) -> None:
    objs = template(helm_home, "--set", "metrics.service.enabled=false")
    ports = [p["name"] for o in objs if o["kind"] == "Service" for p in o["spec"]["ports"]]
    assert ports == ["http-fileserver"]
    error = refused(
        helm_home, "--set", "metrics.service.enabled=false", "--set", "serviceMonitor.enabled=true"
    )
    assert "serviceMonitor.enabled needs metrics.service.enabled" in error


def test_leader_election_can_be_turned_off_for_one_replica_only(helm_home: Path) -> None:
    _, container = manager(template(helm_home, "--set", "leaderElection.enabled=false"))
    assert "--leader-elect" not in container["args"]
    error = refused(helm_home, "--set", "leaderElection.enabled=false", "--set", "replicaCount=2")
    assert "replicaCount > 1 needs leaderElection.enabled" in error


def test_several_watched_namespaces_are_refused_with_the_reason(helm_home: Path) -> None:
    # watchNamespace is the Go operator's one namespace, a string; several go in watchNamespaces.
    assert "/watchNamespace': got array, want string" in refused(helm_home, "--set", "watchNamespace={a,b}")


def namespaced_overlay() -> list[Obj]:
    out = run("kustomize", str(REPO / "config" / "namespaced")).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_namespaced_install_is_config_namespaced_in_each_watched_namespace(helm_home: Path) -> None:
    """rbac.namespaced: the Role config/namespaced ships, in each of watchNamespaces, bound to the
    manager's account; the manager's ClusterRole cut down as there; the namespaces watched."""
    overlay = {key(o): o for o in namespaced_overlay()}
    ns = config_namespace()
    objs = template(
        helm_home,
        "--set",
        "rbac.namespaced=true",
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "watchLabelSelector=shard=a",
    )
    found = by_key(objs)
    role = overlay[("Role", "pulumi-kubernetes-operator-watched", ns)]
    for watched in ("team-a", "team-b"):
        assert found[("Role", "pulumi-kubernetes-operator-watched", watched)]["rules"] == role["rules"]
        binding = found[("RoleBinding", "pulumi-kubernetes-operator-watched", watched)]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "controller-manager", "namespace": ns}
        ]
        assert binding["roleRef"]["name"] == "pulumi-kubernetes-operator-watched"
    cluster_role = ("ClusterRole", "pulumi-kubernetes-operator-controller-manager", None)
    assert found[cluster_role]["rules"] == overlay[cluster_role]["rules"]
    assert not [k for k in found if k[0] == "Role" and k[1].endswith("-watched") and k[2] == ns]
    env = env_of(manager(objs)[1])
    assert env["WATCH_NAMESPACES"] == "team-a,team-b" and env["WATCH_LABEL_SELECTOR"] == "shard=a"

    # Without watchNamespaces the release namespace is the one watched, as config/namespaced's default.
    alone = by_key(template(helm_home, "--set", "rbac.namespaced=true"))
    assert ("Role", "pulumi-kubernetes-operator-watched", ns) in alone
    assert env_of(manager(list(alone.values()))[1])["WATCH_NAMESPACES"] == ns
    # Without rbac.namespaced, several namespaces are watched with the cluster-wide RBAC.
    wide = template(helm_home, "--set", "watchNamespaces={team-a,team-b}")
    assert not [o for o in wide if o["kind"] == "Role" and o["metadata"]["name"].endswith("-watched")]
    assert env_of(manager(wide)[1])["WATCH_NAMESPACES"] == "team-a,team-b"


def test_helm_lint_passes_with_default_and_custom_values(helm_home: Path, values_file: Path) -> None:
    helm(helm_home, "lint", "--strict", str(CHART))
    helm(helm_home, "lint", "--strict", str(CHART), "--values", str(values_file))

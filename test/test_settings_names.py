"""The operator's flag names, environment variable names and defaults, pinned as they were before the
settings were declared once (pko/settings): users' Deployments and manifests depend on every one.

Checked through ``parse_settings`` and ``pko --help`` only, so the pin holds whatever builds them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from pko.__main__ import parse_settings

# flags (aliases after the first) | environment variables (the first set wins) | what they set |
# its value with no flag and no variable | an example value on the command line | what it parses to
PINNED: list[tuple[tuple[str, ...], tuple[str, ...], str, Any, str, Any]] = [
    (("--kubeconfig",), ("KUBECONFIG",), "kubeconfig", None, "/k", "/k"),
    (("--leader-elect",), ("LEADER_ELECT",), "leader_elect", False, "true", True),
    (
        ("--leader-election-id",),
        ("LEADER_ELECTION_ID",),
        "leader_election_id",
        "operator.pulumi.com",
        "x",
        "x",
    ),
    (
        ("--leader-election-namespace",),
        ("LEADER_ELECTION_NAMESPACE", "POD_NAMESPACE"),
        "leader_election_namespace",
        "pulumi-kubernetes-operator",
        "x",
        "x",
    ),
    (
        ("--leader-election-lease-duration",),
        ("LEADER_ELECTION_LEASE_DURATION",),
        "lease_duration",
        60.0,
        "2m",
        120.0,
    ),
    (
        ("--leader-election-renew-deadline",),
        ("LEADER_ELECTION_RENEW_DEADLINE",),
        "renew_deadline",
        45.0,
        "30s",
        30.0,
    ),
    (
        ("--leader-election-retry-period",),
        ("LEADER_ELECTION_RETRY_PERIOD",),
        "retry_period",
        10.0,
        "5s",
        5.0,
    ),
    (("--metrics-bind-address",), ("METRICS_BIND_ADDRESS",), "metrics_bind_address", ":8383", ":1", ":1"),
    (("--metrics-secure",), ("METRICS_SECURE",), "metrics_secure", True, "false", False),
    (("--metrics-cert-dir",), ("METRICS_CERT_DIR",), "metrics_cert_dir", None, "/certs", "/certs"),
    (
        ("--health-probe-bind-address",),
        ("HEALTH_PROBE_BIND_ADDRESS",),
        "health_probe_bind_address",
        ":8081",
        ":2",
        ":2",
    ),
    (("--program-fs-addr",), ("PROGRAM_FS_ADDR",), "program_fs_addr", ":9090", "0", "0"),
    (("--program-fs-adv-addr",), ("PROGRAM_FS_ADV_ADDR",), "program_fs_adv_addr", "", "h:80", "h:80"),
    (
        ("--operator-namespace",),
        ("POD_NAMESPACE",),
        "operator_namespace",
        "pulumi-kubernetes-operator",
        "ops",
        "ops",
    ),
    (
        ("--operator-service-account",),
        ("POD_SA_NAME",),
        "operator_service_account",
        "controller-manager",
        "sa",
        "sa",
    ),
    (("--agent-image",), ("AGENT_IMAGE",), "agent_image", "pko-agent:latest", "a:1", "a:1"),
    (
        ("--agent-image-pull-policy",),
        ("AGENT_IMAGE_PULL_POLICY",),
        "agent_image_pull_policy",
        "IfNotPresent",
        "Never",
        "Never",
    ),
    (("--workspace-image",), ("WORKSPACE_IMAGE",), "workspace_image", None, "p:3", "p:3"),
    (
        ("--default-workspace-template",),
        ("DEFAULT_WORKSPACE_TEMPLATE",),
        "default_workspace_template",
        None,
        "ops/base",
        "ops/base",
    ),
    (
        ("--workspace-address-mode",),
        ("WORKSPACE_ADDRESS_MODE",),
        "workspace_address_mode",
        "dns",
        "pod-ip",
        "pod-ip",
    ),
    (
        ("--workspace-localhost",),
        ("WORKSPACE_LOCALHOST",),
        "workspace_static_address",
        None,
        "localhost:1",
        "localhost:1",
    ),
    (("--watch-namespace",), ("WATCH_NAMESPACE",), "watch_namespace", None, "team", "team"),
    # Added with issue 42 (several namespaces, shards): new names, pinned from their first release.
    (("--watch-namespaces",), ("WATCH_NAMESPACES",), "watch_namespaces", (), "a, b,a", ("a", "b")),
    (
        ("--watch-label-selector",),
        ("WATCH_LABEL_SELECTOR",),
        "watch_label_selector",
        None,
        "shard=a",
        "shard=a",
    ),
    (
        ("--engine-event-log-level",),
        ("ENGINE_EVENT_LOG_LEVEL",),
        "engine_event_log_level",
        "debug",
        "warn",
        "warn",
    ),
    (
        ("--flux-max-untar-size-bytes",),
        ("FLUX_MAX_UNTAR_SIZE_BYTES",),
        "flux_max_untar_size_bytes",
        None,
        "1024",
        1024,
    ),
    (
        ("--agent-unreachable-timeout",),
        ("AGENT_UNREACHABLE_TIMEOUT",),
        "agent_unreachable_timeout",
        300.0,
        "1m30s",
        90.0,
    ),
    (
        ("--stack-max-update-failures",),
        ("STACK_MAX_UPDATE_FAILURES",),
        "max_update_failures",
        3,
        "0",
        0,
    ),
    (
        ("--stack-transient-retry-base",),
        ("STACK_TRANSIENT_RETRY_BASE",),
        "transient_retry_base",
        5.0,
        "2s",
        2.0,
    ),
    (
        ("--stack-transient-retry-factor",),
        ("STACK_TRANSIENT_RETRY_FACTOR",),
        "transient_retry_factor",
        2.0,
        "1.5",
        1.5,
    ),
    (
        ("--stack-transient-retry-cap",),
        ("STACK_TRANSIENT_RETRY_CAP",),
        "transient_retry_cap",
        300.0,
        "1m",
        60.0,
    ),
    (
        ("--stack-transient-retry-jitter",),
        ("STACK_TRANSIENT_RETRY_JITTER",),
        "transient_retry_jitter",
        0.2,
        "0",
        0.0,
    ),
    (
        ("--stack-deterministic-retry-base",),
        ("STACK_DETERMINISTIC_RETRY_BASE",),
        "deterministic_retry_base",
        10.0,
        "1m",
        60.0,
    ),
    (
        ("--stack-deterministic-retry-factor",),
        ("STACK_DETERMINISTIC_RETRY_FACTOR",),
        "deterministic_retry_factor",
        3.0,
        "2",
        2.0,
    ),
    (
        ("--stack-max-retry-backoff",),
        ("STACK_MAX_RETRY_BACKOFF",),
        "max_retry_backoff",
        86400.0,
        "1h",
        3600.0,
    ),
    # Added with issue 46: a new name, pinned from its first release.
    (
        ("--allow-insecure-git-credentials",),
        ("ALLOW_INSECURE_GIT_CREDENTIALS",),
        "allow_insecure_git_credentials",
        False,
        "true",
        True,
    ),
    (
        ("--workspace-network-policy",),
        ("WORKSPACE_NETWORK_POLICY",),
        "workspace_network_policy",
        True,
        "false",
        False,
    ),
    (("--workspace-metrics",), ("WORKSPACE_METRICS",), "workspace_metrics", "https", "off", "off"),
    (
        ("--stack-secrets-role",),
        ("STACK_SECRETS_ROLE",),
        "stack_secrets_role",
        "pko-stack-secrets",
        "team-secrets",
        "team-secrets",
    ),
    # Added with issue 42.
    (("--events-address",), ("EVENTS_ADDRESS",), "events_address", None, "http://nc/", "http://nc/"),
    *[
        (
            (f"--max-concurrent-reconciles-{kind}",),
            (f"MAX_CONCURRENT_RECONCILES_{kind.upper()}", "MAX_CONCURRENT_RECONCILES"),
            f"max_concurrent_reconciles[{kind}-controller]",
            25,
            "7",
            7,
        )
        for kind in ("stack", "workspace", "update", "program")
    ],
    (("--log-level", "--zap-log-level"), ("LOG_LEVEL",), "log_level", "info", "error", "error"),
    (("--log-format", "--zap-encoder"), ("LOG_FORMAT",), "log_format", "json", "console", "console"),
    (("--kube-api-timeout",), ("KUBE_API_TIMEOUT",), "kube_api_timeout", 30.0, "45s", 45.0),
    (
        ("--shutdown-grace-period",),
        ("SHUTDOWN_GRACE_PERIOD",),
        "shutdown_grace_period",
        30.0,
        "1m",
        60.0,
    ),
]


def read(settings: object, what: str) -> Any:
    """``name`` or ``name[key]`` of the parsed settings."""
    name, _, key = what.partition("[")
    value = getattr(settings, name)
    return value[key.rstrip("]")] if key else value


class Recording(Mapping[str, str]):
    """An environment that records every name the parser looks up."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.read.add(name)
        return self.values[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.read.add(name)
        return name in self.values

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the settings read named variables, never the whole environment")

    def __len__(self) -> int:
        return len(self.values)


def test_the_flags_are_exactly_the_pinned_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--help"], env={})
    assert exc.value.code == 0
    usage = capsys.readouterr().out.split("\n\n", 1)[0]
    first_flags = {flags[0] for flags, *_ in PINNED}
    assert set(re.findall(r"\[(--[a-z-]+)", usage)) == first_flags | {"--version"}


def test_the_environment_variables_read_are_exactly_the_pinned_ones() -> None:
    env = Recording({})
    parse_settings([], env=env)
    assert env.read == {var for _, variables, *_ in PINNED for var in variables}


@pytest.mark.parametrize(
    ("flags", "variables", "what", "default", "text", "value"), PINNED, ids=[row[0][0] for row in PINNED]
)
def test_each_flag_and_variable_sets_its_setting_and_the_default_holds(
    flags: tuple[str, ...], variables: tuple[str, ...], what: str, default: Any, text: str, value: Any
) -> None:
    assert read(parse_settings([], env={}), what) == default
    for flag in flags:
        assert read(parse_settings([f"{flag}={text}"], env={}), what) == value
    for i, var in enumerate(variables):
        # Each variable sets it, and an earlier one wins over a later one (set to the default here).
        later = {other: str(default) for other in variables[i + 1 :]}
        assert read(parse_settings([], env={**later, var: text}), what) == value, var

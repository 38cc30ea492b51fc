"""The ``pko`` command line: Go durations, flags over environment over defaults, usage errors, and
settings that reach the Manager's and the controllers' options (pure: no cluster)."""

from __future__ import annotations

import pytest

from pko.__main__ import parse_duration, parse_settings
from pko.controllers.options import ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.manager import ManagerOptions
from pko.machinery.serving import parse_bind_address

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

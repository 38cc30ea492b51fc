"""The operator process: ``pko`` (console script) or ``python -m pko``.

Flags keep the Go operator's names (so its Deployment arguments work unchanged) and each has an
environment variable; a flag given on the command line wins over its variable, which wins over
the default. Durations take Go's syntax (``60s``, ``1m30s``, ``500ms``) or plain seconds.

Exit status: 0 after a clean shutdown on SIGTERM/SIGINT; 1 when leadership was lost (the pod is
restarted and campaigns again, as a controller-runtime operator does) or the manager failed; a
second SIGTERM/SIGINT during shutdown exits 1 at once.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import structlog
from kubernetes_asyncio import client, config

from pko import defaults
from pko.api.meta import parse_go_duration
from pko.defaults import go_duration_text
from pko.logging import configure_logging
from pko.machinery.apiclient import new_api_client
from pko.machinery.controller import CONTROLLER_NAMES, DEFAULT_WORKERS
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.manager import LeaderElectionLost, Manager, ManagerOptions
from pko.version import VERSION

if TYPE_CHECKING:
    # Imported lazily at run time: importing pko.controllers imports the reconcilers, which may
    # log at import, and logging is configured only after the settings are parsed.
    from pko.controllers.options import AddressMode, ControllerOptions

__all__ = ["Settings", "load_client_configuration", "main", "parse_duration", "parse_settings"]

# The operator's defaults are stated once, in pko.defaults (also ManagerOptions', LeaderElectionConfig's,
# ControllerOptions' and RetrySettings').
DEFAULT_LEADER_ELECTION_ID = defaults.LEADER_ELECTION_ID  # the Go operator's Lease name
DEFAULT_NAMESPACE = defaults.OPERATOR_NAMESPACE
DEFAULT_SERVICE_ACCOUNT = defaults.OPERATOR_SERVICE_ACCOUNT
DEFAULT_AGENT_IMAGE = defaults.AGENT_IMAGE
ADDRESS_MODES = ("dns", "pod-ip", "static")
_LOG_LEVELS = ["debug", "info", "warn", "warning", "error", "critical"]


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (``1m30s``, ``500ms``; :func:`pko.api.meta.parse_go_duration`)
    or a plain number of seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_go_duration(text).total_seconds()
        except ValueError:
            raise ValueError(f"invalid duration {text!r} (use e.g. 45s, 1m30s, 500ms)") from None
    if seconds < 0:
        raise ValueError(f"duration {text!r} is negative")
    return seconds


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes", "on"):
        return True
    if value in ("0", "f", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bool_arg(text: str) -> bool:
    try:
        return _parse_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _retry_seconds_arg(text: str) -> float:
    """A retry base or cap: a duration of at least 1 s (status times have whole seconds)."""
    seconds = _duration_arg(text)
    if not (math.isfinite(seconds) and seconds >= defaults.MIN_RETRY_SECONDS):
        raise argparse.ArgumentTypeError(f"must be at least {defaults.MIN_RETRY_SECONDS:g}s, got {text!r}")
    return seconds


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _factor_arg(text: str) -> float:
    """A backoff factor: at least 1 (1 keeps the wait fixed; below 1 it would shrink)."""
    value = _finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (1: a fixed wait), got {value:g}")
    return value


def _jitter_arg(text: str) -> float:
    """A jitter fraction in [0, 1) (0.2: +-20%; 1 or more could make a wait zero or negative)."""
    value = _finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and less than 1 (0.2: +-20%), got {value:g}")
    return value


def _optional_positive_int(text: str) -> int | None:
    return _positive_int(text) if text.strip() else None


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the command line and environment decide."""

    kubeconfig: str | None
    leader_elect: bool
    leader_election_id: str
    leader_election_namespace: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    metrics_bind_address: str
    health_probe_bind_address: str
    program_fs_addr: str
    program_fs_adv_addr: str
    max_concurrent_reconciles: Mapping[str, int]
    log_level: str
    log_format: Literal["json", "console"]
    kube_api_timeout: float
    shutdown_grace_period: float
    operator_namespace: str = DEFAULT_NAMESPACE
    operator_service_account: str = DEFAULT_SERVICE_ACCOUNT
    agent_image: str = DEFAULT_AGENT_IMAGE
    agent_image_pull_policy: str = defaults.AGENT_IMAGE_PULL_POLICY
    workspace_image: str | None = None
    workspace_address_mode: str = defaults.WORKSPACE_ADDRESS_MODE
    workspace_static_address: str | None = None
    watch_namespace: str | None = None
    engine_event_log_level: str = defaults.ENGINE_EVENT_LOG_LEVEL
    flux_max_untar_size_bytes: int | None = None
    agent_unreachable_timeout: float = defaults.AGENT_UNREACHABLE_TIMEOUT
    max_update_failures: int = defaults.MAX_UPDATE_FAILURES
    transient_retry_base: float = defaults.TRANSIENT_RETRY_BASE
    transient_retry_factor: float = defaults.TRANSIENT_RETRY_FACTOR
    transient_retry_cap: float = defaults.TRANSIENT_RETRY_CAP
    transient_retry_jitter: float = defaults.TRANSIENT_RETRY_JITTER
    deterministic_retry_base: float = defaults.DETERMINISTIC_RETRY_BASE
    deterministic_retry_factor: float = defaults.DETERMINISTIC_RETRY_FACTOR
    max_retry_backoff: float = defaults.MAX_RETRY_BACKOFF

    def controller_options(self) -> ControllerOptions:
        """What the reconcilers are told (``pko.controllers.register``)."""
        from pko.controllers.options import ControllerOptions
        from pko.controllers.retrysettings import RetrySettings

        return ControllerOptions(
            operator_namespace=self.operator_namespace,
            operator_service_account=self.operator_service_account,
            agent_image=self.agent_image,
            agent_image_pull_policy=self.agent_image_pull_policy,
            default_workspace_image=self.workspace_image,
            workspace_address_mode=cast("AddressMode", self.workspace_address_mode),
            workspace_static_address=self.workspace_static_address,
            engine_event_log_level=self.engine_event_log_level,
            program_fs_addr=self.program_fs_addr,
            program_fs_adv_addr=self.program_fs_adv_addr,
            flux_max_untar_size_bytes=self.flux_max_untar_size_bytes,
            watch_namespace=self.watch_namespace,
            agent_unreachable_timeout=self.agent_unreachable_timeout,
            retry=RetrySettings(
                max_update_failures=self.max_update_failures,
                deterministic_base=self.deterministic_retry_base,
                deterministic_factor=self.deterministic_retry_factor,
                transient_base=self.transient_retry_base,
                transient_factor=self.transient_retry_factor,
                transient_cap=self.transient_retry_cap,
                jitter=self.transient_retry_jitter,
                max_backoff=self.max_retry_backoff,
            ),
        )

    def manager_options(self, identity: str) -> ManagerOptions:
        le = None
        if self.leader_elect:
            le = LeaderElectionConfig(
                lease_name=self.leader_election_id,
                lease_namespace=self.leader_election_namespace,
                identity=identity,
                lease_duration=self.lease_duration,
                renew_deadline=self.renew_deadline,
                retry_period=self.retry_period,
                predecessors=_predecessors(identity),
            )
        return ManagerOptions(
            metrics_bind_address=self.metrics_bind_address,
            health_probe_bind_address=self.health_probe_bind_address,
            leader_election=le,
            shutdown_grace_period=self.shutdown_grace_period,
            max_concurrent_reconciles=dict(self.max_concurrent_reconciles),
            namespace=self.watch_namespace,
            kube_api_timeout=self.kube_api_timeout,
        )


# Reconcile workers per controller kind (the flag's name): the Go operator's defaults.
_CONCURRENCY = tuple((name.removesuffix("-controller"), DEFAULT_WORKERS[name]) for name in CONTROLLER_NAMES)


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def env_or(name: str, default: str) -> str:
        return env.get(name) or default

    pod_namespace = env_or("POD_NAMESPACE", DEFAULT_NAMESPACE)
    p = argparse.ArgumentParser(
        prog="pko",
        description="The Pulumi Kubernetes Operator (pko): runs the Stack, Workspace, Update and Program "
        "controllers. Each flag can also be set by the environment variable named in its help; "
        "the flag wins.",
        allow_abbrev=False,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        default=env.get("KUBECONFIG") or None,
        help="kubeconfig file [KUBECONFIG]; without it: in-cluster config, else ~/.kube/config",
    )

    le = p.add_argument_group("leader election")
    le.add_argument(
        "--leader-elect",
        metavar="BOOL",
        nargs="?",
        const=True,
        type=_bool_arg,
        default=env_or("LEADER_ELECT", "false"),
        help="run controllers only while holding a Lease, so replicas can stand by [LEADER_ELECT]",
    )
    le.add_argument(
        "--leader-election-id",
        metavar="NAME",
        default=env_or("LEADER_ELECTION_ID", DEFAULT_LEADER_ELECTION_ID),
        help="name of the Lease (default %(default)s) [LEADER_ELECTION_ID]",
    )
    le.add_argument(
        "--leader-election-namespace",
        metavar="NAME",
        default=env_or("LEADER_ELECTION_NAMESPACE", pod_namespace),
        help="namespace of the Lease (default $POD_NAMESPACE, else "
        f"{DEFAULT_NAMESPACE}) [LEADER_ELECTION_NAMESPACE]",
    )
    for flag, var, seconds, what in (
        (
            "lease-duration",
            "LEADER_ELECTION_LEASE_DURATION",
            defaults.LEASE_DURATION,
            "how long followers wait before taking over an unrenewed Lease",
        ),
        (
            "renew-deadline",
            "LEADER_ELECTION_RENEW_DEADLINE",
            defaults.RENEW_DEADLINE,
            "how long the leader keeps trying to renew before it stops leading",
        ),
        (
            "retry-period",
            "LEADER_ELECTION_RETRY_PERIOD",
            defaults.RETRY_PERIOD,
            "time between Lease attempts",
        ),
    ):
        default = go_duration_text(seconds)
        le.add_argument(
            f"--leader-election-{flag}",
            type=_duration_arg,
            metavar="DURATION",
            default=env_or(var, default),
            help=f"{what} (default {default}) [{var}]",
        )

    srv = p.add_argument_group("endpoints (host:port; ':PORT' = every interface; '0' disables)")
    srv.add_argument(
        "--metrics-bind-address",
        metavar="ADDR",
        default=env_or("METRICS_BIND_ADDRESS", defaults.METRICS_BIND_ADDRESS),
        help="Prometheus /metrics (default %(default)s) [METRICS_BIND_ADDRESS]",
    )
    srv.add_argument(
        "--health-probe-bind-address",
        metavar="ADDR",
        default=env_or("HEALTH_PROBE_BIND_ADDRESS", defaults.HEALTH_PROBE_BIND_ADDRESS),
        help="/healthz and /readyz (default %(default)s) [HEALTH_PROBE_BIND_ADDRESS]",
    )
    srv.add_argument(
        "--program-fs-addr",
        metavar="ADDR",
        default=env_or("PROGRAM_FS_ADDR", defaults.PROGRAM_FS_ADDR),
        help="where the Program artifact server listens, on every replica (default %(default)s; "
        '"0" disables it) [PROGRAM_FS_ADDR]',
    )
    srv.add_argument(
        "--program-fs-adv-addr",
        metavar="ADDR",
        default=env_or("PROGRAM_FS_ADV_ADDR", ""),
        help="address workspaces use to reach the Program artifact server, host[:port] "
        "(default: this pod's name and the bound port) [PROGRAM_FS_ADV_ADDR]",
    )

    ops = p.add_argument_group("workspaces and the operator's identity")
    ops.add_argument(
        "--operator-namespace",
        metavar="NAME",
        default=pod_namespace,
        help=f"the operator's namespace (default {DEFAULT_NAMESPACE}) [POD_NAMESPACE]",
    )
    ops.add_argument(
        "--operator-service-account",
        metavar="NAME",
        default=env_or("POD_SA_NAME", DEFAULT_SERVICE_ACCOUNT),
        help="the operator's ServiceAccount, the identity of the tokens it presents to workspace "
        f"agents (default {DEFAULT_SERVICE_ACCOUNT}) [POD_SA_NAME]",
    )
    ops.add_argument(
        "--agent-image",
        metavar="IMAGE",
        default=env_or("AGENT_IMAGE", DEFAULT_AGENT_IMAGE),
        help="image of the workspace pods' bootstrap and fetch containers (default %(default)s) "
        "[AGENT_IMAGE]",
    )
    ops.add_argument(
        "--agent-image-pull-policy",
        default=env_or("AGENT_IMAGE_PULL_POLICY", defaults.AGENT_IMAGE_PULL_POLICY),
        choices=["Always", "IfNotPresent", "Never"],
        help="pull policy of the agent image (default %(default)s) [AGENT_IMAGE_PULL_POLICY]",
    )
    ops.add_argument(
        "--workspace-image",
        metavar="IMAGE",
        default=env.get("WORKSPACE_IMAGE") or None,
        help="Pulumi image of Workspaces that name none (default: the official image for the "
        "Workspace's security profile) [WORKSPACE_IMAGE]",
    )
    ops.add_argument(
        "--workspace-address-mode",
        default=env.get("WORKSPACE_ADDRESS_MODE") or None,
        choices=ADDRESS_MODES,
        help="how the operator reaches workspace agents: dns (the Service name, in a cluster), "
        "pod-ip (the pod's IP, outside the cluster DNS) or static (--workspace-localhost for every "
        "workspace) (default dns, static when --workspace-localhost is set) [WORKSPACE_ADDRESS_MODE]",
    )
    ops.add_argument(
        "--workspace-localhost",
        metavar="HOST:PORT",
        default=env.get("WORKSPACE_LOCALHOST") or None,
        help="the one agent address of static mode, e.g. a kubectl port-forward [WORKSPACE_LOCALHOST]",
    )
    ops.add_argument(
        "--watch-namespace",
        metavar="NAME",
        default=env.get("WATCH_NAMESPACE") or None,
        help="watch and reconcile only this namespace (default: all) [WATCH_NAMESPACE]",
    )
    ops.add_argument(
        "--engine-event-log-level",
        default=env_or("ENGINE_EVENT_LOG_LEVEL", defaults.ENGINE_EVENT_LOG_LEVEL),
        choices=_LOG_LEVELS,
        help="level at which Pulumi engine events are logged (default %(default)s) [ENGINE_EVENT_LOG_LEVEL]",
    )
    ops.add_argument(
        "--flux-max-untar-size-bytes",
        type=_optional_positive_int,
        metavar="N",
        default=env.get("FLUX_MAX_UNTAR_SIZE_BYTES") or None,
        help="largest Flux artifact a workspace unpacks, passed to its fetch container "
        "(default: the agent's) [FLUX_MAX_UNTAR_SIZE_BYTES]",
    )

    stk = p.add_argument_group(
        "stacks and updates (pko extensions; a Stack may override each retry setting: docs/retries.md)"
    )
    stk.add_argument(
        "--agent-unreachable-timeout",
        type=_duration_arg,
        metavar="DURATION",
        default=env_or("AGENT_UNREACHABLE_TIMEOUT", go_duration_text(defaults.AGENT_UNREACHABLE_TIMEOUT)),
        help="how long a running Update waits for its workspace agent to answer again before it "
        "ends Failed/AgentUnreachable (default %(default)s) [AGENT_UNREACHABLE_TIMEOUT]",
    )
    stk.add_argument(
        "--stack-max-update-failures",
        type=_non_negative_int,
        metavar="N",
        default=env_or("STACK_MAX_UPDATE_FAILURES", str(defaults.MAX_UPDATE_FAILURES)),
        help="retries of a deterministic failure (program, config, install, auth) before the Stack "
        "is Stalled; spec.maxUpdateFailures overrides (default %(default)s) [STACK_MAX_UPDATE_FAILURES]",
    )
    metavars = {_factor_arg: "FACTOR", _jitter_arg: "FRACTION"}
    for flag, var, parse, value, what in (
        (
            "transient-retry-base",
            "STACK_TRANSIENT_RETRY_BASE",
            _retry_seconds_arg,
            go_duration_text(defaults.TRANSIENT_RETRY_BASE),
            "wait before the first retry of a transient failure (network, 5xx, 429, lock, conflict); "
            "spec.retryPolicy.transient.baseSeconds overrides",
        ),
        (
            "transient-retry-factor",
            "STACK_TRANSIENT_RETRY_FACTOR",
            _factor_arg,
            f"{defaults.TRANSIENT_RETRY_FACTOR:g}",
            "how much that wait grows with each transient failure in a row (at least 1); "
            "spec.retryPolicy.transient.factor overrides",
        ),
        (
            "transient-retry-cap",
            "STACK_TRANSIENT_RETRY_CAP",
            _retry_seconds_arg,
            go_duration_text(defaults.TRANSIENT_RETRY_CAP),
            "longest wait before retrying a transient failure, after the jitter; "
            "spec.retryPolicy.transient.maxSeconds overrides",
        ),
        (
            "transient-retry-jitter",
            "STACK_TRANSIENT_RETRY_JITTER",
            _jitter_arg,
            f"{defaults.TRANSIENT_RETRY_JITTER:g}",
            "spread of each transient wait, a fraction either way (0.2: +-20%%, 0: none); "
            "spec.retryPolicy.transient.jitter overrides",
        ),
        (
            "deterministic-retry-base",
            "STACK_DETERMINISTIC_RETRY_BASE",
            _retry_seconds_arg,
            go_duration_text(defaults.DETERMINISTIC_RETRY_BASE),
            "wait before the first retry of a deterministic failure (program, config, install, auth); "
            "spec.retryPolicy.deterministic.baseSeconds overrides",
        ),
        (
            "deterministic-retry-factor",
            "STACK_DETERMINISTIC_RETRY_FACTOR",
            _factor_arg,
            f"{defaults.DETERMINISTIC_RETRY_FACTOR:g}",
            "how much that wait grows with each deterministic failure in a row (at least 1); "
            "spec.retryPolicy.deterministic.factor overrides",
        ),
        (
            "max-retry-backoff",
            "STACK_MAX_RETRY_BACKOFF",
            _retry_seconds_arg,
            go_duration_text(defaults.MAX_RETRY_BACKOFF),
            "longest wait before any retry (the cap of deterministic ones); "
            "spec.retryMaxBackoffDurationSeconds overrides",
        ),
    ):
        stk.add_argument(
            f"--stack-{flag}",
            type=parse,
            metavar=metavars.get(parse, "DURATION"),
            default=env_or(var, value),
            help=f"{what} (default {value}) [{var}]",
        )

    conc = p.add_argument_group("concurrency")
    for kind, workers in _CONCURRENCY:
        var = f"MAX_CONCURRENT_RECONCILES_{kind.upper()}"
        conc.add_argument(
            f"--max-concurrent-reconciles-{kind}",
            type=_positive_int,
            metavar="N",
            default=env.get(var) or env.get("MAX_CONCURRENT_RECONCILES") or str(workers),
            help=f"{kind} reconcile workers (default {workers}) [{var}, else MAX_CONCURRENT_RECONCILES]",
        )

    run = p.add_argument_group("process")
    run.add_argument(
        "--log-level",
        "--zap-log-level",
        default=env_or("LOG_LEVEL", "info"),
        choices=_LOG_LEVELS,
        help="lowest level logged (default %(default)s) [LOG_LEVEL]",
    )
    run.add_argument(
        "--log-format",
        "--zap-encoder",
        default=env_or("LOG_FORMAT", "json"),
        choices=["json", "console"],
        help="json (one object per line) or console (default %(default)s) [LOG_FORMAT]",
    )
    run.add_argument(
        "--kube-api-timeout",
        type=_duration_arg,
        metavar="DURATION",
        default=env_or("KUBE_API_TIMEOUT", go_duration_text(defaults.KUBE_API_TIMEOUT)),
        help="timeout of Kubernetes API requests (default %(default)s) [KUBE_API_TIMEOUT]",
    )
    run.add_argument(
        "--shutdown-grace-period",
        type=_duration_arg,
        metavar="DURATION",
        default=env_or("SHUTDOWN_GRACE_PERIOD", go_duration_text(defaults.SHUTDOWN_GRACE_PERIOD)),
        help="on SIGTERM, how long in-flight reconciles may finish before they are cancelled "
        "(default %(default)s) [SHUTDOWN_GRACE_PERIOD]",
    )
    return p


def parse_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``argv`` (default ``sys.argv[1:]``) and ``env`` (default ``os.environ``).

    Invalid input (flags or environment) exits with status 2 and a message, as argparse does:
    argparse converts string defaults, i.e. the environment's values, with the flag's type.
    """
    environ = os.environ if env is None else env
    parser = _parser(environ)
    try:
        args = parser.parse_args(argv)
        settings = Settings(
            kubeconfig=args.kubeconfig,
            leader_elect=bool(args.leader_elect),
            leader_election_id=args.leader_election_id,
            leader_election_namespace=args.leader_election_namespace,
            lease_duration=args.leader_election_lease_duration,
            renew_deadline=args.leader_election_renew_deadline,
            retry_period=args.leader_election_retry_period,
            metrics_bind_address=args.metrics_bind_address,
            health_probe_bind_address=args.health_probe_bind_address,
            program_fs_addr=args.program_fs_addr,
            program_fs_adv_addr=args.program_fs_adv_addr,
            max_concurrent_reconciles={
                f"{kind}-controller": getattr(args, f"max_concurrent_reconciles_{kind}")
                for kind, _ in _CONCURRENCY
            },
            log_level=args.log_level,
            log_format=cast(Literal["json", "console"], args.log_format),
            kube_api_timeout=args.kube_api_timeout,
            shutdown_grace_period=args.shutdown_grace_period,
            operator_namespace=args.operator_namespace,
            operator_service_account=args.operator_service_account,
            agent_image=args.agent_image,
            agent_image_pull_policy=args.agent_image_pull_policy,
            workspace_image=args.workspace_image,
            workspace_address_mode=args.workspace_address_mode
            or ("static" if args.workspace_localhost else defaults.WORKSPACE_ADDRESS_MODE),
            workspace_static_address=args.workspace_localhost,
            watch_namespace=args.watch_namespace,
            engine_event_log_level=args.engine_event_log_level,
            flux_max_untar_size_bytes=args.flux_max_untar_size_bytes,
            agent_unreachable_timeout=args.agent_unreachable_timeout,
            max_update_failures=args.stack_max_update_failures,
            transient_retry_base=args.stack_transient_retry_base,
            transient_retry_factor=args.stack_transient_retry_factor,
            transient_retry_cap=args.stack_transient_retry_cap,
            transient_retry_jitter=args.stack_transient_retry_jitter,
            deterministic_retry_base=args.stack_deterministic_retry_base,
            deterministic_retry_factor=args.stack_deterministic_retry_factor,
            max_retry_backoff=args.stack_max_retry_backoff,
        )
        # argparse checks choices on the command line only; the environment's values are checked here.
        for action in parser._actions:
            value = getattr(args, action.dest, None)
            if action.choices is not None and value is not None and value not in action.choices:
                raise ValueError(f"{action.option_strings[0]}: invalid choice {value!r}")
        if settings.workspace_address_mode == "static" and not settings.workspace_static_address:
            raise ValueError(
                "--workspace-address-mode=static needs --workspace-localhost (WORKSPACE_LOCALHOST)"
            )
        if settings.leader_elect:
            settings.manager_options("validate")  # durations must be consistent
    except ValueError as exc:
        parser.error(str(exc))
    return settings


def _home_kubeconfig() -> str:
    return str(Path("~/.kube/config").expanduser())


async def load_client_configuration(kubeconfig: str | None) -> client.Configuration:
    """controller-runtime's order: ``--kubeconfig``/``$KUBECONFIG``, in-cluster, ``~/.kube/config``."""
    cfg = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=_home_kubeconfig(), client_configuration=cfg)
    return cfg


def _predecessors(identity: str) -> str:
    """In a pod, the identities of this container's earlier runs (its pod's name): their Lease is
    taken at once after a restart. Elsewhere none: two processes on one host share a hostname."""
    pod = os.environ.get("POD_NAME")
    return f"{pod}_" if pod and identity.startswith(f"{pod}_") else ""


def _identity() -> str:
    """Unique per process (hostname_uuid, as controller-runtime): two processes never share a term."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


async def _serve(settings: Settings) -> int:
    """Run managers until a signal: one that loses its lease (the apiserver away past the renew
    deadline, the process frozen, another replica taking over) has stopped every reconcile when
    ``run`` raises, so a new manager campaigns again in this process. Exiting instead (as
    controller-runtime does) makes the kubelet restart the container with its crash-loop backoff,
    which grows to 5 minutes when an apiserver restarts several times within 10 minutes (an upgrade):
    the operator would sit out that backoff after the apiserver is back."""
    log = structlog.get_logger("pko")
    from pko.controllers import register  # after logging is configured: reconcilers may log at import

    cfg = await load_client_configuration(settings.kubeconfig)
    async with new_api_client(cfg) as api:
        loop = asyncio.get_running_loop()
        signals_seen = 0
        current: Manager | None = None

        def on_signal(signum: int) -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen > 1:
                log.warning("second signal during shutdown; exiting now", signal=signal.Signals(signum).name)
                os._exit(1)
            log.info(
                "signal received; shutting down",
                signal=signal.Signals(signum).name,
                grace_period=settings.shutdown_grace_period,
            )
            if current is not None:
                current.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        log.info(
            "starting",
            server=cfg.host,
            leader_elect=settings.leader_elect,
            watch_namespace=settings.watch_namespace or "*",
            workspace_address_mode=settings.workspace_address_mode,
            program_fs_addr=settings.program_fs_addr,
        )
        try:
            while not signals_seen:
                current = Manager(api, settings.manager_options(_identity()))
                register(current, settings.controller_options())
                try:
                    await current.run()
                except LeaderElectionLost as exc:
                    if signals_seen:
                        break
                    log.warning("leader election lost; campaigning again", error=str(exc))
                    continue
                break
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``pko`` console script."""
    settings = parse_settings(argv)
    configure_logging(settings.log_level, settings.log_format)
    try:
        code = asyncio.run(_serve(settings))
    except Exception:
        structlog.get_logger("pko").exception("manager failed")
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()

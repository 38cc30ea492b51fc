"""Every setting of the operator process, each declared once, and the Options objects built from them.

Flag names keep the Go operator's (so its Deployment arguments work unchanged) and each setting has an
environment variable; a flag given on the command line wins over its variable, which wins over the
default. Defaults are :mod:`pko.defaults`' (which the Options classes default to as well).
``pko/devtools/apiref_settings.py`` writes the settings table of docs/operator.md from these declarations and
test/test_settings_names.py pins every flag name, variable name and default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from pko import defaults
from pko.defaults import go_duration_text
from pko.machinery.controller import DEFAULT_WORKERS
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.manageroptions import ManagerOptions
from pko.settings.kinds import (
    BOOL,
    COUNT,
    DURATION,
    FACTOR,
    FRACTION,
    NAMES,
    RETRY_DURATION,
    WORKERS,
    choice,
    optional,
    text,
)
from pko.settings.setting import Group, Setting, fed_fields

if TYPE_CHECKING:
    # Imported when called: importing pko.controllers imports the reconcilers, which may log at
    # import, and logging is configured only after the settings are parsed.
    from pko.controllers.options import AddressMode, ControllerOptions

__all__ = ["DECLARED", "GROUPS", "LOG_LEVELS", "Settings"]

LOG_LEVELS = ("debug", "info", "warn", "warning", "error", "critical")

API = Group("the Kubernetes API")
LEADER = Group("leader election")
ENDPOINTS = Group("endpoints", "each a host:port; ':PORT' listens on every interface, '0' turns it off")
WORKSPACES = Group("workspaces and the operator's identity")
STACKS = Group(
    "stacks and updates", "extensions of pko; a Stack may override each retry setting: docs/retries.md"
)
CONCURRENCY = Group("concurrency")
PROCESS = Group("process")
GROUPS = (API, LEADER, ENDPOINTS, WORKSPACES, STACKS, CONCURRENCY, PROCESS)


def _workers(kind: str) -> Setting[int]:
    """The reconcile workers of one controller (the Go operator's flag and default)."""
    controller = f"{kind}-controller"
    return Setting(
        f"--max-concurrent-reconciles-{kind}",
        WORKERS,
        (f"MAX_CONCURRENT_RECONCILES_{kind.upper()}", "MAX_CONCURRENT_RECONCILES"),
        str(DEFAULT_WORKERS[controller]),
        f"{kind} reconcile workers",
        CONCURRENCY,
        feeds=(f"ManagerOptions.max_concurrent_reconciles[{controller}]",),
    )


def _address_mode(values: Mapping[str, Any]) -> str:
    """The Go operator's rule: a static address given selects static mode."""
    return "static" if values["workspace_static_address"] else defaults.WORKSPACE_ADDRESS_MODE


class Settings:
    """Everything the command line and environment decide (:func:`pko.settings.cli.parse_settings`)."""

    __slots__ = ("values",)

    # --- the Kubernetes API -----------------------------------------------------------------------
    kubeconfig = Setting(
        "--kubeconfig",
        optional(text("FILE", "path")),
        ("KUBECONFIG",),
        "",
        "kubeconfig file",
        API,
        shown="in-cluster config, else ~/.kube/config",
    )
    kube_api_timeout = Setting(
        "--kube-api-timeout",
        DURATION,
        ("KUBE_API_TIMEOUT",),
        go_duration_text(defaults.KUBE_API_TIMEOUT),
        "timeout of Kubernetes API requests",
        API,
        feeds=("ManagerOptions.kube_api_timeout",),
    )
    # --- leader election --------------------------------------------------------------------------
    leader_elect = Setting(
        "--leader-elect",
        BOOL,
        ("LEADER_ELECT",),
        "false",
        "run controllers only while holding a Lease, so replicas can stand by",
        LEADER,
    )
    leader_election_id = Setting(
        "--leader-election-id",
        text("NAME", "name"),
        ("LEADER_ELECTION_ID",),
        defaults.LEADER_ELECTION_ID,
        "name of the Lease, the Go operator's",
        LEADER,
        feeds=("LeaderElectionConfig.lease_name",),
    )
    leader_election_namespace = Setting(
        "--leader-election-namespace",
        text("NAME", "name"),
        ("LEADER_ELECTION_NAMESPACE", "POD_NAMESPACE"),
        defaults.OPERATOR_NAMESPACE,
        "namespace of the Lease",
        LEADER,
        feeds=("LeaderElectionConfig.lease_namespace",),
    )
    lease_duration = Setting(
        "--leader-election-lease-duration",
        DURATION,
        ("LEADER_ELECTION_LEASE_DURATION",),
        go_duration_text(defaults.LEASE_DURATION),
        "how long followers wait before taking over an unrenewed Lease",
        LEADER,
        feeds=("LeaderElectionConfig.lease_duration",),
    )
    renew_deadline = Setting(
        "--leader-election-renew-deadline",
        DURATION,
        ("LEADER_ELECTION_RENEW_DEADLINE",),
        go_duration_text(defaults.RENEW_DEADLINE),
        "how long the leader keeps trying to renew before it stops leading",
        LEADER,
        feeds=("LeaderElectionConfig.renew_deadline",),
    )
    retry_period = Setting(
        "--leader-election-retry-period",
        DURATION,
        ("LEADER_ELECTION_RETRY_PERIOD",),
        go_duration_text(defaults.RETRY_PERIOD),
        "time between Lease attempts",
        LEADER,
        feeds=("LeaderElectionConfig.retry_period",),
    )
    # --- endpoints --------------------------------------------------------------------------------
    metrics_bind_address = Setting(
        "--metrics-bind-address",
        text("ADDR", "host:port"),
        ("METRICS_BIND_ADDRESS",),
        defaults.METRICS_BIND_ADDRESS,
        "Prometheus /metrics",
        ENDPOINTS,
        feeds=("ManagerOptions.metrics_bind_address",),
    )
    metrics_secure = Setting(
        "--metrics-secure",
        BOOL,
        ("METRICS_SECURE",),
        "true",
        "serve /metrics over HTTPS to scrapers whose token may get /metrics (a TokenReview and a "
        "SubjectAccessReview each, cached briefly); false: plain HTTP to anyone",
        ENDPOINTS,
        feeds=("ManagerOptions.metrics_secure",),
    )
    metrics_cert_dir = Setting(
        "--metrics-cert-dir",
        optional(text("DIR", "path")),
        ("METRICS_CERT_DIR",),
        "",
        "directory holding the metrics server's tls.crt and tls.key (e.g. a mounted cert-manager Secret), "
        "reloaded when they change",
        ENDPOINTS,
        feeds=("ManagerOptions.metrics_cert_dir",),
        shown="a self-signed certificate made at start",
    )
    health_probe_bind_address = Setting(
        "--health-probe-bind-address",
        text("ADDR", "host:port"),
        ("HEALTH_PROBE_BIND_ADDRESS",),
        defaults.HEALTH_PROBE_BIND_ADDRESS,
        "/healthz and /readyz",
        ENDPOINTS,
        feeds=("ManagerOptions.health_probe_bind_address",),
    )
    program_fs_addr = Setting(
        "--program-fs-addr",
        text("ADDR", "host:port"),
        ("PROGRAM_FS_ADDR",),
        defaults.PROGRAM_FS_ADDR,
        'where the Program artifact server listens, on every replica; "0" disables it',
        ENDPOINTS,
        feeds=("ControllerOptions.program_fs_addr",),
    )
    program_fs_adv_addr = Setting(
        "--program-fs-adv-addr",
        text("ADDR", "host[:port]"),
        ("PROGRAM_FS_ADV_ADDR",),
        "",
        "address workspaces use to reach the Program artifact server, host[:port]",
        ENDPOINTS,
        feeds=("ControllerOptions.program_fs_adv_addr",),
        shown="this pod's name and the bound port",
    )
    # --- workspaces and the operator's identity ---------------------------------------------------
    operator_namespace = Setting(
        "--operator-namespace",
        text("NAME", "name"),
        ("POD_NAMESPACE",),
        defaults.OPERATOR_NAMESPACE,
        "the operator's namespace",
        WORKSPACES,
        feeds=("ControllerOptions.operator_namespace",),
    )
    operator_service_account = Setting(
        "--operator-service-account",
        text("NAME", "name"),
        ("POD_SA_NAME",),
        defaults.OPERATOR_SERVICE_ACCOUNT,
        "the operator's ServiceAccount, the identity of the tokens it presents to workspace agents",
        WORKSPACES,
        feeds=("ControllerOptions.operator_service_account",),
    )
    stack_secrets_role = Setting(
        "--stack-secrets-role",
        text("NAME", "name"),
        ("STACK_SECRETS_ROLE",),
        defaults.STACK_SECRETS_ROLE,
        "the ClusterRole a refused Secret or ConfigMap names, to bind in the Stack's namespace (the "
        "secrets-per-namespace install's; the Helm chart sets the name it gives it)",
        WORKSPACES,
        feeds=("ControllerOptions.stack_secrets_role",),
    )
    agent_image = Setting(
        "--agent-image",
        text("IMAGE", "image"),
        ("AGENT_IMAGE",),
        defaults.AGENT_IMAGE,
        "image of the workspace pods' bootstrap and fetch containers, built from agent/Dockerfile",
        WORKSPACES,
        feeds=("ControllerOptions.agent_image",),
    )
    agent_image_pull_policy = Setting(
        "--agent-image-pull-policy",
        choice("Always", "IfNotPresent", "Never"),
        ("AGENT_IMAGE_PULL_POLICY",),
        defaults.AGENT_IMAGE_PULL_POLICY,
        "pull policy of the agent image",
        WORKSPACES,
        feeds=("ControllerOptions.agent_image_pull_policy",),
    )
    workspace_image = Setting(
        "--workspace-image",
        optional(text("IMAGE", "image")),
        ("WORKSPACE_IMAGE",),
        "",
        "Pulumi image of Workspaces that name none",
        WORKSPACES,
        feeds=("ControllerOptions.default_workspace_image",),
        shown="by the Workspace's security profile: pulumi/pulumi:latest-nonroot (restricted), "
        "pulumi/pulumi:latest (baseline)",
    )
    default_workspace_template = Setting(
        "--default-workspace-template",
        optional(text("NAMESPACE/NAME", "a WorkspaceTemplate's namespace/name (bare name: the operator's)")),
        ("DEFAULT_WORKSPACE_TEMPLATE",),
        "",
        "WorkspaceTemplate merged into every Stack's Workspace, under the Stack's own (docs/workspaces.md)",
        WORKSPACES,
        feeds=("ControllerOptions.default_workspace_template",),
        shown="none",
    )
    workspace_address_mode = Setting(
        "--workspace-address-mode",
        optional(choice("dns", "pod-ip", "static")),
        ("WORKSPACE_ADDRESS_MODE",),
        "",
        "how the operator reaches workspace agents: dns (the Service name, in a cluster), "
        "pod-ip (the pod's IP, outside the cluster DNS) or static (--workspace-localhost for every "
        "workspace)",
        WORKSPACES,
        feeds=("ControllerOptions.workspace_address_mode",),
        shown=f"{defaults.WORKSPACE_ADDRESS_MODE}, static when --workspace-localhost is set",
        unset=_address_mode,
    )
    workspace_static_address = Setting(
        "--workspace-localhost",
        optional(text("HOST:PORT", "host:port")),
        ("WORKSPACE_LOCALHOST",),
        "",
        "the one agent address of static mode, e.g. a kubectl port-forward",
        WORKSPACES,
        feeds=("ControllerOptions.workspace_static_address",),
    )
    workspace_network_policy = Setting(
        "--workspace-network-policy",
        BOOL,
        ("WORKSPACE_NETWORK_POLICY",),
        "true",
        "give each Workspace a NetworkPolicy that lets only the operator's pods (in its namespace) "
        "reach the agent's gRPC port (its metrics port: any scraper, whose token the agent reviews); "
        "false for an operator outside the cluster network (docs/security.md)",
        WORKSPACES,
        feeds=("ControllerOptions.workspace_network_policy",),
    )
    workspace_metrics = Setting(
        "--workspace-metrics",
        choice("https", "http", "off"),
        ("WORKSPACE_METRICS",),
        "https",
        "the workspace agents' own /metrics, on container port https-metrics (8443): https as the "
        "operator's (a self-signed certificate, a TokenReview and a SubjectAccessReview per scraper); "
        "http: plain HTTP to anyone (port http-metrics); off: not served (docs/metrics.md)",
        WORKSPACES,
        feeds=("ControllerOptions.workspace_metrics",),
    )
    watch_namespace = Setting(
        "--watch-namespace",
        optional(text("NAME", "name")),
        ("WATCH_NAMESPACE",),
        "",
        "watch and reconcile only this namespace",
        WORKSPACES,
        feeds=("ControllerOptions.watch_namespace", "ManagerOptions.namespace"),
        shown="all",
    )
    watch_namespaces = Setting(
        "--watch-namespaces",
        NAMES,
        ("WATCH_NAMESPACES",),
        "",
        "watch and reconcile only these namespaces (with --watch-namespace: both), each listed and "
        "watched apart, so Roles in them suffice (docs/install.md, namespaced install)",
        WORKSPACES,
        feeds=("ManagerOptions.namespaces",),
        shown="all",
    )
    watch_label_selector = Setting(
        "--watch-label-selector",
        optional(text("SELECTOR", "label selector")),
        ("WATCH_LABEL_SELECTOR",),
        "",
        "reconcile only the Stacks this label selector matches; a shard: pko.pulumi.com/shard=a, the "
        "default shard !pko.pulumi.com/shard (their Workspaces and Updates too, and a Lease each: "
        "docs/sharding.md)",
        WORKSPACES,
        feeds=("ManagerOptions.label_selectors[stacks.pulumi.com]",),
        shown="every Stack",
    )
    engine_event_log_level = Setting(
        "--engine-event-log-level",
        choice(*LOG_LEVELS),
        ("ENGINE_EVENT_LOG_LEVEL",),
        defaults.ENGINE_EVENT_LOG_LEVEL,
        "level at which Pulumi engine events are logged",
        WORKSPACES,
        feeds=("ControllerOptions.engine_event_log_level",),
    )
    flux_max_untar_size_bytes = Setting(
        "--flux-max-untar-size-bytes",
        optional(WORKERS),
        ("FLUX_MAX_UNTAR_SIZE_BYTES",),
        "",
        "largest Flux artifact a workspace unpacks, passed to its fetch container",
        WORKSPACES,
        feeds=("ControllerOptions.flux_max_untar_size_bytes",),
        shown="the agent's",
    )
    # --- stacks and updates -----------------------------------------------------------------------
    agent_unreachable_timeout = Setting(
        "--agent-unreachable-timeout",
        DURATION,
        ("AGENT_UNREACHABLE_TIMEOUT",),
        go_duration_text(defaults.AGENT_UNREACHABLE_TIMEOUT),
        "how long a running Update waits for its workspace agent to answer again before it ends "
        "Failed/AgentUnreachable",
        STACKS,
        feeds=("ControllerOptions.agent_unreachable_timeout",),
    )
    max_update_failures = Setting(
        "--stack-max-update-failures",
        COUNT,
        ("STACK_MAX_UPDATE_FAILURES",),
        str(defaults.MAX_UPDATE_FAILURES),
        "retries of a deterministic failure (program, config, install, auth) before the Stack is Stalled",
        STACKS,
        overrides="spec.maxUpdateFailures",
        feeds=("RetrySettings.max_update_failures",),
    )
    transient_retry_base = Setting(
        "--stack-transient-retry-base",
        RETRY_DURATION,
        ("STACK_TRANSIENT_RETRY_BASE",),
        go_duration_text(defaults.TRANSIENT_RETRY_BASE),
        "wait before the first retry of a transient failure (network, 5xx, 429, lock, conflict)",
        STACKS,
        overrides="spec.retryPolicy.transient.baseSeconds",
        feeds=("RetrySettings.transient_base",),
    )
    transient_retry_factor = Setting(
        "--stack-transient-retry-factor",
        FACTOR,
        ("STACK_TRANSIENT_RETRY_FACTOR",),
        f"{defaults.TRANSIENT_RETRY_FACTOR:g}",
        "how much that wait grows with each transient failure in a row (at least 1)",
        STACKS,
        overrides="spec.retryPolicy.transient.factor",
        feeds=("RetrySettings.transient_factor",),
    )
    transient_retry_cap = Setting(
        "--stack-transient-retry-cap",
        RETRY_DURATION,
        ("STACK_TRANSIENT_RETRY_CAP",),
        go_duration_text(defaults.TRANSIENT_RETRY_CAP),
        "longest wait before retrying a transient failure, after the jitter",
        STACKS,
        overrides="spec.retryPolicy.transient.maxSeconds",
        feeds=("RetrySettings.transient_cap",),
    )
    transient_retry_jitter = Setting(
        "--stack-transient-retry-jitter",
        FRACTION,
        ("STACK_TRANSIENT_RETRY_JITTER",),
        f"{defaults.TRANSIENT_RETRY_JITTER:g}",
        "spread of each transient wait, a fraction either way (0.2: +-20%, 0: none)",
        STACKS,
        overrides="spec.retryPolicy.transient.jitter",
        feeds=("RetrySettings.jitter",),
    )
    deterministic_retry_base = Setting(
        "--stack-deterministic-retry-base",
        RETRY_DURATION,
        ("STACK_DETERMINISTIC_RETRY_BASE",),
        go_duration_text(defaults.DETERMINISTIC_RETRY_BASE),
        "wait before the first retry of a deterministic failure (program, config, install, auth)",
        STACKS,
        overrides="spec.retryPolicy.deterministic.baseSeconds",
        feeds=("RetrySettings.deterministic_base",),
    )
    deterministic_retry_factor = Setting(
        "--stack-deterministic-retry-factor",
        FACTOR,
        ("STACK_DETERMINISTIC_RETRY_FACTOR",),
        f"{defaults.DETERMINISTIC_RETRY_FACTOR:g}",
        "how much that wait grows with each deterministic failure in a row (at least 1)",
        STACKS,
        overrides="spec.retryPolicy.deterministic.factor",
        feeds=("RetrySettings.deterministic_factor",),
    )
    max_retry_backoff = Setting(
        "--stack-max-retry-backoff",
        RETRY_DURATION,
        ("STACK_MAX_RETRY_BACKOFF",),
        go_duration_text(defaults.MAX_RETRY_BACKOFF),
        "longest wait before any retry (the cap of deterministic ones)",
        STACKS,
        overrides="spec.retryMaxBackoffDurationSeconds",
        feeds=("RetrySettings.max_backoff",),
    )
    allow_insecure_git_credentials = Setting(
        "--allow-insecure-git-credentials",
        BOOL,
        ("ALLOW_INSECURE_GIT_CREDENTIALS",),
        "false",
        "run Stacks whose projectRepo is plain http:// with credentials (sent unencrypted); false: "
        "such a Stack is Stalled and nothing is sent. Either way it carries an InsecureTransport "
        "condition and a Warning Event",
        STACKS,
        feeds=("ControllerOptions.allow_insecure_git_credentials",),
    )
    events_address = Setting(
        "--events-address",
        optional(text("URL", "URL")),
        ("EVENTS_ADDRESS",),
        "",
        "also POST every Event about a Stack, as a Flux event, to this URL: Flux's notification-controller, "
        "e.g. http://notification-controller.flux-system.svc.cluster.local./ (docs/gitops.md)",
        STACKS,
        feeds=("ControllerOptions.events_address",),
        shown="none",
    )
    # --- concurrency: one per controller (pko.machinery.controller.CONTROLLER_NAMES) --------------
    max_concurrent_reconciles_stack = _workers("stack")
    max_concurrent_reconciles_workspace = _workers("workspace")
    max_concurrent_reconciles_update = _workers("update")
    max_concurrent_reconciles_program = _workers("program")
    # --- process ----------------------------------------------------------------------------------
    log_level = Setting(
        "--log-level",
        choice(*LOG_LEVELS),
        ("LOG_LEVEL",),
        "info",
        "lowest level logged",
        PROCESS,
        aliases=("--zap-log-level",),
    )
    log_format = Setting(
        "--log-format",
        choice("json", "console"),
        ("LOG_FORMAT",),
        "json",
        "json (one object per line) or console",
        PROCESS,
        aliases=("--zap-encoder",),
    )
    shutdown_grace_period = Setting(
        "--shutdown-grace-period",
        DURATION,
        ("SHUTDOWN_GRACE_PERIOD",),
        go_duration_text(defaults.SHUTDOWN_GRACE_PERIOD),
        "on SIGTERM, how long in-flight reconciles may finish before they are cancelled",
        PROCESS,
        feeds=("ManagerOptions.shutdown_grace_period",),
    )

    def __init__(self, values: Mapping[str, Any]) -> None:
        missing = {s.name for s in DECLARED} - values.keys()
        if missing:
            raise ValueError(f"settings without a value: {sorted(missing)}")
        self.values: Mapping[str, Any] = dict(values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self.values == other.values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.values.items())))

    def __repr__(self) -> str:
        return f"Settings({dict(self.values)!r})"

    @property
    def max_concurrent_reconciles(self) -> Mapping[str, int]:
        """Reconcile workers by controller name."""
        workers: Mapping[str, int] = self._fed("ManagerOptions")["max_concurrent_reconciles"]
        return workers

    def _fed(self, target: str) -> dict[str, Any]:
        return fed_fields(self, DECLARED, target)

    def controller_options(self) -> ControllerOptions:
        """What the reconcilers are told (``pko.controllers.register``)."""
        from pko.controllers.options import ControllerOptions
        from pko.controllers.retrysettings import RetrySettings

        fields = self._fed("ControllerOptions")
        fields["workspace_address_mode"] = cast("AddressMode", fields["workspace_address_mode"])
        return ControllerOptions(**fields, retry=RetrySettings(**self._fed("RetrySettings")))

    def manager_options(self, identity: str) -> ManagerOptions:
        """How the manager runs; with leader election (``--leader-elect``), as ``identity``."""
        from pko.controllers.sharding import child_selectors, lease_name

        election = None
        if self.leader_elect:
            lease = self._fed("LeaderElectionConfig")
            # One Lease per shard (pko.controllers.sharding): the selector's digest suffixes the name.
            lease["lease_name"] = lease_name(lease["lease_name"], self.watch_label_selector)
            election = LeaderElectionConfig(**lease, identity=identity, predecessors=_predecessors(identity))
        fields = self._fed("ManagerOptions")
        # A selector left unset selects everything: no entry (e.g. --watch-label-selector).
        fields["label_selectors"] = {
            **child_selectors(self.watch_label_selector),
            **{k: v for k, v in fields["label_selectors"].items() if v},
        }
        return ManagerOptions(**fields, leader_election=election)


DECLARED: tuple[Setting[Any], ...] = tuple(v for v in vars(Settings).values() if isinstance(v, Setting))


def _predecessors(identity: str) -> str:
    """In a pod, the identities of this container's earlier runs (its pod's name): their Lease is
    taken at once after a restart. Elsewhere none: two processes on one host share a hostname."""
    pod = os.environ.get("POD_NAME")
    return f"{pod}_" if pod and identity.startswith(f"{pod}_") else ""

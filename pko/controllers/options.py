"""Operator-wide settings the reconcilers share. The operator builds them from its declared settings
(:meth:`pko.settings.operator.Settings.controller_options`: each field's flag, variable and default
are declared there); tests and tools build them directly, with the same defaults (:mod:`pko.defaults`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pko import defaults
from pko.api.workspace import DEFAULT_IMAGES, SecurityProfile
from pko.controllers.retrysettings import RetrySettings
from pko.machinery.manager import Manager
from pko.tokens import TokenSource

AddressMode = Literal["dns", "pod-ip", "static"]
# How workspace agents serve their own /metrics (pko.controllers.workspace.podspec.metrics_args).
WorkspaceMetrics = Literal["https", "http", "off"]


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """What every reconciler may need to know about the operator it runs in.

    ``workspace_address_mode`` says how the operator reaches a workspace agent: ``dns`` (the Service
    name ``<ws>-workspace.<ns>.svc.cluster.local:50051``, what runs in a cluster), ``pod-ip`` (the
    workspace pod's IP, for an operator outside the cluster network's DNS, e.g. on a developer
    machine or a cluster without DNS) or ``static`` (one fixed ``host:port`` for every workspace,
    the Go operator's ``WORKSPACE_LOCALHOST``, e.g. with ``kubectl port-forward``).
    """

    operator_namespace: str = defaults.OPERATOR_NAMESPACE
    # The operator's own identity: TokenRequest tokens for the agents are minted for it (POD_SA_NAME).
    operator_service_account: str = defaults.OPERATOR_SERVICE_ACCOUNT
    # The ClusterRole a refused Secret or ConfigMap tells to bind (STACK_SECRETS_ROLE; the chart
    # sets the name it gives the secrets-per-namespace role).
    stack_secrets_role: str = defaults.STACK_SECRETS_ROLE
    agent_image: str = defaults.AGENT_IMAGE
    agent_image_pull_policy: str = defaults.AGENT_IMAGE_PULL_POLICY
    # The Pulumi image of a Workspace that names none (None: the Go operator's default per profile).
    default_workspace_image: str | None = None
    # The WorkspaceTemplate under every Stack's own, "namespace/name" (a bare name: this operator's
    # namespace); None: none.
    default_workspace_template: str | None = None
    workspace_address_mode: AddressMode = defaults.WORKSPACE_ADDRESS_MODE
    workspace_static_address: str | None = None
    # Level at which Pulumi engine events are written to the operator's log.
    engine_event_log_level: str = defaults.ENGINE_EVENT_LOG_LEVEL
    # Where the Program artifact server listens (--program-fs-addr; "0" disables it).
    program_fs_addr: str = defaults.PROGRAM_FS_ADDR
    # Where workspace pods fetch Program artifacts from (the Program artifact server's advertised
    # address, --program-fs-adv-addr; empty: this host's name and the bound port).
    program_fs_adv_addr: str = ""
    # Passed through to the fetch init container (FLUX_MAX_UNTAR_SIZE_BYTES), when set.
    flux_max_untar_size_bytes: int | None = None
    # Run Stacks that send git credentials over plain http:// (else they are Stalled, nothing sent).
    allow_insecure_git_credentials: bool = False
    # One NetworkPolicy per Workspace admitting only the operator's pods to its agent's port.
    workspace_network_policy: bool = True
    # The agents' /metrics: HTTPS with token reviews (the default), plain HTTP, or not served.
    workspace_metrics: WorkspaceMetrics = "https"
    # Limit every informer to one namespace (None: the whole cluster).
    watch_namespace: str | None = None
    # How long a running Update waits for its unreachable agent before it ends AgentUnreachable.
    agent_unreachable_timeout: float = defaults.AGENT_UNREACHABLE_TIMEOUT
    # Where Stack Events are also POSTed as Flux events (pko.controllers.fluxevents); None: nowhere.
    events_address: str | None = None
    # Operator-wide retry defaults for failed Stack operations (a Stack overrides any of them).
    retry: RetrySettings = field(default_factory=RetrySettings)

    def operator_tokens(self, manager: Manager) -> TokenSource:
        """The operator's TokenRequest token source (one per operator, shared by the controllers
        that call agents; each builds its own only when run alone, as in tests)."""
        return TokenSource(
            manager.api,
            self.operator_namespace,
            self.operator_service_account,
            request_timeout=manager.options.kube_api_timeout,
        )

    def workspace_image(self, security_profile: str | None) -> str:
        """The Pulumi image of a Workspace that names none: this operator's setting, else the Go
        operator's default for the Workspace's security profile (``restricted`` unless ``baseline``)."""
        profile: SecurityProfile = "baseline" if security_profile == "baseline" else "restricted"
        return self.default_workspace_image or DEFAULT_IMAGES[profile]

"""The operator's defaults, stated once (no imports: the command line is parsed before the
reconcilers, and their pydantic models, are imported).

``pko.__main__`` (flags and environment), ``pko.machinery.manager.ManagerOptions``,
``pko.machinery.leaderelection.LeaderElectionConfig``, ``pko.controllers.options.ControllerOptions``
and ``pko.controllers.retrysettings.RetrySettings`` all take their defaults from here.
"""

from __future__ import annotations

from typing import Final

# The process (the manager): its endpoints, its Kubernetes API requests, its shutdown.
METRICS_BIND_ADDRESS: Final = ":8383"
HEALTH_PROBE_BIND_ADDRESS: Final = ":8081"
# Timeout of one Kubernetes API request (seconds); every client the manager hands out carries it.
KUBE_API_TIMEOUT: Final = 30.0
# On SIGTERM, how long in-flight reconciles may finish before they are cancelled (seconds).
SHUTDOWN_GRACE_PERIOD: Final = 30.0
# Leader election on the Go operator's Lease, with its durations (seconds).
LEADER_ELECTION_ID: Final = "operator.pulumi.com"
LEASE_DURATION: Final = 60.0
RENEW_DEADLINE: Final = 45.0
RETRY_PERIOD: Final = 10.0

# The operator and its workspaces.
OPERATOR_NAMESPACE: Final = "pulumi-kubernetes-operator"
# The operator's own identity: TokenRequest tokens for the agents are minted for it (POD_SA_NAME).
OPERATOR_SERVICE_ACCOUNT: Final = "controller-manager"
# The ClusterRole a refused Secret names (the secrets-per-namespace install's, as config/ names it).
STACK_SECRETS_ROLE: Final = "pko-stack-secrets"
AGENT_IMAGE: Final = "pko-agent:latest"
AGENT_IMAGE_PULL_POLICY: Final = "IfNotPresent"
WORKSPACE_ADDRESS_MODE: Final = "dns"
ENGINE_EVENT_LOG_LEVEL: Final = "debug"
PROGRAM_FS_ADDR: Final = ":9090"
# How long a running Update waits for its unreachable agent before it ends AgentUnreachable.
AGENT_UNREACHABLE_TIMEOUT: Final = 300.0
# Failed Stack operations (docs/retries.md): the failure budget before Stalled; transient failures
# back off from 5 s, doubling, +-20%, capped at 5 min; deterministic ones keep the Go operator's
# cooldown (10 s x 3^n); no retry waits longer than MAX_RETRY_BACKOFF (seconds).
MAX_UPDATE_FAILURES: Final = 3
TRANSIENT_RETRY_BASE: Final = 5.0
TRANSIENT_RETRY_FACTOR: Final = 2.0
TRANSIENT_RETRY_CAP: Final = 300.0
TRANSIENT_RETRY_JITTER: Final = 0.2
DETERMINISTIC_RETRY_BASE: Final = 10.0
DETERMINISTIC_RETRY_FACTOR: Final = 3.0
MAX_RETRY_BACKOFF: Final = 24 * 3600.0
# The shortest retry wait and cap (status times have whole seconds): bases and caps below it are refused.
MIN_RETRY_SECONDS: Final = 1.0


def go_duration_text(seconds: float) -> str:
    """``seconds`` as a Go duration a flag's default shows (``5m``, ``24h``, ``90s``)."""
    whole = int(seconds)
    if whole == seconds and whole % 3600 == 0 and whole:
        return f"{whole // 3600}h"
    if whole == seconds and whole % 60 == 0 and whole:
        return f"{whole // 60}m"
    return f"{seconds:g}s"

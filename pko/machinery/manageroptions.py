"""How the manager runs (:class:`ManagerOptions`): what a process configures, apart from the run
loop that reads it (:mod:`pko.machinery.manager`). ``pko.settings`` builds it from the flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pko import defaults
from pko.machinery.leaderelection import LeaderElectionConfig
from pko.machinery.serving import DEFAULT_STALL_THRESHOLD

__all__ = ["ManagerOptions"]


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    """How the manager runs. Durations are seconds.

    ``max_concurrent_reconciles`` maps controller names to worker counts (overriding
    :data:`~pko.machinery.controller.DEFAULT_WORKERS`); ``namespace`` limits every informer to one
    namespace (``None``: all), ``namespaces`` to several (with ``namespace``: their union), each
    watched apart; ``label_selectors`` gives resources (by ``Resource.name``) a label selector
    their informers list and watch with (see :mod:`pko.machinery.informerfactory`).
    Bind addresses are ``host:port``; ``"0"`` disables that server.
    ``discovery_interval`` and ``optional_sync_timeout`` govern optional watches.
    ``kube_api_timeout`` bounds every request of the informers, the event recorder and the clients
    :meth:`Manager.client` hands out. The process-level defaults are :mod:`pko.defaults`'.
    ``metrics_secure``: ``/metrics`` over HTTPS to scrapers the apiserver authenticates and allows
    ``get`` on it (:mod:`pko.machinery.metricsauth`), with the pair in ``metrics_cert_dir``
    (``tls.crt``, ``tls.key``) or a self-signed certificate; false: plain HTTP to anyone.
    ``liveness_stall_threshold``: ``/healthz`` fails once the event loop has not run its
    once-a-second heartbeat for this long (see :data:`~pko.machinery.serving.DEFAULT_STALL_THRESHOLD`).
    """

    metrics_bind_address: str = defaults.METRICS_BIND_ADDRESS
    metrics_secure: bool = True
    metrics_cert_dir: str | None = None
    health_probe_bind_address: str = defaults.HEALTH_PROBE_BIND_ADDRESS
    leader_election: LeaderElectionConfig | None = None
    shutdown_grace_period: float = defaults.SHUTDOWN_GRACE_PERIOD
    max_concurrent_reconciles: Mapping[str, int] = field(default_factory=dict)
    namespace: str | None = None
    namespaces: tuple[str, ...] = ()
    label_selectors: Mapping[str, str] = field(default_factory=dict)
    resync_period: float = 0.0
    kube_api_timeout: float = defaults.KUBE_API_TIMEOUT
    discovery_interval: float = 30.0
    optional_sync_timeout: float = 60.0
    liveness_stall_threshold: float = DEFAULT_STALL_THRESHOLD

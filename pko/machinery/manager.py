"""The manager: one process's shared informers, controllers, leader election, probes and metrics.

What it wires, and the rules it keeps (controller-runtime's manager, asyncio-native):

* **One informer factory.** Every watch a controller declares asks the factory, so each resource
  type has one list+watch and one cache however many controllers use it. Informers start when the
  manager starts, on every replica, leader or not: a follower's caches are warm when it takes over,
  and ``/readyz`` means "caches synced" everywhere.
* **Controllers are declared, then built when leading.** :meth:`Manager.controller` returns a
  :class:`~pko.machinery.builder.ControllerBuilder` that records watches: the controller's own
  objects, owned objects mapped to their controlling owner, arbitrary key mappings, index-based
  fan-out (a Program change enqueues every Stack whose index points at it) and key channels
  (:mod:`pko.machinery.source`). Event handlers (:mod:`pko.machinery.handler`) only enqueue keys.
  When this replica leads (at once without leader election) it waits until every cache has
  synced, then builds each controller (queue, workers, handlers) and starts it. Reconcilers read
  the caches through :meth:`Manager.informer` and write through :meth:`Manager.client`.
* **Leader election** (optional) on a Lease: only the leader runs reconcilers. Losing the Lease
  (a renewal missed its deadline, or another holder appeared) cancels in-flight reconciles at
  once (the successor may start as soon as the lease expires) and makes :meth:`Manager.run` raise
  :class:`LeaderElectionLost`; the process then exits non-zero and its Deployment restarts it as
  a fresh candidate. That is controller-runtime's choice, and the simple one: nothing has to be
  reset for a second term.
* **Graceful shutdown** (:meth:`Manager.stop`, wired to SIGTERM/SIGINT by ``pko.__main__``):
  ``/readyz`` fails at once; controllers stop taking keys and in-flight reconciles get up to
  ``shutdown_grace_period`` seconds, then are cancelled; only then is the Lease released (renewals
  continue during the grace period, so nobody else leads while our reconciles still run), then
  informers and finally the HTTP servers stop.
* **Runnables** (:meth:`Manager.add_runnable`): long-lived tasks beside the controllers, e.g. an
  artifact server (every replica) or per-operation watch tasks (leader only: started with the
  controllers, cancelled with them). A runnable that raises is logged and restarted with backoff.
* **Scoped caches**: an informer may carry a label or field selector (fixed when it is created),
  so Pods, StatefulSets and Services are cached only when they belong to a workspace.
* **Optional watches** (``watches(..., optional=True)``) for kinds whose CRD may not be installed
  (Flux sources): their informers never hold up ``/readyz`` or the leader's start. The manager
  asks discovery every ``discovery_interval`` s until the kind is served, then starts the
  informer; one that has not synced after ``optional_sync_timeout`` s is reported (a warning and
  :meth:`Manager.optional_cache_status`), and its events flow whenever it does sync.
* **Events**: :attr:`Manager.events` records Kubernetes Events as ``pulumi-kubernetes-operator``;
  it runs from start to stop on every replica (only leaders' reconcilers use it).
* **Observability**: one ``CollectorRegistry`` per manager, served on ``/metrics``, holding the
  workqueue, controller, reflector, process, ``leader_election_master_status`` and
  ``pko_event_loop_heartbeat_age_seconds`` series.
* **Probes and metrics off the loop**: ``/healthz``, ``/readyz`` and ``/metrics`` are answered by
  threads of their own (:mod:`pko.machinery.serving`), so a loop busy with a first pass over
  thousands of objects still answers the kubelet within its 1 s timeout. Liveness watches a
  heartbeat the loop stamps every second and fails once it is older than
  ``liveness_stall_threshold`` (a wedged loop); readiness checks run on the probe thread and must
  only read simple state (see :meth:`Manager.add_readiness_check`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final

import structlog
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from pko.machinery.builder import ControllerBuilder
from pko.machinery.controller import DEFAULT_WORKERS, Controller, Reconciler
from pko.machinery.events import EventRecorder
from pko.machinery.handler import Enqueuer
from pko.machinery.informer import SharedInformer
from pko.machinery.informerfactory import InformerFactory
from pko.machinery.kubeclient import KubeClient
from pko.machinery.leaderelection import LeaderElector
from pko.machinery.manageroptions import ManagerOptions
from pko.machinery.metrics import PrometheusControllerMetrics, PrometheusWorkqueueMetrics
from pko.machinery.metricsreviews import secure_metrics
from pko.machinery.predicates import Predicate, generation_changed
from pko.machinery.ratelimit import RateLimiter
from pko.machinery.ratelimitingqueue import RateLimitingQueue
from pko.machinery.resource import DEFAULT_FIELD_MANAGER, Resource, ResourceClient, served
from pko.machinery.runnables import Runnables
from pko.machinery.serving import (
    Heartbeat,
    ReadinessCheck,
    Route,
    ThreadedHttpServer,
    metrics_routes,
    parse_bind_address,
    probe_routes,
)
from pko.machinery.store import IndexFunc

__all__ = [
    "ControllerBuilder",  # what Manager.controller returns (pko.machinery.builder)
    "LeaderElectionLost",
    "Manager",
    "ManagerOptions",
    "Predicate",
    "generation_changed",
]

# A threaded server's routes and its TLS (None: plain HTTP).
ThreadedHttpServerArgs = tuple[dict[str, Route], ssl.SSLContext | None]

# The component that signs the manager's Events, as the Go operator's recorder does.
EVENT_COMPONENT: Final = "pulumi-kubernetes-operator"

# The status of an optional informer (see Manager.optional_cache_status).
CACHE_ABSENT: Final = "absent"  # the kind is not served (CRD not installed)
CACHE_SYNCING: Final = "syncing"
CACHE_SYNCED: Final = "synced"
CACHE_STALLED: Final = "stalled"  # served, but not synced within optional_sync_timeout


class LeaderElectionLost(RuntimeError):
    """This replica stopped leading before it was asked to stop; the process should exit."""


class Manager:
    """Runs informers, probes, metrics and (while leading) controllers until stopped.

    Build it, declare controllers, then ``await run()``; call :meth:`stop` (signal-safe: it only
    sets an event) to shut down. ``run()`` returns after a clean stop and raises
    :class:`LeaderElectionLost` if leadership ended otherwise. A manager runs once.
    """

    def __init__(
        self,
        api: KubeClient,
        options: ManagerOptions | None = None,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.api = api
        self.options = options if options is not None else ManagerOptions()
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        self.factory = InformerFactory(
            api,
            namespace=self.options.namespace,
            namespaces=self.options.namespaces,
            label_selectors=self.options.label_selectors,
            resync_period=self.options.resync_period,
            metrics_registry=registry,
            request_timeout=self.options.kube_api_timeout,
        )
        self._workqueue_metrics = PrometheusWorkqueueMetrics(registry)
        self._controller_metrics = PrometheusControllerMetrics(registry)
        self._leader_gauge = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
            "1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
            registry=registry,
        )
        self.events = EventRecorder(
            api, EVENT_COMPONENT, registry=registry, request_timeout=self.options.kube_api_timeout
        )
        self._heartbeat = Heartbeat(self.options.liveness_stall_threshold)
        registry.register(self._heartbeat)
        self._builders: dict[str, ControllerBuilder] = {}
        # Watches declared optional / required, by (group, version, plural).
        self._optional: dict[tuple[str, str, str], Resource] = {}
        self._required: set[tuple[str, str, str]] = set()
        self._optional_status: dict[tuple[str, str, str], str] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._controllers_started = False
        self._controllers: list[Controller] = []
        self._handlers: list[tuple[SharedInformer, Enqueuer]] = []
        self._stop = asyncio.Event()
        self._serving = asyncio.Event()
        self._ran = False
        self._stopping = False
        self._leading = False
        self._elector: LeaderElector | None = None
        self._servers: list[ThreadedHttpServer] = []
        self._readiness: list[ReadinessCheck] = [("informer-sync", self._informers_synced)]
        self._log = structlog.get_logger("pko.manager")
        self._runnables = Runnables(self._log)

    # --- declaration -------------------------------------------------------------------------

    def client(
        self, resource: Resource, namespace: str | None = None, *, field_manager: str = DEFAULT_FIELD_MANAGER
    ) -> ResourceClient:
        """A client for ``resource`` (all namespaces, or ``namespace``) whose requests time out after
        ``options.kube_api_timeout`` (``--kube-api-timeout``): the one way reconcilers get clients,
        so every request of the process keeps the flag. ``field_manager`` names the manager of
        writes that name none (default: the Go operator's, see :mod:`pko.machinery.resource`)."""
        return ResourceClient(
            self.api,
            resource,
            namespace,
            request_timeout=self.options.kube_api_timeout,
            field_manager=field_manager,
        )

    def informer(
        self,
        resource: Resource,
        *,
        indexers: Mapping[str, IndexFunc] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> SharedInformer:
        """The shared informer (and cache) of ``resource``, with ``indexers`` added.

        The first request creates it, with its selectors: e.g. Pods with
        ``label_selector="auto.pulumi.com/component=workspace"`` caches only workspace Pods.
        Later requests may omit the selectors; naming a different one raises ``ValueError``.
        """
        return self.factory.informer(
            resource, indexers=indexers, label_selector=label_selector, field_selector=field_selector
        )

    def declare_watch(self, resource: Resource, *, optional: bool) -> None:
        """Record that a controller watches ``resource`` (called by :class:`ControllerBuilder`): a kind
        watched only optionally starts once discovery finds it served, any other at start."""
        key = (resource.group, resource.version, resource.plural)
        if optional:
            self._optional.setdefault(key, resource)
        else:
            self._required.add(key)

    def _optional_resources(self) -> list[Resource]:
        # list(...) first: one C-level snapshot, safe from the probe thread (see _informers_synced).
        return [r for k, r in list(self._optional.items()) if k not in self._required]

    def add_runnable(self, name: str, fn: Callable[[], Awaitable[None]], *, leader_only: bool = True) -> None:
        """Run ``fn()`` as a long-lived task under the manager.

        ``leader_only`` runnables start with the controllers (caches synced, this replica leading)
        and are cancelled when leadership ends or the manager stops; the others run on every
        replica from start to stop. An exception is logged and ``fn`` is called again after a
        backoff (1 s doubling to 60 s); returning ends the runnable. May be called while running.
        """
        runnable = self._runnables.add(name, fn, leader_only=leader_only)
        if self._ran and not self._stopping:
            if not leader_only or self._controllers_started:
                self._runnables.start(runnable)

    def optional_cache_status(self, resource: Resource) -> str:
        """``absent`` (not served yet), ``syncing``, ``synced`` or ``stalled`` (not synced within
        ``optional_sync_timeout``); for a required informer, ``syncing`` or ``synced``.

        Raises ``KeyError`` for a resource no informer was created for.
        """
        key = (resource.group, resource.version, resource.plural)
        if key in self._optional and key not in self._required:
            return self._optional_status.get(key, CACHE_ABSENT)
        informer = self.factory.get(resource)
        if informer is None:
            raise KeyError(resource.name)
        return CACHE_SYNCED if informer.has_synced() else CACHE_SYNCING

    def controller(
        self,
        name: str,
        reconciler: Reconciler,
        *,
        workers: int | None = None,
        rate_limiter: Callable[[], RateLimiter] | None = None,
    ) -> ControllerBuilder:
        """Declare a controller; chain ``for_``/``owns``/``watches``/``watches_by_index`` on the result.

        ``workers`` defaults to ``options.max_concurrent_reconciles[name]``, else the Go
        operator's default for that name, else 1. ``rate_limiter`` makes a fresh limiter per
        run (default: controller-runtime's).
        """
        if self._ran:
            raise RuntimeError("declare controllers before the manager runs")
        if name in self._builders:
            raise ValueError(f"a controller named {name!r} is already declared")
        if workers is not None:
            count = workers
        else:
            count = self.options.max_concurrent_reconciles.get(name) or DEFAULT_WORKERS.get(name, 1)
        if count < 1:
            raise ValueError(f"controller {name!r} needs at least one worker, got {count}")
        builder = ControllerBuilder(self, name, reconciler, count, rate_limiter)
        self._builders[name] = builder
        return builder

    def add_readiness_check(self, name: str, check: Callable[[], str | None]) -> None:
        """Another ``/readyz`` check: ``check()`` returns None when ready, else why not.

        It is called on the probe server's thread, not the event loop, so it must be quick and
        only read simple state the loop writes (a bool, ``asyncio.Event.is_set()``, a snapshot
        taken by one C call such as ``list(d.values())``); a check needing more should read a value
        the loop publishes (e.g. an attribute a task refreshes).
        """
        self._readiness.append((name, check))

    # --- state -------------------------------------------------------------------------------

    @property
    def controllers(self) -> list[Controller]:
        """The running controllers (empty unless leading)."""
        return list(self._controllers)

    def is_leader(self) -> bool:
        return self._leading

    def is_ready(self) -> bool:
        return all(check() is None for _, check in self._readiness)

    def address(self, server: str) -> tuple[str, int] | None:
        """``(host, port)`` a server (``"metrics"`` or ``"probes"``) listens on, once serving."""
        for s in self._servers:
            if s.name == server:
                return s.host, s.port
        return None

    async def wait_serving(self) -> None:
        """Until the HTTP servers listen (their ports are then known)."""
        await self._serving.wait()

    def _informers_synced(self) -> str | None:
        if self._stopping or self._stop.is_set():
            return "shutting down"
        # Runs on the probe thread: the two containers are read through one-call snapshots
        # (_optional_resources, factory.informers), never iterated while the loop may resize them.
        optional = {(r.group, r.version, r.plural) for r in self._optional_resources()}
        pending = [
            i.resource.name
            for i in self.factory.informers
            if not i.has_synced()
            and (i.resource.group, i.resource.version, i.resource.plural) not in optional
        ]
        return f"not synced: {', '.join(sorted(pending))}" if pending else None

    # --- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin a graceful shutdown; :meth:`run` returns once it is complete."""
        self._stop.set()

    async def run(self) -> None:
        if self._ran:
            raise RuntimeError("a manager runs once; build a new one")
        self._ran = True
        try:
            await self._start_servers()
            self._serving.set()
            self.events.start()
            optional = self._optional_resources()
            self.factory.start(exclude=optional)
            if optional:
                self._spawn(self._discover(optional), "manager:discovery")
            self._runnables.start_all(leader_only=False)
            self._log.info(
                "manager started",
                controllers=sorted(self._builders),
                runnables=self._runnables.names(),
                optional_watches=sorted(r.name for r in optional),
                leader_election=self.options.leader_election is not None,
            )
            await self._run_until_stopped()
        finally:
            self._stopping = True
            await self._runnables.stop_all(leader_only=False)
            background, self._background = self._background, set()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.events.stop()
            await self.factory.stop()
            await self._stop_servers()
            self._log.info("manager stopped")

    async def _run_until_stopped(self) -> None:
        le = self.options.leader_election
        if le is None:
            body: asyncio.Task[None] = asyncio.create_task(self._lead(), name="manager:lead")
        else:
            self._elector = LeaderElector(self.api, le, on_started_leading=self._lead_elected)
            self._leader_gauge.labels(le.lease_name).set(0)
            body = asyncio.create_task(self._elector.run(), name="manager:leader-election")
        stopped = asyncio.create_task(self._stop.wait(), name="manager:stop")
        try:
            await asyncio.wait({body, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._stop.set()  # cancelling run() is a stop, just not a patient one
            raise
        finally:
            stopped.cancel()
            self._stopping = True
            if not body.done():
                self._log.info("shutting down", grace_period=self.options.shutdown_grace_period)
                # Controllers first, while the elector still renews the Lease ...
                await self._stop_controllers(self.options.shutdown_grace_period)
                # ... then leave leadership (which releases the Lease) or cancel the leaderless body.
                if self._elector is not None:
                    self._elector.stop()
                else:
                    body.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await body
        failure = body.exception() if body.done() and not body.cancelled() else None
        if failure is not None:
            raise failure
        if not self._stop.is_set():
            raise LeaderElectionLost("leadership ended while the manager was running")

    async def _lead_elected(self) -> None:
        assert self.options.leader_election is not None
        gauge = self._leader_gauge.labels(self.options.leader_election.lease_name)
        gauge.set(1)
        try:
            await self._lead()
        finally:
            gauge.set(0)

    async def _lead(self) -> None:
        """Run the controllers until cancelled (end of leadership or stop)."""
        self._leading = True
        try:
            await self.factory.wait_for_cache_sync(exclude=self._optional_resources())
            if not self._stopping:
                self._start_controllers()
                self._controllers_started = True
                self._runnables.start_all(leader_only=True)
            await asyncio.Future()  # until cancelled
        finally:
            self._leading = False
            self._controllers_started = False
            # A stop has already drained the controllers gracefully; getting here with controllers
            # still running means leadership was lost: another replica may lead as soon as the
            # lease expires, so in-flight reconciles are cancelled now.
            await self._stop_controllers(0.0)
            await self._runnables.stop_all(leader_only=True)

    # --- background tasks and optional informers -----------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _discover(self, resources: list[Resource]) -> None:
        """Start each optional informer once discovery says its kind is served."""
        pending = {(r.group, r.version, r.plural): r for r in resources}
        for key in pending:
            self._optional_status[key] = CACHE_ABSENT
        reported: set[tuple[str, str, str]] = set()
        while pending:
            for key, resource in list(pending.items()):
                try:
                    ok = await served(self.api, resource, request_timeout=self.options.kube_api_timeout)
                except Exception as exc:
                    self._log.warning("discovery failed", resource=resource.name, error=str(exc))
                    continue
                if not ok:
                    if key not in reported:
                        reported.add(key)
                        self._log.info(
                            "optional watch: kind not served; checking again periodically",
                            resource=resource.name,
                            interval=self.options.discovery_interval,
                        )
                    continue
                del pending[key]
                self._optional_status[key] = CACHE_SYNCING
                informer = self.factory.start_informer(resource)
                self._spawn(self._await_optional_sync(key, informer), f"manager:sync:{resource.name}")
            if pending:
                await asyncio.sleep(self.options.discovery_interval)

    async def _await_optional_sync(self, key: tuple[str, str, str], informer: SharedInformer) -> None:
        timeout = self.options.optional_sync_timeout
        if not await informer.wait_for_sync(timeout):
            self._optional_status[key] = CACHE_STALLED
            self._log.warning(
                "optional watch: cache not synced in time; its events flow once it does",
                resource=informer.resource.name,
                timeout=timeout,
            )
            await informer.wait_for_sync()
        self._optional_status[key] = CACHE_SYNCED
        self._log.info("optional watch: cache synced", resource=informer.resource.name)

    def _start_controllers(self) -> None:
        for builder in self._builders.values():
            limiter = builder.rate_limiter() if builder.rate_limiter is not None else None
            queue: RateLimitingQueue[str] = RateLimitingQueue(
                builder.name, rate_limiter=limiter, metrics=self._workqueue_metrics
            )
            controller = Controller(
                builder.name,
                builder.reconciler,
                queue,
                workers=builder.workers,
                metrics=self._controller_metrics,
            )
            controller.start()
            self._controllers.append(controller)
            for channel in builder.channels:
                channel.connect(queue.add)
            for watch in builder.sources:
                handler = Enqueuer(queue.add, watch)
                # Replays the cache as adds, so the queue starts with every existing object.
                watch.informer.add_event_handler(handler)
                self._handlers.append((watch.informer, handler))

    async def _stop_controllers(self, grace_period: float) -> None:
        for builder in self._builders.values():
            for channel in builder.channels:
                channel.disconnect()
        handlers, self._handlers = self._handlers, []
        for informer, handler in handlers:
            informer.remove_event_handler(handler)
        controllers, self._controllers = self._controllers, []
        if controllers:
            await asyncio.gather(*(c.stop(grace_period) for c in controllers))

    async def _start_servers(self) -> None:
        """The probes and metrics servers, each on a thread of its own (see pko.machinery.serving)."""
        opts = self.options
        self._heartbeat.start()
        wanted: list[tuple[str, str, Callable[[], ThreadedHttpServerArgs]]] = [
            (
                "probes",
                opts.health_probe_bind_address,
                lambda: (probe_routes([("ping", self._heartbeat.check)], self._readiness), None),
            ),
            ("metrics", opts.metrics_bind_address, self._metrics_server),
        ]
        for name, address, make in wanted:
            bind = parse_bind_address(address)
            if bind is None:
                continue
            routes, tls = make()
            server = ThreadedHttpServer(name, routes, *bind, tls=tls)
            server.start()
            self._servers.append(server)
            self._log.info("serving", server=name, address=f"{server.host or '*'}:{server.port}")

    def _metrics_server(self) -> ThreadedHttpServerArgs:
        """``/metrics``, over HTTPS to scrapers the apiserver allows unless ``metrics_secure`` is off."""
        if not self.options.metrics_secure:
            return metrics_routes(self.registry), None
        tls, authorizer = secure_metrics(
            self.api, self.options.metrics_cert_dir, request_timeout=self.options.kube_api_timeout
        )
        return metrics_routes(self.registry, authorizer), tls

    async def _stop_servers(self) -> None:
        # Each stop waits (up to half a second) for its thread to notice: not on the loop.
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self._servers))
        self._heartbeat.stop()

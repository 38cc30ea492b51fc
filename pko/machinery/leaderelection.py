"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

One loop over one Lease and three durations; it knows nothing of controllers:
- A candidate tries every ``retry_period`` (jittered, x1..x2.2) to take the Lease. It may when
  the Lease has no holder, or when the holder's record has not changed for the record's
  ``leaseDurationSeconds`` *as measured on the candidate's own clock* (no cross-machine clock
  comparison, as in client-go). When that expiry comes before the next try, it tries at the expiry
  instead (client-go does not: its standby takes over up to 2.2 retry periods, 22 s, late).
- Writes use the Lease's resourceVersion (optimistic concurrency): of two candidates racing for
  one Lease exactly one write succeeds.
- The leader renews every ``retry_period``. If it has not renewed for ``renew_deadline`` it stops
  leading. Since ``renew_deadline < lease_duration``, it has stopped before anyone else may take
  over, provided stopping its work takes less than ``lease_duration - renew_deadline``.
- On a clean stop the leader first stops its work, then releases the Lease (no holder, duration
  1 s) so a successor takes over at its next try instead of after the lease duration.
- ``leaseTransitions`` counts changes of holder; ``acquireTime`` is kept across renewals.
- A Lease held by a *predecessor* (an identity starting with ``predecessors``: in a pod, the pod's
  name, so an earlier run of this very container) is taken at once: that process has ended, since
  the kubelet starts a container again only after it exited, so waiting out its lease (60 s by
  default) after a crash or a lost renewal would only delay the restarted operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from pko import defaults
from pko.machinery.kubeclient import KubeClient
from pko.machinery.resource import LEASES, ResourceClient, api_error_status
from pko.machinery.store import Obj

JITTER_FACTOR = 1.2
# A try at a Lease's expiry comes this much after it at most (spread, so candidates do not collide).
EXPIRY_SPREAD = 0.5

OnStartedLeading = Callable[[], Coroutine[Any, Any, None]]
OnStoppedLeading = Callable[[], Awaitable[None] | None]
OnNewLeader = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    """Durations in seconds. Defaults are the Go operator's (60 / 45 / 10, :mod:`pko.defaults`)."""

    lease_name: str
    lease_namespace: str
    identity: str
    lease_duration: float = defaults.LEASE_DURATION
    renew_deadline: float = defaults.RENEW_DEADLINE
    retry_period: float = defaults.RETRY_PERIOD
    release_on_cancel: bool = True
    predecessors: str = ""  # an identity prefix of earlier runs of this candidate ("" for none)

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election identity must not be empty")
        if not self.lease_name or not self.lease_namespace:
            raise ValueError("lease name and namespace are required")
        if self.retry_period <= 0:
            raise ValueError("retry_period must be positive")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(f"renew_deadline must be greater than retry_period*{JITTER_FACTOR}")

    @property
    def lease_duration_seconds(self) -> int:
        """The whole seconds written to the Lease (rounded up: never shorter than configured)."""
        return max(1, math.ceil(self.lease_duration))


@dataclass(frozen=True, slots=True)
class LeaderElectionRecord:
    """The Lease spec fields leader election uses."""

    holder_identity: str
    lease_duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    lease_transitions: int

    @classmethod
    def from_lease(cls, lease: Obj) -> LeaderElectionRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder_identity=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> Obj:
        return {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.lease_transitions,
        }


def next_try_in(retry: float, expires_in: float | None, spread: float) -> float:
    """When a candidate tries again: after ``retry``, or just after the holder's lease expires
    (``expires_in``, + ``spread``) when that is sooner. A lease already expired whose try failed
    (another candidate won, the apiserver did not answer) waits the whole ``retry``."""
    if expires_in is None or expires_in <= 0 or expires_in + spread >= retry:
        return retry
    return expires_in + spread


def micro_time(now: datetime) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaign for a Lease, run ``on_started_leading`` while holding it, hand it over on stop.

    ``run()`` returns when leadership ends: after :meth:`stop` (the Lease is then released when
    ``release_on_cancel``), or when a renewal deadline was missed. It does not campaign again;
    a process that lost its lease should exit (as the Go operator does) or call ``run()`` anew.
    If ``on_started_leading`` raises, leadership is given up and ``run()`` re-raises.
    """

    def __init__(
        self,
        api: KubeClient,
        config: LeaderElectionConfig,
        *,
        on_started_leading: OnStartedLeading,
        on_stopped_leading: OnStoppedLeading | None = None,
        on_new_leader: OnNewLeader | None = None,
    ) -> None:
        self.config = config
        self._leases = ResourceClient(
            api, LEASES, config.lease_namespace, request_timeout=config.renew_deadline
        )
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._stop = asyncio.Event()
        self._is_leader = False
        self._observed: LeaderElectionRecord | None = None
        self._observed_time = 0.0
        self._observed_lease: Obj | None = None
        self._reported_leader = ""
        self._log = structlog.get_logger("pko.leaderelection").bind(
            lease=f"{config.lease_namespace}/{config.lease_name}", identity=config.identity
        )

    # --- public state

    def is_leader(self) -> bool:
        """True from acquiring the Lease until leadership ends (before ``on_stopped_leading``)."""
        return self._is_leader

    @property
    def leader(self) -> str:
        """The holder this candidate last observed ("" when none)."""
        return self._observed.holder_identity if self._observed else ""

    def stop(self) -> None:
        """Ask ``run()`` to stop leading (or campaigning), release the Lease, and return."""
        self._stop.set()

    # --- the loop

    async def run(self) -> None:
        if not await self._acquire():
            return
        self._is_leader = True
        self._log.info("became leader")
        leading = asyncio.create_task(self._on_started_leading(), name=f"leading:{self.config.identity}")
        release = False
        cancelled = False
        try:
            release = await self._renew_until_done(leading)
        except asyncio.CancelledError:
            release = cancelled = True  # cancelling run() is a clean stop
        finally:
            self._is_leader = False
            failure = await self._stop_leading(leading)
            if release or failure is not None:
                await self._release()
        if cancelled:
            raise asyncio.CancelledError()
        if failure is not None:
            raise failure

    async def _acquire(self) -> bool:
        self._log.info("campaigning for leadership")
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(self.config.renew_deadline):
                    if await self._try_acquire_or_renew():
                        return True
            except TimeoutError:
                self._log.warning("acquire attempt timed out")
            retry = self.config.retry_period * random.uniform(1.0, 1.0 + JITTER_FACTOR)
            await self._wait_stop(next_try_in(retry, self._expires_in(), random.uniform(0.0, EXPIRY_SPREAD)))
        return False

    def _expires_in(self) -> float | None:
        """Seconds until the observed holder's lease expires on this clock (None: no other holder)."""
        observed = self._observed
        if (
            observed is None
            or not observed.holder_identity
            or observed.holder_identity == self.config.identity
        ):
            return None
        return self._observed_time + observed.lease_duration_seconds - asyncio.get_running_loop().time()

    async def _renew_until_done(self, leading: asyncio.Task[None]) -> bool:
        """Renew until stopped (True) or leadership is lost or abandoned (False)."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        last_renew = loop.time()
        stopped = asyncio.create_task(self._stop.wait())
        try:
            while True:
                remaining = last_renew + cfg.renew_deadline - loop.time()
                await asyncio.wait(
                    {leading, stopped},
                    timeout=min(cfg.retry_period, max(remaining, 0.0)),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if stopped.done():
                    return True
                if leading.done():
                    return False
                attempt_start = loop.time()
                remaining = last_renew + cfg.renew_deadline - attempt_start
                renewed = False
                if remaining > 0:
                    try:
                        async with asyncio.timeout(remaining):
                            renewed = await self._try_acquire_or_renew()
                    except TimeoutError:
                        renewed = False
                if renewed:
                    last_renew = attempt_start
                    continue
                if self.leader and self.leader != cfg.identity:
                    self._log.warning("lease taken by another candidate", holder=self.leader)
                    return False
                if loop.time() - last_renew >= cfg.renew_deadline:
                    self._log.error(
                        "failed to renew lease before the deadline; stopping leading",
                        renew_deadline=cfg.renew_deadline,
                    )
                    return False
        finally:
            stopped.cancel()

    async def _stop_leading(self, leading: asyncio.Task[None]) -> BaseException | None:
        """Cancel the leader's work, wait for it, then call ``on_stopped_leading``.

        Returns the exception ``on_started_leading`` failed with, if it failed on its own.
        """
        failure: BaseException | None = None
        if leading.done():
            if not leading.cancelled() and leading.exception() is not None:
                failure = leading.exception()
                self._log.error("on_started_leading failed; giving up leadership", error=repr(failure))
        else:
            leading.cancel()
            try:
                await leading
            except asyncio.CancelledError:
                pass
            except Exception:
                self._log.exception("on_started_leading failed while stopping")
        self._log.info("stopped leading")
        if self._on_stopped_leading is not None:
            try:
                result = self._on_stopped_leading()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                self._log.exception("on_stopped_leading failed")
        return failure

    async def _wait_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    # --- Lease access

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        loop = asyncio.get_running_loop()
        try:
            lease = await self._leases.get(cfg.lease_name)
        except Exception as exc:
            if api_error_status(exc) != 404:
                self._log.warning("cannot read lease", error=_describe(exc))
                return False
            now = micro_time(datetime.now(UTC))
            record = LeaderElectionRecord(cfg.identity, cfg.lease_duration_seconds, now, now, 0)
            body: Obj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.lease_name, "namespace": cfg.lease_namespace},
                "spec": record.to_spec(),
            }
            try:
                created = await self._leases.create(body)
            except Exception as create_exc:
                self._log.info("cannot create lease", error=_describe(create_exc))
                return False
            self._observe(record, created, loop.time())
            return True

        old = LeaderElectionRecord.from_lease(lease)
        if old != self._observed:
            self._observe(old, lease, loop.time())
        holder = old.holder_identity
        expires_in = self._expires_in()
        predecessor = bool(cfg.predecessors) and holder.startswith(cfg.predecessors)
        if expires_in is not None and expires_in > 0 and not predecessor:
            return False  # held by someone else and not expired

        # Timestamps are taken after the expiry check, so a successor's acquireTime is never
        # earlier than the previous holder's last renewTime plus the lease duration.
        now = micro_time(datetime.now(UTC))
        if holder == cfg.identity:
            acquire_time, transitions = old.acquire_time, old.lease_transitions
        else:
            acquire_time, transitions = now, old.lease_transitions + 1
        record = LeaderElectionRecord(
            cfg.identity, cfg.lease_duration_seconds, acquire_time, now, transitions
        )
        lease["spec"] = {**(lease.get("spec") or {}), **record.to_spec()}
        try:
            updated = await self._leases.replace(lease)
        except Exception as exc:
            # 409: someone else wrote the Lease since we read it; they won this round.
            self._log.info("cannot update lease", error=_describe(exc))
            return False
        self._observe(record, updated, loop.time())
        return True

    def _observe(self, record: LeaderElectionRecord, lease: Obj, at: float) -> None:
        self._observed, self._observed_lease, self._observed_time = record, lease, at
        holder = record.holder_identity
        if holder and holder != self._reported_leader:
            self._reported_leader = holder
            self._log.info("new leader observed", leader=holder)
            if self._on_new_leader is not None:
                try:
                    self._on_new_leader(holder)
                except Exception:
                    self._log.exception("on_new_leader failed")

    async def _release(self) -> None:
        """Clear the holder so a successor need not wait out the lease. Best effort, bounded."""
        if not self.config.release_on_cancel:
            return
        lease, observed = self._observed_lease, self._observed
        if lease is None or observed is None or observed.holder_identity != self.config.identity:
            return
        now = micro_time(datetime.now(UTC))
        record = LeaderElectionRecord("", 1, now, now, observed.lease_transitions)
        body = {**lease, "spec": {**(lease.get("spec") or {}), **record.to_spec()}}
        try:
            async with asyncio.timeout(self.config.renew_deadline):
                released = await self._leases.replace(body)
        except Exception as exc:
            self._log.warning("cannot release lease", error=_describe(exc))
            return
        self._observed, self._observed_lease = record, released
        self._log.info("released lease")


def _describe(exc: BaseException) -> str:
    status = api_error_status(exc)
    if status is not None:
        return f"{status} {getattr(exc, 'reason', '')}".strip()
    return f"{type(exc).__name__}: {exc}"

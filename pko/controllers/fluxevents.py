"""Stack Events forwarded to Flux's notification-controller (``--events-address``), so a Flux
``Alert`` can name a Stack as an event source (docs/gitops.md, "Notifications through Flux").

Every Event the operator records about a Stack (:meth:`pko.machinery.events.EventRecorder.event`,
the one place Events are recorded) is also POSTed to the address as JSON of the shape Flux's
controllers send (fluxcd/pkg ``event/v1beta1``): ``involvedObject``, ``severity`` (Warning is
``error``, Normal ``info``), ``timestamp``, ``message``, ``reason``, ``metadata`` (the Stack's last
commit as ``pulumi.com/revision``, Flux's group-prefixed key, when its status has one),
``reportingController`` (``pko``) and ``reportingInstance`` (this host).

Forwarding must never slow a reconcile, and a notification-controller that is down must cost
nothing but notifications. So: the recorder's listener only builds the body and appends it to a
bounded in-memory queue (full: the oldest is dropped); one background task (a leader-only
runnable: only the leader's reconcilers record) drains it, one POST at a time, each with a short
timeout and no retry. ``pko_events_forwarded_total{result}`` counts ``sent``, ``failed`` and
``dropped``; a failure is logged at most once per ``log_interval`` (with the count since).
The counter is declared whether or not an address is set, so the metrics reference lists it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import deque
from datetime import UTC, datetime
from typing import Final

import aiohttp
import structlog
from prometheus_client import Counter

from pko.controllers.resources import STACKS
from pko.machinery.events import EventType
from pko.machinery.manager import Manager
from pko.machinery.resource import Obj

__all__ = ["EventForwarder", "flux_event", "setup"]

REPORTING_CONTROLLER: Final = "pko"
REVISION_KEY: Final = f"{STACKS.group}/revision"  # Flux prefixes metadata keys with the object's group
MAX_QUEUED: Final = 1000
POST_TIMEOUT: Final = 5.0
LOG_INTERVAL: Final = 60.0
_SEVERITY: Final[dict[str, str]] = {"Warning": "error", "Normal": "info"}

_log = structlog.get_logger("pko.fluxevents")


def _revision(stack: Obj) -> str | None:
    """The commit of the Stack's last update (attempted, else successful), if its status has one."""
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return last.get("lastAttemptedCommit") or last.get("lastSuccessfulCommit") or None


def flux_event(
    obj: Obj, type_: EventType, reason: str, message: str, at: datetime, instance: str
) -> Obj | None:
    """The notification-controller's body for an Event about ``obj``; None unless ``obj`` is a Stack."""
    if obj.get("apiVersion") != STACKS.api_version or obj.get("kind") != STACKS.kind:
        return None
    meta = obj.get("metadata") or {}
    body: Obj = {
        "involvedObject": {
            "apiVersion": STACKS.api_version,
            "kind": STACKS.kind,
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
        },
        "severity": _SEVERITY[type_],
        "timestamp": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "message": message,
        "reason": reason,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
    }
    revision = _revision(obj)
    if revision:
        body["metadata"] = {REVISION_KEY: revision}
    return body


class EventForwarder:
    """The bounded queue (:meth:`submit`, never blocks) and its one sender (:meth:`run`).

    Invariant: at most ``max_queued`` bodies wait; each submitted body ends counted exactly once,
    as ``sent``, ``failed`` or ``dropped`` (unless the process stops first).
    """

    def __init__(
        self,
        address: str | None,
        counter: Counter,
        *,
        instance: str,
        max_queued: int = MAX_QUEUED,
        timeout: float = POST_TIMEOUT,
        log_interval: float = LOG_INTERVAL,
    ) -> None:
        self.address = address
        self._counter = counter
        self._instance = instance
        self._max_queued = max_queued
        self._timeout = timeout
        self._log_interval = log_interval
        self._queue: deque[Obj] = deque()
        self._wake = asyncio.Event()
        self._failures_unlogged = 0
        self._last_logged = float("-inf")

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        """Queue the Flux event of an Event the recorder was given (a Stack's; others are ignored)."""
        body = flux_event(obj, type_, reason, message, datetime.now(UTC), self._instance)
        if body is None or not self.address:
            return
        if len(self._queue) >= self._max_queued:
            self._queue.popleft()
            self._counter.labels("dropped").inc()
        self._queue.append(body)
        self._wake.set()

    async def run(self) -> None:
        """Send queued bodies until cancelled."""
        assert self.address, "run only with an address"
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                while not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                await self._post(session, self.address, self._queue.popleft())

    async def _post(self, session: aiohttp.ClientSession, address: str, body: Obj) -> None:
        try:
            async with session.post(address, json=body) as response:
                if response.status >= 300:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status, message=response.reason or ""
                    )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._counter.labels("failed").inc()
            self._failed(body, exc)
            return
        self._counter.labels("sent").inc()

    def _failed(self, body: Obj, exc: BaseException) -> None:
        """Log a failure, at most once per ``log_interval`` (saying how many there were since)."""
        self._failures_unlogged += 1
        now = time.monotonic()
        if now - self._last_logged < self._log_interval:
            return
        _log.warning(
            "could not forward an event to the events address",
            address=self.address,
            reason=body.get("reason"),
            failures=self._failures_unlogged,
            error=str(exc) or type(exc).__name__,
        )
        self._failures_unlogged = 0
        self._last_logged = now


def setup(manager: Manager, address: str | None) -> EventForwarder:
    """Declare the counter; with an address, forward the recorder's Stack events from the leader."""
    counter = Counter(
        "pko_events_forwarded",
        "Stack Events forwarded to --events-address (Flux's notification-controller), by result: "
        "sent, failed (an error or timeout; not retried), dropped (the queue was full).",
        ["result"],
        registry=manager.registry,
    )
    instance = os.environ.get("POD_NAME") or socket.gethostname()
    forwarder = EventForwarder(address, counter, instance=instance)
    if address:
        manager.events.add_listener(forwarder.submit)
        manager.add_runnable("flux-events", forwarder.run, leader_only=True)
    return forwarder

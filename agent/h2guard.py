"""A grpclib server whose connections cannot be held or broken by a hostile peer.

* grpclib decodes request headers as ASCII inside ``data_received``; a non-ASCII byte (say, in
  ``authorization``) raises UnicodeDecodeError there, which asyncio reports as a fatal protocol
  error: an ERROR line with a traceback for every such request. Here the connection is refused at
  WARNING (rate-limited and counted like every other refusal) and closed.
* A connection with no open stream and nothing received for ``idle_timeout`` seconds is closed:
  peers that connect and never send the HTTP/2 preface would otherwise hold a file descriptor each,
  forever.
* Open streams (a long WatchOperation) are kept alive with HTTP/2 PINGs every ``keepalive_time``
  seconds, and the connection is closed when a PING goes unanswered for ``keepalive_timeout``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from grpclib.config import Configuration
from grpclib.protocol import H2Protocol
from grpclib.server import Server
from pko.agent.auth import RefusalLog

DEFAULT_IDLE_TIMEOUT = 120.0
DEFAULT_KEEPALIVE_TIME = 60.0
DEFAULT_KEEPALIVE_TIMEOUT = 20.0

_REFUSALS = RefusalLog(interval=60.0)


class _GuardedProtocol(H2Protocol):
    _transport: asyncio.BaseTransport | None = None
    _idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    _last_received: float = 0.0
    _idle_check: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._last_received = time.monotonic()
        super().connection_made(transport)
        self._schedule_idle_check(self._idle_timeout)

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        try:
            super().data_received(data)
        except UnicodeDecodeError:
            _REFUSALS.refused("malformed request headers", detail="a header is not ASCII", peer=self._peer())
            self.processor.close("Malformed headers")
            self._close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._idle_check is not None:
            self._idle_check.cancel()
        super().connection_lost(exc)

    def _schedule_idle_check(self, delay: float) -> None:
        self._idle_check = asyncio.get_running_loop().call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        streams = self.connection._connection.streams.values()
        idle_for = time.monotonic() - self._last_received
        if any(s.open for s in streams) or idle_for < self._idle_timeout:
            self._schedule_idle_check(max(self._idle_timeout - idle_for, 1.0))
            return
        _REFUSALS.refused("idle connection closed", idle_seconds=round(idle_for), peer=self._peer())
        self._close()

    def _peer(self) -> str:
        return str(self._transport.get_extra_info("peername") if self._transport is not None else None)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class GuardedServer(Server):
    """``grpclib.server.Server`` with guarded connections (see the module's docstring)."""

    def __init__(
        self,
        handlers: Any,
        *,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        keepalive_time: float = DEFAULT_KEEPALIVE_TIME,
        keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT,
    ) -> None:
        config = Configuration(
            _keepalive_time=keepalive_time,
            _keepalive_timeout=keepalive_timeout,
            # A watch stream may carry no data for long: keep pinging it, as often as configured.
            _http2_max_pings_without_data=0,
            _http2_min_sent_ping_interval_without_data=keepalive_time,
        )
        super().__init__(handlers, config=config)
        self._idle_timeout = idle_timeout

    def _protocol_factory(self) -> H2Protocol:
        # grpclib builds the protocol from private state; re-classing what it built keeps that intact.
        protocol = super()._protocol_factory()
        protocol.__class__ = _GuardedProtocol
        assert isinstance(protocol, _GuardedProtocol)
        protocol._idle_timeout = self._idle_timeout
        return protocol

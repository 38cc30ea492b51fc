"""A grpclib server whose connections survive hostile bytes quietly.

grpclib decodes request headers as ASCII inside ``data_received``; a non-ASCII byte (say, in
``authorization``) raises UnicodeDecodeError there, which asyncio reports as a fatal protocol error:
an ERROR line with a traceback for every such request, before the connection is dropped. Here the
connection is refused at WARNING (rate-limited and counted like every other refusal) and closed.
"""

from __future__ import annotations

import asyncio

from grpclib.protocol import H2Protocol
from grpclib.server import Server
from pko.agent.auth import RefusalLog

_REFUSALS = RefusalLog(interval=60.0)


class _GuardedProtocol(H2Protocol):
    _transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        try:
            super().data_received(data)
        except UnicodeDecodeError:
            peer = self._transport.get_extra_info("peername") if self._transport is not None else None
            _REFUSALS.refused("malformed request headers", detail="a header is not ASCII", peer=str(peer))
            self.processor.close("Malformed headers")
            if self._transport is not None:
                self._transport.close()


class GuardedServer(Server):
    """``grpclib.server.Server`` with :class:`_GuardedProtocol` connections."""

    def _protocol_factory(self) -> H2Protocol:
        # grpclib builds the protocol from private state; re-classing what it built keeps that intact.
        protocol = super()._protocol_factory()
        protocol.__class__ = _GuardedProtocol
        return protocol

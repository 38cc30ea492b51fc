"""Connections to `agent serve` (pko.agent.h2guard): idle ones are closed, open calls are kept alive
with PINGs, and a peer that stops answering PINGs is dropped. Raw sockets and a hand-driven HTTP/2
client play the hostile or silent peers."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import h2.config
import h2.connection
import h2.events
import pytest
from grpclib.health.service import Health
from pko.agent.h2guard import GuardedServer
from pko.api.generated.pko.agent import v1 as pb


@pytest.fixture
async def server() -> AsyncIterator[tuple[GuardedServer, int]]:
    s = GuardedServer(
        [pb.AutomationServiceBase(), Health()], idle_timeout=1.0, keepalive_time=0.5, keepalive_timeout=1.0
    )
    await s.start("127.0.0.1", 0)
    assert s._server is not None
    yield s, s._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    s.close()
    await s.wait_closed()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_connections_that_never_speak_are_closed(server: tuple[GuardedServer, int]) -> None:
    _, port = server
    before = _open_fds()
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
    assert _open_fds() >= before + 40  # ours, plus the server's side of each
    started = asyncio.get_running_loop().time()
    for reader, _ in conns:
        # The server sends its own preface first, then closes: read until EOF.
        while await asyncio.wait_for(reader.read(65536), 10):
            pass
    assert asyncio.get_running_loop().time() - started < 8
    for _, writer in conns:
        writer.close()
    await asyncio.sleep(0.2)
    assert _open_fds() <= before + 2, "the server kept file descriptors of closed connections"


async def _watch(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, h2.connection.H2Connection]:
    """Open Health/Watch, a call that stays open with nothing to say."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [
            (b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
            (b":path", b"/grpc.health.v1.Health/Watch"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ],
    )  # fmt: skip
    conn.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)  # an empty HealthCheckRequest
    writer.write(conn.data_to_send())
    return reader, writer, conn


async def test_an_open_call_is_kept_alive_with_pings_past_the_idle_timeout(
    server: tuple[GuardedServer, int],
) -> None:
    _, port = server
    reader, writer, conn = await _watch(port)
    pings = 0
    deadline = asyncio.get_running_loop().time() + 4  # four idle timeouts
    try:
        while asyncio.get_running_loop().time() < deadline:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "the server closed a connection with an open call"
            for event in conn.receive_data(data):
                pings += isinstance(event, h2.events.PingReceived)
            writer.write(conn.data_to_send())  # h2 answers each PING
    finally:
        writer.close()
    assert pings >= 3


async def test_a_peer_that_stops_answering_pings_is_dropped(server: tuple[GuardedServer, int]) -> None:
    _, port = server
    reader, writer, _ = await _watch(port)
    # Never read again, so no PING is answered: keepalive 0.5 s + timeout 1 s, then the server closes.
    await asyncio.sleep(3)
    try:
        while await asyncio.wait_for(reader.read(65536), 5):
            pass  # what was sent before the close, then EOF
    finally:
        writer.close()

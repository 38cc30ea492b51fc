"""A loopback HTTP/1.1 server that records each request (method, target, headers, JSON body) and
answers it as the test says: for what a client *sends* (headers, query parameters), which an
apiserver's stored objects cannot show."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the JSON body, None when there is none


Answer = Callable[[Request], tuple[int, Any]]  # the status and the JSON body to answer with


@dataclass
class RecordingServer:
    answer: Answer
    requests: list[Request] = field(default_factory=list)
    port: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                method, target, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) != b"\r\n":
                    name, _, value = h.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, target, headers, json.loads(raw) if raw else None)
                self.requests.append(request)
                status, reply = self.answer(request)
                body = json.dumps(reply).encode()
                head = f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
                writer.write(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def recording_server(answer: Answer) -> AsyncIterator[RecordingServer]:
    """A :class:`RecordingServer` on a free loopback port, for the ``async with`` block."""
    rec = RecordingServer(answer)
    server = await asyncio.start_server(rec._serve, "127.0.0.1", 0)
    rec.port = server.sockets[0].getsockname()[1]
    try:
        yield rec
    finally:
        server.close()
        await server.wait_closed()

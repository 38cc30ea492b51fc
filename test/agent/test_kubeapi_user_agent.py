"""The agent's apiserver client says who it is: ``pko-agent/<version>``, on both reviews.

A loopback HTTP server records the headers as they arrive (the reviews are not stored objects, so
the apiserver's managedFields cannot show them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from pko.agent.kubeapi import USER_AGENT, KubeAPI

from pko.version import AGENT_PRODUCT, VERSION


class HeaderRecorder:
    """Answers every request with its own JSON body plus an empty ``status``; keeps the headers."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline():
                headers: dict[str, str] = {}
                while (line := await reader.readline()) != b"\r\n":
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                request = json.loads(await reader.readexactly(int(headers["content-length"])))
                self.headers.append(headers)
                body = json.dumps({**request, "status": {}}).encode()
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def recorder() -> AsyncIterator[HeaderRecorder]:
    rec = HeaderRecorder()
    server = await asyncio.start_server(rec.serve, "127.0.0.1", 0)
    rec.port = server.sockets[0].getsockname()[1]
    yield rec
    server.close()
    await server.wait_closed()


def test_the_agents_user_agent_is_its_own_product() -> None:
    assert USER_AGENT.split("/", 1)[0] == AGENT_PRODUCT == "pko-agent"
    assert USER_AGENT.startswith(f"pko-agent/{VERSION} (python/")


async def test_both_reviews_carry_the_agents_user_agent(recorder: HeaderRecorder) -> None:
    async with KubeAPI(f"http://127.0.0.1:{recorder.port}", token="t") as api:
        await api.create_token_review("a-token", ["aud"])
        await api.create_subject_access_review({"user": "alice"})
    assert [h.get("user-agent") for h in recorder.headers] == [USER_AGENT, USER_AGENT]
    assert all(h.get("authorization") == "Bearer t" for h in recorder.headers)

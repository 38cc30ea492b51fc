"""The agent's apiserver client says who it is: ``pko-agent/<version>``, on both reviews.

A loopback HTTP server records the headers as they arrive (the reviews are not stored objects, so
the apiserver's managedFields cannot show them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pko.agent.kubeapi import USER_AGENT, KubeAPI
from recordingserver import RecordingServer, recording_server

from pko.version import AGENT_PRODUCT, VERSION


@pytest.fixture
async def recorder() -> AsyncIterator[RecordingServer]:
    # Answers every review with its own body plus an empty status.
    async with recording_server(lambda req: (201, {**req.body, "status": {}})) as rec:
        yield rec


def test_the_agents_user_agent_is_its_own_product() -> None:
    assert USER_AGENT.split("/", 1)[0] == AGENT_PRODUCT == "pko-agent"
    assert USER_AGENT.startswith(f"pko-agent/{VERSION} (python/")


async def test_both_reviews_carry_the_agents_user_agent(recorder: RecordingServer) -> None:
    async with KubeAPI(f"http://127.0.0.1:{recorder.port}", token="t") as api:
        await api.create_token_review("a-token", ["aud"])
        await api.create_subject_access_review({"user": "alice"})
    assert [r.headers.get("user-agent") for r in recorder.requests] == [USER_AGENT, USER_AGENT]
    assert all(r.headers.get("authorization") == "Bearer t" for r in recorder.requests)

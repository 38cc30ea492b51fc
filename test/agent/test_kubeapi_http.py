"""The agent's own apiserver client (pko.agent.kubeapi) over HTTP/1.1, against the scripted HTTPS
server of pko/devtools/fakeapiserver.py: a 401 re-reads a rotated token, connections are pooled and
replaced, errors carry status and reason only, a cancelled request leaves the pool sound; and the
reason the client is our own: the agent imports neither kubernetes_asyncio nor aiohttp.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pko.agent.kubeapi import KubeAPI, KubeAPIError, load_incluster, load_kubeconfig

from pko.devtools.fakeapiserver import (
    PKI,
    FakeAPIServer,
    Reply,
    Request,
    b64,
    json_reply,
    review_reply,
    write_kubeconfig,
)

# -- token rotation ----------------------------------------------------------------------------------


async def test_incluster_token_rotation_and_retry_on_401(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(pki.ca.cert_pem)
    (sa / "token").write_text("old")
    valid = {"old"}

    def handler(request: Request) -> Reply:
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in valid:
            return json_reply(401, {"kind": "Status", "reason": "Unauthorized", "code": 401})
        return review_reply(request)

    fake.handler = handler
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake.port)}
    async with load_incluster(env, sa) as api:
        await api.create_token_review("t", ["a"])
        # The kubelet rotates the token and the apiserver stops accepting the old one: the 401 makes
        # the client re-read the file at once (not a minute later) and send the request again.
        (sa / "token").write_text("new")
        valid.clear()
        valid.add("new")
        await api.create_token_review("t", ["a"])
        assert [r.headers["authorization"] for r in fake.requests] == [
            "Bearer old",
            "Bearer old",
            "Bearer new",
        ]
        # A 401 with no new token in the file is the caller's to handle (no loop).
        valid.clear()
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review("t", ["a"])
        assert info.value.status == 401 and info.value.reason == "Unauthorized"
        assert len(fake.requests) == 4


# -- HTTP ---------------------------------------------------------------------------------------------


async def _api(fake: FakeAPIServer, pki: PKI, tmp_path: Path) -> KubeAPI:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        fake.url,
        {"certificate-authority-data": b64(pki.ca.cert_pem)},
        {"token": "t"},
    )
    return load_kubeconfig([path])


async def test_connections_are_kept_alive_and_chunked_answers_read(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    big = "x" * 100_000
    fake.handler = lambda r: json_reply(201, {"status": {"allowed": True, "reason": big}}, chunked=True)
    async with await _api(fake, pki, tmp_path) as api:
        for _ in range(3):
            status = await api.create_subject_access_review({"user": "u"})
            assert status == {"allowed": True, "reason": big}
        assert fake.connections == 1
        # Concurrent requests each get a connection; they are kept for the next ones.
        await asyncio.gather(*(api.create_subject_access_review({"user": "u"}) for _ in range(3)))
        assert fake.connections == 3
        await asyncio.gather(*(api.create_subject_access_review({"user": "u"}) for _ in range(3)))
        assert fake.connections == 3


async def test_a_connection_the_server_dropped_is_replaced(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    fake.close_after_reply = True
    async with await _api(fake, pki, tmp_path) as api:
        for _ in range(3):
            await api.create_token_review("t", ["a"])
            await asyncio.sleep(0.05)
    assert fake.connections == 3 and len(fake.requests) == 3
    fake.close_after_reply = False
    fake.handler = lambda r: json_reply(201, {"status": {}}, close=True)  # announced: not reused
    async with await _api(fake, pki, tmp_path) as api:
        await api.create_token_review("t", ["a"])
        await api.create_token_review("t", ["a"])
    assert fake.connections == 5


async def test_error_answers_carry_status_and_reason_only(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    fake.handler = lambda r: json_reply(
        403,
        {"kind": "Status", "reason": "Forbidden", "message": f"echo {r.body['spec']['token']}", "code": 403},
    )
    async with await _api(fake, pki, tmp_path) as api:
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review("secret-token", ["a"])
    assert (info.value.status, info.value.reason) == (403, "Forbidden")
    assert "secret-token" not in str(info.value)
    fake.handler = lambda r: (503, {"Content-Length": "5"}, b"oops!")
    async with await _api(fake, pki, tmp_path) as api:
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review("t", ["a"])
    assert (info.value.status, info.value.reason) == (503, "")


async def test_a_cancelled_request_does_not_poison_the_pool(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    async with await _api(fake, pki, tmp_path) as api:
        await api.create_token_review("t", ["a"])
        fake.delay = 30.0  # the next answer would come too late: the caller gives up (a timeout)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(api.create_token_review("t", ["a"]), 0.5)
        fake.delay = 0.0
        status = await asyncio.wait_for(api.create_token_review("t", ["a"]), 10)
        assert status["authenticated"] is True
    # The abandoned connection was closed, not handed to the next request (whose answer would be
    # the late one).
    assert fake.connections == 2 and [r.connection for r in fake.requests] == [0, 0, 1]


# -- start-up cost ------------------------------------------------------------------------------------


def test_the_agent_imports_neither_kubernetes_asyncio_nor_aiohttp() -> None:
    """Start-up (``serve``'s imports) and the PyInstaller bundle (hack/build-agent.sh excludes both
    packages): no module of pko.agent may import them."""
    code = (
        "import sys, pko.agent.server, pko.agent.cli\n"
        "heavy = lambda: sorted(m for m in sys.modules\n"
        "                       if m.split('.')[0] in ('kubernetes_asyncio', 'aiohttp'))\n"
        "print(heavy())\n"
        "import importlib, pkgutil, pko.agent\n"
        "for m in pkgutil.iter_modules(pko.agent.__path__): importlib.import_module('pko.agent.' + m.name)\n"
        "print(heavy())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout

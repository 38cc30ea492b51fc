"""The agent's TokenReview + SubjectAccessReview gate, against a real kube-apiserver.

Calls go through a real grpclib server with the auth hook installed, serving the generated
``AutomationServiceBase`` (every method UNIMPLEMENTED): a call that passes the gate comes back
UNIMPLEMENTED, one that does not comes back UNAUTHENTICATED or PERMISSION_DENIED.

Tokens are what a current apiserver issues (bound, expiring, audience-scoped: TokenRequest). One
the apiserver cannot mint, an expired one (TokenRequest's minimum lifetime is 10 minutes), is
signed here with the test control plane's service-account signing key (``pki/sa.key``), with the
very header and claims of a token the apiserver minted, only the times changed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest
from pko.agent.auth import (
    REFUSALS,
    CacheTTLs,
    KubeAuthorizer,
    RefusalLog,
    TTLCache,
    bearer_token,
    token_expiry,
)
from pko.agent.h2guard import GuardedServer
from pko.api.generated.pko.agent import v1 as pb

from pko.devtools.agents import AuthWorld
from pko.devtools.waiting import wait_until

PASSED = Status.UNIMPLEMENTED  # the gate let the call through to the (empty) service


class _Gate:
    """The agent's grpclib server guarded by one authorizer."""

    def __init__(self, authorizer: KubeAuthorizer) -> None:
        from grpclib.health.service import Health

        self.server = GuardedServer([pb.AutomationServiceBase(), Health()])
        authorizer.install(self.server)

    async def __aenter__(self) -> _Gate:
        await self.server.start("127.0.0.1", 0)
        assert self.server._server is not None
        self.port = self.server._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def call(self, token: str | None, raw_header: str | None = None) -> Status:
        metadata = None
        if raw_header is not None:
            metadata = {"authorization": raw_header}
        elif token is not None:
            metadata = {"authorization": f"Bearer {token}"}
        channel = Channel("127.0.0.1", self.port)
        try:
            await pb.AutomationServiceStub(channel, metadata=metadata).pulumi_version(timeout=60)
        except GRPCError as exc:
            return exc.status
        finally:
            channel.close()
        raise AssertionError("the empty service answered a call")


@pytest.fixture
async def gate(auth_world: AuthWorld) -> AsyncIterator[_Gate]:
    async with _Gate(auth_world.authorizer()) as g:
        yield g


@pytest.mark.cluster
async def test_only_a_granted_service_account_with_the_workspace_audience_passes(
    auth_world: AuthWorld, gate: _Gate
) -> None:
    await auth_world.create_service_account("operator")
    await auth_world.create_service_account("stranger")
    await auth_world.create_service_account("ghost")
    await auth_world.grant("operator")
    await auth_world.grant("ghost")
    right = await auth_world.mint("operator")
    wrong_audience = await auth_world.mint("operator", audience="pko-test")
    ungranted = await auth_world.mint("stranger")
    deleted = await auth_world.mint("ghost")
    await auth_world.delete_service_account("ghost")

    assert await gate.call(None) == Status.UNAUTHENTICATED
    assert await gate.call(None, raw_header="Basic dXNlcjpwYXNz") == Status.UNAUTHENTICATED
    assert await gate.call("not-a-token") == Status.UNAUTHENTICATED
    assert await gate.call(wrong_audience) == Status.UNAUTHENTICATED
    assert await gate.call(ungranted) == Status.PERMISSION_DENIED
    assert await gate.call(deleted) == Status.UNAUTHENTICATED
    assert await gate.call(right) == PASSED


@pytest.mark.cluster
async def test_health_needs_no_token(gate: _Gate) -> None:
    channel = Channel("127.0.0.1", gate.port)
    try:
        reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=60)
    finally:
        channel.close()
    assert reply.status == reply.SERVING


@pytest.mark.cluster
async def test_a_revoked_grant_stops_working_after_the_allow_ttl(auth_world: AuthWorld) -> None:
    await auth_world.create_service_account("revokee")
    binding = await auth_world.grant("revokee")
    token = await auth_world.mint("revokee")
    short = auth_world.authorizer(CacheTTLs(access_allowed=1.0, access_denied=1.0))
    long = auth_world.authorizer(CacheTTLs(access_allowed=3600.0))
    async with _Gate(short) as short_gate, _Gate(long) as long_gate:
        assert await short_gate.call(token) == PASSED
        assert await long_gate.call(token) == PASSED

        await auth_world.revoke(binding)

        async def apiserver_denies() -> bool:
            return not await auth_world.sar_allows("revokee")

        await wait_until("the apiserver to deny", apiserver_denies, within=60.0)
        # The long-lived cache still answers from its allow decision: the cache is really used...
        assert await long_gate.call(token) == PASSED

        # ...and the short one asks again once its TTL has passed.
        async def short_denies() -> bool:
            return await short_gate.call(token) == Status.PERMISSION_DENIED

        await wait_until("the short-lived cache to deny", short_denies, within=60.0)


@pytest.mark.cluster
async def test_tokens_never_reach_the_logs(
    auth_world: AuthWorld, gate: _Gate, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    await auth_world.create_service_account("quiet")
    token = await auth_world.mint("quiet")
    caplog.set_level(logging.DEBUG)
    assert await gate.call(token) == Status.PERMISSION_DENIED
    assert await gate.call(token + "x") == Status.UNAUTHENTICATED
    captured = capsys.readouterr()
    assert token not in caplog.text
    assert token not in captured.out + captured.err


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_ttl_cache_is_bounded_and_expires() -> None:
    now = [0.0]
    cache: TTLCache[str, int] = TTLCache(2, clock=lambda: now[0])
    cache.put("a", 1, ttl=10)
    cache.put("b", 2, ttl=10)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3, ttl=10)
    assert cache.get("b") is None  # evicted as least recently used
    assert cache.get("a") == 1 and cache.get("c") == 3
    now[0] = 10.0
    assert cache.get("a") is None
    assert len(cache) == 1


# --- hardening (issue 11) ----------------------------------------------------------------------


def _jwt(claims: dict[str, object]) -> str:
    import base64
    import json

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


def test_token_expiry_is_read_without_trusting_the_token() -> None:
    assert token_expiry(_jwt({"exp": 1700000000})) == 1700000000.0
    assert token_expiry(_jwt({"sub": "x"})) is None
    assert token_expiry(_jwt({"exp": True})) is None
    assert token_expiry("not-a-jwt") is None
    assert token_expiry("a.%%%.c") is None
    # Positive decisions are short-lived by default (kube-apiserver's webhook cache: 2 minutes).
    assert CacheTTLs().token_success <= 120.0


def test_refusals_are_counted_and_their_log_lines_rate_limited(capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]
    refusals = RefusalLog(10.0, clock=lambda: now[0])
    before = REFUSALS.labels(reason="authentication failed")._value.get()
    capsys.readouterr()
    for _ in range(50):
        refusals.refused("authentication failed")
    now[0] = 11.0
    refusals.refused("authentication failed")
    assert REFUSALS.labels(reason="authentication failed")._value.get() - before == 51
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "authentication failed" in line]
    assert len(lines) == 2, lines
    assert "suppressed_since_last" in lines[1] and "49" in lines[1]


@pytest.mark.cluster
async def test_concurrent_calls_with_one_unknown_token_share_one_review(auth_world: AuthWorld) -> None:
    authorizer = auth_world.authorizer()
    async with _Gate(authorizer) as gate:
        statuses = await asyncio.gather(*(gate.call("not-a-valid-token") for _ in range(20)))
    assert set(statuses) == {Status.UNAUTHENTICATED}
    assert authorizer.token_reviews == 1


@pytest.mark.cluster
async def test_a_positive_decision_never_outlives_the_token(auth_world: AuthWorld) -> None:
    await auth_world.create_service_account("expiring")
    await auth_world.grant("expiring")
    token = await auth_world.mint("expiring")
    expiry = token_expiry(token)
    assert expiry is not None
    # A clock 5 s before the token's expiry: however long the configured TTL, the decision must go then.
    authorizer = auth_world.authorizer(CacheTTLs(token_success=3600.0))
    authorizer.wall_clock = lambda: expiry - 5.0
    async with _Gate(authorizer) as gate:
        assert await gate.call(token) == PASSED
        assert await gate.call(token) == PASSED
        assert authorizer.token_reviews == 1
        await asyncio.sleep(6.0)
        assert await gate.call(token) == PASSED
        assert authorizer.token_reviews == 2, "the cached decision outlived the token's exp"


@pytest.mark.cluster
async def test_a_token_of_a_recreated_service_account_is_refused_once_the_default_ttl_passed(
    auth_world: AuthWorld,
) -> None:
    # The account is deleted and recreated under the same name (a new uid): the apiserver refuses the
    # old token at once; the agent may trust its cached decision only for the default positive TTL.
    await auth_world.create_service_account("phoenix")
    await auth_world.grant("phoenix")  # by name: the new account is granted too
    token = await auth_world.mint("phoenix")
    now = [1000.0]
    cached = auth_world.authorizer(clock=lambda: now[0])  # the TTLs the agent runs with
    async with _Gate(cached) as gate:
        assert await gate.call(token) == PASSED
        await auth_world.delete_service_account("phoenix")
        await auth_world.create_service_account("phoenix")

        async def apiserver_refuses() -> bool:
            async with _Gate(auth_world.authorizer()) as fresh:
                return await fresh.call(token) == Status.UNAUTHENTICATED

        await wait_until("the apiserver to refuse the token", apiserver_refuses, within=60.0)
        assert await gate.call(token) == PASSED, "the decision is cached for a while..."
        now[0] += CacheTTLs().token_success + 1.0
        assert await gate.call(token) == Status.UNAUTHENTICATED, "...but not past the positive TTL"
        assert CacheTTLs().token_success <= 120.0


async def _raw_call(port: int, authorization: bytes) -> bytes:
    """One gRPC request written by hand over HTTP/2 (grpclib's client would refuse to send it);
    returns what the server sent before it closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    headers = [
        (b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
        (b":path", b"/pko.agent.v1.AutomationService/PulumiVersion"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"authorization", authorization),
    ]  # fmt: skip
    conn.send_headers(1, headers, end_stream=True)
    writer.write(conn.data_to_send())
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 30):
            received += chunk
    finally:
        writer.close()
    return received


@pytest.mark.cluster
async def test_a_non_ascii_authorization_header_is_refused_quietly(
    auth_world: AuthWorld, gate: _Gate, caplog: pytest.LogCaptureFixture
) -> None:
    """grpclib decodes headers as ASCII inside data_received: without the guard, asyncio logs a fatal
    protocol error with a traceback at ERROR for every such request."""
    before = REFUSALS.labels(reason="malformed request headers")._value.get()
    with caplog.at_level(logging.DEBUG):
        await _raw_call(gate.port, b"Bearer \xff\xfe\xc3token")  # returns: the connection was closed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert REFUSALS.labels(reason="malformed request headers")._value.get() - before == 1
    # The server is unharmed: the next caller is served as usual.
    await auth_world.create_service_account("after-garbage")
    await auth_world.grant("after-garbage")
    assert await gate.call(await auth_world.mint("after-garbage")) == PASSED


# --- bound, expiring, audience-scoped tokens (issue 17) -----------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def _sign(signing_key: Path, header: dict[str, Any], claims: dict[str, Any]) -> str:
    """An RS256 JWT signed with the apiserver's service-account key, as the apiserver signs its own."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = serialization.load_pem_private_key(signing_key.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"


@pytest.fixture
def signing_key(cluster: Any) -> Path:
    key = Path(cluster.dir) / "pki" / "sa.key"
    if not key.is_file():
        pytest.skip("needs the service-account signing key of a control plane started by the tests")
    return key


@pytest.mark.cluster
async def test_an_expired_token_is_refused_on_first_use(auth_world: AuthWorld, signing_key: Path) -> None:
    await auth_world.create_service_account("lapsed")
    await auth_world.grant("lapsed")
    minted = await auth_world.mint("lapsed")
    header_part, claims_part, _ = minted.split(".")
    header, claims = _unb64(header_part), _unb64(claims_part)
    assert header["alg"] == "RS256" and header.get("kid")
    assert claims["aud"] == [auth_world.audience]
    assert claims["sub"] == f"system:serviceaccount:{auth_world.namespace}:lapsed"
    assert claims["kubernetes.io"]["serviceaccount"]["name"] == "lapsed"
    assert {"iss", "exp", "iat", "nbf"} <= set(claims)

    now = int(time.time())

    def resigned(issued: int, lifetime: int) -> str:
        times = {"iat": issued, "nbf": issued, "exp": issued + lifetime, "jti": str(uuid.uuid4())}
        return _sign(signing_key, header, {**claims, **times})

    valid = resigned(now, 600)
    # Expired 10 minutes ago: well past the apiserver's 1-minute clock-skew leeway.
    expired = resigned(now - 1200, 600)
    # The control: the apiserver accepts what we sign, so the refusal below is the expiry's.
    ok = await auth_world.review(valid, [auth_world.audience])
    assert ok.authenticated and ok.user.username == claims["sub"]
    refused = await auth_world.review(expired, [auth_world.audience])
    assert not refused.authenticated
    assert "expired" in (refused.error or ""), refused.error

    authorizer = auth_world.authorizer(CacheTTLs(token_success=3600.0))
    async with _Gate(authorizer) as gate:
        assert await gate.call(expired) == Status.UNAUTHENTICATED
        assert authorizer.token_reviews == 1, "refused by the apiserver's TokenReview on first use"
        assert await gate.call(valid) == PASSED


@pytest.mark.cluster
async def test_a_token_for_another_audience_is_refused_by_the_apiservers_review(
    auth_world: AuthWorld, gate: _Gate
) -> None:
    await auth_world.create_service_account("elsewhere")
    await auth_world.grant("elsewhere")
    # A good token for the apiserver itself (pko-test is one of its --api-audiences), and one for
    # another workspace's agent: both valid, neither for this agent.
    for audience in ("pko-test", f"other-ws.{auth_world.namespace}"):
        token = await auth_world.mint("elsewhere", audience=audience)
        assert (await auth_world.review(token, [audience])).authenticated
        refused = await auth_world.review(token, [auth_world.audience])
        assert not refused.authenticated, audience
        assert await gate.call(token) == Status.UNAUTHENTICATED, audience
    assert await gate.call(await auth_world.mint("elsewhere")) == PASSED


@pytest.mark.cluster
async def test_a_token_bound_to_a_deleted_pod_is_refused_once_the_positive_ttl_passed(
    auth_world: AuthWorld,
) -> None:
    await auth_world.create_service_account("tenant")
    await auth_world.grant("tenant")
    pod = await auth_world.create_pod("holder", "tenant")  # no node: it stays Pending
    token = await auth_world.mint("tenant", bound_pod=pod)
    bound = _unb64(token.split(".")[1])["kubernetes.io"]["pod"]
    assert bound == {"name": "holder", "uid": pod.metadata.uid}

    now = [1000.0]
    cached = auth_world.authorizer(clock=lambda: now[0])  # the TTLs the agent runs with
    async with _Gate(cached) as gate:
        assert await gate.call(token) == PASSED
        await auth_world.delete_pod("holder")

        errors: list[str] = []

        async def apiserver_refuses() -> bool:
            status = await auth_world.review(token, [auth_world.audience])
            errors.append(status.error or "")
            return not status.authenticated

        # The apiserver itself trusts a positive authentication for 10 s (its token cache).
        await wait_until("the apiserver to refuse the token", apiserver_refuses, within=60.0)
        assert "invalidated" in errors[-1], errors[-1]
        async with _Gate(auth_world.authorizer()) as fresh:
            assert await fresh.call(token) == Status.UNAUTHENTICATED, "a new gate refuses it at once"
        assert await gate.call(token) == PASSED, "the decision is cached for a while..."
        now[0] += CacheTTLs().token_success + 1.0
        assert await gate.call(token) == Status.UNAUTHENTICATED, "...but not past the positive TTL"
    # A Pod of the same name is another Pod (a new uid): the token stays refused.
    await auth_world.create_pod("holder", "tenant")
    assert not (await auth_world.review(token, [auth_world.audience])).authenticated

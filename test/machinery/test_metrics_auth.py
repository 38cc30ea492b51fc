"""``/metrics`` authenticated and authorised (pko.machinery.metricsauth, servingcert).

The cache and its verdicts are pure (reviewers as plain functions, a hand-moved clock); the server
runs against the suite's real kube-apiserver: no token 401, a token whose user lacks the
metrics-reader ClusterRole 403, one bound to it 200, over HTTPS with a self-signed certificate or the
pair of a directory (renewed without a restart); ``metrics_secure=False`` serves plain HTTP to anyone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.machinery.manager import Manager, ManagerOptions
from pko.machinery.metricsauth import CacheTTLs, MetricsAuthorizer, UserInfo, bearer_token, token_expiry
from pko.machinery.resource import Resource, ResourceClient
from pko.machinery.servingcert import CERT_NAME, KEY_NAME, CertSource, self_signed

REPO = Path(__file__).resolve().parents[2]
Running = list[tuple[Manager, "asyncio.Task[None]"]]
ALICE = UserInfo("system:serviceaccount:ns:alice", uid="u1", groups=("system:serviceaccounts",))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reviews:
    """Reviewers answering from tables, counting what they were asked."""

    def __init__(self, users: dict[str, UserInfo], allowed: set[str]) -> None:
        self.users = users
        self.allowed = allowed
        self.tokens: list[str] = []
        self.access: list[str] = []
        self.fail = False

    def token(self, token: str) -> UserInfo | None:
        self.tokens.append(token)
        if self.fail:
            raise ConnectionError("apiserver unreachable")
        return self.users.get(token)

    def access_of(self, user: UserInfo) -> tuple[bool, str]:
        self.access.append(user.username)
        if self.fail:
            raise ConnectionError("apiserver unreachable")
        return (user.username in self.allowed, "" if user.username in self.allowed else "no RBAC")


def authorizer(reviews: Reviews, clock: Clock, wall: float = 0.0) -> MetricsAuthorizer:
    return MetricsAuthorizer(
        reviews.token,
        reviews.access_of,
        ttls=CacheTTLs(120, 10, 60, 10),
        clock=clock,
        wall_clock=lambda: wall,
    )


def test_verdicts_no_token_401_unknown_401_not_allowed_403_allowed_200() -> None:
    bob = UserInfo("bob")
    reviews = Reviews({"a": ALICE, "b": bob}, {ALICE.username})
    auth = authorizer(reviews, Clock())
    assert auth.check(None).status == 401
    assert auth.check("Basic a").status == 401
    assert auth.check("Bearer ").status == 401
    assert auth.check("Bearer x").status == 401
    verdict = auth.check("Bearer b")
    assert verdict.status == 403 and "bob may not get /metrics" in verdict.reason
    assert auth.check("bearer a").allowed
    assert reviews.tokens == ["x", "b", "a"]  # no review without a token


def test_answers_are_cached_for_their_ttl_then_asked_again() -> None:
    clock = Clock()
    reviews = Reviews({"a": ALICE}, {ALICE.username})
    auth = authorizer(reviews, clock)
    for _ in range(5):  # a scrape every 15 s for a minute: one review of each kind
        assert auth.check("Bearer a").allowed
        clock.now += 14
    assert (reviews.tokens, reviews.access) == (["a"], [ALICE.username])
    clock.now += 60 - 14 * 5 + 1  # the access answer (60 s) expired, the token's (120 s) not
    assert auth.check("Bearer a").allowed
    assert (len(reviews.tokens), len(reviews.access)) == (1, 2)
    clock.now += 60
    assert auth.check("Bearer a").allowed
    assert (len(reviews.tokens), len(reviews.access)) == (2, 3)


def test_refusals_are_cached_briefly() -> None:
    clock = Clock()
    reviews = Reviews({"a": ALICE}, set())
    auth = authorizer(reviews, clock)
    assert auth.check("Bearer nobody").status == 401
    assert auth.check("Bearer a").status == 403
    clock.now += 9
    assert auth.check("Bearer nobody").status == 401
    assert auth.check("Bearer a").status == 403
    assert (reviews.tokens, reviews.access) == (["nobody", "a"], [ALICE.username])
    reviews.allowed.add(ALICE.username)  # bound to metrics-reader: seen once the denial expires
    clock.now += 2
    assert auth.check("Bearer nobody").status == 401
    assert auth.check("Bearer a").allowed
    assert len(reviews.tokens) == 3 and len(reviews.access) == 2


def test_a_failed_review_is_500_and_not_cached() -> None:
    reviews = Reviews({"a": ALICE}, {ALICE.username})
    auth = authorizer(reviews, Clock())
    reviews.fail = True
    assert auth.check("Bearer a").status == 500
    reviews.fail = False
    assert auth.check("Bearer a").allowed
    assert reviews.tokens == ["a", "a"]


def _jwt(claims: dict[str, Any]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"e30.{body}.sig"


def test_a_token_is_trusted_no_longer_than_its_exp() -> None:
    clock = Clock()
    token = _jwt({"exp": 5030})
    reviews = Reviews({token: ALICE}, {ALICE.username})
    auth = authorizer(reviews, clock, wall=5000.0)  # expires in 30 s
    assert auth.check(f"Bearer {token}").allowed
    clock.now += 29
    assert auth.check(f"Bearer {token}").allowed
    clock.now += 2
    assert auth.check(f"Bearer {token}").allowed
    assert len(reviews.tokens) == 2
    assert token_expiry("not-a-jwt") is None and token_expiry(_jwt({"exp": True})) is None
    assert bearer_token("Bearer  t ") == "t"


def test_concurrent_scrapes_with_one_unknown_token_share_one_review() -> None:
    release = threading.Event()
    asked: list[str] = []

    def slow_token(token: str) -> UserInfo | None:
        asked.append(token)
        release.wait(5)
        return ALICE

    auth = MetricsAuthorizer(slow_token, lambda user: (True, ""))
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(auth.check("Bearer a").status)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    release.set()
    for t in threads:
        t.join(5)
    assert results == [200] * 4 and asked == ["a"]


def test_the_server_speaks_tls_1_2_at_least() -> None:
    assert CertSource().context().minimum_version == ssl.TLSVersion.TLSv1_2


# --- against the real apiserver ------------------------------------------------------------------

SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
READER_ROLE = yaml.safe_load((REPO / "config/rbac/metrics_reader_role.yaml").read_text())


async def token_of(api: client.ApiClient, namespace: str, name: str) -> str:
    await ResourceClient(api, SERVICE_ACCOUNTS, namespace).create({"metadata": {"name": name}})
    resp = await client.CoreV1Api(api).create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}, _preload_content=False
    )
    return str(json.loads(await resp.read())["status"]["token"])


@pytest.fixture
async def reader_binding(api_client: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    """The shipped metrics-reader ClusterRole bound to ServiceAccount ``reader`` of ``namespace``."""
    await ResourceClient(api_client, CLUSTER_ROLES).apply(READER_ROLE, field_manager="pko-tests")
    name = f"metrics-reader-{namespace}"
    await ResourceClient(api_client, BINDINGS).create(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READER_ROLE["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        }
    )
    yield name
    with contextlib.suppress(ApiException):
        await ResourceClient(api_client, BINDINGS).delete(name)


@pytest.fixture
async def serving() -> AsyncIterator[list[tuple[Manager, asyncio.Task[None]]]]:
    """The managers :func:`start` ran, stopped afterwards."""
    running: list[tuple[Manager, asyncio.Task[None]]] = []
    yield running
    for manager, task in running:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)


async def start(api: client.ApiClient, namespace: str, running: Running, **options: Any) -> int:
    manager = Manager(
        api,
        ManagerOptions(
            metrics_bind_address="127.0.0.1:0", health_probe_bind_address="0", namespace=namespace, **options
        ),
    )
    task = asyncio.create_task(manager.run())
    running.append((manager, task))
    waiting = asyncio.create_task(manager.wait_serving())
    await asyncio.wait({task, waiting}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    address = manager.address("metrics")
    assert address is not None
    return address[1]


async def scrape(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=False) as resp:
        return resp.status, await resp.text()


@pytest.mark.cluster
async def test_https_scrapes_are_reviewed_by_the_apiserver(
    api_client: client.ApiClient, namespace: str, reader_binding: str, serving: Running
) -> None:
    reader = await token_of(api_client, namespace, "reader")
    stranger = await token_of(api_client, namespace, "stranger")
    port = await start(api_client, namespace, serving)
    url = f"https://127.0.0.1:{port}/metrics"

    assert (await scrape(url))[0] == 401
    assert (await scrape(url, "not-a-token"))[0] == 401
    status, text = await scrape(url, stranger)
    assert status == 403 and f"system:serviceaccount:{namespace}:stranger may not get /metrics" in text
    status, text = await scrape(url, reader)
    assert status == 200 and "pko_event_loop_heartbeat_age_seconds" in text
    # TLS only: plain HTTP gets no answer.
    with pytest.raises(aiohttp.ClientError):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            await resp.read()


@pytest.mark.cluster
async def test_plain_http_when_metrics_secure_is_off(
    api_client: client.ApiClient, namespace: str, serving: Running
) -> None:
    port = await start(api_client, namespace, serving, metrics_secure=False)
    status, text = await scrape(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and "pko_event_loop_heartbeat_age_seconds" in text


def served_certificate(port: int) -> str:
    return ssl.get_server_certificate(("127.0.0.1", port))


def write_pair(directory: Path, host: str) -> str:
    cert, key = self_signed([host, "127.0.0.1"])
    (directory / KEY_NAME).write_bytes(key)
    (directory / CERT_NAME).write_bytes(cert)
    return cert.decode()


def same_cert(a: str, b: str) -> bool:
    return ssl.PEM_cert_to_DER_cert(a) == ssl.PEM_cert_to_DER_cert(b)


@pytest.mark.cluster
async def test_a_cert_dir_pair_is_served_and_a_renewed_one_picked_up(
    api_client: client.ApiClient, namespace: str, reader_binding: str, serving: Running, tmp_path: Path
) -> None:
    first = write_pair(tmp_path, "first.example")
    port = await start(api_client, namespace, serving, metrics_cert_dir=str(tmp_path))
    assert same_cert(await asyncio.to_thread(served_certificate, port), first)
    # A client that trusts exactly that certificate, as Prometheus given the CA does.
    trusting = ssl.create_default_context(cadata=first)
    trusting.check_hostname = False
    reader = await token_of(api_client, namespace, "reader")
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {reader}"}, ssl=trusting
        ) as resp,
    ):
        assert resp.status == 200

    await asyncio.sleep(0.01)  # a distinct modification time
    second = write_pair(tmp_path, "second.example")
    assert same_cert(await asyncio.to_thread(served_certificate, port), second)

"""TokenSource against the real apiserver: caching, single flight, refresh, pruning, clear errors."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from pko.devtools.agents import AuthWorld
from pko.tokens import TokenError, TokenSource

pytestmark = pytest.mark.cluster


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


async def test_one_request_per_audience_shared_by_concurrent_callers(
    api_client: client.ApiClient, auth_world: AuthWorld, operator_sa: str
) -> None:
    tokens = TokenSource(api_client, auth_world.namespace, operator_sa)
    first = await asyncio.gather(*(tokens.token("a.ns") for _ in range(8)))
    assert len(set(first)) == 1 and tokens.requests == 1
    assert await tokens.token("a.ns") == first[0] and tokens.requests == 1
    other = await tokens.token("b.ns")
    assert tokens.requests == 2 and other != first[0]
    c = claims(first[0])
    assert c["aud"] == ["a.ns"]
    assert c["sub"] == f"system:serviceaccount:{auth_world.namespace}:{operator_sa}"
    assert 3500 <= c["exp"] - c["iat"] <= 3600
    assert sorted(tokens.audiences) == ["a.ns", "b.ns"]


async def test_a_token_is_refreshed_leeway_before_it_expires(
    api_client: client.ApiClient, auth_world: AuthWorld, operator_sa: str
) -> None:
    # 600 s is the apiserver's minimum; a leeway of 598 s makes the token due for refresh after 2 s.
    tokens = TokenSource(api_client, auth_world.namespace, operator_sa, expiration_seconds=600, leeway=598)
    first = await tokens.token("r.ns")
    assert await tokens.token("r.ns") == first and tokens.requests == 1
    await asyncio.sleep(2.5)
    second = await tokens.token("r.ns")
    assert second != first and tokens.requests == 2
    assert claims(second)["iat"] > claims(first)["iat"]
    tokens.invalidate("r.ns")
    await tokens.token("r.ns")
    assert tokens.requests == 3


async def test_audiences_unused_for_two_hours_are_pruned(
    api_client: client.ApiClient, auth_world: AuthWorld, operator_sa: str
) -> None:
    now = [1000.0]
    tokens = TokenSource(api_client, auth_world.namespace, operator_sa, clock=lambda: now[0])
    await tokens.token("old.ns")
    now[0] += 3600
    await tokens.token("new.ns")
    now[0] += 3700  # old: idle 7300 s; new: 3700 s
    assert await tokens.token("new.ns")
    assert tokens.audiences == ["new.ns"] and tokens.requests == 3  # new.ns refreshed (past leeway)


async def test_errors_name_the_missing_account_and_the_missing_rbac(
    api_client: client.ApiClient, auth_world: AuthWorld, client_as: Callable[[str], client.ApiClient]
) -> None:
    missing = TokenSource(api_client, auth_world.namespace, "nobody")
    with pytest.raises(TokenError) as nobody:
        await missing.token("x.ns")
    assert nobody.value.reason == "ServiceAccountNotFound" and not nobody.value.transient
    assert f"ServiceAccount {auth_world.namespace}/nobody not found" in nobody.value.message
    assert missing.audiences == []  # failures are not cached
    with pytest.raises(TokenError):
        await missing.token("x.ns")
    assert missing.requests == 2

    await auth_world.create_service_account("no-rbac")
    # A token with no audience given is for the apiserver itself: the account can log in, no more.
    api_token = (
        await client.CoreV1Api(api_client).create_namespaced_service_account_token(
            "no-rbac",
            auth_world.namespace,
            client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec()),
        )
    ).status.token
    async with client_as(str(api_token)) as limited:
        forbidden = TokenSource(limited, auth_world.namespace, "no-rbac")
        with pytest.raises(TokenError) as denied:
            await forbidden.token("x.ns")
    assert denied.value.reason == "TokenRequestForbidden" and not denied.value.transient
    assert "serviceaccounts/token" in denied.value.message


async def test_a_failed_refresh_keeps_the_valid_token_and_backs_off_until_it_expires(
    api_client: client.ApiClient, auth_world: AuthWorld
) -> None:
    # A fake clock drives refresh, backoff and expiry; the failures are the apiserver's own (the
    # ServiceAccount deleted: TokenRequest answers 404).
    await auth_world.create_service_account("refreshed")
    now = [1000.0]
    tokens = TokenSource(
        api_client,
        auth_world.namespace,
        "refreshed",
        expiration_seconds=600,  # the apiserver's minimum; refresh from ~1300, expiry ~1600
        leeway=300,
        retry_initial=5,
        retry_max=20,
        clock=lambda: now[0],
    )
    first = await tokens.token("f.ns")
    await auth_world.delete_service_account("refreshed")

    now[0] = 1350.0  # in the refresh window: one shared TokenRequest fails, everyone gets the cached token
    assert await asyncio.gather(*(tokens.token("f.ns") for _ in range(4))) == [first] * 4
    assert tokens.requests == 2
    # backing off: no TokenRequest on each call, a retry after 5 s, 10 s, then 20 s (the cap)
    for at, sent in ((1354.9, 2), (1355, 3), (1364.9, 3), (1365, 4), (1384.9, 4), (1385, 5), (1404.9, 5)):
        now[0] = at
        assert await tokens.token("f.ns") == first
        assert tokens.requests == sent, at
    assert tokens.audiences == ["f.ns"]

    now[0] = 1601.0  # expired: now the failure is the caller's, and nothing is cached
    with pytest.raises(TokenError) as gone:
        await tokens.token("f.ns")
    assert gone.value.reason == "ServiceAccountNotFound"
    assert tokens.audiences == []
    with pytest.raises(TokenError):
        await tokens.token("f.ns")  # no token to fall back on: every call asks
    assert tokens.requests == 7

    # the account is back: a new token, and a later failed refresh starts the backoff over
    await auth_world.create_service_account("refreshed")
    second = await tokens.token("f.ns")
    assert second != first and tokens.requests == 8
    await auth_world.delete_service_account("refreshed")
    now[0] += 350
    assert await tokens.token("f.ns") == second and tokens.requests == 9
    now[0] += 5.5
    assert await tokens.token("f.ns") == second and tokens.requests == 10


async def test_a_refused_token_is_not_fallen_back_on(
    api_client: client.ApiClient, auth_world: AuthWorld
) -> None:
    # invalidate (an agent refused the token) drops it: a failed mint then reaches the caller
    await auth_world.create_service_account("dropped")
    now = [1000.0]
    tokens = TokenSource(
        api_client, auth_world.namespace, "dropped", expiration_seconds=600, leeway=300, clock=lambda: now[0]
    )
    await tokens.token("d.ns")
    await auth_world.delete_service_account("dropped")
    tokens.invalidate("d.ns")
    with pytest.raises(TokenError):
        await tokens.token("d.ns")

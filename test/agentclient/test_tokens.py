"""TokenSource against the real apiserver: caching, single flight, refresh, pruning, clear errors."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest_agent import AuthWorld
from kubernetes_asyncio import client

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

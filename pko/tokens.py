"""Bound service-account tokens for the operator's calls to workspace agents (TokenRequest).

Each workspace agent accepts only tokens whose audience is its own (``<ws>.<ns>``), so the operator
needs one token per workspace. It mints them for its own ServiceAccount (``POD_SA_NAME``) with the
TokenRequest API, like the Go operator, instead of reusing its projected token: that one carries the
apiserver's audience and would be accepted by any agent that trusted it.

Invariants:

* one cached token per audience, reused until ``leeway`` seconds (upstream: 5 minutes) before it
  expires, so a call never carries a token about to lapse mid-operation;
* concurrent callers for one audience share a single TokenRequest (single flight); a caller that
  is cancelled does not cancel the request the others wait on;
* an audience unused for ``idle_ttl`` (2 h) is dropped, checked lazily at most every
  ``prune_interval`` (5 min), so workspaces that come and go do not grow the cache forever;
* failures are never cached: the next call asks again. They raise ``TokenError`` with a message
  that names the fix (a missing ServiceAccount, RBAC forbidding ``serviceaccounts/token`` create).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient, ApiException

DEFAULT_EXPIRATION: Final = 3600  # seconds; not 3607, which the apiserver may silently extend to a year
DEFAULT_LEEWAY: Final = 300.0
IDLE_TTL: Final = 2 * 3600.0
PRUNE_INTERVAL: Final = 300.0


class TokenError(Exception):
    """A token could not be minted: ``reason`` (CamelCase, for conditions), ``transient`` (retry may work)."""

    def __init__(self, reason: str, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.transient = transient


@dataclass
class _Entry:
    token: str
    refresh_at: float  # monotonic: when to mint a new one
    last_used: float  # monotonic


class TokenSource:
    """TokenRequest tokens for one ServiceAccount, cached per audience; see the module docstring."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        service_account: str,
        *,
        expiration_seconds: int = DEFAULT_EXPIRATION,
        leeway: float = DEFAULT_LEEWAY,
        idle_ttl: float = IDLE_TTL,
        prune_interval: float = PRUNE_INTERVAL,
        request_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.service_account = service_account
        self.expiration_seconds = expiration_seconds
        self.leeway = leeway
        self.idle_ttl = idle_ttl
        self.prune_interval = prune_interval
        self.request_timeout = request_timeout
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Task[_Entry]] = {}
        self._last_prune = clock()
        self.requests = 0  # TokenRequests sent (successful or not): for metrics and tests

    @property
    def audiences(self) -> list[str]:
        """Audiences with a cached token."""
        return list(self._entries)

    async def token(self, audience: str) -> str:
        """A token for ``audience``, from the cache unless it is within ``leeway`` of expiring."""
        if not audience:
            raise ValueError("an audience is required")
        now = self._clock()
        self._maybe_prune(now)
        entry = self._entries.get(audience)
        if entry is not None and now < entry.refresh_at:
            entry.last_used = now
            return entry.token
        task = self._inflight.get(audience)
        if task is None:
            task = asyncio.create_task(self._mint(audience), name=f"token-request-{audience}")
            self._inflight[audience] = task
            task.add_done_callback(lambda t: self._done(audience, t))
        entry = await asyncio.shield(task)
        entry.last_used = self._clock()
        return entry.token

    def invalidate(self, audience: str) -> None:
        """Forget the cached token (e.g. an agent refused it): the next call mints a new one."""
        self._entries.pop(audience, None)

    def _done(self, audience: str, task: asyncio.Task[_Entry]) -> None:
        if self._inflight.get(audience) is task:
            del self._inflight[audience]
        if not task.cancelled() and task.exception() is None:
            self._entries[audience] = task.result()

    def _maybe_prune(self, now: float) -> None:
        if now - self._last_prune < self.prune_interval:
            return
        self._last_prune = now
        for audience in [a for a, e in self._entries.items() if now - e.last_used >= self.idle_ttl]:
            del self._entries[audience]

    async def _mint(self, audience: str) -> _Entry:
        self.requests += 1
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[audience], expiration_seconds=self.expiration_seconds)
        )
        who = f"ServiceAccount {self.namespace}/{self.service_account}"
        try:
            res = await self._core.create_namespaced_service_account_token(
                self.service_account, self.namespace, body, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            raise _token_error(exc, who) from None
        except (TimeoutError, OSError) as exc:
            raise TokenError(
                "TokenRequestFailed",
                f"TokenRequest for {who} failed: {type(exc).__name__}: {exc}",
                transient=True,
            ) from None
        status = res.status
        if status is None or not status.token:
            raise TokenError(
                "TokenRequestFailed", f"TokenRequest for {who} returned no token", transient=True
            )
        now = self._clock()
        lifetime = float(self.expiration_seconds)
        expires: datetime | None = status.expiration_timestamp
        if expires is not None:
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=UTC)
            lifetime = (expires - datetime.now(UTC)).total_seconds()
        return _Entry(
            token=str(status.token), refresh_at=now + max(0.0, lifetime - self.leeway), last_used=now
        )


def _token_error(exc: ApiException, who: str) -> TokenError:
    status = exc.status or 0
    if status == 404:
        return TokenError(
            "ServiceAccountNotFound", f"{who} not found: cannot request a token", transient=False
        )
    if status == 403:
        return TokenError(
            "TokenRequestForbidden",
            f"the operator may not create serviceaccounts/token for {who}: grant it RBAC "
            "'create' on 'serviceaccounts/token' in that namespace",
            transient=False,
        )
    transient = status == 0 or status == 429 or status >= 500
    return TokenError(
        "TokenRequestFailed", f"TokenRequest for {who} failed: {status} {exc.reason}", transient=transient
    )

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
* a refresh that fails while the cached token is still valid (inside the ``leeway`` window) is
  not the caller's problem: the cached token is returned, the failure logged, and the next
  TokenRequest waits ``retry_initial`` seconds, doubling with each failure up to ``retry_max``
  (not one request per call); a success starts over;
* a failure reaches the caller only when there is no valid token to fall back on (none cached,
  expired, or dropped by ``invalidate`` because an agent refused it): then nothing is cached and
  the next call asks again. It raises ``TokenError`` with a message that names the fix (a missing
  ServiceAccount, RBAC forbidding ``serviceaccounts/token`` create).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from urllib.parse import quote

import aiohttp
import structlog

from pko.machinery.conditions import parse_time
from pko.machinery.kubeclient import ApiException, KubeClient

DEFAULT_EXPIRATION: Final = 3600  # seconds; not 3607, which the apiserver may silently extend to a year
DEFAULT_LEEWAY: Final = 300.0
IDLE_TTL: Final = 2 * 3600.0
PRUNE_INTERVAL: Final = 300.0
RETRY_INITIAL: Final = 5.0  # seconds after a failed refresh, doubling with each failure ...
RETRY_MAX: Final = 60.0  # ... up to this

_log = structlog.get_logger("pko.tokens")


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
    expires_at: float  # monotonic: when the token stops being valid
    last_used: float  # monotonic
    retry_at: float = 0.0  # monotonic: after a failed refresh, no TokenRequest before this
    failures: int = 0  # failed refreshes in a row


class TokenSource:
    """TokenRequest tokens for one ServiceAccount, cached per audience; see the module docstring."""

    def __init__(
        self,
        api: KubeClient,
        namespace: str,
        service_account: str,
        *,
        expiration_seconds: int = DEFAULT_EXPIRATION,
        leeway: float = DEFAULT_LEEWAY,
        idle_ttl: float = IDLE_TTL,
        prune_interval: float = PRUNE_INTERVAL,
        request_timeout: float = 30.0,
        retry_initial: float = RETRY_INITIAL,
        retry_max: float = RETRY_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.service_account = service_account
        self.expiration_seconds = expiration_seconds
        self.leeway = leeway
        self.idle_ttl = idle_ttl
        self.prune_interval = prune_interval
        self.request_timeout = request_timeout
        self.retry_initial = retry_initial
        self.retry_max = retry_max
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
        """A token for ``audience``, from the cache unless it is within ``leeway`` of expiring (and
        then still from the cache while a new one cannot be had and it has not expired)."""
        if not audience:
            raise ValueError("an audience is required")
        now = self._clock()
        self._maybe_prune(now)
        entry = self._entries.get(audience)
        if entry is not None and (now < entry.refresh_at or now < min(entry.retry_at, entry.expires_at)):
            entry.last_used = now
            return entry.token
        task = self._inflight.get(audience)
        if task is None:
            task = asyncio.create_task(self._refresh(audience), name=f"token-request-{audience}")
            self._inflight[audience] = task
            task.add_done_callback(lambda t: self._done(audience, t))
        try:
            fresh = await asyncio.shield(task)
        except Exception:
            stale = self._entries.get(audience)
            now = self._clock()
            if stale is None or now >= stale.expires_at:
                self._entries.pop(audience, None)  # expired: nothing to fall back on
                raise
            stale.last_used = now
            return stale.token
        fresh.last_used = self._clock()
        return fresh.token

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

    async def _refresh(self, audience: str) -> _Entry:
        """Mint a token; when that fails while the cached one is valid, back off before the next try."""
        try:
            return await self._mint(audience)
        except Exception as exc:
            entry = self._entries.get(audience)
            now = self._clock()
            if entry is not None and now < entry.expires_at:
                entry.failures += 1
                delay = min(self.retry_max, self.retry_initial * 2 ** (entry.failures - 1))
                entry.retry_at = now + delay
                _log.warning(
                    "could not refresh a workspace token; using the cached one until it expires",
                    audience=audience,
                    reason=exc.reason if isinstance(exc, TokenError) else type(exc).__name__,
                    error=str(exc),
                    failures=entry.failures,
                    retry_in=round(delay, 1),
                    expires_in=round(entry.expires_at - now, 1),
                )
            raise

    async def _mint(self, audience: str) -> _Entry:
        self.requests += 1
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [audience], "expirationSeconds": self.expiration_seconds},
        }
        who = f"ServiceAccount {self.namespace}/{self.service_account}"
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/serviceaccounts/"
        path += f"{quote(self.service_account, safe='')}/token"
        try:
            res = await self._api.call_json(
                "POST", path, body=body, client_timeout=aiohttp.ClientTimeout(total=self.request_timeout)
            )
        except ApiException as exc:
            raise _token_error(exc, who) from None
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise TokenError(
                "TokenRequestFailed",
                f"TokenRequest for {who} failed: {type(exc).__name__}: {exc}",
                transient=True,
            ) from None
        status = res.get("status") or {}
        if not status.get("token"):
            raise TokenError(
                "TokenRequestFailed", f"TokenRequest for {who} returned no token", transient=True
            )
        now = self._clock()
        lifetime = float(self.expiration_seconds)
        expires = parse_time(status.get("expirationTimestamp"))
        if expires is not None:
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=UTC)
            lifetime = (expires - datetime.now(UTC)).total_seconds()
        return _Entry(
            token=str(status["token"]),
            refresh_at=now + max(0.0, lifetime - self.leeway),
            expires_at=now + max(0.0, lifetime),
            last_used=now,
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

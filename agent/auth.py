"""Kubernetes authentication and authorisation of every RPC the agent serves.

A call must carry ``authorization: Bearer <token>``. The token is checked with a TokenReview that
names the audiences the workspace was configured with (so a token minted for another workspace, or
for the apiserver itself, is rejected), then a SubjectAccessReview asks whether that user may
``use`` the ``workspaces/rpc`` subresource (group ``auto.pulumi.com``) of this Workspace. A token
that fails review, or a review the agent may not make (its account lacks ``system:auth-delegator``),
is ``UNAUTHENTICATED``; a SubjectAccessReview that says no is ``PERMISSION_DENIED``; any other
apiserver error is ``INTERNAL`` and an unreachable apiserver ``UNAVAILABLE`` (docs/security.md).

Decisions are cached in bounded LRUs: TokenReview success 2 min (kube-apiserver's own webhook token
cache default; the Go agent's 1 h let a token outlive its expiry, its service account's deletion and
its re-creation), never beyond the token's own ``exp`` (read from the JWT without trusting it for
anything else), failure 10 s; SubjectAccessReview allow 5 min, deny 5 s. So an expired token is
refused on first use (kube-apiserver allows 1 min of clock skew past ``exp``), and a token whose
grounds are gone (its ServiceAccount deleted or recreated, the Pod
it is bound to deleted) passes at most 2 min more, plus the 10 s kube-apiserver itself trusts a
successful token authentication (its token cache). Concurrent calls with the
same unknown token share one TokenReview (single flight). Tokens are never logged and never used as
cache keys (only their SHA-256 is). Errors talking to the apiserver are not cached.

Refusals are counted (``agent_auth_refusals_total{reason}``) and logged at WARNING at most once per
``refusal_log_interval`` with the number suppressed since, so a flood of bad tokens cannot flood the log.

The gRPC health service is exempt: probes carry no token and health reveals nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from grpclib.const import Status
from grpclib.events import RecvRequest, listen
from grpclib.exceptions import GRPCError
from grpclib.server import Server
from pko.agent.kubeapi import KubeAPI, KubeAPIError
from prometheus_client import Counter

from pko.machinery.metricsauth import token_expiry

log = structlog.get_logger("pko.agent.auth")

# Library loggers that print bearer tokens at DEBUG: hpack logs every header it encodes or decodes
# (the request's authorization header). Pinned at INFO whatever the agent's log level. (The agent's
# own apiserver client, pko.agent.kubeapi, logs nothing.)
TOKEN_LEAKING_LOGGERS = ("hpack",)


def silence_token_leaking_loggers() -> None:
    for name in TOKEN_LEAKING_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:  # includes NOTSET, which would inherit the root's DEBUG
            logger.setLevel(logging.INFO)


API_GROUP = "auto.pulumi.com"
API_VERSION = "v1alpha1"
RESOURCE = "workspaces"
SUBRESOURCE = "rpc"
VERB = "use"
# Methods reachable without a token.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class CacheTTLs:
    """How long decisions are trusted (seconds); a positive token decision never outlives the token."""

    token_success: float = 120.0
    token_failure: float = 10.0
    access_allowed: float = 300.0
    access_denied: float = 5.0


@dataclass(frozen=True)
class UserInfo:
    """The authenticated caller as TokenReview reported it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class _TokenDecision:
    user: UserInfo | None  # None: not authenticated
    reason: str


class TTLCache(Generic[K, V]):
    """A bounded LRU whose entries expire after a per-entry TTL (monotonic clock)."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        item = self._entries.get(key)
        if item is None:
            return None
        expires, value = item
        if self._clock() >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        self._entries[key] = (self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for transient apiserver errors (Go: 500ms x1.5, jitter 0.2, 5 steps)."""

    initial: float = 0.5
    factor: float = 1.5
    jitter: float = 0.2
    steps: int = 5
    request_timeout: float = 10.0


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, KubeAPIError):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, (OSError, asyncio.TimeoutError))


async def _with_retries(call: Callable[[], Awaitable[Any]], policy: RetryPolicy) -> Any:
    delay = policy.initial
    for attempt in range(policy.steps):
        try:
            return await asyncio.wait_for(call(), policy.request_timeout)
        except Exception as exc:
            if attempt == policy.steps - 1 or not _transient(exc):
                raise
            await asyncio.sleep(delay * (1 + random.uniform(0, policy.jitter)))
            delay *= policy.factor
    raise AssertionError("unreachable")


REFUSALS = Counter("agent_auth_refusals_total", "RPC calls the agent refused, by reason", ["reason"])


class RefusalLog:
    """One WARNING per ``interval`` seconds for refused calls, with how many were suppressed since."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._next = 0.0
        self._suppressed = 0

    def refused(self, event: str, **fields: Any) -> None:
        REFUSALS.labels(reason=event).inc()
        now = self._clock()
        if now < self._next:
            self._suppressed += 1
            return
        if self._suppressed:
            fields["suppressed_since_last"] = self._suppressed
        self._suppressed = 0
        self._next = now + self.interval
        log.warning(event, **fields)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


@dataclass
class KubeAuthorizer:
    """Checks bearer tokens against the apiserver for one Workspace; see the module docstring.

    ``api`` is the agent's own identity (``pko.agent.kubeapi.connect``): it needs ``create`` on
    ``tokenreviews`` and ``subjectaccessreviews`` (ClusterRole ``system:auth-delegator``).
    """

    api: KubeAPI
    audiences: list[str]
    workspace_namespace: str
    workspace_name: str
    ttls: CacheTTLs = field(default_factory=CacheTTLs)
    max_entries: int = 1024
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    refusal_log_interval: float = 10.0
    wall_clock: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic  # what cache TTLs are measured on

    def __post_init__(self) -> None:
        if not self.audiences:
            raise ValueError("at least one audience is required")
        silence_token_leaking_loggers()
        self._tokens: TTLCache[str, _TokenDecision] = TTLCache(self.max_entries, self.clock)
        self._access: TTLCache[UserInfo, tuple[bool, str]] = TTLCache(self.max_entries, self.clock)
        self._reviews: dict[str, asyncio.Future[_TokenDecision]] = {}
        self._refusals = RefusalLog(self.refusal_log_interval)
        self.token_reviews = 0  # TokenReviews sent (single flight makes this lower than the calls)

    def install(self, server: Server) -> None:
        """Check every request to ``server`` before its handler runs."""
        listen(server, RecvRequest, self._on_request)

    async def _on_request(self, event: RecvRequest) -> None:
        if event.method_name.startswith(UNAUTHENTICATED_PREFIXES):
            return
        values = event.metadata.getall("authorization", [])
        header = values[0] if values else None
        user = await self.authorize(header if isinstance(header, str) else None)
        log.debug("rpc authorized", method=event.method_name, user=user.username)

    async def authorize(self, authorization: str | None) -> UserInfo:
        """Authenticate and authorise one call; raises GRPCError when it must be refused."""
        token = bearer_token(authorization)
        if token is None:
            self._refusals.refused("missing bearer token")
            raise GRPCError(Status.UNAUTHENTICATED, "missing bearer token")
        user = await self.authenticate(token)
        allowed, reason = await self.check_access(user)
        if not allowed:
            self._refusals.refused("access denied", user=user.username, reason=reason)
            raise GRPCError(Status.PERMISSION_DENIED, reason or "forbidden")
        return user

    async def authenticate(self, token: str) -> UserInfo:
        key = hashlib.sha256(token.encode()).hexdigest()
        decision = self._tokens.get(key)
        if decision is None:
            decision = await self._single_flight(key, token)
        if decision.user is None:
            self._refusals.refused("authentication failed", reason=decision.reason)
            raise GRPCError(Status.UNAUTHENTICATED, "unauthenticated")
        return decision.user

    async def _single_flight(self, key: str, token: str) -> _TokenDecision:
        """One TokenReview per token at a time: concurrent callers await the same review."""
        pending = self._reviews.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[_TokenDecision] = asyncio.get_running_loop().create_future()
        self._reviews[key] = future
        try:
            self.token_reviews += 1
            decision = await self._review_token(token)
            self._tokens.put(key, decision, self._token_ttl(token, decision))
            future.set_result(decision)
            return decision
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it; no "never retrieved" warning
            raise
        finally:
            del self._reviews[key]

    def _token_ttl(self, token: str, decision: _TokenDecision) -> float:
        if decision.user is None:
            return self.ttls.token_failure
        ttl = self.ttls.token_success
        expiry = token_expiry(token)
        if expiry is not None:
            ttl = min(ttl, expiry - self.wall_clock())
        return ttl

    async def _review_token(self, token: str) -> _TokenDecision:
        try:
            status: dict[str, Any] = await _with_retries(
                lambda: self.api.create_token_review(token, self.audiences), self.retry
            )
        except KubeAPIError as exc:
            if exc.status == 403:
                log.error("the agent may not create TokenReviews: bind it to system:auth-delegator")
                raise GRPCError(Status.UNAUTHENTICATED, "TokenReview API is unavailable") from None
            log.warning("TokenReview failed", status=exc.status)
            raise GRPCError(Status.UNAUTHENTICATED, "TokenReview failed") from None
        except (TimeoutError, OSError) as exc:
            log.warning("TokenReview failed", error=type(exc).__name__)
            raise GRPCError(Status.UNAUTHENTICATED, "TokenReview failed") from None
        u = status.get("user")
        if status.get("authenticated") is not True or not isinstance(u, dict):
            return _TokenDecision(None, _text(status.get("error")) or "not authenticated")
        granted = set(_strings(status.get("audiences")))
        if not granted.intersection(self.audiences):
            return _TokenDecision(None, "token audiences do not match")
        extra_map = u.get("extra")
        extra = tuple(
            sorted(
                (str(k), _strings(v)) for k, v in (extra_map.items() if isinstance(extra_map, dict) else ())
            )
        )
        user = UserInfo(
            username=_text(u.get("username")),
            uid=_text(u.get("uid")),
            groups=_strings(u.get("groups")),
            extra=extra,
        )
        return _TokenDecision(user, "")

    async def check_access(self, user: UserInfo) -> tuple[bool, str]:
        cached = self._access.get(user)
        if cached is not None:
            return cached
        decision = await self._review_access(user)
        self._access.put(user, decision, self.ttls.access_allowed if decision[0] else self.ttls.access_denied)
        return decision

    async def _review_access(self, user: UserInfo) -> tuple[bool, str]:
        spec: dict[str, Any] = {
            "user": user.username,
            "resourceAttributes": {
                "group": API_GROUP,
                "version": API_VERSION,
                "resource": RESOURCE,
                "subresource": SUBRESOURCE,
                "verb": VERB,
                "namespace": self.workspace_namespace,
                "name": self.workspace_name,
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.groups:
            spec["groups"] = list(user.groups)
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        try:
            status: dict[str, Any] = await _with_retries(
                lambda: self.api.create_subject_access_review(spec), self.retry
            )
        except KubeAPIError as exc:
            if exc.status == 403:
                log.error("the agent may not create SubjectAccessReviews: bind it to system:auth-delegator")
                raise GRPCError(Status.UNAUTHENTICATED, "SubjectAccessReview API is unavailable") from None
            log.warning("SubjectAccessReview failed", status=exc.status)
            raise GRPCError(Status.INTERNAL, "SubjectAccessReview failed") from None
        except (TimeoutError, OSError) as exc:
            log.warning("SubjectAccessReview failed", error=type(exc).__name__)
            raise GRPCError(Status.UNAVAILABLE, "SubjectAccessReview failed") from None
        allowed = status.get("allowed") is True and status.get("denied") is not True
        reason = _text(status.get("reason")) or ("" if allowed else "forbidden")
        return allowed, reason


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

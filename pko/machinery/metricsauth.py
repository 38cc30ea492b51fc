"""Who may read ``/metrics``: each scrape's bearer token checked against the apiserver, as
controller-runtime's ``filters.WithAuthenticationAndAuthorization`` (and kube-rbac-proxy) do.

A scrape must carry ``Authorization: Bearer <token>``. A TokenReview (no audiences: the
apiserver's own, which a ServiceAccount token mounted in Prometheus' pod has) says who it is; a
SubjectAccessReview asks whether that user may ``get`` the non-resource URL ``/metrics`` (what the
``pulumi-kubernetes-operator-metrics-reader`` ClusterRole grants). No token or one the apiserver
does not accept: 401; a user without the permission: 403; a review that fails (apiserver
unreachable, the operator may not create reviews): 500, not cached, so the next scrape asks again.

Why a cache: Prometheus scrapes every 15-30 s with the same token; two API calls each time would
be the operator's most frequent requests. Answers are trusted briefly (:class:`CacheTTLs`: a
token 2 min, kube-apiserver's own webhook token cache default, never past its ``exp``; a refusal
10 s; an access decision 1 min / 10 s), in bounded LRUs keyed by the token's SHA-256 (a token is
never kept, logged or used as a key). Concurrent scrapes with the same unknown token share one
TokenReview.

Why the reviews take callables: the checks run on the metrics server's request thread
(:mod:`pko.machinery.serving`), which must not run the loop's API client itself.
:class:`pko.machinery.metricsreviews.LoopReviews` sends each review on the event loop
(``run_coroutine_threadsafe``) and waits on the thread: the loop is never blocked, and only a scrape
whose answer is not cached waits for it. This module imports no API client, so the workspace agent
(which has its own) can use it too.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import structlog

__all__ = [
    "METRICS_PATH",
    "AccessReview",
    "CacheTTLs",
    "MetricsAuthorizer",
    "TTLCache",
    "TokenReview",
    "UserInfo",
    "Verdict",
    "access_decision",
    "access_review",
    "bearer_token",
    "reviewed_user",
    "token_expiry",
    "token_review",
]

log = structlog.get_logger("pko.metricsauth")

METRICS_PATH: Final = "/metrics"
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CacheTTLs:
    """How long answers are trusted (seconds); a token's never outlives its own ``exp``."""

    token_success: float = 120.0
    token_failure: float = 10.0
    access_allowed: float = 60.0
    access_denied: float = 10.0


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The scraper as the TokenReview named it (what the SubjectAccessReview asks about)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to one scrape: ``status`` 200 (go on), 401, 403 or 500, and why (for the body)."""

    status: int
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


# token -> the user, or None when the apiserver does not accept it; raises when it cannot say.
TokenReview = Callable[[str], UserInfo | None]
# user -> (allowed, reason); raises when the apiserver cannot say.
AccessReview = Callable[[UserInfo], tuple[bool, str]]


class TTLCache(Generic[K, V]):
    """A bounded LRU whose entries expire after their own TTL; safe to share between threads."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            if self._clock() >= item[0]:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return item[1]

    def put(self, key: K, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        with self._lock:
            self._entries[key] = (self._clock() + ttl, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_expiry(token: str) -> float | None:
    """A JWT's ``exp`` (Unix time), unverified: only ever used to shorten a cache entry."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


class MetricsAuthorizer:
    """:meth:`check` one scrape's ``Authorization`` header; called on request threads."""

    def __init__(
        self,
        review_token: TokenReview,
        review_access: AccessReview,
        *,
        ttls: CacheTTLs | None = None,
        max_entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._review_token = review_token
        self._review_access = review_access
        self.ttls = ttls or CacheTTLs()
        self._wall_clock = wall_clock
        # A 1-tuple, so a cached refusal (None) is told from a miss.
        self._tokens: TTLCache[str, tuple[UserInfo | None]] = TTLCache(max_entries, clock)
        self._access: TTLCache[UserInfo, tuple[bool, str]] = TTLCache(max_entries, clock)
        self._lock = threading.Lock()
        self._inflight: dict[str, concurrent.futures.Future[UserInfo | None]] = {}
        self.token_reviews = 0  # reviews sent, for tests and the curious
        self.access_reviews = 0

    def check(self, authorization: str | None) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token")
        try:
            user = self._authenticate(token)
            if user is None:
                return Verdict(401, "token not accepted")
            allowed, reason = self._authorize(user)
        except Exception as exc:
            # The apiserver could not answer: refuse this scrape, remember nothing.
            log.warning("metrics scrape not reviewed", error=f"{type(exc).__name__}: {exc}")
            return Verdict(500, "authentication or authorization failed")
        if not allowed:
            return Verdict(
                403, f"{user.username} may not get {METRICS_PATH}" + (f": {reason}" if reason else "")
            )
        return Verdict(200)

    def _authenticate(self, token: str) -> UserInfo | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._tokens.get(key)
        if cached is not None:
            return cached[0]
        with self._lock:
            pending = self._inflight.get(key)
            owner = pending is None
            if pending is None:
                pending = self._inflight[key] = concurrent.futures.Future()
        if not owner:
            return pending.result()
        try:
            self.token_reviews += 1
            user = self._review_token(token)
            self._tokens.put(key, (user,), self._token_ttl(token, user))
            pending.set_result(user)
            return user
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._inflight[key]

    def _token_ttl(self, token: str, user: UserInfo | None) -> float:
        if user is None:
            return self.ttls.token_failure
        ttl = self.ttls.token_success
        expiry = token_expiry(token)
        return ttl if expiry is None else min(ttl, expiry - self._wall_clock())

    def _authorize(self, user: UserInfo) -> tuple[bool, str]:
        cached = self._access.get(user)
        if cached is not None:
            return cached
        self.access_reviews += 1
        decision = self._review_access(user)
        self._access.put(user, decision, self.ttls.access_allowed if decision[0] else self.ttls.access_denied)
        return decision


def token_review(token: str) -> dict[str, Any]:
    """A TokenReview of ``token`` for the apiserver's own audiences (a mounted ServiceAccount token's)."""
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def reviewed_user(answer: dict[str, Any]) -> UserInfo | None:
    """The user a created TokenReview names, or None when the token was not accepted."""
    status = answer.get("status") or {}
    user = status.get("user")
    if status.get("authenticated") is not True or not isinstance(user, dict):
        return None
    extra = user.get("extra")
    return UserInfo(
        username=_text(user.get("username")),
        uid=_text(user.get("uid")),
        groups=_strings(user.get("groups")),
        extra=tuple(
            sorted((str(k), _strings(v)) for k, v in (extra.items() if isinstance(extra, dict) else ()))
        ),
    )


def access_review(user: UserInfo) -> dict[str, Any]:
    """A SubjectAccessReview: may ``user`` ``get`` the non-resource URL ``/metrics``?"""
    spec: dict[str, Any] = {
        "user": user.username,
        "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.groups:
        spec["groups"] = list(user.groups)
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def access_decision(answer: dict[str, Any]) -> tuple[bool, str]:
    """A created SubjectAccessReview's answer: allowed (and not denied), and the reason given."""
    status = answer.get("status") or {}
    allowed = status.get("allowed") is True and status.get("denied") is not True
    return allowed, _text(status.get("reason"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

"""The operator's side of :mod:`pko.machinery.metricsauth`: its reviews sent with the manager's
``KubeClient`` on the event loop, and the secure metrics server's TLS context and authorizer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final

from pko.machinery.kubeclient import KubeClient
from pko.machinery.metricsauth import (
    MetricsAuthorizer,
    UserInfo,
    access_decision,
    access_review,
    reviewed_user,
    token_review,
)
from pko.machinery.resource import Resource, ResourceClient
from pko.machinery.servingcert import CertSource

__all__ = ["LoopReviews", "secure_metrics"]

TOKEN_REVIEWS: Final = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
)
ACCESS_REVIEWS: Final = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
# How long a scrape waits for a review (sent on the loop) before it is answered 500.
REVIEW_TIMEOUT: Final = 10.0


class LoopReviews:
    """TokenReviews and SubjectAccessReviews sent with the manager's ``KubeClient`` on its loop,
    called from other threads (:class:`MetricsAuthorizer`'s reviewers)."""

    def __init__(
        self, api: KubeClient, loop: asyncio.AbstractEventLoop, *, request_timeout: float = REVIEW_TIMEOUT
    ) -> None:
        self._loop = loop
        self._timeout = request_timeout
        self._tokens = ResourceClient(api, TOKEN_REVIEWS, request_timeout=request_timeout)
        self._access = ResourceClient(api, ACCESS_REVIEWS, request_timeout=request_timeout)

    def _wait(self, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self._timeout + 1.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def review_token(self, token: str) -> UserInfo | None:
        return reviewed_user(self._wait(self._tokens.create(token_review(token))))

    def review_access(self, user: UserInfo) -> tuple[bool, str]:
        return access_decision(self._wait(self._access.create(access_review(user))))


def secure_metrics(
    api: KubeClient, cert_dir: str | None, *, request_timeout: float = REVIEW_TIMEOUT
) -> tuple[ssl.SSLContext, MetricsAuthorizer]:
    """The metrics server's TLS context and its authorizer reviewing with ``api``; call on the loop
    the reviews are to be sent on (``--metrics-secure``, the default)."""
    reviews = LoopReviews(api, asyncio.get_running_loop(), request_timeout=request_timeout)
    tls = CertSource(Path(cert_dir) if cert_dir else None).context()
    return tls, MetricsAuthorizer(reviews.review_token, reviews.review_access)

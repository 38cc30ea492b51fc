"""The agent's own ``/metrics`` (``--metrics-bind-address``, off unless given: the operator gives it in
every workspace pod, pko.controllers.workspace.podspec), served as the operator
serves its own (pko.machinery.serving, metricsauth, servingcert): from a thread of its own, over HTTPS
to scrapers whose bearer token the apiserver accepts (a TokenReview for its own audiences, not the
workspace's) and whose user may ``get`` the non-resource URL ``/metrics`` (a SubjectAccessReview);
answers cached briefly; ``--metrics-secure=false`` for plain HTTP to anyone.

What it serves: the process' default registry, i.e. ``agent_auth_refusals_total`` (pko.agent.auth),
``agent_operations_total`` and ``agent_operation_duration_seconds`` (pko.agent.operations) and the
process and Python collectors.

The reviews go through the agent's own apiserver client (pko.agent.kubeapi, the identity that
already reviews RPC callers: ``system:auth-delegator``), sent on the agent's event loop while the
scrape waits on its request thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final

from pko.agent.kubeapi import KubeAPI
from prometheus_client import REGISTRY

from pko.machinery.metricsauth import (
    MetricsAuthorizer,
    UserInfo,
    access_decision,
    access_review,
    reviewed_user,
    token_review,
)
from pko.machinery.serving import ThreadedHttpServer, metrics_routes, parse_bind_address
from pko.machinery.servingcert import CertSource

__all__ = ["AgentReviews", "start_metrics_server"]

TOKEN_REVIEWS: Final = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
REVIEW_TIMEOUT: Final = 10.0


class AgentReviews:
    """The two reviews, sent with ``api`` on ``loop`` and waited for on the calling (request) thread."""

    def __init__(
        self, api: KubeAPI, loop: asyncio.AbstractEventLoop, timeout: float = REVIEW_TIMEOUT
    ) -> None:
        self._api = api
        self._loop = loop
        self._timeout = timeout

    def _wait(self, coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, self._timeout), self._loop)
        return future.result(self._timeout + 1.0)

    def review_token(self, token: str) -> UserInfo | None:
        return reviewed_user(self._wait(self._api.post(TOKEN_REVIEWS, token_review(token))))

    def review_access(self, user: UserInfo) -> tuple[bool, str]:
        return access_decision(self._wait(self._api.post(ACCESS_REVIEWS, access_review(user))))


def start_metrics_server(
    address: str, *, api: KubeAPI | None, secure: bool = True, cert_dir: Path | None = None
) -> ThreadedHttpServer | None:
    """Start serving ``/metrics`` at ``address`` (``host:port``; ``0`` or empty: not at all), on the
    running loop's behalf; stop it with ``stop()`` (from a thread: it blocks briefly). ``secure``
    needs ``api``."""
    bind = parse_bind_address(address)
    if bind is None:
        return None
    authorizer = None
    tls = None
    if secure:
        if api is None:
            raise ValueError(
                "a secure /metrics reviews tokens: it needs an apiserver client (--auth-mode kube)"
            )
        reviews = AgentReviews(api, asyncio.get_running_loop())
        authorizer = MetricsAuthorizer(reviews.review_token, reviews.review_access)
        tls = CertSource(cert_dir).context()
    server = ThreadedHttpServer("metrics", metrics_routes(REGISTRY, authorizer), *bind, tls=tls)
    server.start()
    return server

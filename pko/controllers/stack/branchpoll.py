"""Branch polling: when each Stack that tracks a branch looks again (:func:`next_poll`), and
resolving a branch to its head commit without a clone, one remote lookup per interval.

The Go operator lists the remote's refs (``git ls-remote``) on every reconcile of every Stack
that tracks a branch. Here Stacks tracking the same repository, branch and credentials share one
lookup per polling interval: a cached answer younger than the interval is reused, and concurrent
callers await the same in-flight lookup. Credentials are part of the cache key (as a digest, so
two tenants with different tokens never share an answer) and never appear in a log or an error.

A Stack's ``spec.branch`` always means a branch: it is looked up by its full name
(:func:`pko.git.branch_ref`, ``refs/heads/<branch>`` unless already a ``refs/`` name), so a tag of
the same name never shadows it. The resolved commit, not the branch, goes to the Workspace.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from pko.controllers.stack.retry import jitter_fraction
from pko.git import GitCredentials, branch_ref, ls_remote, redact_text, redact_url, resolve_ref
from pko.git.errors import SourceError

__all__ = ["BranchResolver", "GitCredentials", "GitLookupError", "next_poll"]

LOOKUP_TIMEOUT: Final = 30.0


class GitLookupError(Exception):
    """The remote could not be listed, or has no such branch (message safe to show: no secrets)."""


Lister = Callable[[str, GitCredentials], Mapping[bytes, Any]]


def _lookup_failure(exc: BaseException, creds: GitCredentials) -> str:
    """Why a listing failed, in words a Stack's author can act on (never a secret): an HTTP
    refusal in the agent's fetch's words, pko.git's SSH errors as they are, else the library's
    kind and message."""
    # Here, not at start: dulwich (~3 MB resident) stays out of an operator with no git Stacks; a
    # failed lookup has already loaded it (pko.git.ls_remote imports it when called).
    from dulwich.client import HTTPUnauthorized
    from dulwich.errors import NotGitRepository

    if isinstance(exc, HTTPUnauthorized):
        if any(creds.secrets()) or creds.username:
            return "authentication failed: the server rejected the credentials (spec.gitAuth)"
        return "authentication failed: the server requires credentials (set spec.gitAuth)"
    if isinstance(exc, NotGitRepository):  # the server's 404: the agent's fetch's words
        return "no git repository there (or it is not visible with the credentials given)"
    if isinstance(exc, SourceError):  # pko.git's own (SSH): already one line to act on
        return redact_text(str(exc), creds.secrets())
    return redact_text(f"{type(exc).__name__}: {exc}", creds.secrets())


class BranchResolver:
    """Shared, interval-cached branch head lookups."""

    def __init__(self, lister: Lister = ls_remote, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lister = lister
        self._clock = clock
        self._cache: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._inflight: dict[tuple[str, str, str], asyncio.Future[str]] = {}
        self.lookups = 0

    async def head(self, url: str, branch: str, creds: GitCredentials, interval: float) -> str:
        """The commit branch ``branch`` points at (by its full name, :func:`pko.git.branch_ref`:
        never a tag of the same name), at most ``interval`` seconds old."""
        ref = branch_ref(branch)
        key = (url, ref, creds.fingerprint())
        cached = self._cache.get(key)
        now = self._clock()
        if cached is not None and now - cached[0] < interval:
            return cached[1]
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            commit = await self._lookup(url, ref, creds)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            del self._inflight[key]
        self._cache[key] = (self._clock(), commit)
        future.set_result(commit)
        self._prune(now, interval)
        return commit

    async def _lookup(self, url: str, ref: str, creds: GitCredentials) -> str:
        self.lookups += 1
        try:
            refs = await asyncio.wait_for(asyncio.to_thread(self._lister, url, creds), LOOKUP_TIMEOUT)
        except TimeoutError as exc:
            raise GitLookupError(f"listing {redact_url(url)}: timed out after {LOOKUP_TIMEOUT:.0f}s") from exc
        except Exception as exc:  # dulwich raises many kinds: report the kind and message
            raise GitLookupError(f"listing {redact_url(url)}: {_lookup_failure(exc, creds)}") from exc
        found = resolve_ref(refs, ref, peel=True)  # a full name: the rule takes it as given
        value = found[1] if found is not None else None
        if not isinstance(value, bytes):
            raise GitLookupError(f"no commits found for ref {ref!r}")
        return value.decode()

    def _prune(self, now: float, interval: float) -> None:
        """Forget answers far older than any interval in use, so the cache stays small."""
        horizon = max(interval, 3600.0) * 2
        for key in [k for k, (at, _) in self._cache.items() if now - at > horizon]:
            del self._cache[key]


def next_poll(seed: str, interval: float, now: datetime) -> float:
    """Seconds to this Stack's next branch poll: at its own phase of the interval (stable per
    ``seed``, uniform over a fleet), so Stacks created or reconciled together poll spread over the
    whole interval instead of all at once, and any extra reconcile leaves the schedule where it was.
    Polls are ``interval`` apart; only the first after a (re)start may come between half and one and
    a half intervals after the previous one."""
    phase = (jitter_fraction(seed, 0.5) - 0.5) * interval  # in [0, interval)
    at = now.timestamp()
    following = math.floor((at - phase) / interval) * interval + phase + interval
    if following - at < interval / 2:
        following += interval
    return following - at

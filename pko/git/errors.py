"""Why a git remote could not be used, for both callers of :mod:`pko.git`: each error's message is
one line a person can act on, names the remote by a redacted URL and never carries a credential."""

from __future__ import annotations

__all__ = ["AuthError", "HostKeyError", "RefNotFound", "SourceError", "UnreachableError", "UsageError"]


class SourceError(Exception):
    """The source could not be fetched; the message says why and what to check."""


class UsageError(SourceError):
    """The fetch was asked for in a way that cannot work (missing or contradictory settings)."""


class RefNotFound(SourceError):
    """The requested revision (branch, tag, ref or commit) is not in the repository."""


class AuthError(SourceError):
    """The server refused the credentials, or none were given where they are required."""


class HostKeyError(SourceError):
    """An SSH server's host key is unknown or does not match the known_hosts given."""


class UnreachableError(SourceError):
    """The host could not be reached: DNS, connection refused, timeout, TLS failure."""

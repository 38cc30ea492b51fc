"""Errors raised while fetching a program's source, and the redaction that keeps them safe to print.

Every error's message is one line a person can act on, names the source by a redacted URL and
never carries a credential: `agent init` prints `str(error)` to stderr as its only output.
"""

from __future__ import annotations

# The redaction is the operator's too (one rule for both): pko.git.
from pko.git.remote import redact_text, redact_url

__all__ = [
    "AuthError",
    "DigestMismatch",
    "HostKeyError",
    "RefNotFound",
    "SourceError",
    "UnreachableError",
    "UnsafeArchive",
    "UsageError",
    "redact_text",
    "redact_url",
]


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


class DigestMismatch(SourceError):
    """A downloaded artifact's digest differs from the expected one."""


class UnsafeArchive(SourceError):
    """An archive member would escape the target directory, or the archive breaks a size bound."""



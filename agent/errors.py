"""Errors raised while fetching a program's source, and the redaction that keeps them safe to print.

Every error's message is one line a person can act on, names the source by a redacted URL and
never carries a credential: `agent init` prints `str(error)` to stderr as its only output.
"""

from __future__ import annotations

# The git errors and the redaction are the operator's too (one rule for both): pko.git.
from pko.git.errors import AuthError, HostKeyError, RefNotFound, SourceError, UnreachableError, UsageError
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


class DigestMismatch(SourceError):
    """A downloaded artifact's digest differs from the expected one."""


class UnsafeArchive(SourceError):
    """An archive member would escape the target directory, or the archive breaks a size bound."""

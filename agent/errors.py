"""Errors raised while fetching a program's source, and the redaction that keeps them safe to print.

Every error's message is one line a person can act on, names the source by a redacted URL and
never carries a credential: `agent init` prints `str(error)` to stderr as its only output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit


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


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")


def redact_url(url: str) -> str:
    """Return `url` without a password in its userinfo and without a query string.

    A username alone is kept (``git@host`` tells the reader which account); query strings are
    dropped because pre-signed artifact URLs carry their signature there.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO.sub(r"\g<scheme>***@", url)
    if not parts.scheme or not parts.netloc:
        return url  # scp-like "git@host:path" carries no password
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostport}" if ":" in userinfo else f"{user}@{hostport}"
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_text(text: str, secrets: Iterable[str | None]) -> str:
    """Replace every secret (and every URL password) in `text` with ``***``.

    Used on messages of underlying libraries, which may echo a URL or a header verbatim.
    Secrets shorter than 4 characters are left alone: replacing them would garble the text
    while protecting nothing.
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*):[^/@\s]*@", r"\1:***@", text)

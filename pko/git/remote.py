"""Git remotes: which URL forms name a repository (:func:`parse_remote`), and keeping their secrets
out of messages (:func:`redact_url`, :func:`redact_text`). Listing a remote's refs is
:mod:`pko.git.lsremote` (it needs :mod:`pko.git.ssh`, which needs :class:`Remote` from here).

The URL forms are git's own: ``<scheme>://`` is a URL (the scheme must be one git speaks, and all
but ``file`` need a host); otherwise a colon before the first slash makes it scp-like
(``git@github.com:org/repo.git``, ``host:path``, ``[::1]:repo``), and an absolute path is a local
repository. Git's remote-helper syntax ``<transport>::<address>`` (``ext::<command>``, ``fd::<n>``)
comes first, as in git, and is refused (no caller runs helpers): ``ext::sh -c ...`` is never the
scp-like host ``ext``. A relative path (``github.com/org/repo`` without ``https://``) is refused: it
names nothing in a pod. The API's ``projectRepo`` check and the agent's fetch both parse with this, so
they accept the same URLs; whether a local repository may be read is the caller's policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = [
    "GIT_URL_SCHEMES",
    "GitURLError",
    "Remote",
    "is_remote_helper",
    "parse_remote",
    "redact_text",
    "redact_url",
]

# URL schemes git (and the workspace agent's fetch) can clone from; the scp-like form
# ``[user@]host:path`` and an absolute local path have none.
GIT_URL_SCHEMES: Final = ("https", "http", "ssh", "git+ssh", "ssh+git", "git", "file")
URL_FORMS: Final = "https://, http://, ssh://, git://, file:// or user@host:path"
_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# [user@]host:path or [user@][host]:path (an IPv6 address between brackets)
_SCP: Final = re.compile(
    r"^(?:(?P<user>[^@/\[\]]*)@)?(?:\[(?P<bracketed>[^\]/]*)\]|(?P<host>[^:/\[\]@]*)):(?P<path>.*)$"
)
# git's transport.c: a transport name ([A-Za-z0-9][A-Za-z0-9+.-]*, possibly empty) followed by "::"
_REMOTE_HELPER: Final = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9+.-]*)?::")
_USERINFO: Final = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")


class GitURLError(ValueError):
    """A URL git cannot clone from; the message says why and never repeats the URL (which may
    carry credentials)."""


def redact_url(url: str) -> str:
    """`url` without a password in its userinfo and without a query string (a username alone is
    kept: ``git@host`` tells the reader which account)."""
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
    """`text` with every secret (and every URL password) replaced by ``***``: for messages of
    libraries, which may echo a URL or a header verbatim. Secrets shorter than 4 characters are
    left alone: replacing them would garble the text while protecting nothing."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://[^/:@\s]*):[^/@\s]*@", r"\1:***@", text)


@dataclass(frozen=True)
class Remote:
    """A parsed remote: `display` is safe to print, `url` is what a clone records as its origin
    (no password in it)."""

    transport: Literal["http", "ssh", "local", "other"]
    url: str
    display: str
    host: str | None = None
    port: int | None = None
    username: str | None = None
    password: str | None = None
    path: str = ""


def is_remote_helper(url: str) -> bool:
    """Whether git reads `url` (surrounding blanks ignored) as ``<transport>::<address>``, a
    remote-helper invocation rather than a URL: ``ext::sh -c ...`` is a command line, which
    :func:`redact_url` cannot clean, so callers must not print it."""
    return _REMOTE_HELPER.match(url.strip()) is not None


def parse_remote(url: str) -> Remote:
    """Classify `url` (surrounding blanks ignored) as HTTP(S), SSH (``ssh://`` or scp-like), a local
    repository (``file://`` or an absolute path) or ``git://``; :class:`GitURLError` if git could
    not clone from it. Credentials embedded in an HTTP(S) URL are split off into the result."""
    text = url.strip()
    if is_remote_helper(text):
        raise GitURLError(
            "git remote-helper URLs (<transport>::<address>, such as ext:: or fd::) are not supported"
            f" (use {URL_FORMS})"
        )
    display = redact_url(text)
    match = _SCHEME.match(text)
    if match:
        scheme = match.group(1).lower()
        if scheme not in GIT_URL_SCHEMES:
            # The Go operator's words ("invalid URL scheme: hhtp"), with what would work.
            raise GitURLError(f"invalid URL scheme: {match.group(1)} (use {URL_FORMS})")
        try:
            parts = urlsplit(text)
            port = parts.port  # parsed lazily: a bad port or bracket raises here, not later
        except ValueError as exc:
            raise GitURLError(f"invalid URL: {exc}") from None
        if scheme == "file":
            return Remote("local", text, display, path=unquote(parts.path))
        if not parts.hostname:
            raise GitURLError(f"a {scheme}:// URL needs a host")
        username = unquote(parts.username) if parts.username else None
        if scheme in ("http", "https"):
            hostport = parts.netloc.rpartition("@")[2]
            clean = urlunsplit((parts.scheme, hostport, parts.path, parts.query, ""))
            password = unquote(parts.password) if parts.password else None
            return Remote("http", clean, display, parts.hostname, port, username, password, parts.path)
        if scheme == "git":
            return Remote("other", text, display, parts.hostname, port, path=parts.path)
        return Remote("ssh", display, display, parts.hostname, port, username, path=unquote(parts.path))
    if text.startswith("/"):
        return Remote("local", text, display, path=text)
    if ":" in text.split("/", 1)[0]:
        # scp-like, git's rule: no "://" and a colon before the first slash.
        scp = _SCP.match(text)
        host = scp and (scp.group("bracketed") or scp.group("host"))
        if not scp or not host:
            raise GitURLError("an scp-like URL (user@host:path) needs a host")
        return Remote("ssh", text, display, host, username=scp.group("user") or None, path=scp.group("path"))
    raise GitURLError(f"not a git URL (use {URL_FORMS})")

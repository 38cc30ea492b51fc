"""Credentials for a git remote: one class for the operator's lookups and the agent's fetches."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["DEFAULT_TOKEN_USER", "GitCredentials"]

# The username sent with a token over HTTP(S) when none is given (GitHub, GitLab and Bitbucket
# accept any username with a token as the password).
DEFAULT_TOKEN_USER = "git"


@dataclass(frozen=True, repr=False)
class GitCredentials:
    """What a remote is authenticated with; any subset may be present.

    Over HTTP(S) a token wins over username/password and is sent as basic auth with the token as
    password (:meth:`basic_auth`). Over SSH the private key is used and `password`, if set, is its
    passphrase, which is therefore never sent to an HTTP(S) server; `known_hosts` (OpenSSH format)
    decides which servers are trusted. ``repr`` names only which fields are set, so a value never
    lands in a log line or a traceback.
    """

    username: str | None = None
    password: str | None = None
    token: str | None = None
    ssh_private_key: str | None = None
    known_hosts: str | None = None

    def secrets(self) -> tuple[str | None, ...]:
        """The values to redact from any message a library hands back."""
        return (self.password, self.token, self.ssh_private_key)

    def fingerprint(self) -> str:
        """A digest of every field: equal credentials share cached answers, different ones never."""
        fields = (self.username, self.password, self.token, self.ssh_private_key, self.known_hosts)
        text = "\0".join(v or "" for v in fields)
        return hashlib.sha256(text.encode()).hexdigest()

    def basic_auth(
        self, url_username: str | None = None, url_password: str | None = None
    ) -> tuple[str | None, str | None]:
        """HTTP basic auth (username, password): a token, else username/password, else the URL's own.
        With an SSH key, ``password`` is the key's passphrase: a secret of the key's owner, not a
        password of the git host, so it is never sent to one."""
        if self.token:
            return self.username or url_username or DEFAULT_TOKEN_USER, self.token
        password = None if self.ssh_private_key else self.password
        if self.username or password:
            return self.username or url_username or DEFAULT_TOKEN_USER, password
        return url_username, url_password

    def __repr__(self) -> str:
        names = ("username", "password", "token", "ssh_private_key", "known_hosts")
        return f"GitCredentials(present={[n for n in names if getattr(self, n)]})"

"""Listing a remote's refs without a clone (:func:`ls_remote`, the operator's branch lookups).

Its own module so that the import graph of ``pko.git`` has no cycle: ``remote`` (URL forms) is
imported by ``ssh`` (the SSH transport) and both by this one; nothing imports back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pko.git.credentials import GitCredentials
from pko.git.remote import parse_remote

__all__ = ["ls_remote"]


def ls_remote(url: str, creds: GitCredentials, *, timeout: float = 30.0) -> Mapping[bytes, Any]:
    """The remote's refs, full name to object id (blocking: run it in a thread).

    Over HTTP(S) the credentials are sent as :meth:`GitCredentials.basic_auth` says. Over SSH the
    connection is the agent's (:func:`pko.git.ssh.ssh_client`: in-process, the private key given,
    only hosts in known_hosts; a refusal is a :class:`~pko.git.errors.SourceError`), and
    ``creds.known_hosts`` unset means the environment's (:func:`pko.git.ssh.known_hosts`).
    """
    remote = parse_remote(url)
    if remote.transport == "ssh":
        from pko.git.ssh import known_hosts, ssh_client  # paramiko: only for SSH remotes

        if creds.known_hosts is None:
            creds = replace(creds, known_hosts=known_hosts())
        result: Any = ssh_client(remote, creds, timeout).get_refs(remote.path.encode())
        return dict(getattr(result, "refs", result))
    from dulwich import porcelain  # not at import: the agent imports this package and never lists

    username: str | None = None
    password: str | None = None
    if remote.transport == "http":
        target = remote.url
        username, password = creds.basic_auth(remote.username, remote.password)
    else:
        target = url.strip()
    result = porcelain.ls_remote(target, username=username, password=password)
    return dict(getattr(result, "refs", result))

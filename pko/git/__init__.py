"""Git, shared by the operator (branch lookups) and the workspace agent (fetching a revision).

Module map:

* ``credentials``: :class:`GitCredentials`, what a remote is authenticated with (never printed).
* ``refs``: the one rule for which ref a name means (:func:`resolve_ref`, git's rev-parse order) and
  :func:`branch_ref`, the full name of a Stack's branch.
* ``remote``: :func:`parse_remote`, the URL forms git clones from (the API's projectRepo check and
  the agent's fetch draw the same line); :func:`redact_url` and :func:`redact_text`, so no message
  carries a secret.
* ``ssh``: git over SSH in-process (paramiko), strict host keys, the environment's known_hosts.
* ``lsremote``: :func:`ls_remote`, the operator's listing of a remote's refs without a clone (over
  HTTP(S) or ``ssh``). The modules import one way: ``lsremote`` -> ``ssh`` -> ``remote``.
* ``errors``: why a remote could not be used (:class:`~pko.git.errors.SourceError` and its kinds).

Importing this package stays cheap (the agent's start time): dulwich at most, no Kubernetes client,
no pydantic; ``ls_remote`` loads ``dulwich.porcelain`` (or ``ssh``, and paramiko) only when called.
"""

from __future__ import annotations

from pko.git.credentials import DEFAULT_TOKEN_USER, GitCredentials
from pko.git.lsremote import ls_remote
from pko.git.refs import branch_ref, ref_candidates, resolve_ref
from pko.git.remote import (
    GIT_URL_SCHEMES,
    GitURLError,
    Remote,
    parse_remote,
    redact_text,
    redact_url,
)

__all__ = [
    "DEFAULT_TOKEN_USER",
    "GIT_URL_SCHEMES",
    "GitCredentials",
    "GitURLError",
    "Remote",
    "branch_ref",
    "ls_remote",
    "parse_remote",
    "redact_text",
    "redact_url",
    "ref_candidates",
    "resolve_ref",
]

"""Git credentials over plain HTTP: whether a Stack would send them in clear, and what the operator
does about it (pure, no I/O).

A ``spec.projectRepo`` that is ``http://`` carries whatever credentials the Stack names unencrypted
to anyone on the path, from the operator (its branch lookup) and from the workspace pod (its fetch).
The Go operator refuses every ``http://`` URL; pko keeps plain HTTP without credentials (in-cluster
git mirrors) and decides the rest with one operator setting, ``--allow-insecure-git-credentials``:

- off (the default): the Stack is ``Stalled`` (:data:`REFUSED_REASON`) before its Secrets are read,
  its branch looked up or a Workspace built for it, so nothing is sent; a destroy on deletion runs
  from the saved ``projectInfo`` as it does when the source is gone;
- on: the Stack runs.

Either way it carries an ``InsecureTransport`` condition (True; the reason says which verdict) and
a Warning Event each time that condition changes (it appears, the URL, the credentials or the
verdict change), not at every reconcile. The condition goes once the URL is ``https://`` or SSH, or
the credentials are gone.

What counts is read from the spec (:func:`insecure_credentials`): ``gitAuth``'s basic auth, access
token or GitHub App, ``gitAuthSecret`` whatever keys it holds (the fetch takes its username, password
and accessToken), and a password in the URL itself. An SSH key and its passphrase are never sent over
HTTP (:meth:`pko.git.credentials.GitCredentials.basic_auth`). A Flux source or a
Program brings no credentials: the workspace fetches their artifact anonymously and checks its
digest, so they never carry the condition.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import urlsplit

from pko.api.stack import PolicyPack, Stack
from pko.api.stackterms import (
    CONDITION_INSECURE_TRANSPORT,
    INSECURE_TRANSPORT_ALLOWED,
    INSECURE_TRANSPORT_REFUSED,
)
from pko.controllers.stack.steps import Emit, Unresolved
from pko.git import redact_url
from pko.machinery.conditions import get_condition, remove_condition, set_condition
from pko.machinery.resource import Obj
from pko.settings.operator import Settings as OperatorSettings

__all__ = [
    "REFUSED_REASON",
    "insecure_credentials",
    "mark_insecure_transport",
    "pack_refusal",
    "refusal",
]

REFUSED_REASON: Final = INSECURE_TRANSPORT_REFUSED
"""The Stalled reason of a Stack whose git credentials would go over plain HTTP (the operator's
``--allow-insecure-git-credentials`` is off)."""

_SETTING: Final = OperatorSettings.allow_insecure_git_credentials
_FIX: Final = "an https:// or SSH URL for spec.projectRepo"


@dataclass(frozen=True, slots=True)
class InsecureCredentials:
    """``url`` (shown without its password) is plain HTTP, and ``sent`` names the credentials the
    Stack gives for it (spec fields), in the order they are listed."""

    url: str
    sent: tuple[str, ...]


def insecure_credentials(stack: Stack) -> InsecureCredentials | None:
    """The credentials ``stack`` would send over plain HTTP; None when its source is not an
    ``http://`` git URL or names none (see the module docstring for what counts)."""
    spec = stack.spec
    url = (spec.project_repo or "").strip()
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return None  # not a URL git speaks: the spec check refuses it with its own message
    if parts.scheme.lower() != "http":
        return None
    sent: list[str] = []
    if password:
        sent.append("a password in spec.projectRepo")
    if spec.git_auth_secret:
        sent.append("spec.gitAuthSecret")
    auth = spec.git_auth
    if auth is not None:
        if auth.basic_auth is not None:
            sent.append("spec.gitAuth.basicAuth")
        if auth.access_token is not None:
            sent.append("spec.gitAuth.accessToken")
        if auth.github_app is not None:
            sent.append("spec.gitAuth.githubApp")
    return InsecureCredentials(redact_url(url), tuple(sent)) if sent else None


def _message(found: InsecureCredentials, allowed: bool) -> str:
    what = " and ".join(found.sent)
    if allowed:
        return (
            f"spec.projectRepo {found.url} is plain HTTP: {what} is sent over it unencrypted, because the "
            f"operator runs with {_SETTING.flag}; use {_FIX}"
        )
    return (
        f"spec.projectRepo {found.url} is plain HTTP and {what} would be sent over it unencrypted: "
        f"refused, nothing was sent. Use {_FIX}, or run the operator with {_SETTING.flag} "
        f"({_SETTING.env[0]}=true) to accept the risk"
    )


def refusal(stack: Stack, allowed: bool) -> Unresolved | None:
    """The source as refused (a Stalled reason and message), before anything reads or sends the
    credentials; None when the Stack may use its source."""
    found = insecure_credentials(stack)
    if found is None or allowed:
        return None
    return Unresolved(REFUSED_REASON, _message(found, allowed))


def pack_refusal(pack: PolicyPack, allowed: bool) -> Unresolved | None:
    """A policy pack's git source as refused, as :func:`refusal` refuses the Stack's own: its
    ``git.auth`` (but an SSH key) or a password in its URL would go over plain HTTP; None otherwise."""
    git = pack.git
    if git is None or allowed:
        return None
    try:
        parts = urlsplit(git.url.strip())
        password = parts.password
    except ValueError:
        return None
    auth = git.auth
    sent = [
        what
        for what, present in (
            ("a password in the URL", password),
            ("git.auth.username", auth and auth.username),
            ("git.auth.password", auth and auth.password and not auth.ssh_private_key),
            ("git.auth.token", auth and auth.token),
            ("git.auth.githubApp", auth and auth.github_app),
        )
        if present
    ]
    if parts.scheme.lower() != "http" or not sent:
        return None
    return Unresolved(
        REFUSED_REASON,
        f"policy pack {pack.name!r}: {redact_url(git.url)} is plain HTTP and {' and '.join(sent)} would be "
        f"sent over it unencrypted: refused, nothing was sent. Use an https:// or SSH URL, or run the "
        f"operator with {_SETTING.flag} ({_SETTING.env[0]}=true) to accept the risk",
    )


def mark_insecure_transport(
    status: Obj, stack: Stack, allowed: bool, generation: int | None, now: datetime
) -> list[Emit]:
    """Set (or remove) the ``InsecureTransport`` condition on ``status``; the Warning Event to
    record when it changed (it appeared, or its reason or message changed), else none."""
    before = copy.deepcopy(get_condition(status.get("conditions"), CONDITION_INSECURE_TRANSPORT))
    conditions = list(status.get("conditions") or [])
    found = insecure_credentials(stack)
    if found is None:
        if before is not None:
            status["conditions"] = remove_condition(conditions, CONDITION_INSECURE_TRANSPORT)
        return []
    reason = INSECURE_TRANSPORT_ALLOWED if allowed else INSECURE_TRANSPORT_REFUSED
    message = _message(found, allowed)
    status["conditions"] = set_condition(
        conditions, CONDITION_INSECURE_TRANSPORT, "True", reason, message, generation, now
    )
    if before is not None and (before.get("reason"), before.get("message")) == (reason, message):
        return []
    return [Emit("Warning", reason, message)]

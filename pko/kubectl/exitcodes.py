"""The plugin's exit codes, one meaning each, so a script can branch on them without parsing text.

``2`` is also what argparse exits with on a usage error, so every usage error, argparse's or ours,
means the same thing.

``4`` meant "not supported by the operator" while the operator had no approval gate, refresh or
cancel request (issue 29); the same commands now exit 4 when the Stack's state refuses the request
(nothing to approve), so a script that read 4 as "cannot do that now" still reads it right.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode", "PluginError"]


class ExitCode(IntEnum):
    OK = 0
    """Done; for ``status``/``why``: every Stack shown is Ready."""
    NOT_READY = 1
    """``status``/``why``: a Stack shown is not Ready (in progress, failed, stalled, suspended,
    awaiting approval); ``refresh --wait``: the refresh ran and failed."""
    USAGE = 2
    """Bad arguments, an unknown ``--context``, ``-A`` with a name."""
    NOT_FOUND = 3
    """The Stack (or the Update asked for, or any engine output) does not exist."""
    REFUSED = 4
    """The Stack's state refuses the request, nothing was written: ``approve`` without a recorded
    plan, while the Stack is not AwaitingApproval, for a Stack changed since its plan, or with a
    ``--digest`` that is not the recorded plan's."""
    API_ERROR = 5
    """No usable kubeconfig, the apiserver unreachable, or the request failed (401, 5xx, ...)."""
    FORBIDDEN = 6
    """The apiserver refused the request with 403 Forbidden: RBAC, or an admission policy (approving
    a plan needs the verb ``approve`` on stacks.pulumi.com); its message is printed."""
    TIMEOUT = 7
    """``--wait``: the operator did not record the request within ``--timeout``."""


class PluginError(Exception):
    """Ends the command with ``code`` after printing ``message`` (prefixed ``error: ``) to stderr."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

"""The plugin's exit codes, one meaning each, so a script can branch on them without parsing text.

``2`` is also what argparse exits with on a usage error, so every usage error, argparse's or ours,
means the same thing.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["ExitCode", "PluginError"]


class ExitCode(IntEnum):
    OK = 0
    """Done; for ``status``/``why``: every Stack shown is Ready."""
    NOT_READY = 1
    """``status``/``why``: a Stack shown is not Ready (in progress, failed, stalled, suspended)."""
    USAGE = 2
    """Bad arguments, an unknown ``--context``, ``-A`` with a name."""
    NOT_FOUND = 3
    """The Stack (or the Update asked for, or any engine output) does not exist."""
    UNSUPPORTED = 4
    """The operator has no mechanism for what was asked (``cancel``, a one-off ``refresh``)."""
    API_ERROR = 5
    """No usable kubeconfig, the apiserver unreachable, or the request refused (401, 403, 5xx)."""


class PluginError(Exception):
    """Ends the command with ``code`` after printing ``message`` (prefixed ``error: ``) to stderr."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

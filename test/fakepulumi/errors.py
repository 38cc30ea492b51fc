"""Errors the stand-in CLI reports, each carrying the real CLI's exit code.

Exit codes follow the real CLI's taxonomy (pkg/cmd/pulumi/cmd/exit_codes.go): a generic failure is
1, a missing stack 6, changes despite ``--expect-no-changes`` 7, a cancelled operation 8. A *bail*
is a failure whose message was already shown (engine diagnostics), so nothing more is printed to
stderr.
"""

from __future__ import annotations

EXIT_ERROR = 1
EXIT_CONFIGURATION = 2
EXIT_STACK_NOT_FOUND = 6
EXIT_NO_CHANGES = 7
EXIT_CANCELLED = 8


class CliError(Exception):
    """A failure printed to stderr as ``error: <message>``."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class BailError(CliError):
    """A failure already reported through diagnostics; stderr stays quiet."""

    def __init__(self, message: str = "bail") -> None:
        super().__init__(message, EXIT_ERROR)


class StackNotFound(CliError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no stack named '{name}' found", EXIT_STACK_NOT_FOUND)


class StackAlreadyExists(CliError):
    def __init__(self, name: str) -> None:
        super().__init__(f"stack '{name}' already exists")

"""What the CLI's commands ask the engine to run, and the error of an operation that expected no changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import EXIT_NO_CHANGES, CliError
from .importing import ImportSpec


@dataclass
class Request:
    kind: str  # "update" | "refresh" | "destroy" | "import"
    dry_run: bool
    message: str = ""
    exec_kind: str = "cli"
    event_log: str | None = None
    replace: list[str] = field(default_factory=list)
    clear_pending_creates: bool = False
    show_secrets: bool = False
    remove: bool = False
    targets: list[str] = field(default_factory=list)
    target_dependents: bool = False
    expect_no_changes: bool = False
    imports: list[ImportSpec] = field(default_factory=list)
    protect_imports: bool = True
    refresh: bool = False  # `up`/`preview --refresh`: read every resource back before the update


class NoChangesExpected(CliError):
    """backenderr.NoChangesExpectedError: checked after the operation, exit code 7 (ExitNoChanges)."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            f"no changes were expected for {operation} but changes were proposed", EXIT_NO_CHANGES
        )


def operation_name(req: Request) -> str:
    """The operation NoChangesExpectedError names: ``preview``, ``update`` or ``refresh``."""
    if req.kind == "update":
        return "preview" if req.dry_run else "update"
    return req.kind

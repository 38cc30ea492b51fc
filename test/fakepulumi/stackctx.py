"""Everything a stack command needs: project, backend, stack reference, settings and secrets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import workspace
from .backend import FileBackend, StackRef, parse_stack_ref
from .config import Raw
from .crypto import Crypter, crypter_from_state, new_salt_state, read_passphrase
from .errors import CliError
from .workspace import Project


@dataclass
class Context:
    """Process-wide settings parsed from global flags."""

    cwd: Path
    non_interactive: bool = True
    fully_qualify: bool = False


@dataclass
class StackContext:
    project: Project
    backend: FileBackend
    ref: StackRef
    settings: dict[str, Any] = field(default_factory=dict)
    _crypter: Crypter | None = None

    @property
    def shown_name(self) -> str:
        return self.ref.display(self.project.name)

    @property
    def config(self) -> dict[str, Raw]:
        cfg = self.settings.setdefault("config", {})
        if not isinstance(cfg, dict):
            raise CliError("stack config must be a mapping")
        # Top-level scalars from hand-written files are strings to the real CLI.
        for key, value in list(cfg.items()):
            if isinstance(value, bool):
                cfg[key] = "true" if value else "false"
            elif isinstance(value, (int, float)):
                cfg[key] = str(value)
        return cfg

    def save_settings(self) -> None:
        workspace.save_stack_settings(self.project, self.ref.name, self.settings)

    def crypter(self) -> Crypter:
        """The passphrase crypter; creates the stack's ``encryptionsalt`` on first use, as the CLI does."""
        if self._crypter is None:
            salt = self.settings.get("encryptionsalt")
            phrase = read_passphrase()
            if isinstance(salt, str) and salt:
                self._crypter = crypter_from_state(phrase, salt)
            else:
                state, self._crypter = new_salt_state(phrase)
                self.settings["encryptionsalt"] = state
                self.save_settings()
        return self._crypter

    def encrypt(self, plaintext: str) -> str:
        return self.crypter().encrypt(plaintext)

    def decrypt(self, ciphertext: str) -> str:
        return self.crypter().decrypt(ciphertext)

    def decrypter(self) -> Callable[[str], str]:
        return self.decrypt

    def secrets_provider_state(self) -> dict[str, Any] | None:
        salt = self.settings.get("encryptionsalt")
        return {"type": "passphrase", "state": {"salt": salt}} if isinstance(salt, str) else None


def open_backend(ctx: Context, project: Project | None) -> FileBackend:
    url = workspace.backend_url(project)
    return FileBackend(url, workspace.backend_root(url, ctx.cwd))


def resolve_stack(ctx: Context, stack_flag: str | None, must_exist: bool = True) -> StackContext:
    """The stack named by ``--stack`` or the selected one, as cmdStack.RequireStack resolves it."""
    project = workspace.require_project(ctx.cwd)
    backend = open_backend(ctx, project)
    name = stack_flag or workspace.current_stack(project)
    if not name:
        raise CliError("no stack selected; specify a stack name with --stack", 6)
    ref = parse_stack_ref(name, project.name)
    shown = ref.display(project.name)
    if must_exist:
        backend.require(ref, shown)
    settings = workspace.load_stack_settings(project, ref.name)
    return StackContext(project=project, backend=backend, ref=ref, settings=settings)

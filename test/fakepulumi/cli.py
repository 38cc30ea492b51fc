"""Command-line parsing and dispatch, cobra-style: global flags anywhere, ``--`` ends flags.

Only the commands and flags the Automation API issues (plus login/logout) exist; anything else is an
``unknown command`` / ``unknown flag`` error with the configuration exit code, so a test notices when
the agent starts using something this stand-in does not model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EXIT_CONFIGURATION, BailError, CliError
from .stackctx import Context

BOOL, VALUE, LIST = "bool", "value", "list"

# Global flags (pulumi's persistent root flags), name -> kind.
GLOBAL_FLAGS = {
    "non-interactive": BOOL,
    "color": VALUE,
    "logtostderr": BOOL,
    "logflow": BOOL,
    "verbose": VALUE,
    "tracing": VALUE,
    "tracing-header": VALUE,
    "profiling": VALUE,
    "memprofilerate": VALUE,
    "disable-integrity-checking": BOOL,
    "fully-qualify-stack-names": BOOL,
    "cwd": VALUE,
    "emoji": BOOL,
    "otel-traces": VALUE,
}
GLOBAL_SHORT = {"v": "verbose", "C": "cwd", "e": "emoji"}

_OPERATION_FLAGS = {
    "message": VALUE,
    "expect-no-changes": BOOL,
    "clear-pending-creates": BOOL,
    "skip-pending-creates": BOOL,
    "import-pending-creates": LIST,
    "diff": BOOL,
    "replace": LIST,
    "target": LIST,
    "exclude": LIST,
    "policy-pack": LIST,
    "policy-pack-config": LIST,
    "target-dependents": BOOL,
    "exclude-dependents": BOOL,
    "target-replace": LIST,
    "parallel": VALUE,
    "exclude-protected": BOOL,
    "debug": BOOL,
    "suppress-outputs": BOOL,
    "suppress-progress": BOOL,
    "suppress-permalink": VALUE,
    "continue-on-error": BOOL,
    "attach-debugger": BOOL,
    "refresh": BOOL,
    "config-file": VALUE,
    "yes": BOOL,
    "skip-preview": BOOL,
    "preview-only": BOOL,
    "run-program": BOOL,
    "client": VALUE,
    "exec-kind": VALUE,
    "exec-agent": VALUE,
    "event-log": VALUE,
    "json": BOOL,
    "plan": VALUE,
    "save-plan": VALUE,
    "import-file": VALUE,
    "show-secrets": BOOL,
    "show-config": BOOL,
    "show-replacement-steps": BOOL,
    "show-sames": BOOL,
    "show-reads": BOOL,
    "stack": VALUE,
    "remove": BOOL,
    "config": LIST,
    "config-path": BOOL,
    "secrets-provider": VALUE,
    "show-policy-remediations": BOOL,
    "neo": BOOL,
}
_DESTROY_FLAGS = {k: v for k, v in _OPERATION_FLAGS.items() if k != "expect-no-changes"}
"""``pulumi destroy`` has no ``--expect-no-changes`` (pkg/cmd/pulumi/operations/destroy.go)."""
_IMPORT_FLAGS = {
    "parent": VALUE,
    "provider": VALUE,
    "properties": LIST,
    "file": VALUE,
    "out": VALUE,
    "generate-code": BOOL,
    "debug": BOOL,
    "message": VALUE,
    "stack": VALUE,
    "config-file": VALUE,
    "diff": BOOL,
    "parallel": VALUE,
    "preview-only": BOOL,
    "skip-preview": BOOL,
    "json": BOOL,
    "output": VALUE,
    "suppress-outputs": BOOL,
    "urns": BOOL,
    "suppress-progress": BOOL,
    "suppress-permalink": VALUE,
    "yes": BOOL,
    "protect": BOOL,
    "from": VALUE,
    "generate-resources": VALUE,
    "skip-plugin-pre-install": BOOL,
    "event-log": VALUE,
    "exec-kind": VALUE,
    "exec-agent": VALUE,
}
"""``pulumi import``'s flags (pkg/cmd/pulumi/operations/import.go)."""
_IMPORT_SHORT = {
    "f": "file",
    "o": "out",
    "d": "debug",
    "m": "message",
    "s": "stack",
    "p": "parallel",
    "j": "json",
    "y": "yes",
}

_OPERATION_SHORT = {
    "m": "message",
    "t": "target",
    "p": "parallel",
    "d": "debug",
    "r": "refresh",
    "y": "yes",
    "f": "skip-preview",
    "j": "json",
    "s": "stack",
    "c": "config",
}


@dataclass
class Command:
    handler: Callable[[Context, Parsed], int]
    flags: dict[str, str]
    short: dict[str, str] = field(default_factory=dict)


@dataclass
class Parsed:
    path: tuple[str, ...]
    args: list[str]
    flags: dict[str, str | bool | list[str]]

    def flag(self, name: str) -> str | None:
        value = self.flags.get(name)
        return value if isinstance(value, str) else None

    def bool(self, name: str) -> bool:
        value = self.flags.get(name, False)
        return value is True or (isinstance(value, str) and value.lower() in ("true", "1"))

    def list(self, name: str) -> list[str]:
        value = self.flags.get(name)
        return value if isinstance(value, list) else []


def _commands() -> dict[tuple[str, ...], Command]:
    from . import commands as c
    from . import configcommands as cc

    stack = {"stack": VALUE}
    s = {"s": "stack"}
    return {
        ("version",): Command(c.version, {}),
        ("whoami",): Command(c.whoami, {"json": BOOL}, {"j": "json"}),
        ("login",): Command(
            c.login,
            {"local": BOOL, "cloud-url": VALUE, "default-org": VALUE, "insecure": BOOL},
            {"l": "local", "c": "cloud-url"},
        ),
        ("logout",): Command(c.logout, {"local": BOOL, "all": BOOL, "cloud-url": VALUE}, {"l": "local"}),
        ("stack", "init"): Command(
            c.stack_init,
            {**stack, "secrets-provider": VALUE, "no-select": BOOL, "copy-config-from": VALUE, "teams": LIST},
            s,
        ),
        ("stack", "select"): Command(
            c.stack_select, {**stack, "create": BOOL, "secrets-provider": VALUE}, {**s, "c": "create"}
        ),
        ("stack", "ls"): Command(
            c.stack_ls,
            {"json": BOOL, "all": BOOL, "project": VALUE, "organization": VALUE, "tag": VALUE},
            {"j": "json", "a": "all", "p": "project"},
        ),
        ("stack", "rm"): Command(
            c.stack_rm,
            {**stack, "yes": BOOL, "force": BOOL, "preserve-config": BOOL, "remove-backups": BOOL},
            {**s, "y": "yes", "f": "force"},
        ),
        ("stack", "output"): Command(
            c.stack_output, {**stack, "json": BOOL, "show-secrets": BOOL, "shell": BOOL}, {**s, "j": "json"}
        ),
        ("stack", "history"): Command(
            c.stack_history,
            {
                **stack,
                "json": BOOL,
                "show-secrets": BOOL,
                "page-size": VALUE,
                "page": VALUE,
                "full-dates": BOOL,
            },
            {**s, "j": "json"},
        ),
        ("stack", "export"): Command(
            c.stack_export, {**stack, "file": VALUE, "show-secrets": BOOL, "version": VALUE}, s
        ),
        ("stack", "import"): Command(c.stack_import, {**stack, "file": VALUE, "force": BOOL}, s),
        ("config",): Command(
            cc.config_ls,
            {**stack, "json": BOOL, "show-secrets": BOOL, "config-file": VALUE, "open": BOOL},
            {**s, "j": "json"},
        ),
        ("config", "get"): Command(
            cc.config_get,
            {**stack, "json": BOOL, "path": BOOL, "config-file": VALUE, "open": BOOL},
            {**s, "j": "json"},
        ),
        ("config", "set"): Command(
            cc.config_set,
            {**stack, "secret": BOOL, "plaintext": BOOL, "path": BOOL, "config-file": VALUE, "type": VALUE},
            s,
        ),
        ("config", "set-all"): Command(
            cc.config_set_all,
            {**stack, "plaintext": LIST, "secret": LIST, "path": BOOL, "json": VALUE, "config-file": VALUE},
            s,
        ),
        ("config", "rm"): Command(cc.config_rm, {**stack, "path": BOOL, "config-file": VALUE}, s),
        ("config", "rm-all"): Command(cc.config_rm_all, {**stack, "path": BOOL, "config-file": VALUE}, s),
        ("config", "refresh"): Command(
            cc.config_refresh, {**stack, "force": BOOL, "config-file": VALUE}, {**s, "f": "force"}
        ),
        ("config", "env", "add"): Command(cc.config_env, {**stack, "yes": BOOL, "show-secrets": BOOL}, s),
        ("config", "env", "ls"): Command(cc.config_env, {**stack, "json": BOOL}, s),
        ("config", "env", "rm"): Command(cc.config_env, {**stack, "yes": BOOL, "show-secrets": BOOL}, s),
        ("install",): Command(
            c.install,
            {
                "no-plugins": BOOL,
                "no-dependencies": BOOL,
                "reinstall": BOOL,
                "use-language-version-tools": BOOL,
                "parallel": VALUE,
            },
        ),
        ("plugin", "ls"): Command(c.plugin_ls, {"json": BOOL, "project": BOOL}, {"j": "json"}),
        ("plugin", "install"): Command(c.plugin_install, {"server": VALUE, "exact": BOOL, "reinstall": BOOL}),
        ("preview",): Command(c.preview, _OPERATION_FLAGS, _OPERATION_SHORT),
        ("up",): Command(c.up, _OPERATION_FLAGS, _OPERATION_SHORT),
        ("refresh",): Command(c.refresh, _OPERATION_FLAGS, _OPERATION_SHORT),
        ("destroy",): Command(c.destroy, _DESTROY_FLAGS, _OPERATION_SHORT),
        ("import",): Command(c.import_, _IMPORT_FLAGS, _IMPORT_SHORT),
        ("cancel",): Command(c.cancel, {**stack, "yes": BOOL}, {**s, "y": "yes"}),
    }


def _value_flags(commands: dict[tuple[str, ...], Command]) -> set[str]:
    names = {n for n, k in GLOBAL_FLAGS.items() if k != BOOL}
    for cmd in commands.values():
        names |= {n for n, k in cmd.flags.items() if k != BOOL}
    return names


def parse(argv: list[str]) -> tuple[Command, Parsed, dict[str, str | bool]]:
    commands = _commands()
    value_flags = _value_flags(commands)
    # Pass 1: find the command words (positionals before `--` that name a command).
    words: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            break
        if tok.startswith("-"):
            name = tok.lstrip("-").split("=", 1)[0]
            if "=" not in tok and (name in value_flags or GLOBAL_SHORT.get(name) in value_flags):
                i += 1
            i += 1
            continue
        if (*words, tok) in commands or any(k[: len(words) + 1] == (*words, tok) for k in commands):
            words.append(tok)
            i += 1
            continue
        break
    path = tuple(words)
    if path not in commands:
        shown = " ".join(path) or (argv[0] if argv else "")
        raise CliError(f'unknown command "{shown}" for "pulumi"', EXIT_CONFIGURATION)
    cmd = commands[path]
    # Pass 2: assign flags and positionals.
    flags: dict[str, str | bool | list[str]] = {}
    globals_: dict[str, str | bool] = {}
    args: list[str] = []
    remaining = list(argv)
    for word in path:
        remaining.remove(word)
    j = 0
    while j < len(remaining):
        tok = remaining[j]
        j += 1
        if tok == "--":
            args.extend(remaining[j:])
            break
        if not tok.startswith("-") or tok == "-":
            args.append(tok)
            continue
        long = tok.startswith("--")
        body = tok[2:] if long else tok[1:]
        name, has_value, inline = body.partition("=")
        if not long:
            name = cmd.short.get(name) or GLOBAL_SHORT.get(name) or name
        if name in cmd.flags:
            kind, target = cmd.flags[name], "cmd"
        elif name in GLOBAL_FLAGS:
            kind, target = GLOBAL_FLAGS[name], "global"
        else:
            raise CliError(f"unknown flag: {tok.split('=', 1)[0]}", EXIT_CONFIGURATION)
        if kind == BOOL:
            value: str | bool = inline if has_value else True
        else:
            if has_value:
                value = inline
            elif j < len(remaining):
                value = remaining[j]
                j += 1
            else:
                raise CliError(f"flag needs an argument: {tok}", EXIT_CONFIGURATION)
        if target == "global":
            globals_[name] = value
        elif kind == LIST:
            existing = flags.setdefault(name, [])
            assert isinstance(existing, list) and isinstance(value, str)
            existing.append(value)
        else:
            flags[name] = value
    return cmd, Parsed(path=path, args=args, flags=flags), globals_


def main(argv: list[str]) -> int:
    try:
        cmd, parsed, globals_ = parse(argv)
        cwd_flag = globals_.get("cwd")
        cwd = Path(cwd_flag) if isinstance(cwd_flag, str) else Path(os.getcwd())
        ctx = Context(cwd=cwd.resolve(), fully_qualify=bool(globals_.get("fully-qualify-stack-names")))
        return cmd.handler(ctx, parsed)
    except BailError as exc:
        return exc.exit_code
    except CliError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"error: {exc.message}\n")
        sys.stderr.flush()
        return exc.exit_code

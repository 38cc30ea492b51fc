"""The command line and the environment, read into :class:`~pko.settings.operator.Settings`: one flag
per declared setting, whose default is the first of its environment variables set, else its own.

Durations take Go's syntax (``60s``, ``1m30s``, ``500ms``) or plain seconds.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pko.settings.operator import DECLARED, Settings
from pko.settings.setting import Group
from pko.version import VERSION

__all__ = ["build_parser", "parse_settings"]

DESCRIPTION = (
    "The Pulumi Kubernetes Operator (pko): runs the Stack, Workspace, Update and Program controllers. "
    "Each flag can also be set by the environment variable named in its help; the flag wins."
)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """``pko``'s parser; each flag's default is read from ``env`` (argparse converts a string
    default with the flag's type, so the environment's values are checked as the flag's are)."""
    parser = argparse.ArgumentParser(prog="pko", description=DESCRIPTION, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    groups: dict[Group, Any] = {}
    for setting in DECLARED:
        group = setting.group
        if group not in groups:
            title = f"{group.title} ({group.note})" if group.note else group.title
            groups[group] = parser.add_argument_group(title)
        kind = setting.kind
        options: dict[str, Any] = {
            "dest": setting.name,
            "type": kind.parse,
            "default": setting.text_from(env),
            "help": setting.help_text().replace("%", "%%"),
        }
        if kind.metavar is not None:
            options["metavar"] = kind.metavar
        if kind.choices is not None:
            options["choices"] = kind.choices
        if kind.bare is not None:
            options.update(nargs="?", const=kind.bare)
        groups[group].add_argument(setting.flag, *setting.aliases, **options)
    return parser


def parse_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``argv`` (default ``sys.argv[1:]``) and ``env`` (default ``os.environ``).

    Invalid input (flags or environment) exits with status 2 and a message, as argparse does.
    """
    parser = build_parser(os.environ if env is None else env)
    try:
        args = parser.parse_args(argv)
        values = {setting.name: getattr(args, setting.name) for setting in DECLARED}
        for setting in DECLARED:
            value = values[setting.name]
            # argparse checks choices on the command line only; the environment's values are checked here.
            choices = setting.kind.choices
            if choices is not None and value is not None and value not in choices:
                raise ValueError(f"{setting.flag}: invalid choice {value!r}")
            if value is None and setting.unset is not None:
                values[setting.name] = setting.unset(values)
        settings = Settings(values)
        if settings.workspace_address_mode == "static" and not settings.workspace_static_address:
            raise ValueError(
                "--workspace-address-mode=static needs --workspace-localhost (WORKSPACE_LOCALHOST)"
            )
        if settings.leader_elect:
            settings.manager_options("validate")  # durations must be consistent
    except ValueError as exc:
        parser.error(str(exc))
    return settings

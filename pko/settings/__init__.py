"""The operator's settings, each declared once (:mod:`pko.settings.operator`): the flags and the
environment reading (:mod:`pko.settings.cli`), the Options objects and the docs' settings table are
made from the declarations. Importing it imports no reconciler: it is read before logging is set up.
"""

from __future__ import annotations

from pko.settings.cli import build_parser, parse_settings
from pko.settings.kinds import Kind, parse_duration
from pko.settings.operator import DECLARED, GROUPS, Settings
from pko.settings.setting import Group, Setting

__all__ = [
    "DECLARED",
    "GROUPS",
    "Group",
    "Kind",
    "Setting",
    "Settings",
    "build_parser",
    "parse_duration",
    "parse_settings",
]

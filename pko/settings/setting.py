"""One operator setting, declared once: its flag, environment variables, kind of value, default, help
and the Options fields it feeds. :class:`pko.settings.operator.Settings` declares each as a class
attribute; the flags and the environment reading (:mod:`pko.settings.cli`), the Options objects
(:meth:`~pko.settings.operator.Settings.controller_options`, ``manager_options``) and the docs'
settings table (``pko/devtools/apiref_settings.py``) are all made from those declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from pko.settings.kinds import Kind

__all__ = ["Group", "HasValues", "Setting", "fed_fields"]

T = TypeVar("T")


class HasValues(Protocol):
    """What holds the settings' values (:class:`pko.settings.operator.Settings`), by setting name."""

    @property
    def values(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Group:
    """A section of ``pko --help`` and of the docs' table. ``note`` follows the title in ``--help``."""

    title: str
    note: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Setting(Generic[T]):
    """A setting; on a :class:`~pko.settings.operator.Settings` instance, its value.

    ``env``: the variables read, the first one set (non-empty) winning; the flag wins over them all.
    ``default``: the text used when neither is given, read by ``kind`` like a flag's value.
    ``shown``: the default in words, for ``--help`` and the docs, when the text alone would mislead
    (empty ``default`` of an optional setting, or ``unset``). ``unset``: the value, from the other
    settings, when the setting parsed to None. ``overrides``: the Stack field that wins over it for
    that Stack (docs/retries.md). ``feeds``: the Options fields it sets, as ``Class.field`` or
    ``Class.field[key]`` for a mapping (see :func:`fed_fields`).
    """

    flag: str
    kind: Kind[T]
    env: tuple[str, ...]
    default: str
    help: str
    group: Group
    overrides: str = ""
    feeds: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    shown: str = ""
    unset: Callable[[Mapping[str, Any]], T] | None = None
    name: str = field(default="", init=False)

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "name", name)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: HasValues, owner: type | None = None) -> T: ...
    def __get__(self, obj: HasValues | None, owner: type | None = None) -> Setting[T] | T:
        if obj is None:
            return self
        return cast(T, obj.values[self.name])

    def text_from(self, env: Mapping[str, str]) -> str:
        """The value's text when no flag is given: the first variable set, else the default."""
        return next((env[var] for var in self.env if env.get(var)), self.default)

    def default_shown(self) -> str:
        """The default in words (empty: none worth saying)."""
        return self.shown or self.default

    def says(self) -> str:
        """What it does, and the Stack field that overrides it."""
        return f"{self.help}; {self.overrides} overrides" if self.overrides else self.help

    def help_text(self) -> str:
        """``pko --help``'s line: what it does, its default and its variables."""
        default = self.default_shown()
        says = f" (default {default})" if default else ""
        return f"{self.says()}{says} [{', else '.join(self.env)}]"


def fed_fields(settings: HasValues, declared: tuple[Setting[Any], ...], target: str) -> dict[str, Any]:
    """The keyword arguments of Options class ``target`` that the ``declared`` settings feed, with
    their values in ``settings``; ``field[key]`` feeds collect into a dict."""
    fields: dict[str, Any] = {}
    for setting in declared:
        for feed in setting.feeds:
            cls, _, name = feed.partition(".")
            if cls != target:
                continue
            value = setting.__get__(settings)
            name, _, key = name.partition("[")
            if key:
                fields.setdefault(name, {})[key.removesuffix("]")] = value
            else:
                fields[name] = value
    return fields

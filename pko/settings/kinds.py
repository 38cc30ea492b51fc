"""The kinds of value a setting takes: how its text (a flag's value or an environment variable's) is
read, what ``pko --help`` calls it and how the docs describe it.

A parse function raises ``argparse.ArgumentTypeError`` with a message that names no flag: argparse
adds ``argument --flag:`` (for the environment's values too, which it converts as string defaults).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pko import defaults
from pko.api.meta import parse_go_duration

__all__ = [
    "BOOL",
    "COUNT",
    "DURATION",
    "FACTOR",
    "FRACTION",
    "RETRY_DURATION",
    "WORKERS",
    "Kind",
    "choice",
    "optional",
    "parse_bool",
    "parse_duration",
    "text",
]

T = TypeVar("T")
# The values a Kind's parse returns are read out of argparse's namespace, so a Kind is covariant.
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Kind(Generic[T_co]):
    """``parse`` reads a value's text; ``metavar`` names it in ``pko --help`` (None: argparse lists
    the ``choices``); ``label`` says in the docs what it accepts; ``bare`` is the value of the flag
    given without one (``--leader-elect``), None when a value is required."""

    parse: Callable[[str], T_co]
    metavar: str | None
    label: str
    choices: tuple[str, ...] | None = None
    bare: T_co | None = None


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (``1m30s``, ``500ms``; :func:`pko.api.meta.parse_go_duration`)
    or a plain number of seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_go_duration(text).total_seconds()
        except ValueError:
            raise ValueError(f"invalid duration {text!r} (use e.g. 45s, 1m30s, 500ms)") from None
    if seconds < 0:
        raise ValueError(f"duration {text!r} is negative")
    return seconds


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes", "on"):
        return True
    if value in ("0", "f", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _usage_error(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` with its ValueError turned into argparse's usage error."""

    def read(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return read


def _retry_seconds(text: str) -> float:
    """A retry base or cap: a duration of at least 1 s (status times have whole seconds)."""
    seconds = _usage_error(parse_duration)(text)
    if not (math.isfinite(seconds) and seconds >= defaults.MIN_RETRY_SECONDS):
        raise argparse.ArgumentTypeError(f"must be at least {defaults.MIN_RETRY_SECONDS:g}s, got {text!r}")
    return seconds


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _factor(text: str) -> float:
    """A backoff factor: at least 1 (1 keeps the wait fixed; below 1 it would shrink)."""
    value = _finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (1: a fixed wait), got {value:g}")
    return value


def _jitter(text: str) -> float:
    """A jitter fraction in [0, 1) (0.2: +-20%; 1 or more could make a wait zero or negative)."""
    value = _finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and less than 1 (0.2: +-20%), got {value:g}")
    return value


def _int_at_least(least: int, message: str) -> Callable[[str], int]:
    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{message}, got {value}")
        return value

    return read


def _same(value: str) -> str:
    return value


def text(metavar: str, label: str) -> Kind[str]:
    """Any text (a name, an address, an image)."""
    return Kind(_same, metavar, label)


def choice(*values: str) -> Kind[str]:
    """One of ``values`` (checked for the environment's values too: :mod:`pko.settings.cli`)."""
    return Kind(_same, None, "one of " + ", ".join(f"`{v}`" for v in values), values)


def optional(kind: Kind[T]) -> Kind[T | None]:
    """``kind``, or None for an empty text: a setting that is unset unless given."""

    def read(value: str) -> T | None:
        return kind.parse(value) if value.strip() else None

    return Kind(read, kind.metavar, kind.label, kind.choices)


def _names(text: str) -> tuple[str, ...]:
    """Comma-separated names (``a,b``), blanks and repeats dropped, in order."""
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if n and not _DNS_LABEL.fullmatch(n)]
    if bad:
        raise argparse.ArgumentTypeError(f"not a namespace name: {bad[0]!r}")
    return tuple(dict.fromkeys(n for n in names if n))


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

NAMES: Kind[tuple[str, ...]] = Kind(_names, "NAME,...", "comma-separated names")
BOOL: Kind[bool] = Kind(
    _usage_error(parse_bool), "BOOL", "`true` or `false` (the flag alone: `true`)", bare=True
)
DURATION: Kind[float] = Kind(
    _usage_error(parse_duration), "DURATION", "duration (`45s`, `1m30s`, `500ms`) or seconds"
)
RETRY_DURATION: Kind[float] = Kind(_retry_seconds, "DURATION", "duration, at least `1s`")
FACTOR: Kind[float] = Kind(_factor, "FACTOR", "number, at least 1 (1: a fixed wait)")
FRACTION: Kind[float] = Kind(_jitter, "FRACTION", "fraction, at least 0 and less than 1")
COUNT: Kind[int] = Kind(_int_at_least(0, "must not be negative"), "N", "integer, at least 0")
WORKERS: Kind[int] = Kind(_int_at_least(1, "must be at least 1"), "N", "integer, at least 1")

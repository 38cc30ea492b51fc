"""The operator-wide retry settings of failed Stack operations (``--stack-*`` flags): a dataclass of
defaults, shared by :mod:`pko.controllers.options` (what the reconcilers are told) and
:mod:`pko.controllers.stack.retry` (the backoff rules that read it, and ``for_stack``, which lays a
Stack's own values over it), so neither reaches into the other. Its defaults are
:mod:`pko.defaults`'; docs/retries.md describes each setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pko import defaults

__all__ = ["RetrySettings", "retry_settings_problems"]

# Settings that are durations (seconds): bases and caps.
_DURATIONS = ("transient_base", "transient_cap", "deterministic_base", "max_backoff")
_FACTORS = ("transient_factor", "deterministic_factor")


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """Operator-wide retry defaults; a Stack may override each of them.

    Invariant (checked on construction, whatever builds it: flags, a Stack's values, a test):
    :func:`retry_settings_problems` is empty, so a backoff never shrinks, never waits less than a
    second and always reaches its cap.
    """

    max_update_failures: int = defaults.MAX_UPDATE_FAILURES
    deterministic_base: float = defaults.DETERMINISTIC_RETRY_BASE
    deterministic_factor: float = defaults.DETERMINISTIC_RETRY_FACTOR
    transient_base: float = defaults.TRANSIENT_RETRY_BASE
    transient_factor: float = defaults.TRANSIENT_RETRY_FACTOR
    transient_cap: float = defaults.TRANSIENT_RETRY_CAP
    # The +- fraction of transient delays (deterministic ones keep the Go cooldown, unjittered).
    jitter: float = defaults.TRANSIENT_RETRY_JITTER
    # The longest wait before any retry (the cap of deterministic ones, and of transient ones).
    max_backoff: float = defaults.MAX_RETRY_BACKOFF

    def __post_init__(self) -> None:
        problems = retry_settings_problems(self)
        if problems:
            raise ValueError("invalid retry settings: " + "; ".join(problems))


def retry_settings_problems(settings: RetrySettings) -> list[str]:
    """What is wrong with ``settings`` (empty: nothing): durations of at least 1 s, factors of at
    least 1, a jitter in [0, 1), a non-negative failure budget; every number finite."""
    problems: list[str] = []
    for name in _DURATIONS:
        value = getattr(settings, name)
        if not (math.isfinite(value) and value >= defaults.MIN_RETRY_SECONDS):
            problems.append(f"{name} must be at least {defaults.MIN_RETRY_SECONDS:g} s, got {value}")
    for name in _FACTORS:
        value = getattr(settings, name)
        if not (math.isfinite(value) and value >= 1):
            problems.append(f"{name} must be at least 1 (1: a fixed delay), got {value}")
    if not 0 <= settings.jitter < 1:
        problems.append(f"jitter must be at least 0 and less than 1, got {settings.jitter}")
    if settings.max_update_failures < 0:
        problems.append(f"max_update_failures must not be negative, got {settings.max_update_failures}")
    return problems

"""The operator-wide retry settings of failed Stack operations (``--stack-*`` flags): a dataclass of
defaults, shared by :mod:`pko.controllers.options` (what the reconcilers are told) and
:mod:`pko.controllers.stack.retry` (the backoff rules that read it), so neither reaches into the
other. Its defaults are :mod:`pko.defaults`'; the bases, factors and jitter are built in.
"""

from __future__ import annotations

from dataclasses import dataclass

from pko import defaults

__all__ = ["RetrySettings"]


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """Operator-wide retry defaults (a Stack overrides the budget and the cap)."""

    max_update_failures: int = defaults.MAX_UPDATE_FAILURES
    deterministic_base: float = 10.0
    deterministic_factor: float = 3.0
    transient_base: float = 5.0
    transient_factor: float = 2.0
    transient_cap: float = defaults.TRANSIENT_RETRY_CAP
    jitter: float = 0.2
    max_backoff: float = defaults.MAX_RETRY_BACKOFF

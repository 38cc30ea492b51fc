"""Carrying out a reconcile's plan: the one loop every reconciler's ``_act`` uses.

A reconcile observes, asks a pure ``decide`` for a plan (ordered writes, a ``Result``, and perhaps
``then``: the pure function that plans the rest from the last write's answer), and carries the plan
out here. Each controller keeps its own vocabulary of writes and its own ``carry_out`` (the only
code that touches the API or an agent); what is shared is the protocol:

* the writes run in order; the answer of the last one is what ``follow`` plans from (the Workspace
  as applied, the operation an agent started, a dry run's refusal);
* a write's failure is *expected* when its exception is of a type the controller's table lists for
  that write's type (``expected``, as the Update reconciler's ``_EXPECTED`` first did); it is turned
  into the controller's failure data (``failure_of``) and the pure ``refused`` plans the rest, or
  returns None: then, like any unexpected failure, it propagates and the controller retries with
  backoff;
* the loop ends when a plan's writes are done and ``follow`` plans nothing more: that plan (its
  ``Result``, its finding) is returned to the reconciler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import structlog

__all__ = ["Expected", "Planned", "execute"]

_log = structlog.get_logger("pko.machinery.executor")

W_co = TypeVar("W_co", covariant=True)
P = TypeVar("P", bound="Planned[Any]")
W = TypeVar("W")
F = TypeVar("F")

Expected = Mapping[type, tuple[type[BaseException], ...]]
"""Per write type, the exception types whose failure the plan expects (and plans from)."""


class Planned(Protocol[W_co]):
    """What a plan has for the executor: its writes, in order."""

    @property
    def writes(self) -> Sequence[W_co]: ...


async def execute(
    plan: P,
    carry_out: Callable[[W], Awaitable[Any]],
    *,
    expected: Expected,
    failure_of: Callable[[BaseException], F],
    refused: Callable[[P, W, F], P | None],
    follow: Callable[[P, Any], P | None],
) -> P:
    """Carry out ``plan`` (see the module docstring); the plan the reconcile ends with."""
    while True:
        answer: Any = None
        rest: P | None = None
        for write in plan.writes:
            try:
                answer = await carry_out(write)
            except BaseException as exc:
                if not isinstance(exc, expected.get(type(write), ())):
                    raise
                failure = failure_of(exc)
                rest = refused(plan, write, failure)
                if rest is None:
                    raise
                _log.debug(
                    "write failed; planned from its failure", write=type(write).__name__, failure=failure
                )
                break
        if rest is not None:
            plan = rest
            continue
        following = follow(plan, answer)
        if following is None:
            return plan
        plan = following

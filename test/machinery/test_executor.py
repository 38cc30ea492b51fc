"""The one loop that carries out a reconcile's plan (pko.machinery.executor), with a toy vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from pko.machinery.executor import execute


@dataclass(frozen=True)
class Put:
    value: str


@dataclass(frozen=True)
class Ask:
    question: str


@dataclass
class Plan:
    writes: list[Put | Ask]
    then: Callable[[str], Plan] | None = None
    done: str = ""
    failures: list[str] = field(default_factory=list)


class Boom(Exception):
    pass


class Carrier:
    """Carries writes out into ``log``; ``fail`` maps a write to the exception it raises."""

    def __init__(self, fail: dict[Put | Ask, BaseException] | None = None) -> None:
        self.log: list[str] = []
        self.fail = fail or {}

    async def __call__(self, write: Put | Ask) -> str | None:
        if write in self.fail:
            raise self.fail[write]
        if isinstance(write, Ask):
            self.log.append(f"ask {write.question}")
            return f"answer to {write.question}"
        self.log.append(f"put {write.value}")
        return None


def follow(plan: Plan, answer: str | None) -> Plan | None:
    return plan.then(answer) if plan.then is not None and answer is not None else None


def never(plan: Plan, write: Put | Ask, failure: str) -> Plan | None:
    raise AssertionError("nothing was expected to fail")


EXPECTED = {Ask: (Boom,)}


async def test_writes_run_in_order_then_the_plan_from_the_last_answer() -> None:
    carrier = Carrier()
    first = Plan([Put("a"), Ask("q")], then=lambda answer: Plan([Put(answer)], then=None, done="third"))
    end = await execute(first, carrier, expected=EXPECTED, failure_of=str, refused=never, follow=follow)
    assert carrier.log == ["put a", "ask q", "put answer to q"]
    assert end.done == "third"


async def test_an_expected_failure_is_planned_from_and_the_rest_of_that_plan_skipped() -> None:
    carrier = Carrier({Ask("q"): Boom("agent away")})
    seen: list[tuple[Put | Ask, str]] = []

    def refused(plan: Plan, write: Put | Ask, failure: str) -> Plan | None:
        seen.append((write, failure))
        return Plan([Put("waiting")], done="waited")

    first = Plan([Put("a"), Ask("q"), Put("never")], then=lambda answer: Plan([], done="not reached"))
    end = await execute(first, carrier, expected=EXPECTED, failure_of=str, refused=refused, follow=follow)
    assert carrier.log == ["put a", "put waiting"]
    assert seen == [(Ask("q"), "agent away")] and end.done == "waited"


async def test_a_failure_the_write_does_not_expect_or_refused_declines_propagates() -> None:
    # Boom is expected of an Ask, not of a Put
    carrier = Carrier({Put("a"): Boom("api down")})
    with pytest.raises(Boom, match="api down"):
        await execute(
            Plan([Put("a")]), carrier, expected=EXPECTED, failure_of=str, refused=never, follow=follow
        )
    # another type than the one expected
    carrier = Carrier({Ask("q"): KeyError("bug")})
    with pytest.raises(KeyError):
        await execute(
            Plan([Ask("q")]), carrier, expected=EXPECTED, failure_of=str, refused=never, follow=follow
        )
    # expected, but the plan says it is not its to plan from
    carrier = Carrier({Ask("q"): Boom("unknown")})
    with pytest.raises(Boom):
        await execute(
            Plan([Ask("q")]),
            carrier,
            expected=EXPECTED,
            failure_of=str,
            refused=lambda plan, write, failure: None,
            follow=follow,
        )

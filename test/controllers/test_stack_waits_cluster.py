"""Waiting Stacks on a real apiserver (issue 44): a Stack whose Program does not exist is not looked
at again while nothing changes (no timer, no reconcile), and the Program's creation wakes it at
once; a Stack waiting on a missing Secret (not watched) keeps its timer. The decisions, wait by
wait: test_stack_waits.py."""

from __future__ import annotations

import asyncio
import time

from pko.controllers.stack.reconciler import CONTROLLER_NAME
from pko.devtools.waiting import wait_until
from pko.machinery.ratelimitingqueue import RateLimitingQueue

from .stackenv import SECRET_RECHECK, Env, stack_env

env = stack_env()

IDLE = 10  # Stacks waiting on one missing Program
WINDOW = 6.0  # seconds of watching them idle


def stack_queue(env: Env) -> RateLimitingQueue[str]:
    return next(c for c in env.reconciler.manager.controllers if c.name == CONTROLLER_NAME).queue


def timer_pending(env: Env, name: str) -> bool:
    """Whether the Stack's key waits in the queue for a timer (a ``requeue_after``)."""
    return f"{env.ns}/{name}" in stack_queue(env)._waiting


async def test_stacks_waiting_on_a_missing_program_are_woken_by_its_creation_not_a_timer(env: Env) -> None:
    names = [f"idle-{i}" for i in range(IDLE)]
    for name in names:
        await env.create_stack(name, {"programRef": {"name": "later"}})
    for name in names:
        conditions = await env.wait_condition(name, "Stalled", "SourceUnavailable")
        assert conditions["Stalled"][2] == "unable to retrieve program for stack"
    queue = stack_queue(env)
    await wait_until("the Stacks' reconciles done", lambda: len(queue) == 0 and queue.processing == 0)
    # The Go operator (and pko before issue 44) held a 30 s timer per Stack here.
    assert [name for name in names if timer_pending(env, name)] == []
    versions = {name: (await env.stack(name))["metadata"]["resourceVersion"] for name in names}
    reconciles = env.reconciles()
    await asyncio.sleep(WINDOW)
    assert env.reconciles() == reconciles, "a waiting Stack was looked at again while nothing changed"
    assert {name: (await env.stack(name))["metadata"]["resourceVersion"] for name in names} == versions

    # The Program appears (with its artifact): its watch wakes every Stack that names it, at once.
    started = time.monotonic()
    await env.program("later")
    for name in names:
        await env.workspace(name)
    woken = time.monotonic() - started
    assert woken < 20.0, woken  # well before any 30 s timer would have fired, even on a loaded machine
    for name in names:
        stalled = (await env.conditions(name)).get("Stalled")
        assert stalled is None or stalled[0] != "True", (name, stalled)


async def test_a_stack_waiting_on_a_missing_secret_keeps_its_timer(env: Env) -> None:
    # Secrets are read with a GET, never watched (issue 46): only a timer finds one created later.
    spec = {"projectRepo": "https://127.0.0.1:9/idle.git", "branch": "main", "gitAuthSecret": "absent"}
    await env.create_stack("secretless", spec)
    conditions = await env.wait_condition("secretless", "Stalled", "SpecInvalid")
    assert 'secrets "absent" not found' in conditions["Stalled"][2]
    await wait_until("its recheck timer", lambda: timer_pending(env, "secretless"), within=SECRET_RECHECK * 3)

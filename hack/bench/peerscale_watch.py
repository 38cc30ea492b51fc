"""peerscale.py's watch on the Stacks: when every one of them is Ready (row 3) or has a status (row 4),
from one LIST and then events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from peer import condition
from peerscale_requests import SENT
from procstats import Requests

from pko.controllers.resources import STACKS
from pko.machinery.resource import ResourceClient

Obj = dict[str, Any]

# --- the Stacks, watched -------------------------------------------------------------------------


def ready_now(obj: Obj) -> bool:
    """peer.ready_at's test on an object: Ready, its last update for its current generation."""
    last = (obj.get("status") or {}).get("lastUpdate") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    return condition(obj, "Ready").get("status") == "True" and last.get("generation") == generation


def has_status(obj: Obj) -> bool:
    """Whether the operator has written the Stack's status (both write conditions in their first pass)."""
    return bool((obj.get("status") or {}).get("conditions"))


def conditions_of(obj: Obj) -> str:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return ", ".join(
        sorted(f"{c.get('type')}={c.get('status')} {c.get('reason') or ''}".strip() for c in conditions)
    )


class StackWatch:
    """A watch on the namespace's Stacks, noting the first moment ``done`` holds for all of ``names``
    (one LIST, then events: polling 10,000 Stacks would load the apiserver the figures measure)."""

    def __init__(
        self, client: ResourceClient, names: Iterable[str], done: Callable[[Obj], bool], selector: str | None
    ) -> None:
        self.client, self.names, self.done, self.selector = client, set(names), done, selector
        self.state: dict[str, bool] = {}
        self.conditions: dict[str, str] = {}
        self.satisfied = 0
        self.done_at: float | None = None
        self._complete = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _see(self, kind: str, obj: Obj, now: float) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if name not in self.names:
            return
        was = self.state.pop(name, False)
        now_done = kind != "DELETED" and self.done(obj)
        if kind != "DELETED":
            self.state[name] = now_done
            self.conditions[name] = conditions_of(obj)
        self.satisfied += int(now_done) - int(was)
        if self.done_at is None and self.satisfied == len(self.names):
            self.done_at = now
            self._complete.set()

    async def _list(self) -> str:
        listing = await self.client.list(label_selector=self.selector)
        SENT.add({STACKS.group: Requests(reads=1)})
        self.state.clear()
        self.satisfied = 0
        now = time.time()
        for item in listing.items:
            self._see("ADDED", item, now)
        return listing.resource_version

    async def _run(self, version: str) -> None:
        while True:
            try:
                async with self.client.watch(
                    resource_version=version, timeout_seconds=300, label_selector=self.selector
                ) as events:
                    async for event in events:
                        version = str((event.object.get("metadata") or {}).get("resourceVersion") or version)
                        if event.type != "BOOKMARK":
                            self._see(event.type, event.object, time.time())
            except ApiException as exc:
                if exc.status != 410:
                    raise
                version = await self._list()

    async def __aenter__(self) -> StackWatch:
        self._task = asyncio.create_task(self._run(await self._list()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait(self, within: float) -> float:
        """When ``done`` first held for every Stack; TimeoutError after ``within`` seconds."""
        assert self._task is not None, "use inside `async with`"
        complete = asyncio.create_task(self._complete.wait())
        finished, _ = await asyncio.wait(
            {complete, self._task}, timeout=within, return_when=asyncio.FIRST_COMPLETED
        )
        complete.cancel()
        if self._task in finished:
            self._task.result()  # the watch failed: raise why
        if self.done_at is None:
            raise TimeoutError(f"{self.satisfied} of {len(self.names)} Stacks after {within:.0f}s")
        return self.done_at

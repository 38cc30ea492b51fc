"""One update's timeline on the real node: each step from the Stack's new generation to Ready, the
moment it was first seen, so the operator's overhead per update can be read step by step.

Two sources, both sub-second: watches this script holds on the Stack, its Workspace, its Updates and
the workspace pod while the update runs (when a change reached the API server, as any client sees
it), and the JSON logs of the agent (its RPCs, ``pulumi install``, stack selection, the operation's
start and end: the engine's own time) and of the operator (when it started and recorded the
Update). The API's own timestamps (whole seconds) are not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pko.machinery.conditions import get_condition
from pko.machinery.resource import ApiException, ResourceClient

Obj = dict[str, Any]
OPERATOR_NS = "pulumi-kubernetes-operator"


def when(entry: Obj) -> float:
    """A structlog JSON line's ``ts`` as Unix time."""
    return datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp()


def json_log(kubeconfig: Path, namespace: str, target: str, container: str | None = None) -> list[Obj]:
    """The JSON lines of a pod's (or ``deployment/...``'s) log."""
    args = ["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "logs", target]
    if container:
        args += ["-c", container]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    lines = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            lines.append(json.loads(line))
    return lines


def _true(obj: Obj, kind: str) -> bool:
    condition = get_condition((obj.get("status") or {}).get("conditions"), kind) or {}
    return condition.get("status") == "True"


@dataclass
class Rule:
    """A step: the first event of ``client``'s kind whose object ``matches`` marks it."""

    step: str
    client: ResourceClient
    matches: Callable[[str, Obj], bool]
    label_selector: str | None = None


@dataclass
class Timeline:
    """Steps (name -> Unix time first seen), from the watches and then from the logs."""

    start: float
    seen: dict[str, float] = field(default_factory=dict)

    def mark(self, step: str, at: float) -> None:
        self.seen.setdefault(step, at)

    def rows(self) -> list[tuple[str, float, float]]:
        """(step, seconds since start, seconds since the step before), in time order."""
        ordered = sorted(self.seen.items(), key=lambda item: item[1])
        rows, before = [], self.start
        for step, at in ordered:
            rows.append((step, at - self.start, at - before))
            before = at
        return rows


async def _watch(rule_set: list[Rule], timeline: Timeline) -> None:
    """Watch one kind (all rules share its client and selector) and mark each rule's first match."""
    client, selector = rule_set[0].client, rule_set[0].label_selector
    listing = await client.list(label_selector=selector)
    version = listing.resource_version
    while True:
        try:
            async with client.watch(
                resource_version=version, timeout_seconds=300, label_selector=selector, allow_bookmarks=False
            ) as events:
                async for event in events:
                    now = time.time()
                    version = str((event.object.get("metadata") or {}).get("resourceVersion") or version)
                    for rule in rule_set:
                        if rule.step not in timeline.seen and rule.matches(event.type, event.object):
                            timeline.mark(rule.step, now)
        except ApiException as exc:
            if exc.status != 410:
                raise
            version = (await client.list(label_selector=selector)).resource_version


@contextlib.asynccontextmanager
async def watching(rules: list[Rule]) -> AsyncIterator[Timeline]:
    """Watches for ``rules`` running while the block runs; the timeline starts when they are open."""
    timeline = Timeline(start=0.0)
    kinds: dict[tuple[int, str | None], list[Rule]] = {}
    for rule in rules:
        kinds.setdefault((id(rule.client), rule.label_selector), []).append(rule)
    tasks = [asyncio.create_task(_watch(rule_set, timeline)) for rule_set in kinds.values()]
    await asyncio.sleep(0.5)  # each has listed and opened its watch
    timeline.start = time.time()
    try:
        yield timeline
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def update_rules(
    clients: dict[str, ResourceClient],
    stack: str,
    pod: str,
    old_pod_uid: str,
    workspace_generation: int,
    generation: Callable[[], int | None],
) -> list[Rule]:
    """The API-side steps of one update of ``stack``: ``clients`` by kind (stacks, workspaces, updates,
    pods), the Workspace's generation before it, ``generation()`` the Stack's new generation (known
    once the patch is answered)."""
    updates = f"pulumi.com/stack-name={stack}"

    def meta(obj: Obj) -> Obj:
        return obj.get("metadata") or {}

    def new_workspace(obj: Obj) -> bool:
        return meta(obj).get("name") == stack and int(meta(obj).get("generation") or 0) > workspace_generation

    def new_pod(obj: Obj) -> bool:
        return meta(obj).get("name") == pod and meta(obj).get("uid") != old_pod_uid

    def old_pod_going(kind: str, obj: Obj) -> bool:
        if meta(obj).get("name") != pod or meta(obj).get("uid") != old_pod_uid:
            return False
        return kind == "DELETED" or bool(meta(obj).get("deletionTimestamp"))

    def workspace_ready(kind: str, obj: Obj) -> bool:
        ready = get_condition((obj.get("status") or {}).get("conditions"), "Ready") or {}
        current = ready.get("observedGeneration") == meta(obj).get("generation")
        return new_workspace(obj) and ready.get("status") == "True" and current

    def stack_ready(kind: str, obj: Obj) -> bool:
        last = (obj.get("status") or {}).get("lastUpdate") or {}
        mine = meta(obj).get("name") == stack and last.get("generation") == generation()
        return mine and _true(obj, "Ready")

    return [
        Rule("Workspace spec written (new generation)", clients["workspaces"], lambda k, o: new_workspace(o)),
        Rule("Update created", clients["updates"], lambda k, o: k == "ADDED", updates),
        Rule("old workspace pod deleting", clients["pods"], old_pod_going),
        Rule("new workspace pod created", clients["pods"], lambda k, o: k == "ADDED" and new_pod(o)),
        Rule("new workspace pod Ready", clients["pods"], lambda k, o: new_pod(o) and _true(o, "Ready")),
        Rule(
            "Workspace Ready (agent connected, installed, stack set)", clients["workspaces"], workspace_ready
        ),
        Rule("Update Progressing", clients["updates"], lambda k, o: _true(o, "Progressing"), updates),
        Rule("Update Complete", clients["updates"], lambda k, o: _true(o, "Complete"), updates),
        Rule("Stack Ready for the new generation", clients["stacks"], stack_ready),
    ]


def add_log_steps(
    timeline: Timeline, agent: list[Obj], operator: list[Obj], operation: str, update_key: str
) -> None:
    """The agent's and the operator's steps of the update whose operation id is ``operation``."""
    after = [e for e in agent if when(e) >= timeline.start]
    firsts = {
        "server listening": "agent: listening",
        "selected stack": "agent: stack selected",
        "created stack": "agent: stack selected",
    }
    for entry in after:
        step = firsts.get(str(entry.get("msg")))
        if step:
            timeline.mark(step, when(entry))
    install = [when(e) for e in after if e.get("msg") == "pulumi install"]
    if install:
        timeline.mark("agent: `pulumi install` first line", install[0])
        timeline.mark("agent: `pulumi install` last line", install[-1])
    span = operation_span(agent, operation)
    if span is not None:
        timeline.mark("agent: operation started (engine start)", span[0])
        timeline.mark("agent: operation ended (engine end)", span[1])
    for entry in operator:
        if when(entry) < timeline.start:
            continue
        msg = entry.get("msg")
        if msg == "workspace pod initialized":
            timeline.mark("operator: workspace pod initialized", when(entry))
        elif entry.get("update") != update_key:
            continue
        elif msg == "update started":
            timeline.mark("operator: Update started (RPC answered)", when(entry))
        elif msg in ("update succeeded", "update failed"):
            timeline.mark("operator: Update result recorded", when(entry))


def operation_span(agent: list[Obj], operation: str) -> tuple[float, float] | None:
    """The agent's start and end of operation ``operation`` (the engine's own run), from its log."""
    entries = [e for e in agent if e.get("operation") == operation]
    started = [when(e) for e in entries if e.get("msg") == "operation started"]
    ended = [when(e) for e in entries if e.get("msg") in ("operation succeeded", "operation failed")]
    return (started[-1], ended[-1]) if started and ended else None


def engine_seconds(timeline: Timeline) -> float | None:
    start = timeline.seen.get("agent: operation started (engine start)")
    end = timeline.seen.get("agent: operation ended (engine end)")
    return end - start if start is not None and end is not None else None

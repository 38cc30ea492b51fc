"""One big Stack (issue 44) on a real control plane: the real operator, apiserver and play-kubelet
running real agents with the stand-in CLI. Thousands of resources never push an object the operator
writes past ``MAX_OBJECT_BYTES`` (1 MiB, under etcd's 1.5 MiB), and the Stack ends where it should:

* a preview-only Stack of 2,000 ``random:RandomPet``: its Update lists the first changes, counts all
  2,002 (the stack's and the provider's creates too), and the Stack is Ready; the agent's log names every one;
* the same program under ``approval: Always``: the recorded plan counts 2,000 creates and waits;
* a deployed Stack of ``PKO_BIG_STACK_DEPLOYED`` pets (300 by default: the stand-in's ``up`` is
  quadratic, 2,000 take minutes; ``hack/bench/bigstack.py`` runs that size) with a 700 KB output
  past the outputs budget: Ready, the small output recorded, the large one left out and named on
  the outputs Secret; then destroyed.

Each test prints one ``bigstack`` JSON line: the largest object, the time, the operator's and the
agent's peak memory (what the benchmark reports)."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest
from pko.api.limits import MAX_LISTED_ENTRIES, MAX_OBJECT_BYTES, MAX_OUTPUTS_BYTES

from pko.controllers.bounds import json_size
from pko.controllers.resources import OMITTED_OUTPUTS_ANNOTATION
from pko.devtools.waiting import wait_until
from pko.machinery.resource import SECRETS, ResourceClient

from .conftest import operator_env
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]
PREVIEWED = int(os.environ.get("PKO_BIG_STACK_RESOURCES", "2000"))
DEPLOYED = int(os.environ.get("PKO_BIG_STACK_DEPLOYED", "300"))

env = operator_env(Env)


def pets(n: int) -> Obj:
    return {f"pet{i:05d}": {"type": "random:RandomPet"} for i in range(n)}


def _peak_kib(pid: int) -> int | None:
    """A process's peak resident memory (VmHWM), while it runs."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def written(env: Env, name: str) -> list[Obj]:
    """Every object the operator wrote for Stack ``name``: the Stack, its Updates, their outputs Secrets."""
    stack = await env.get(env.stacks, name)
    updates = (await env.updates.list(label_selector=f"pulumi.com/stack-name={name}")).items
    secrets = ResourceClient(env.api, SECRETS, env.ns)
    found: list[Obj] = [stack or {}, *updates]
    for update in updates:
        outputs = (update.get("status") or {}).get("outputs")
        secret = await env.get(secrets, outputs) if outputs else None
        if secret is not None:
            found.append(secret)
    return found


def report(env: Env, name: str, objects: list[Obj], started: float) -> Obj:
    """Assert every object is under ``MAX_OBJECT_BYTES``; print and return the figures."""
    sizes = {f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}": json_size(o) for o in objects}
    largest = max(sizes, key=lambda k: sizes[k])
    assert sizes[largest] < MAX_OBJECT_BYTES, sizes
    agents = [p.get("pulumi") for key, p in env.kubelet.processes.items() if name in key]
    figures = {
        "stack": name,
        "largest": largest,
        "largest_bytes": sizes[largest],
        "seconds": round(time.monotonic() - started, 1),
        "operator_peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "agent_peak_rss_kib": next((_peak_kib(p) for p in agents if p), None),
    }
    print("bigstack " + json.dumps(figures))
    return figures


def agent_log(env: Env, name: str) -> str:
    [key] = [k for k in env.kubelet.processes if name in k]
    return env.kubelet.output(key, "pulumi", lines=1_000_000)


async def test_a_preview_of_thousands_of_resources_is_recorded_bounded_and_the_stack_is_ready(
    env: Env,
) -> None:
    started = time.monotonic()
    await env.create_program("pets", {"resources": pets(PREVIEWED)})
    await env.create_stack("pets", {"programRef": {"name": "pets"}, "preview": True})
    stack = await env.condition("pets", "Ready", "ProcessingCompleted", within=600)
    update = await env.get(env.updates, stack["status"]["lastUpdate"]["name"])
    assert update is not None
    status = update["status"]
    # The pets, the stack's own create and the random provider's.
    assert status["changeCount"] == PREVIEWED + 2 and status["changesTruncated"] is True
    assert 0 < len(status["changes"]) <= MAX_LISTED_ENTRIES
    assert status["changeSummary"] == {"create": PREVIEWED, "update": 0, "delete": 0, "replace": 0}
    report(env, "pets", await written(env, "pets"), started)
    # Every change is in the agent's log, one line each.
    log = agent_log(env, "pets")
    assert log.count("resource change") >= PREVIEWED + 2, log[-2000:]


async def test_a_plan_of_thousands_of_resources_counts_them_all_and_waits_for_approval(env: Env) -> None:
    started = time.monotonic()
    await env.create_program("gated-pets", {"resources": pets(PREVIEWED)})
    await env.create_stack(
        "gated-pets", {"programRef": {"name": "gated-pets"}, "approval": {"mode": "Always"}}
    )

    async def awaiting() -> Obj | None:
        stack = await env.get(env.stacks, "gated-pets")
        plan = ((stack or {}).get("status") or {}).get("plan")
        return stack if plan else None

    stack = await env.stack_until("gated-pets", "gated-pets plan recorded", awaiting, within=600)
    assert stack["status"]["plan"]["summary"] == {"create": PREVIEWED, "update": 0, "delete": 0, "replace": 0}
    report(env, "gated-pets", await written(env, "gated-pets"), started)


async def test_a_deployed_stack_keeps_its_outputs_within_the_budget_and_is_destroyed(env: Env) -> None:
    started = time.monotonic()
    body = {
        "resources": pets(DEPLOYED),
        "outputs": {"big": "x" * (MAX_OUTPUTS_BYTES + 180_000), "small": "${pet00000.id}"},
    }
    await env.create_program("kennel", body)
    await env.create_stack("kennel", {"programRef": {"name": "kennel"}, "destroyOnFinalize": True})
    stack = await env.condition("kennel", "Ready", "ProcessingCompleted", within=600)
    outputs = stack["status"]["outputs"]
    assert set(outputs) == {"small"} and outputs["small"], outputs
    update = await env.get(env.updates, stack["status"]["lastUpdate"]["name"])
    assert update is not None and update["status"]["changeCount"] == DEPLOYED + 2
    secret = await env.get(ResourceClient(env.api, SECRETS, env.ns), update["status"]["outputs"])
    assert secret is not None
    omitted = json.loads(secret["metadata"]["annotations"][OMITTED_OUTPUTS_ANNOTATION])
    assert omitted == {"count": 1, "keys": ["big"]}
    report(env, "kennel", await written(env, "kennel"), started)

    await env.stacks.delete("kennel")

    async def gone() -> bool:
        return await env.get(env.stacks, "kennel") is None

    await wait_until("kennel destroyed and released", gone, within=600)

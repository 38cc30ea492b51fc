"""Shared WorkspaceTemplates (issue 42) on a real control plane: the operator in process, the
apiserver, kube-controller-manager and the play-kubelet running real agents.

Two Stacks share one template; the template changed once rolls each Workspace's StatefulSet pod
template once (no new Update: the Stacks are in sync); a Stack whose template does not exist waits
(Reconciling) and runs once it is created (the watch wakes it: no polling); a reference to another
namespace is refused. The merge order and the decisions are pure tests: test_stack_templates.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pko.controllers.resources import UPDATES, WORKSPACE_TEMPLATES
from pko.controllers.stack.templates import REASON_TEMPLATE_NOT_FOUND
from pko.devtools.waiting import wait_until
from pko.machinery.resource import STATEFULSETS, ResourceClient

from .conftest import operator_env
from .test_stack import PROGRAM_BODY
from .test_stack import Env as StackEnv

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]


class Env(StackEnv):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.templates = ResourceClient(self.api, WORKSPACE_TEMPLATES, self.ns)
        self.statefulsets = ResourceClient(self.api, STATEFULSETS, self.ns)

    async def put_template(self, name: str, version: str) -> None:
        body = {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "WorkspaceTemplate",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"spec": {"env": [{"name": "TEMPLATE_VERSION", "value": version}]}},
        }
        await self.templates.apply(body, field_manager="test", force=True)

    async def pod_template_env(self, stack: str) -> tuple[int, str | None]:
        """The Workspace StatefulSet's generation and its pulumi container's TEMPLATE_VERSION."""
        sts = await self.statefulsets.get_or_none(f"{stack}-workspace")
        if sts is None:
            return 0, None
        containers = sts["spec"]["template"]["spec"]["containers"]
        env = next(c.get("env") or [] for c in containers if c["name"] == "pulumi")
        value = next((e.get("value") for e in env if e["name"] == "TEMPLATE_VERSION"), None)
        return int(sts["metadata"]["generation"]), value

    async def update_names(self, stack: str) -> set[str]:
        listing = await ResourceClient(self.api, UPDATES, self.ns).list(
            label_selector=f"pulumi.com/stack-name={stack}"
        )
        return {u["metadata"]["name"] for u in listing.items}


env = operator_env(Env)


async def test_a_template_shared_by_two_stacks_rolls_each_workspace_once(env: Env) -> None:
    await env.create_program("shared-prog", PROGRAM_BODY)
    await env.put_template("shared", "1")
    for name in ("tmpl-a", "tmpl-b"):
        # one program, two Pulumi stacks (one stack name in one backend would share its state)
        spec = {
            "stack": name,
            "programRef": {"name": "shared-prog"},
            "workspaceTemplateRef": {"name": "shared"},
        }
        await env.create_stack(name, spec)
    for name in ("tmpl-a", "tmpl-b"):
        await env.condition(name, "Ready", "ProcessingCompleted")
    before = {name: await env.pod_template_env(name) for name in ("tmpl-a", "tmpl-b")}
    assert [value for _, value in before.values()] == ["1", "1"]
    updates = {name: await env.update_names(name) for name in ("tmpl-a", "tmpl-b")}

    await env.put_template("shared", "2")

    async def rolled() -> bool:
        now = [await env.pod_template_env(name) for name in ("tmpl-a", "tmpl-b")]
        return all(value == "2" for _, value in now)

    await wait_until("both workspaces rolled to the new template", rolled, within=120)
    await asyncio.sleep(10)  # long enough for any second write to show
    for name in ("tmpl-a", "tmpl-b"):
        generation, value = await env.pod_template_env(name)
        assert (generation, value) == (before[name][0] + 1, "2"), name
        workspace = await env.get(env.workspaces, name)
        assert workspace is not None
        assert workspace["spec"]["env"][-1] == {"name": "TEMPLATE_VERSION", "value": "2"}
        assert await env.update_names(name) == updates[name]  # rolled, nothing re-run
        stack = await env.get(env.stacks, name)
        ready = next(c for c in stack["status"]["conditions"] if c["type"] == "Ready")  # type: ignore[index]
        assert ready["status"] == "True"
    events = [e for e in await env.events_for("tmpl-a") if e.get("reason") == "WorkspaceTemplateChanged"]
    assert len(events) == 1 and events[0].get("count", 1) == 1


async def test_a_stack_waits_for_its_template_and_runs_once_it_is_created(env: Env) -> None:
    await env.create_program("later-prog", PROGRAM_BODY)
    await env.create_stack(
        "tmpl-later", {"programRef": {"name": "later-prog"}, "workspaceTemplateRef": {"name": "later"}}
    )
    stack = await env.condition("tmpl-later", "Reconciling", REASON_TEMPLATE_NOT_FOUND, within=60)
    reconciling = next(c for c in stack["status"]["conditions"] if c["type"] == "Reconciling")
    assert f'"{env.ns}/later"' in reconciling["message"]
    assert await env.workspaces.get_or_none("tmpl-later") is None
    await env.put_template("later", "1")
    await env.condition("tmpl-later", "Ready", "ProcessingCompleted")
    assert (await env.pod_template_env("tmpl-later"))[1] == "1"


async def test_a_reference_to_another_namespace_is_refused(env: Env) -> None:
    spec = {
        "programRef": {"name": "shared-prog"},
        "workspaceTemplateRef": {"name": "shared", "namespace": "default"},
    }
    await env.create_stack("tmpl-cross", spec)
    stack = await env.condition("tmpl-cross", "Stalled", "SpecInvalid", within=60)
    stalled = next(c for c in stack["status"]["conditions"] if c["type"] == "Stalled")
    assert "spec.workspaceTemplateRef.namespace" in stalled["message"]
    assert "cross-namespace refs are not allowed" in stalled["message"]
    assert await env.workspaces.get_or_none("tmpl-cross") is None

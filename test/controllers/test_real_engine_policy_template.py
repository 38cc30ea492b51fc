"""A policy pack a WorkspaceTemplate enforces (issue 43) on the real Pulumi engine, as
test_real_engine_policy.py runs one a Stack names: the real operator, apiserver and
kube-controller-manager, and the play-kubelet running real agents with a JavaScript pack.

What a platform team relies on: a Stack that names no pack, only the template, is refused by the
template's mandatory policy (nothing created, the pack on its Update); relaxing the pack's config in
the template, without touching the Stack, runs the Stack again and it is Ready.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pko.controllers.resources import WORKSPACE_TEMPLATES
from pko.machinery.resource import ResourceClient

from .conftest import operator_env
from .test_real_engine import _let_programs_manage_objects, configmap
from .test_real_engine_policy import KUBELET_OPTIONS as POLICY_KUBELET_OPTIONS
from .test_real_engine_policy import ended_update, program
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

Obj = dict[str, Any]
KUBELET_OPTIONS = POLICY_KUBELET_OPTIONS
env = operator_env(Env, prepare=_let_programs_manage_objects)


async def put_template(env: Env, pack: Obj) -> None:
    body = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "WorkspaceTemplate",
        "metadata": {"name": "platform", "namespace": env.ns},
        "spec": {"policyPacks": [pack]},
    }
    await ResourceClient(env.api, WORKSPACE_TEMPLATES, env.ns).apply(body, field_manager="test", force=True)


async def test_a_templates_pack_is_enforced_on_a_stack_that_names_none(env: Env) -> None:
    pack = {"name": "configmaps", "path": str(env.kubelet.pulumi.pack)}  # type: ignore[attr-defined]
    await put_template(env, pack)
    await env.create_program("policed", program(env, "policed", "forbidden"))
    await env.create_stack(
        "enforced", {"programRef": {"name": "policed"}, "workspaceTemplateRef": {"name": "platform"}}
    )
    stack = await env.condition("enforced", "Stalled", "PolicyViolation", within=300)
    stalled = next(c for c in stack["status"]["conditions"] if c["type"] == "Stalled")
    assert "no-forbidden-tier" in stalled["message"], stalled
    assert await configmap(env, "policed-settings") is None, "created although the template's pack refused it"
    update = await ended_update(env, "enforced", stack)
    assert update["spec"]["policyPacks"] == [pack]
    enforced_by = json.loads(update["metadata"]["annotations"]["pulumi.com/enforced-policy-packs"])
    assert enforced_by == {"configmaps": f"{env.ns}/platform"}
    digest = stack["status"]["lastUpdate"]["policyPacksDigest"]
    assert digest.startswith("sha256:")

    await put_template(env, {**pack, "config": {"no-forbidden-tier": "disabled"}})
    stack = await env.condition("enforced", "Ready", "ProcessingCompleted", within=300)
    assert stack["status"]["lastUpdate"]["policyPacksDigest"] not in ("", digest)
    created = await configmap(env, "policed-settings")
    assert created is not None and created["data"] == {"tier": "forbidden"}, created

"""``approve``, ``refresh``, ``cancel`` and the plan and drift in ``status``, against the real apiserver.

No operator runs: the tests write the Stack's status through the status subresource as the operator
records it (a plan awaiting approval, drift, a request carried out), and play the operator's part of
``--wait`` while the plugin waits. The plan-approval admission policy and its roles are installed from
``config/default`` (test/kubectl/admission.py); the plugin runs with the tokens of two ServiceAccounts:
``approver`` (bound to ``pko-stack-approver``) and ``editor`` (bound to the built-in ``edit``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from pko.machinery.resource import Resource, ResourceClient

from . import stacks as fx
from .admission import APPROVED_PLAN, POLICY, installed, wait_enforced
from .plugin import Env, Obj, Result, kubeconfig_for

pytestmark = [pytest.mark.cluster]

ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")


@dataclass
class Gate:
    env: Env
    approver: Path
    editor: Path

    async def annotation(self, name: str, key: str) -> str:
        stack = await self.env.client("stacks").get(name)
        return str((stack["metadata"].get("annotations") or {}).get(key) or "")

    async def status(self, name: str, status: Obj) -> None:
        """Write ``status`` as the operator would (a merge patch of the status subresource)."""
        await self.env.client("stacks").patch(name, {"status": status}, subresource="status")

    async def when_requested(self, name: str, key: str, other_than: str = "") -> str:
        """The token of the request ``key`` once the plugin has set it (to other than ``other_than``)."""
        for _ in range(200):
            token = await self.annotation(name, key)
            if token and token != other_than:
                return token
            await asyncio.sleep(0.05)
        raise AssertionError(f"{key} never set on {name}")


async def _token(api: ApiClient, namespace: str, account: str, role: str) -> str:
    core = CoreV1Api(api)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    await ResourceClient(api, ROLEBINDINGS, namespace, field_manager="pko-test").create(
        {
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
    )
    answer = await core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    return str(answer.status.token)


@pytest.fixture(scope="module")
async def gate(
    api_client: ApiClient, cluster: Any, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gate]:
    tmp = tmp_path_factory.mktemp("kubectl-pko-requests")
    source = Path(cluster.kubeconfig)
    env = Env(api_client, namespace, kubeconfig_for(source, tmp / "admin", namespace))
    with installed(source):
        approver = kubeconfig_for(
            source,
            tmp / "approver",
            namespace,
            token=await _token(api_client, namespace, "approver", "pko-stack-approver"),
        )
        editor = kubeconfig_for(
            source, tmp / "editor", namespace, token=await _token(api_client, namespace, "editor", "edit")
        )
        await env.put("updates", fx.preview())
        await env.put("stacks", fx.stack("gated", status=fx.awaiting_status()))
        await env.put("stacks", fx.stack("guarded", status=fx.awaiting_status()))
        await env.put("stacks", fx.stack("plain", status=fx.ready_status("plain-1")))
        await env.put("stacks", fx.stack("drifted", status=fx.drift_status()))
        await env.put("stacks", fx.stack("slow", status=fx.ready_status("slow-1")))
        busy = fx.ready_status("busy-1")
        busy["currentUpdate"] = {"name": "busy-2", "generation": 1}
        await env.put("stacks", fx.stack("busy", status=busy))
        changed = await env.put("stacks", fx.stack("changed", status=fx.awaiting_status()))
        await env.client("stacks").patch("changed", {"spec": {"stack": "prod"}})
        assert changed["metadata"]["generation"] == 1
        await asyncio.to_thread(wait_enforced, source, namespace, f"system:serviceaccount:{namespace}:editor")
        yield Gate(env, approver, editor)


async def _while_waiting(run: Awaitable[Result], operator: Callable[[], Awaitable[None]]) -> Result:
    """Run the plugin and, meanwhile, the operator's part."""
    plugin = asyncio.ensure_future(run)
    try:
        await operator()
    finally:
        result = await plugin
    return result


async def test_approve_shows_the_plan_and_sets_its_digest(gate: Gate) -> None:
    first = await gate.env.pko("approve", "gated", kubeconfig=gate.approver)
    assert first.code == 0, first.err
    lines = first.out.splitlines()
    assert lines[0].startswith(f"Plan {fx.DIGEST} (preview Update web-preview-1, recorded ")
    assert lines[0].endswith("): 1 to create, 2 to update, 0 to delete, 1 to replace")
    assert lines[1:5] == [
        "  +  create  pet (random:index/randomPet:RandomPet)",
        "  ~  update  web (kubernetes:apps/v1:Deployment): spec.replicas",
        "  ~  update  page (kubernetes:core/v1:ConfigMap): data.index.html",
        "  +- replace web (kubernetes:core/v1:Service): spec.clusterIP",
    ]
    assert lines[5] == f"stack.pulumi.com/gated plan approved ({APPROVED_PLAN}={fx.DIGEST})"
    stack = await gate.env.client("stacks").get("gated")
    assert stack["metadata"]["annotations"][APPROVED_PLAN] == fx.DIGEST
    assert "kubectl-pko" in {m["manager"] for m in stack["metadata"]["managedFields"]}

    again = await gate.env.pko("approve", "gated", "--digest", fx.DIGEST, kubeconfig=gate.approver)
    assert again.code == 0
    assert (
        again.out.splitlines()[-1]
        == f"stack.pulumi.com/gated plan already approved ({APPROVED_PLAN}={fx.DIGEST})"
    )


async def test_approve_refuses_what_was_not_reviewed_or_is_not_waiting(gate: Gate) -> None:
    other = await gate.env.pko(
        "approve", "guarded", "--digest", "sha256:seen-yesterday", kubeconfig=gate.approver
    )
    assert other.code == 4 and other.out == ""
    assert other.err.startswith("error: --digest sha256:seen-yesterday is not the plan Stack ")
    none = await gate.env.pko("approve", "plain", kubeconfig=gate.approver)
    assert none.code == 4 and "has no recorded plan (status.plan)" in none.err
    changed = await gate.env.pko("approve", "changed", kubeconfig=gate.approver)
    assert changed.code == 4 and "changed (generation 2) since its plan was recorded" in changed.err
    for name in ("guarded", "plain", "changed"):
        assert await gate.annotation(name, APPROVED_PLAN) == ""


async def test_approve_without_the_approve_verb_is_forbidden_by_the_policy(gate: Gate) -> None:
    refused = await gate.env.pko("approve", "guarded", kubeconfig=gate.editor)
    assert refused.code == 6, refused.err
    assert refused.out.startswith(f"Plan {fx.DIGEST} ")  # shown before the attempt
    assert refused.err.startswith("error: forbidden: ")
    assert POLICY in refused.err
    user = f"system:serviceaccount:{gate.env.ns}:editor"
    assert (
        f'user "{user}" may not approve a plan of Stack {gate.env.ns}/guarded: setting the annotation '
        'pulumi.com/approved-plan needs the verb "approve" on stacks.pulumi.com'
    ) in refused.err
    assert await gate.annotation("guarded", APPROVED_PLAN) == ""
    # The same editor still makes every other request.
    assert (await gate.env.pko("retry", "guarded", kubeconfig=gate.editor)).code == 0


async def test_refresh_waits_until_the_operator_ran_it(gate: Gate) -> None:
    """A refresh that failed transiently is retried: --wait goes on waiting until one succeeds."""

    async def operator() -> None:
        token = await gate.when_requested("plain", "pulumi.com/refresh-request")
        await asyncio.sleep(0.5)  # the refresh runs, and the agent is killed
        failed = {"name": "plain-2", "token": token, "state": "failed", "reason": "Transient",
                  "message": "the agent stopped before the operation finished", "failures": 1}  # fmt: skip
        await gate.status("plain", {"lastRefresh": failed})
        await asyncio.sleep(1.0)  # the retry runs
        succeeded = {"name": "plain-3", "token": token, "state": "succeeded", "failures": 0}
        await gate.status("plain", {"observedRefreshRequest": token, "lastRefresh": succeeded})

    result = await _while_waiting(gate.env.pko("refresh", "plain", "--wait", "--timeout", "60s"), operator)
    assert result.code == 0, result.err
    token = await gate.annotation("plain", "pulumi.com/refresh-request")
    assert result.out == (
        f"stack.pulumi.com/plain refresh requested (pulumi.com/refresh-request={token})\n"
        f"refresh {token} done: Update plain-3 succeeded.\n"
    )


async def test_refresh_wait_reports_a_refresh_that_failed_for_good(gate: Gate) -> None:
    before = await gate.annotation("plain", "pulumi.com/refresh-request")

    async def operator() -> None:
        token = await gate.when_requested("plain", "pulumi.com/refresh-request", other_than=before)
        failed = {"name": "plain-4", "token": token, "state": "failed", "reason": "ProgramError",
                  "message": "error: boom", "failures": 1}  # fmt: skip
        await gate.status("plain", {"observedRefreshRequest": token, "lastRefresh": failed})

    result = await _while_waiting(gate.env.pko("refresh", "plain", "--wait", "--timeout", "60s"), operator)
    token = await gate.annotation("plain", "pulumi.com/refresh-request")
    assert result.code == 1 and result.out.endswith(
        f"refresh {token} done: Update plain-4 failed. error: boom\n"
    )


async def test_refresh_wait_times_out_when_nothing_runs_it(gate: Gate) -> None:
    result = await gate.env.pko("refresh", "slow", "--wait", "--timeout", "2s")
    token = await gate.annotation("slow", "pulumi.com/refresh-request")
    assert result.code == 7 and token
    assert result.err == (
        f"error: timed out after 2s waiting for the operator to carry out "
        f"pulumi.com/refresh-request={token} (status.observedRefreshRequest is unset)\n"
    )
    # Without --wait the request is made and the command returns at once.
    again = await gate.env.pko("refresh", "slow")
    assert again.code == 0 and await gate.annotation("slow", "pulumi.com/refresh-request") != token


async def test_cancel_waits_until_the_cancelled_update_ended(gate: Gate) -> None:
    marked = asyncio.Event()

    async def operator() -> None:
        token = await gate.when_requested("busy", "pulumi.com/cancel-request")
        # Recorded at once, the Update marked while its operation is being cancelled ...
        await gate.status(
            "busy",
            {"observedCancelRequest": token, "currentUpdate": {"name": "busy-2", "cancelRequest": token}},
        )
        marked.set()
        await asyncio.sleep(1.5)
        # ... and once it has ended, the Cancelled failure.
        failure = {**fx.retrying_status("busy-2")["lastFailure"], "reason": "Cancelled"}
        last = {**fx.retrying_status("busy-2")["lastUpdate"], "message": "cancelled"}
        await gate.status("busy", {"currentUpdate": None, "lastFailure": failure, "lastUpdate": last})

    started = asyncio.get_running_loop().time()
    result = await _while_waiting(gate.env.pko("cancel", "busy", "--wait"), operator)
    assert marked.is_set() and asyncio.get_running_loop().time() - started >= 1.5
    token = await gate.annotation("busy", "pulumi.com/cancel-request")
    assert (result.code, result.err) == (0, "")
    assert result.out == (
        f"stack.pulumi.com/busy cancel requested (pulumi.com/cancel-request={token})\n"
        f"cancel {token} done: Update busy-2 cancelled.\n"
    )
    idle = await gate.env.pko("cancel", "busy")
    assert idle.code == 0
    assert idle.err == "No Update is running: the operator records the request and cancels nothing.\n"


async def test_status_shows_the_plan_and_the_drift(gate: Gate) -> None:
    waiting = await gate.env.pko("status", "guarded")
    assert waiting.code == 1
    assert "State:           AwaitingApproval\n" in waiting.out
    assert "  Changes:       1 to create, 2 to update, 0 to delete, 1 to replace\n" in waiting.out
    assert (
        f"  Approval:      awaiting approval: kubectl pko approve guarded -n {gate.env.ns}\n" in waiting.out
    )
    drifted = await gate.env.pko("status", "drifted")
    assert drifted.code == 0
    assert "Drift:           detected in 2 resources (checked " in drifted.out
    assert "    Paths:       spec.replicas, spec.template.spec.containers[0].image\n" in drifted.out
    listing = await gate.env.pko("status")
    rows = {line.split()[0]: line for line in listing.out.splitlines()[1:]}
    assert "Ready (drifted)" in rows["drifted"] and "AwaitingApproval" in rows["guarded"]

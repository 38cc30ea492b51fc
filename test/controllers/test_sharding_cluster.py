"""Two shards in one namespace against the apiserver, the play-kubelet and the stand-in CLI: the
module's operator is shard ``a`` (``pko.pulumi.com/shard=a``), a second one the default shard
(``!pko.pulumi.com/shard``), each as its own ServiceAccount with its own artifact server. They split
the Stacks (and their Workspaces, Updates, StatefulSets: each cache holds its own only), a Program
used by both shards is served to each by its own operator, one shard stopped leaves the other's
Stacks running, and a Stack moved with an Update in flight has that Update finished by the old shard
and recorded by the new one, never run a second time. The decisions: test_sharding.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes_asyncio import client
from pko.api.stackterms import RECONCILE_REQUEST_ANNOTATION, SHARD_LABEL

from pko.controllers.resources import STACKS, UPDATES, WORKSPACES
from pko.devtools.localcluster import free_port
from pko.devtools.operatorharness import Operator
from pko.devtools.waiting import wait_until
from pko.machinery.resource import PODS, SERVICES, STATEFULSETS, Resource, ResourceClient

from .conftest import operator_env
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

Obj = dict[str, Any]

OPERATOR_STACK_SELECTOR = f"{SHARD_LABEL}=a"
_PORT_A = free_port()
# Fixed, so the advertised address is known before the server binds (as in a cluster, a Service's).
OPERATOR_OPTIONS = {"program_fs_addr": f"127.0.0.1:{_PORT_A}", "program_fs_adv_addr": f"127.0.0.1:{_PORT_A}"}
DEFAULT_SHARD = f"!{SHARD_LABEL}"
HELLO: Obj = {"resources": {"echo": {"type": "test:index:Echo", "properties": {"value": "hi"}}}}


@pytest.fixture(scope="module")
async def default_shard(
    api_client: client.ApiClient, cluster: Any, operator: Operator, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Operator]:
    """The second operator: the default shard, in a namespace (and ServiceAccount) of its own."""
    port = free_port()
    options = replace(
        operator.options,
        operator_namespace=f"pko-system-{uuid.uuid4().hex[:6]}",
        program_fs_addr=f"127.0.0.1:{port}",
        program_fs_adv_addr=f"127.0.0.1:{port}",
    )
    op = Operator(api_client, cluster, options, rbac=True, stack_selector=DEFAULT_SHARD)
    await op.setup(tmp_path_factory.mktemp("default-shard"))
    try:
        await op.start()
        yield op
    finally:
        await op.teardown()


env = operator_env(Env)


async def create(env: Env, name: str, shard: str | None, program: str) -> None:
    labels = {SHARD_LABEL: shard} if shard else {}
    await env.stacks.create(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "namespace": env.ns, "labels": labels},
            "spec": {"stack": "dev", "programRef": {"name": program}},
        }
    )


def cached(op: Operator, resource: Resource) -> set[str]:
    """The names ``op`` caches of ``resource``."""
    assert op.manager is not None
    informer = op.manager.factory.get(resource)
    assert informer is not None, resource.name
    return {str(o["metadata"]["name"]) for o in informer.indexer.list()}


async def updates_of(env: Env, stack: str) -> list[Obj]:
    listing = await env.updates.list(label_selector=f"pulumi.com/stack-name={stack}")
    return list(listing.items)


async def request(env: Env, stack: str, token: str) -> None:
    await env.stacks.patch(stack, {"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: token}}})


async def test_two_shards_split_the_stacks_and_a_stopped_shard_leaves_the_others_running(
    env: Env, default_shard: Operator
) -> None:
    await env.create_program("shared", HELLO)
    await create(env, "in-a", "a", "shared")
    await create(env, "in-default", None, "shared")
    for name in ("in-a", "in-default"):
        await env.condition(name, "Ready", "ProcessingCompleted", within=60)

    shard_a = env.operator
    for op, mine in ((shard_a, "in-a"), (default_shard, "in-default")):
        assert mine in cached(op, STACKS) and mine in cached(op, WORKSPACES)
        assert f"{mine}-workspace" in cached(op, STATEFULSETS) and f"{mine}-workspace" in cached(op, SERVICES)
        assert {u.rsplit("-", 1)[0] for u in cached(op, UPDATES)} <= {mine}
    assert not cached(shard_a, STACKS) & cached(default_shard, STACKS)
    assert not cached(shard_a, WORKSPACES) & cached(default_shard, WORKSPACES)

    # What a Stack makes carries its shard; its pod does not (a move must not restart it).
    workspace = await env.get(env.workspaces, "in-a")
    assert workspace is not None and workspace["metadata"]["labels"][SHARD_LABEL] == "a"
    [update] = await updates_of(env, "in-a")
    assert update["metadata"]["labels"][SHARD_LABEL] == "a"
    assert SHARD_LABEL not in (await env.get(env.workspaces, "in-default") or {})["metadata"]["labels"]
    pod = await _pod(env, "in-a")
    assert pod is not None and SHARD_LABEL not in pod["metadata"]["labels"]
    # Each shard's Workspace fetched the shared Program from its own operator's server.
    assert workspace["spec"]["flux"]["url"].startswith(f"http://127.0.0.1:{_PORT_A}/programs/")

    [first_a] = await updates_of(env, "in-a")
    await default_shard.stop()
    try:
        [before] = await updates_of(env, "in-default")
        await request(env, "in-a", "after-default-stopped")
        await request(env, "in-default", "after-default-stopped")
        stack = await env.stack_until(
            "in-a",
            "in-a: a second up while the default shard is down",
            lambda: _recorded(env, "in-a", first_a["metadata"]["name"]),
            within=40,
        )
        assert stack["status"]["lastUpdate"]["state"] == "succeeded"
        # Nobody took the default shard's Stack: no Update, its status untouched.
        assert [u["metadata"]["name"] for u in await updates_of(env, "in-default")] == [
            before["metadata"]["name"]
        ]
        left = await env.get(env.stacks, "in-default")
        assert (left or {}).get("status", {}).get("observedReconcileRequest") != "after-default-stopped"
    finally:
        await default_shard.start()


async def _recorded(env: Env, name: str, after: str) -> Obj | None:
    """The Stack once it recorded an ended Update other than ``after``."""
    stack = await env.get(env.stacks, name)
    last = ((stack or {}).get("status") or {}).get("lastUpdate") or {}
    return stack if last.get("name") not in (None, after) and last.get("state") else None


async def test_a_stack_moved_with_an_update_in_flight_has_it_finished_once_and_recorded_by_the_new_shard(
    env: Env, default_shard: Operator
) -> None:
    slow: Obj = {"resources": {"wait": {"type": "test:index:Hang", "properties": {"seconds": 12}}}}
    await env.create_program("slow", slow)
    await create(env, "mover", "a", "slow")

    async def running() -> Obj | None:
        stack = await env.get(env.stacks, "mover")
        return stack if ((stack or {}).get("status") or {}).get("currentUpdate") else None

    await env.stack_until("mover", "mover: its first Update running", running, within=40)
    [update] = await updates_of(env, "mover")
    workspace = await env.get(env.workspaces, "mover")
    assert workspace is not None

    # The move: to the default shard, by removing the label, while shard a runs the Update.
    await env.stacks.patch("mover", {"metadata": {"labels": {SHARD_LABEL: None}}})
    assert default_shard.manager is not None
    their = default_shard.manager.informer(STACKS)
    await wait_until("the default shard holds mover", lambda: their.indexer.get_by_key(f"{env.ns}/mover"))

    stack = await env.condition("mover", "Ready", "ProcessingCompleted", within=60)
    assert stack["status"]["lastUpdate"]["name"] == update["metadata"]["name"]  # recorded by the new shard
    assert [u["metadata"]["name"] for u in await updates_of(env, "mover")] == [update["metadata"]["name"]]
    assert "mover" not in cached(env.operator, STACKS)

    # The next change runs in the default shard: the Workspace and the new Update lose the label, and
    # the Workspace fetches the Program from the default shard's own server.
    await request(env, "mover", "after-move")
    await env.stack_until(
        "mover",
        "mover: an up in the default shard",
        lambda: _recorded(env, "mover", update["metadata"]["name"]),
        within=40,
    )
    updates = await updates_of(env, "mover")
    assert len(updates) == 2
    [second] = [u for u in updates if u["metadata"]["name"] != update["metadata"]["name"]]
    assert SHARD_LABEL not in second["metadata"]["labels"]
    moved = await env.get(env.workspaces, "mover")
    assert moved is not None and SHARD_LABEL not in moved["metadata"]["labels"]
    assert moved["spec"]["flux"]["url"].startswith(f"http://{default_shard.options.program_fs_adv_addr}/")
    assert "mover" in cached(default_shard, WORKSPACES) and "mover" not in cached(env.operator, WORKSPACES)
    assert "mover-workspace" in cached(default_shard, STATEFULSETS)


async def _pod(env: Env, workspace: str) -> Obj | None:
    return await env.get(ResourceClient(env.api, PODS, env.ns), f"{workspace}-workspace-0")

"""A policy pack from a Flux source that a WorkspaceTemplate enforces (issues 43, 44) through the Stack
reconciler on a real apiserver (see stackenv.py): the Stack waits on the pack's missing source with no
timer, the source's creation wakes it (the Flux watch maps the source to the templates that enforce a
pack from it, then to the Stacks built with them), and a new artifact runs it again at once (its own
resync is an hour away). The mapping itself, pure: test_stack_policy_packs_flux.py."""

from __future__ import annotations

import time
from typing import Any

from pko.controllers.resources import WORKSPACE_TEMPLATES
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import format_time
from pko.machinery.kubeclient import ApiException
from pko.machinery.resource import Obj, ResourceClient

from .stackenv import CRDS, FLUX_CRD, GITREPOSITORIES, Env, stack_env
from .test_stack_waits_cluster import stack_queue, timer_pending

env = stack_env()

REF = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "packs"}
PACK: Obj = {"name": "platform", "fluxSource": {"sourceRef": REF, "dir": "packs/platform"}}


async def install_flux_crd(crds: ResourceClient, sources: ResourceClient) -> None:
    """The GitRepository CRD, served (another module may have just deleted it: wait until it is gone)."""
    name = FLUX_CRD["metadata"]["name"]

    async def not_terminating() -> bool:
        try:
            found = await crds.get(name)
        except ApiException as exc:
            return exc.status == 404
        return not found["metadata"].get("deletionTimestamp")

    await wait_until("the Flux CRD not terminating", not_terminating, within=120.0)
    await crds.apply(FLUX_CRD, field_manager="test")

    async def served() -> bool:
        try:
            await sources.list()
        except Exception:
            return False
        return True

    await wait_until("the GitRepository CRD served", served, within=30.0)


async def test_a_templates_pack_source_wakes_the_stacks_built_with_it_with_no_timer(
    env: Env, api_client: Any
) -> None:
    crds = ResourceClient(api_client, CRDS)
    sources = ResourceClient(api_client, GITREPOSITORIES, namespace=env.ns)
    templates = ResourceClient(api_client, WORKSPACE_TEMPLATES, namespace=env.ns)
    await install_flux_crd(crds, sources)
    try:
        await templates.create(
            {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "WorkspaceTemplate",
                "metadata": {"name": "platform", "namespace": env.ns},
                "spec": {"policyPacks": [PACK]},
            }
        )
        await env.program("prog")
        spec = {"programRef": {"name": "prog"}, "workspaceTemplateRef": {"name": "platform"}}
        await env.create_stack("enforced", {**spec, "resyncFrequencySeconds": 3600})
        missing = (
            "policy pack 'platform': could not resolve sourceRef: "
            'gitrepositories.source.toolkit.fluxcd.io "packs" not found'
        )

        async def waits_on_the_source() -> bool:  # once the GitRepository cache has synced
            stalled = (await env.conditions("enforced")).get("Stalled")
            return stalled is not None and stalled[2] == missing

        await wait_until("the pack's missing source reported", waits_on_the_source, within=60.0)
        queue = stack_queue(env)
        await wait_until("the Stack's reconciles done", lambda: len(queue) == 0 and queue.processing == 0)
        assert not timer_pending(env, "enforced"), "a Stack waiting on a pack's source holds a timer"
        assert await env.get(env.workspaces, "enforced") is None

        meta = {"name": "packs", "namespace": env.ns}

        async def publish(revision: str) -> None:
            body = {
                "apiVersion": REF["apiVersion"],
                "kind": "GitRepository",
                "metadata": meta,
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "Succeeded",
                            "message": "stored artifact",
                            "lastTransitionTime": format_time(),
                        }
                    ],
                    "artifact": {
                        "url": f"http://source-controller/gitrepository/{env.ns}/packs/{revision}.tar.gz",
                        "digest": f"sha256:{revision * 16}",
                        "revision": f"main@sha1:{revision}",
                        "lastUpdateTime": format_time(),
                    },
                },
            }
            await sources.apply_status(body, field_manager="source-controller")

        started = time.monotonic()
        await sources.create({"apiVersion": REF["apiVersion"], "kind": "GitRepository", "metadata": meta,
                              "spec": {"url": "https://e/p"}})  # fmt: skip
        await publish("aaaa")
        ws = await env.workspace("enforced")
        assert time.monotonic() - started < 20.0  # the watch, not a timer (there is none)
        (source,) = ws["spec"]["policyPackSources"]
        assert source["flux"]["digest"] == "sha256:" + "aaaa" * 16
        await env.make_ready("enforced")
        seen: set[str] = set()
        update = await env.next_update("enforced", seen)
        assert update["spec"]["policyPacks"] == [PACK]
        await env.complete(update)
        await env.wait_condition("enforced", "Ready", "ProcessingCompleted")

        # A new artifact: the Stack's resync is an hour away, the source's event wakes it.
        generation = int((await env.workspace("enforced"))["metadata"]["generation"])
        await publish("bbbb")
        await env.make_ready("enforced", newer_than=generation)
        (source,) = (await env.workspace("enforced"))["spec"]["policyPackSources"]
        assert source["flux"]["digest"] == "sha256:" + "bbbb" * 16
        await env.complete(await env.next_update("enforced", seen))
        await env.wait_condition("enforced", "Ready", "ProcessingCompleted")
    finally:
        await crds.delete(FLUX_CRD["metadata"]["name"])

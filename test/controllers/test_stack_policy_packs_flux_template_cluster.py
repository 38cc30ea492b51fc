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
from pko.machinery.resource import ResourceClient

from .stackenv import (
    CRDS,
    GITREPOSITORIES,
    Env,
    create_source,
    remove_flux_crd,
    serve_flux_crd,
    stack_env,
    write_source_status,
)
from .test_stack_policy_packs_flux import FLUXED
from .test_stack_waits_cluster import stack_queue, timer_pending

env = stack_env()


async def test_a_templates_pack_source_wakes_the_stacks_built_with_it_with_no_timer(
    env: Env, api_client: Any
) -> None:
    crds = ResourceClient(api_client, CRDS)
    sources = ResourceClient(api_client, GITREPOSITORIES, namespace=env.ns)
    templates = ResourceClient(api_client, WORKSPACE_TEMPLATES, namespace=env.ns)
    await serve_flux_crd(crds, sources)
    try:
        await templates.create(
            {
                "apiVersion": "auto.pulumi.com/v1alpha1",
                "kind": "WorkspaceTemplate",
                "metadata": {"name": "platform", "namespace": env.ns},
                "spec": {"policyPacks": [FLUXED]},
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

        started = time.monotonic()
        await create_source(sources, "packs")
        await write_source_status(sources, "packs", "aaaa")
        ws = await env.workspace("enforced")
        assert time.monotonic() - started < 20.0  # the watch, not a timer (there is none)
        (source,) = ws["spec"]["policyPackSources"]
        assert source["flux"]["digest"] == "sha256:" + "aaaa" * 16
        await env.make_ready("enforced")
        seen: set[str] = set()
        update = await env.next_update("enforced", seen)
        assert update["spec"]["policyPacks"] == [FLUXED]
        await env.complete(update)
        await env.wait_condition("enforced", "Ready", "ProcessingCompleted")

        # A new artifact: the Stack's resync is an hour away, the source's event wakes it.
        generation = int((await env.workspace("enforced"))["metadata"]["generation"])
        await write_source_status(sources, "packs", "bbbb")
        await env.make_ready("enforced", newer_than=generation)
        (source,) = (await env.workspace("enforced"))["spec"]["policyPackSources"]
        assert source["flux"]["digest"] == "sha256:" + "bbbb" * 16
        await env.complete(await env.next_update("enforced", seen))
        await env.wait_condition("enforced", "Ready", "ProcessingCompleted")
    finally:
        await remove_flux_crd(crds)

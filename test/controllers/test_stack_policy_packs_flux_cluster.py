"""A policy pack from a Flux source (issue 43) through the Stack reconciler on a real apiserver (see
stackenv.py), as test_stack_reconciler_sources.py runs a program's Flux source: the pack's source not
served, then not Ready, Stalls the Stack with the program's message naming the pack and no Workspace;
its artifact reaches the Workspace at its digest and the Update runs the pack; a new artifact (the
source's status, nothing else) respecifies the Workspace and runs the Stack again, woken by the watch
on Flux sources (the Stack's own resync is minutes away)."""

from __future__ import annotations

from typing import Any

from pko.devtools.waiting import wait_until
from pko.machinery.resource import Obj, ResourceClient

from .stackenv import (
    CRDS,
    GITREPOSITORIES,
    STORED,
    Env,
    create_source,
    remove_flux_crd,
    serve_flux_crd,
    source_artifact_url,
    stack_env,
    write_source_status,
)
from .test_stack_policy_packs_flux import FLUXED

env = stack_env()


async def test_a_packs_flux_source_is_awaited_then_fetched_at_its_digest_and_a_new_artifact_runs_again(
    env: Env, api_client: Any
) -> None:
    crds = ResourceClient(api_client, CRDS)
    sources = ResourceClient(api_client, GITREPOSITORIES, namespace=env.ns)
    await env.program("prog")
    spec = {"programRef": {"name": "prog"}, "policyPacks": [FLUXED], "resyncFrequencySeconds": 3600}
    await env.create_stack("policed", spec)
    conditions = await env.wait_condition("policed", "Stalled", "SourceUnavailable")
    assert conditions["Stalled"][2].startswith(
        "policy pack 'platform': could not resolve sourceRef: GitRepository"
    )
    assert "are Flux's CRDs installed?" in conditions["Stalled"][2]
    assert await env.get(env.workspaces, "policed") is None, "nothing runs without the pack"
    await serve_flux_crd(crds, sources)
    try:
        await create_source(sources, "packs")

        async def write_status(revision: str | None, ready: tuple[str, str, str]) -> None:
            await write_source_status(sources, "packs", revision, ready)

        await write_status(None, ("False", "GitOperationFailed", "auth failed"))
        expected = "policy pack 'platform': Flux source has no artifact (GitOperationFailed: auth failed)"

        async def not_ready_reported() -> bool:
            stalled = (await env.conditions("policed")).get("Stalled")
            return stalled is not None and stalled[2] == expected

        await wait_until("the pack's source failure reported", not_ready_reported, within=60)
        assert await env.get(env.workspaces, "policed") is None

        await write_status("aaaa", STORED)
        ws: Obj = {}

        async def fetches_the_pack() -> bool:
            found = await env.get(env.workspaces, "policed")
            ws.clear()
            ws.update(found or {})
            return bool(found and found["spec"].get("policyPackSources"))

        await wait_until("the Workspace's pack source", fetches_the_pack, within=45)
        assert ws["spec"]["policyPackSources"] == [
            {
                "name": "platform",
                "flux": {
                    "url": source_artifact_url(env.ns, "packs", "aaaa"),
                    "digest": "sha256:" + "aaaa" * 16,
                    "dir": "packs/platform",
                },
            }
        ]
        await env.make_ready("policed")
        seen: set[str] = set()
        update = await env.next_update("policed", seen)
        assert update["spec"]["policyPacks"] == [FLUXED]
        await env.complete(update)
        await env.wait_condition("policed", "Ready", "ProcessingCompleted")
        recorded = (await env.stack("policed"))["status"]["lastUpdate"]["policyPacksDigest"]

        generation = int(ws["metadata"]["generation"])
        await write_status("bbbb", STORED)
        ws = await env.make_ready("policed", newer_than=generation)
        (source,) = (await env.workspace("policed"))["spec"]["policyPackSources"]
        assert source["flux"]["digest"] == "sha256:" + "bbbb" * 16
        await env.complete(await env.next_update("policed", seen))

        async def recorded_anew() -> bool:
            last = (await env.stack("policed"))["status"]["lastUpdate"]
            return last.get("state") == "succeeded" and last.get("policyPacksDigest") not in (None, recorded)

        await wait_until("the new pack digest recorded", recorded_anew, within=30.0)
    finally:
        await remove_flux_crd(crds)

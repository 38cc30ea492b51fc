"""The Stack reconciler alone (see stackenv.py): its sources: git commits and branch heads, remote-helper
URLs refused, a missing credentials Secret created later, and a Flux source's artifacts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo

from pko.devtools.gitserver import git_commit, serve_git
from pko.devtools.waiting import wait_until
from pko.machinery.resource import Obj, ResourceClient

from .stackenv import (
    CRDS,
    GITREPOSITORIES,
    STORED,
    Env,
    FakeClock,
    create_source,
    remove_flux_crd,
    serve_flux_crd,
    source_artifact_url,
    stack_env,
    write_source_status,
)

env = stack_env()


# --- git sources -----------------------------------------------------------------------------


def _commit(repo: Repo, text: str) -> str:
    return git_commit(repo, {"Pulumi.yaml": text.encode()}, text.encode(), branch="master", when=1700000000)


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Repo]]:
    root: Path = tmp_path_factory.mktemp("stack-git")
    repo = Repo.init_bare(str(root))
    _commit(repo, "name: one\nruntime: yaml\n")
    with serve_git(repo) as url:
        yield url, repo


async def test_git_commit_and_branch_heads_are_pinned_and_a_push_is_picked_up(
    env: Env, git_server: tuple[str, Repo]
) -> None:
    url, repo = git_server
    head = repo.refs[b"refs/heads/master"].decode()
    await env.create_stack("pinned", {"projectRepo": url, "commit": "a" * 40, "repoDir": "app"})
    ws = await env.workspace("pinned")
    assert ws["spec"]["git"] == {"url": url, "ref": "a" * 40, "dir": "app"}

    await env.create_stack("tracking", {"projectRepo": url, "branch": "master"})
    ws = await env.workspace("tracking")
    assert ws["spec"]["git"]["ref"] == head
    await env.make_ready("tracking")
    seen: set[str] = set()
    await env.complete(await env.next_update("tracking", seen))
    await env.wait_condition("tracking", "Ready", "ProcessingCompleted")
    assert (await env.stack("tracking"))["status"]["lastUpdate"]["lastSuccessfulCommit"] == head

    generation = (await env.workspace("tracking"))["metadata"]["generation"]
    pushed = await asyncio.to_thread(_commit, repo, "name: two\nruntime: yaml\n")
    clock: FakeClock = env.reconciler.clock  # type: ignore[attr-defined]
    clock.now += 61  # the poll interval has passed (the real requeue is 60 s: nudge instead of waiting)
    await env.stacks.patch(
        "tracking", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "poll"}}}
    )
    ws = await env.make_ready("tracking", newer_than=generation)
    update = await env.next_update("tracking", seen)
    assert (await env.workspace("tracking"))["spec"]["git"]["ref"] == pushed
    await env.complete(update)

    async def recorded() -> bool:
        return (await env.stack("tracking"))["status"]["lastUpdate"].get("lastSuccessfulCommit") == pushed

    await wait_until("the pushed commit recorded", recorded, within=30.0)


@pytest.mark.parametrize(
    ("name", "url"), [("helper-ext", "ext::sh -c touch% pwned"), ("helper-fd", "fd::17")]
)
async def test_a_git_remote_helper_url_is_spec_invalid_with_no_lookup_and_no_workspace(
    env: Env, name: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # git reads <transport>::<address> as a remote helper (ext:: runs a command); parsed as scp-like
    # it was SSH host "ext" and the Stack waited on "host key verification failed".
    listed: list[str] = []
    lister = env.reconciler.branches._lister

    def recording(target: str, creds: Any) -> Any:
        listed.append(target)
        return lister(target, creds)

    monkeypatch.setattr(env.reconciler.branches, "_lister", recording)
    await env.create_stack(name, {"projectRepo": url, "branch": "main"})
    conditions = await env.wait_condition(name, "Stalled", "SpecInvalid")
    message = conditions["Stalled"][2]
    assert message.startswith("spec.projectRepo: git remote-helper URLs"), message
    assert "https://, http://, ssh://" in message and url.partition("::")[2] not in message
    await env.quiet(name)
    assert [target for target in listed if "::" in target] == []  # other Stacks may be looked up
    assert await env.get(env.workspaces, name) is None
    assert await env.updates_of(name) == []


async def test_a_missing_secret_created_later_unstalls_the_stack(env: Env) -> None:
    # https: credentials over plain http:// are refused before their Secret is read (insecuretransport)
    spec = {"projectRepo": "https://127.0.0.1:9/late.git", "branch": "main", "gitAuthSecret": "late"}
    await env.create_stack("late-secret", spec)
    conditions = await env.wait_condition("late-secret", "Stalled", "SpecInvalid")
    assert 'secrets "late" not found' in conditions["Stalled"][2]
    # Secrets are not watched: the operator looks again (every SECRET_RECHECK s here) and moves on.
    await env.secrets.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "late", "namespace": env.ns},
            "stringData": {"accessToken": "t"},
        }
    )
    conditions = await env.wait_condition("late-secret", "Stalled", "SourceUnavailable")
    assert "listing https://127.0.0.1:9/late.git" in conditions["Stalled"][2]


# --- Flux (last: it installs a Flux CRD, then removes it) --------------------------------------


async def test_flux_source_artifact_is_deployed_and_a_new_revision_redeploys(
    env: Env, api_client: Any
) -> None:
    crds = ResourceClient(api_client, CRDS)
    sources = ResourceClient(api_client, GITREPOSITORIES, namespace=env.ns)
    ref = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "repo"}
    await env.create_stack("fluxed", {"fluxSource": {"sourceRef": ref, "dir": "app"}})
    conditions = await env.wait_condition("fluxed", "Stalled", "SourceUnavailable")
    assert "are Flux's CRDs installed?" in conditions["Stalled"][2]
    await serve_flux_crd(crds, sources)
    try:
        await create_source(sources, "repo")

        async def write_status(revision: str | None, ready: tuple[str, str, str]) -> None:
            await write_source_status(sources, "repo", revision, ready)

        await write_status(None, ("False", "GitOperationFailed", "auth failed"))

        async def not_ready_reported() -> bool:
            stalled = (await env.conditions("fluxed")).get("Stalled")
            return stalled is not None and "GitOperationFailed: auth failed" in stalled[2]

        await wait_until("the source's failure reported", not_ready_reported, within=60)
        assert (await env.conditions("fluxed"))["Stalled"][2] == (
            "Flux source has no artifact (GitOperationFailed: auth failed)"
        )

        await write_status("aaaa", STORED)
        ws: Obj = {}

        async def has_flux() -> bool:
            found = await env.get(env.workspaces, "fluxed")
            ws.update(found or {})
            return found is not None and "flux" in found["spec"]

        await wait_until("the Workspace's flux source", has_flux, within=45)
        assert ws["spec"]["flux"] == {
            "url": source_artifact_url(env.ns, "repo", "aaaa"),
            "digest": "sha256:" + "aaaa" * 16,
            "dir": "app",
        }
        await env.make_ready("fluxed")
        seen: set[str] = set()
        await env.complete(await env.next_update("fluxed", seen))
        await env.wait_condition("fluxed", "Ready", "ProcessingCompleted")
        assert (await env.stack("fluxed"))["status"]["lastUpdate"][
            "lastSuccessfulCommit"
        ] == "sha256:" + "aaaa" * 16

        generation = int(ws["metadata"]["generation"])
        await write_status("bbbb", STORED)
        await env.make_ready("fluxed", newer_than=generation)
        update = await env.next_update("fluxed", seen)
        assert update["spec"]["message"] == f'New commit detected: "sha256:{"bbbb" * 16}"'
    finally:
        await remove_flux_crd(crds)

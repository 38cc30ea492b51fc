"""Stacks end to end: the real operator (every controller), apiserver, kube-controller-manager and the
play-kubelet running real agents with the stand-in Pulumi CLI.

The seed walkthroughs at control-plane level: a Program-sourced Stack reaches Ready with its
secret output shown as ``[secret]``; a git branch is deployed, then a pushed commit is picked up;
a program error is classified and retried; ``destroyOnFinalize`` destroys before the Stack goes; a
Flux source (the test plays source-controller) is fetched by the agent and a new digest redeploys.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo
from kubernetes_asyncio.client import ApiException

from pko.controllers.program.artifact import project_yaml
from pko.controllers.resources import PROGRAMS, STACKS, UPDATES, WORKSPACES
from pko.controllers.stack.reconciler import StackReconciler
from pko.devtools.gitserver import git_commit, serve_git, serve_wsgi
from pko.devtools.operatorharness import OperatorEnv
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.resource import ResourceClient

from .conftest import operator_env
from .stackenv import CRDS, FLUX_CRD, GITREPOSITORIES, remove_flux_crd

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]

PROGRAM_BODY: Obj = {
    "resources": {
        "pw": {"type": "random:RandomPassword", "properties": {"length": 16}},
        "echo": {"type": "test:index:Echo", "properties": {"value": "hello"}},
    },
    "outputs": {"greeting": "${echo.value}", "password": "${pw.result}"},
}
BAD_BODY: Obj = {"outputs": {"broken": "${nothing.here}"}}


class Env(OperatorEnv):
    def __post_init__(self) -> None:
        self.stacks = ResourceClient(self.api, STACKS, self.ns)
        self.programs = ResourceClient(self.api, PROGRAMS, self.ns)
        self.updates = ResourceClient(self.api, UPDATES, self.ns)
        self.workspaces = ResourceClient(self.api, WORKSPACES, self.ns)

    async def get(self, client: ResourceClient, name: str) -> Obj | None:
        return await client.get_or_none(name)

    async def create_stack(self, name: str, spec: Obj) -> None:
        await self.stacks.create(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": name, "namespace": self.ns},
                "spec": {"stack": "dev", **spec},
            }
        )

    async def create_program(self, name: str, body: Obj) -> None:
        await self.programs.create(
            {"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name}, "program": body}
        )

    async def condition(self, name: str, type_: str, reason: str, *, within: float = 240.0) -> Obj:
        async def probe() -> Obj | None:
            stack = await self.get(self.stacks, name)
            found = get_condition(((stack or {}).get("status") or {}).get("conditions"), type_)
            if found is not None and found.get("status") == "True" and found.get("reason") == reason:
                return stack
            return None

        return await self.stack_until(name, f"{name} {type_}={reason}", probe, within=within)

    async def stack_until(
        self, name: str, what: str, probe: Callable[[], Awaitable[Obj | None]], *, within: float
    ) -> Obj:
        """:func:`wait_until`; a failure shows the Stack ``name``'s status and the play-kubelet's pods."""
        try:
            stack: Obj = await wait_until(what, probe, within=within)
        except AssertionError as exc:
            current = await self.get(self.stacks, name)
            raise AssertionError(
                f"{exc}\nstatus: {(current or {}).get('status')}\n{self.kubelet.describe()}"
            ) from None
        return stack

    def reconciler(self) -> StackReconciler:
        manager = self.operator.manager
        assert manager is not None
        found = next(c.reconciler for c in manager.controllers if isinstance(c.reconciler, StackReconciler))
        return found


env = operator_env(Env)


async def test_program_stack_reaches_ready_with_secret_outputs(env: Env) -> None:
    await env.create_program("website", PROGRAM_BODY)
    await env.create_stack("website", {"programRef": {"name": "website"}})
    stack = await env.condition("website", "Ready", "ProcessingCompleted")
    status = stack["status"]
    assert status["outputs"] == {"greeting": "hello", "password": "[secret]"}
    last = status["lastUpdate"]
    assert (last["state"], last["type"], last["failures"]) == ("succeeded", "up", 0)
    assert last["lastSuccessfulCommit"] == last["lastAttemptedCommit"]
    assert status["observedGeneration"] == stack["metadata"]["generation"]
    assert status["projectInfo"]["runtime"] == "yaml"

    # The Stack records the result, then releases the Update (its finalizer off): a second write.
    async def released() -> bool:
        update = await env.get(env.updates, last["name"])
        return update is not None and not update["metadata"].get("finalizers")

    await wait_until("the recorded Update released", released, within=30)
    reasons = {e["reason"]: e["message"] for e in await env.events_for("website")}
    assert reasons.get("StackCreated") == "Successfully updated stack"
    assert reasons.get("StackUpdateDetected") == "Initial stack update"
    manager = env.operator.manager
    assert manager is not None
    labels = {"namespace": env.ns, "name": "website"}
    assert manager.registry.get_sample_value("stacks_failing", labels) == 0
    assert (manager.registry.get_sample_value("stacks_active") or 0) >= 1

    # kubectl annotate ... pulumi.com/reconciliation-request=...: another up, the request echoed
    request = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "now"}}}
    await env.stacks.patch("website", request)

    async def rerun() -> Obj | None:
        current = await env.get(env.stacks, "website")
        last = ((current or {}).get("status") or {}).get("lastUpdate") or {}
        return current if last.get("reconcileRequest") == "now" and last.get("state") == "succeeded" else None

    stack = await wait_until("the requested run recorded", rerun, within=240)
    assert stack["status"]["observedReconcileRequest"] == "now"
    assert stack["status"]["lastUpdate"]["name"] != last["name"]


async def test_program_error_is_classified_and_retried(env: Env) -> None:
    await env.create_program("broken", BAD_BODY)
    await env.create_stack("broken", {"programRef": {"name": "broken"}})
    stack = await env.condition("broken", "Reconciling", "RetryingAfterFailure")
    status = stack["status"]
    assert status["lastUpdate"]["state"] == "failed"
    assert status["lastFailure"]["transient"] is False
    assert status["lastFailure"]["reason"] in ("ProgramError", "OperationFailed"), status["lastFailure"]
    assert status["nextRetryTime"]
    reasons = {e["reason"] for e in await env.events_for("broken")}
    assert "StackUpdateFailure" in reasons
    manager = env.operator.manager
    assert manager is not None
    labels = {"namespace": env.ns, "name": "broken"}
    assert manager.registry.get_sample_value("stacks_failing", labels) == 1
    assert manager.registry.get_sample_value("stacks_next_retry_timestamp_seconds", labels)


async def test_destroy_on_finalize_destroys_then_releases_the_stack(env: Env) -> None:
    await env.create_program("doomed", PROGRAM_BODY)
    await env.create_stack("doomed", {"programRef": {"name": "doomed"}, "destroyOnFinalize": True})
    await env.condition("doomed", "Ready", "ProcessingCompleted")
    await env.stacks.delete("doomed")

    async def gone() -> bool:
        return await env.get(env.stacks, "doomed") is None

    try:
        await wait_until("the Stack to be destroyed and released", gone, within=240)
    except AssertionError as exc:
        current = await env.get(env.stacks, "doomed")
        raise AssertionError(f"{exc}\nstatus: {(current or {}).get('status')}") from None


# --- git -------------------------------------------------------------------------------------


def _commit(repo: Repo, greeting: str) -> str:
    text = (
        "name: gitproj\nruntime: yaml\nresources:\n  echo:\n    type: test:index:Echo\n"
        f"    properties:\n      value: {greeting}\noutputs:\n  greeting: ${{echo.value}}\n"
    )
    return git_commit(repo, {"app/Pulumi.yaml": text.encode()}, greeting.encode())


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Repo]]:
    root: Path = tmp_path_factory.mktemp("git")
    repo = Repo.init_bare(str(root))
    _commit(repo, "one")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    with serve_git(repo) as url:
        yield url, repo


async def test_git_branch_is_deployed_and_a_pushed_commit_is_picked_up(
    env: Env, git_server: tuple[str, Repo]
) -> None:
    url, repo = git_server
    first = repo.refs[b"refs/heads/main"].decode()
    await env.create_stack("gitops", {"projectRepo": url, "branch": "main", "repoDir": "app"})
    stack = await env.condition("gitops", "Ready", "ProcessingCompleted")
    assert stack["status"]["lastUpdate"]["lastSuccessfulCommit"] == first
    assert stack["status"]["outputs"] == {"greeting": "one"}

    pushed = await asyncio.to_thread(_commit, repo, "two")
    # The branch is polled every 60 s; rather than wait, forget the shared lookup and nudge.
    env.reconciler().branches._cache.clear()
    await env.stacks.patch(
        "gitops", {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "push"}}}
    )

    async def deployed() -> Obj | None:
        current = await env.get(env.stacks, "gitops")
        last = ((current or {}).get("status") or {}).get("lastUpdate") or {}
        return current if last.get("lastSuccessfulCommit") == pushed else None

    stack = await wait_until("the pushed commit deployed", deployed, within=240)
    assert stack["status"]["outputs"] == {"greeting": "two"}

    # a Stack pinned to a commit deploys that commit, whatever the branch says
    await env.create_stack("pinned", {"projectRepo": url, "commit": first, "repoDir": "app"})
    stack = await env.condition("pinned", "Ready", "ProcessingCompleted")
    assert stack["status"]["outputs"] == {"greeting": "one"}
    assert stack["status"]["lastUpdate"]["lastSuccessfulCommit"] == first


async def test_structured_config_round_trips_with_json_types(env: Env) -> None:
    # (configRef/secretsRef from ConfigMaps/Secrets are files the pod mounts: the play-kubelet does not
    # map the paths the agent reads from its config, so those are checked on the Workspace spec only.)
    outputs = {"settings": "${settings}", "count": "${count}", "password": "${password}"}
    await env.create_program(
        "configured", {"configuration": {"count": {"type": "Number"}}, "outputs": outputs}
    )
    await env.create_stack(
        "configured",
        {
            "programRef": {"name": "configured"},
            "config": {"settings": {"a": [1, 2], "b": True}, "count": 3},
            "secretsRef": {"password": {"type": "Literal", "literal": {"value": "s3cret"}}},
        },
    )
    stack = await env.condition("configured", "Ready", "ProcessingCompleted")
    assert stack["status"]["outputs"] == {
        "count": 3,
        "password": "[secret]",
        "settings": {"a": [1, 2], "b": True},
    }


# --- Flux source: the test plays source-controller (serves the artifact, writes the status) ---------


def flux_artifact(greeting: str) -> tuple[bytes, str]:
    """A source-controller-style tarball holding ``app/Pulumi.yaml`` (the Stack's ``dir``)."""
    project = project_yaml("fluxed", {"outputs": {"greeting": greeting}}).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("app/Pulumi.yaml")
        info.size = len(project)
        tar.addfile(info, io.BytesIO(project))
    data = raw.getvalue()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def artifact_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """An HTTP server on loopback serving ``files`` (path -> bytes), as source-controller does."""
    files: dict[str, bytes] = {}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        data = files.get(environ.get("PATH_INFO", ""))
        if data is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        start_response("200 OK", [("Content-Type", "application/gzip"), ("Content-Length", str(len(data)))])
        return [data]

    with serve_wsgi(app) as url:
        yield url, files


async def test_flux_source_is_fetched_deployed_and_a_new_digest_redeploys(
    env: Env, artifact_server: tuple[str, dict[str, bytes]]
) -> None:
    base, files = artifact_server
    crds = ResourceClient(env.api, CRDS)
    sources = ResourceClient(env.api, GITREPOSITORIES, env.ns)
    await crds.apply(FLUX_CRD, field_manager="pko-tests")

    async def publish(greeting: str, revision: str) -> str:
        data, digest = flux_artifact(greeting)
        path = f"/gitrepository/{env.ns}/repo/{digest[7:19]}.tar.gz"
        files[path] = data
        body = {
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "GitRepository",
            "metadata": {"name": "repo", "namespace": env.ns},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Succeeded",
                        "message": "stored artifact",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "artifact": {
                    "url": base + path,
                    "digest": digest,
                    "revision": revision,
                    "lastUpdateTime": "2026-01-01T00:00:00Z",
                },
            },
        }
        await sources.apply_status(body, field_manager="source-controller")
        return digest

    try:
        await wait_until("the GitRepository kind served", lambda: _served(env), within=60)
        await sources.apply(
            {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
             "metadata": {"name": "repo", "namespace": env.ns}, "spec": {"url": "https://example.invalid/r"}},
            field_manager="pko-tests",
        )  # fmt: skip
        first = await publish("one", "main@sha1:1111")
        ref = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "repo"}
        await env.create_stack("fluxed", {"fluxSource": {"sourceRef": ref, "dir": "app"}})
        stack = await env.condition("fluxed", "Ready", "ProcessingCompleted", within=300)
        assert stack["status"]["outputs"] == {"greeting": "one"}
        assert stack["status"]["lastUpdate"]["lastSuccessfulCommit"] == first

        # New content under the same revision (e.g. a changed ignore rule): the digest decides.
        second = await publish("two", "main@sha1:1111")

        async def redeployed() -> Obj | None:
            current = await env.get(env.stacks, "fluxed")
            last = ((current or {}).get("status") or {}).get("lastUpdate") or {}
            return current if last.get("lastSuccessfulCommit") == second else None

        stack = await wait_until("the new digest deployed", redeployed, within=300)
        assert stack["status"]["outputs"] == {"greeting": "two"}
    finally:
        await env.stacks.delete("fluxed")
        await remove_flux_crd(crds)


async def _served(env: Env) -> bool:
    try:
        await ResourceClient(env.api, GITREPOSITORIES, env.ns).list()
    except ApiException:
        return False
    return True


def _state(env: Env, project: str, stack: str = "dev") -> Obj:
    """The stack's checkpoint in the play-kubelet's shared file backend (what `pulumi stack export` reads)."""
    backend = Path(env.kubelet.pulumi.backend_url.removeprefix("file://"))
    checkpoint: Obj = json.loads((backend / ".pulumi" / "stacks" / project / f"{stack}.json").read_text())
    return checkpoint


async def test_targets_deploy_only_the_targeted_resources(env: Env) -> None:
    body = {
        "resources": {
            "wanted": {"type": "test:index:Echo", "properties": {"value": "w"}},
            "skipped": {"type": "test:index:Echo", "properties": {"value": "s"}},
        },
        "outputs": {"wanted": "${wanted.value}"},
    }
    await env.create_program("targeted", body)
    urn = "urn:pulumi:dev::targeted::test:index:Echo::wanted"
    await env.create_stack("targeted", {"programRef": {"name": "targeted"}, "targets": [urn]})
    stack = await env.condition("targeted", "Ready", "ProcessingCompleted")
    update = await env.get(env.updates, stack["status"]["lastUpdate"]["name"])
    assert update is not None and update["spec"]["target"] == [urn]
    urns = {r["urn"] for r in _state(env, "targeted")["checkpoint"]["latest"]["resources"]}
    assert urn in urns
    assert not any(u.endswith("::skipped") for u in urns), urns


async def test_refresh_before_up_picks_up_drift(env: Env, tmp_path: Path) -> None:
    cloud = tmp_path / "cloud-value"  # the "cloud" side of a test:index:Drift resource
    cloud.write_text("v1")
    body = {
        "resources": {"thing": {"type": "test:index:Drift", "properties": {"path": str(cloud)}}},
        "outputs": {"value": "${thing.value}"},
    }
    await env.create_program("drifting", body)
    await env.create_stack("drifting", {"programRef": {"name": "drifting"}, "refresh": True})
    stack = await env.condition("drifting", "Ready", "ProcessingCompleted")
    assert stack["status"]["outputs"] == {"value": "v1"}
    first = stack["status"]["lastUpdate"]["name"]

    cloud.write_text("v2")  # changed out of band
    request = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "drift"}}}
    await env.stacks.patch("drifting", request)

    async def refreshed() -> Obj | None:
        current = await env.get(env.stacks, "drifting")
        last = ((current or {}).get("status") or {}).get("lastUpdate") or {}
        done = last.get("name") != first and last.get("state") == "succeeded"
        return current if done else None

    stack = await wait_until("the next up, refreshed first", refreshed, within=240)
    assert stack["status"]["outputs"] == {"value": "v2"}, stack["status"]

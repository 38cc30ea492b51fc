"""A policy pack from a git repository of its own (issue 43) on the real Pulumi engine, as
test_real_engine_policy.py runs a pack from a path: the real operator, apiserver and
kube-controller-manager, and the play-kubelet running the real agent (its ``init`` fetching the pack in
an init container of its own, with dulwich) and the real CLI with a JavaScript pack whose
``node_modules`` are committed beside it, and a Python pack naming a virtualenv the workspace has.

What a platform team relies on: a Stack whose program breaks the pack's mandatory policy creates
nothing and is Stalled ``PolicyViolation`` naming the pack, the Update records the commit the pack ran
at; once the pack's repository is fixed (a new commit on its branch) the Stack runs again, untouched,
and is Ready. A pack whose repository cannot be had Stalls the Stack with a condition naming the pack
and the git error, and nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo

from pko.devtools.builds import built
from pko.devtools.gitserver import git_commit, serve_git
from pko.devtools.policypacks import policy_sdk, python_policy_env, write_pack, write_python_pack
from pko.machinery.conditions import get_condition

from .conftest import operator_env
from .test_real_engine import _let_programs_manage_objects, configmap
from .test_real_engine_policy import KUBELET_OPTIONS as POLICY_KUBELET_OPTIONS
from .test_real_engine_policy import PACK, PYTHON_PACK, ended_update, program
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

Obj = dict[str, Any]
KUBELET_OPTIONS = POLICY_KUBELET_OPTIONS
env = operator_env(Env, prepare=_let_programs_manage_objects)
PACK_DIR = "packs/configmaps"
FIXED = PACK.replace('enforcementLevel: "mandatory"', 'enforcementLevel: "advisory"')
PYTHON_DIR = "packs/configmaps-py"
PYTHON_FIXED = PYTHON_PACK.replace("EnforcementLevel.MANDATORY", "EnforcementLevel.ADVISORY")


def _files(work: Path, under: str) -> dict[str, bytes]:
    """The files of ``work`` as repository files under ``under``."""
    return {
        f"{under}/{path.relative_to(work).as_posix()}": path.read_bytes()
        for path in sorted(work.rglob("*"))
        if path.is_file()
    }


def _pack_files(work: Path, source: str) -> dict[str, bytes]:
    """The JavaScript pack with ``source`` as its index.js, and its node_modules, as repository files."""
    write_pack(work, policy_sdk(built("build-runtimes.sh")), source, "pko-configmaps")
    return _files(work, PACK_DIR)


def _python_files(work: Path, source: str) -> dict[str, bytes]:
    """The Python pack with ``source`` as its __main__.py, as repository files; its virtualenv one the
    workspace has (here the host's, as an image would ship one: docs/policy.md)."""
    write_python_pack(work, source, python_policy_env(), "pko-configmaps-py")
    return _files(work, PYTHON_DIR)


@contextlib.contextmanager
def _served(root: Path, files: dict[str, bytes]) -> Iterator[tuple[str, Repo, Path]]:
    """A platform team's repository of packs holding ``files``, served over git's smart HTTP: its URL,
    the repository and a scratch directory."""
    repo = Repo.init_bare(str(root / "packs.git"), mkdir=True)
    git_commit(repo, files, b"the configmaps pack: tier forbidden is mandatory")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    with serve_git(repo) as url:
        yield url, repo, root


@pytest.fixture(scope="module")
def pack_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Repo, Path]]:
    root = tmp_path_factory.mktemp("policy-git")
    with _served(root, _pack_files(root / "v1", PACK)) as served:
        yield served


@pytest.fixture(scope="module")
def python_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Repo, Path]]:
    root = tmp_path_factory.mktemp("policy-git-py")
    with _served(root, _python_files(root / "v1", PYTHON_PACK)) as served:
        yield served


async def poll_now(env: Env, name: str) -> None:
    """The Stack's next branch poll, now: forget the shared lookups (polled every 60 s) and queue the
    Stack, without touching it (a new generation or a request would run it anyway)."""
    reconciler = env.reconciler()
    reconciler.branches._cache.clear()
    manager = env.operator.manager
    assert manager is not None
    controller = next(c for c in manager.controllers if c.reconciler is reconciler)
    controller.queue.add(f"{env.ns}/{name}")


async def refused_until_fixed(
    env: Env,
    name: str,
    served: tuple[str, Repo, Path],
    pack_dir: str,
    pack_name: str,
    fixed: dict[str, bytes],
) -> None:
    """A Stack whose program breaks the mandatory policy of the pack at ``pack_dir`` of the served
    repository is Stalled, nothing created, its Update at the pack's commit; once ``fixed`` is
    committed (the policy advisory) the Stack, untouched, runs again at the new commit and is Ready."""
    url, repo, _ = served
    first = repo.refs[b"refs/heads/main"].decode()
    pack = {"name": "configmaps", "path": pack_dir, "git": {"url": url, "branch": "main"}}
    await env.create_program(name, program(env, name, "forbidden"))
    await env.create_stack(name, {"programRef": {"name": name}, "policyPacks": [pack]})

    stack = await env.condition(name, "Stalled", "PolicyViolation", within=300)
    stalled = get_condition(stack["status"]["conditions"], "Stalled")
    assert stalled is not None
    for said in (f"{pack_name}@0.1.0", "no-forbidden-tier", "this ConfigMap's tier is forbidden"):
        assert said in stalled["message"], stalled
    assert await configmap(env, f"{name}-settings") is None, "created although the pack refused it"
    update = await ended_update(env, name, stack)
    assert update["spec"]["policyPacks"] == [{**pack, "git": {"url": url, "commit": first}}]
    workspace = await env.get(env.workspaces, name)
    assert workspace is not None
    (source,) = workspace["spec"]["policyPackSources"]
    assert (source["name"], source["git"]["ref"], source["git"]["dir"]) == ("configmaps", first, pack_dir)

    commit = await asyncio.to_thread(git_commit, repo, fixed, b"tier forbidden is advisory")
    await poll_now(env, name)
    stack = await env.condition(name, "Ready", "ProcessingCompleted", within=300)
    created = await configmap(env, f"{name}-settings")
    assert created is not None and created["data"] == {"tier": "forbidden"}, created
    update = await ended_update(env, name, stack)
    assert update["spec"]["policyPacks"] == [{**pack, "git": {"url": url, "commit": commit}}]
    listed = [(v["policy"], v["enforcementLevel"]) for v in update["status"]["policyViolations"]]
    assert ("no-forbidden-tier", "advisory") in listed, listed
    assert stack["metadata"]["generation"] == 1, "the Stack ran again without being changed"


async def test_a_pack_from_git_refuses_the_program_until_its_repository_is_fixed(
    env: Env, pack_repo: tuple[str, Repo, Path]
) -> None:
    fixed = _pack_files(pack_repo[2] / "v2", FIXED)
    await refused_until_fixed(env, "gitpoliced", pack_repo, PACK_DIR, "pko-configmaps", fixed)


async def test_a_python_pack_from_git_refuses_the_program_until_its_repository_is_fixed(
    env: Env, python_repo: tuple[str, Repo, Path]
) -> None:
    fixed = _python_files(python_repo[2] / "v2", PYTHON_FIXED)
    await refused_until_fixed(env, "gitpoliced-py", python_repo, PYTHON_DIR, "pko-configmaps-py", fixed)


async def test_a_pack_whose_repository_does_not_exist_stalls_the_stack_naming_the_pack(
    env: Env, pack_repo: tuple[str, Repo, Path]
) -> None:
    url, _, _ = pack_repo
    missing = url.rsplit("/", 1)[0] + "/no-such-packs.git"
    pack = {"name": "platform", "path": PACK_DIR, "git": {"url": missing, "branch": "main"}}
    await env.create_program("gitmissing", program(env, "gitmissing", "allowed"))
    await env.create_stack("gitmissing", {"programRef": {"name": "gitmissing"}, "policyPacks": [pack]})

    stack = await env.condition("gitmissing", "Stalled", "SourceUnavailable", within=120)
    stalled = get_condition(stack["status"]["conditions"], "Stalled")
    assert stalled is not None
    assert stalled["message"] == (
        f"policy pack 'platform': listing {missing}: "
        "no git repository there (or it is not visible with the credentials given)"
    ), stalled
    assert "lastUpdate" not in stack["status"] and "currentUpdate" not in stack["status"], stack["status"]
    assert await env.get(env.workspaces, "gitmissing") is None, (
        "a Workspace was made for a pack it cannot have"
    )


async def test_a_pinned_commit_the_repository_lacks_fails_the_packs_fetch_naming_it(
    env: Env, pack_repo: tuple[str, Repo, Path]
) -> None:
    url, _, _ = pack_repo
    absent = "0" * 40
    pack = {"name": "pinned", "path": PACK_DIR, "git": {"url": url, "commit": absent}}
    await env.create_program("gitpinned", program(env, "gitpinned", "allowed"))
    await env.create_stack("gitpinned", {"programRef": {"name": "gitpinned"}, "policyPacks": [pack]})

    stack = await env.condition("gitpinned", "Stalled", "WorkspaceFailed", within=300)
    stalled = get_condition(stack["status"]["conditions"], "Stalled")
    assert stalled is not None
    message = stalled["message"]
    assert message.startswith('InitContainerFailed: init container "fetch-policy-0" failed'), message
    assert f"agent init: policy pack 'pinned': revision '{absent}' not found in {url}" in message, message
    assert "lastUpdate" not in stack["status"], "an Update ran without its pack"


async def test_a_packs_credentials_are_not_sent_over_plain_http(
    env: Env, pack_repo: tuple[str, Repo, Path]
) -> None:
    url, _, _ = pack_repo
    auth = {"token": {"name": "policies-git", "key": "accessToken"}}
    pack = {"name": "secured", "path": PACK_DIR, "git": {"url": url, "branch": "main", "auth": auth}}
    await env.create_program("gitplain", program(env, "gitplain", "allowed"))
    await env.create_stack("gitplain", {"programRef": {"name": "gitplain"}, "policyPacks": [pack]})

    stack = await env.condition("gitplain", "Stalled", "CredentialsOverPlainHTTPRefused", within=120)
    stalled = get_condition(stack["status"]["conditions"], "Stalled")
    assert stalled is not None
    expected = f"policy pack 'secured': {url} is plain HTTP and git.auth.token would be sent over it"
    assert stalled["message"].startswith(expected), stalled
    assert await env.get(env.workspaces, "gitplain") is None

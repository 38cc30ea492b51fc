"""Branch heads without a clone: one remote lookup per repository, branch and credentials per interval."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo
from dulwich.server import DictBackend
from dulwich.web import make_wsgi_chain

from pko.controllers.stack.branchpoll import (
    BranchResolver,
    GitCredentials,
    GitLookupError,
    ls_remote,
    match_ref,
)

REFS = {
    b"HEAD": b"1" * 40,
    b"refs/heads/main": b"2" * 40,
    b"refs/tags/v1": b"3" * 40,
    b"refs/remotes/origin/dev": b"4" * 40,
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingLister:
    def __init__(self, refs: Mapping[bytes, Any] = REFS, delay: float = 0.0) -> None:
        self.refs = dict(refs)
        self.calls: list[tuple[str, GitCredentials]] = []
        self.delay = delay

    def __call__(self, url: str, creds: GitCredentials) -> Mapping[bytes, Any]:
        self.calls.append((url, creds))
        if self.delay:
            threading.Event().wait(self.delay)
        return self.refs


def test_refs_match_by_full_or_short_name() -> None:
    assert match_ref(REFS, "main") == "2" * 40
    assert match_ref(REFS, "refs/heads/main") == "2" * 40
    assert match_ref(REFS, "v1") == "3" * 40
    assert match_ref(REFS, "origin/dev") == "4" * 40
    assert match_ref(REFS, "nope") is None


async def test_stacks_tracking_the_same_branch_share_one_lookup_per_interval() -> None:
    lister, clock = CountingLister(delay=0.1), Clock()
    resolver = BranchResolver(lister, clock=clock)
    creds = GitCredentials(token="t")
    heads = await asyncio.gather(*(resolver.head("https://r", "main", creds, 60) for _ in range(10)))
    assert heads == ["2" * 40] * 10 and len(lister.calls) == 1
    clock.now = 59
    await resolver.head("https://r", "main", creds, 60)
    assert len(lister.calls) == 1
    clock.now = 61
    lister.refs[b"refs/heads/main"] = b"5" * 40
    assert await resolver.head("https://r", "main", creds, 60) == "5" * 40
    assert len(lister.calls) == 2


async def test_different_credentials_or_branches_do_not_share() -> None:
    lister = CountingLister()
    resolver = BranchResolver(lister, clock=Clock())
    await resolver.head("https://r", "main", GitCredentials(token="a"), 60)
    await resolver.head("https://r", "main", GitCredentials(token="b"), 60)
    await resolver.head("https://r", "v1", GitCredentials(token="a"), 60)
    assert len(lister.calls) == 3


async def test_a_commit_needs_no_lookup_and_errors_name_no_secret() -> None:
    lister = CountingLister()
    resolver = BranchResolver(lister, clock=Clock())
    assert await resolver.head("https://r", "a" * 40, GitCredentials(), 60) == "a" * 40
    assert lister.calls == []
    with pytest.raises(GitLookupError, match="no commits found for ref 'gone'"):
        await resolver.head("https://r", "gone", GitCredentials(password="hunter2"), 60)

    def failing(url: str, creds: GitCredentials) -> Mapping[bytes, Any]:
        raise OSError("connection refused")

    with pytest.raises(GitLookupError) as info:
        await BranchResolver(failing).head("https://r", "main", GitCredentials(password="hunter2"), 60)
    assert "connection refused" in str(info.value) and "hunter2" not in str(info.value)
    assert "hunter2" not in repr(GitCredentials(password="hunter2"))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def served_repo(tmp_path: Path) -> Iterator[tuple[str, str]]:
    repo = Repo.init_bare(str(tmp_path))
    blob = Blob.from_string(b"name: x\nruntime: yaml\n")
    tree = Tree()
    tree.add(b"Pulumi.yaml", 0o100644, blob.id)
    commit = Commit()
    commit.tree = tree.id
    commit.author = commit.committer = b"T <t@example.com>"
    commit.commit_time = commit.author_time = 1700000000
    commit.commit_timezone = commit.author_timezone = 0
    commit.message = b"x"
    for obj in (blob, tree, commit):
        repo.object_store.add_object(obj)
    repo.refs[b"refs/heads/main"] = commit.id
    server = make_server("127.0.0.1", 0, make_wsgi_chain(DictBackend({"/r.git": repo})), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/r.git", commit.id.decode()
    server.shutdown()
    server.server_close()


async def test_ls_remote_against_a_smart_http_server(served_repo: tuple[str, str]) -> None:
    url, commit = served_repo
    assert match_ref(await asyncio.to_thread(ls_remote, url, GitCredentials()), "main") == commit
    assert await BranchResolver().head(url, "main", GitCredentials(), 60) == commit

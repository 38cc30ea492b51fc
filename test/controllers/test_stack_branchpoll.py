"""Branch heads without a clone: one remote lookup per repository, branch and credentials per interval."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dulwich.client import HTTPUnauthorized
from dulwich.repo import Repo

from pko.controllers.stack.branchpoll import BranchResolver, GitCredentials, GitLookupError
from pko.devtools.gitserver import same_name_repository, serve_git
from pko.git import ls_remote, resolve_ref
from pko.git.errors import HostKeyError

REFS = {
    b"HEAD": b"1" * 40,
    b"refs/heads/main": b"2" * 40,
    b"refs/tags/v1": b"3" * 40,
    b"refs/remotes/origin/dev": b"4" * 40,
    b"refs/heads/v2": b"6" * 40,
    b"refs/tags/v2": b"7" * 40,
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


async def test_a_stack_branch_is_looked_up_as_a_branch_never_as_a_tag() -> None:
    resolver = BranchResolver(CountingLister(), clock=Clock())
    creds = GitCredentials()
    assert await resolver.head("https://r", "main", creds, 60) == "2" * 40
    assert await resolver.head("https://r", "refs/heads/main", creds, 60) == "2" * 40
    assert await resolver.head("https://r", "v2", creds, 60) == "6" * 40  # the branch, not tag v2
    assert await resolver.head("https://r", "refs/tags/v2", creds, 60) == "7" * 40  # asked for by name
    with pytest.raises(GitLookupError, match="no commits found for ref 'refs/heads/v1'"):
        await resolver.head("https://r", "v1", creds, 60)  # only a tag v1: not a branch


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
    await resolver.head("https://r", "v2", GitCredentials(token="a"), 60)
    assert len(lister.calls) == 3


async def test_errors_name_no_secret() -> None:
    lister = CountingLister()
    resolver = BranchResolver(lister, clock=Clock())
    with pytest.raises(GitLookupError, match="no commits found for ref 'refs/heads/gone'"):
        await resolver.head("https://r", "gone", GitCredentials(password="hunter2"), 60)

    def failing(url: str, creds: GitCredentials) -> Mapping[bytes, Any]:
        raise OSError(f"connection refused for {url} with {creds.password}")

    with pytest.raises(GitLookupError) as info:
        await BranchResolver(failing).head(
            "https://bob:urlpass1@r", "main", GitCredentials(password="hunter2"), 60
        )
    message = str(info.value)
    assert "connection refused" in message and "hunter2" not in message and "urlpass1" not in message
    assert "hunter2" not in repr(GitCredentials(password="hunter2"))


async def test_refusals_say_what_to_fix_in_the_stack() -> None:
    """A 401 reads as the agent's fetch reads it (and names spec.gitAuth); pko.git's own (SSH)
    errors read as they are, without the exception's name."""

    def refuse(url: str, creds: GitCredentials) -> Mapping[bytes, Any]:
        raise HTTPUnauthorized('Basic realm="git"', url)

    def unknown_host(url: str, creds: GitCredentials) -> Mapping[bytes, Any]:
        raise HostKeyError("host key verification failed for git.example: the host is not in known_hosts")

    cases = [
        (refuse, "https://git.example/r.git", GitCredentials(password="hunter2", username="bob"), "rejected"),
        (refuse, "https://git.example/r.git", GitCredentials(), "requires credentials (set spec.gitAuth)"),
        (unknown_host, "git@git.example:r.git", GitCredentials(ssh_private_key="k"), "not in known_hosts"),
    ]
    for lister, url, creds, expected in cases:
        with pytest.raises(GitLookupError) as info:
            await BranchResolver(lister).head(url, "main", creds, 60)
        message = str(info.value)
        assert message.startswith(f"listing {url}: ") and expected in message, message
        assert "hunter2" not in message and "Error" not in message, message


@dataclass
class ServedRepo:
    url: str
    branch: str  # head of branch main, and of branch v1
    tag: str  # the commit annotated tag v1 tags (another commit)


@pytest.fixture
def served_repo(tmp_path: Path) -> Iterator[ServedRepo]:
    """A repository on a loopback smart-HTTP server where a branch and a tag are both named v1."""
    repo = Repo.init_bare(str(tmp_path))
    tagged, head = {"Pulumi.yaml": b"name: x\nruntime: yaml\n"}, {"Pulumi.yaml": b"name: y\nruntime: yaml\n"}
    made = same_name_repository(repo, tagged, head, default="main")
    with serve_git(repo, "/r.git") as url:
        yield ServedRepo(url, made.branch, made.tag)


async def test_ls_remote_against_a_smart_http_server(served_repo: ServedRepo) -> None:
    refs = await asyncio.to_thread(ls_remote, served_repo.url, GitCredentials())
    found = resolve_ref(refs, "main")
    assert found is not None and found[1].decode() == served_repo.branch
    assert await BranchResolver().head(served_repo.url, "main", GitCredentials(), 60) == served_repo.branch


async def test_a_branch_and_a_tag_of_one_name_on_a_real_server(served_repo: ServedRepo) -> None:
    """Branch v1 is the branch's head though git's rule would read plain ``v1`` as the tag; the
    tag, asked for by its full name, is the commit it tags (peeled), not the tag object."""
    resolver = BranchResolver()
    assert await resolver.head(served_repo.url, "v1", GitCredentials(), 60) == served_repo.branch
    assert await resolver.head(served_repo.url, "refs/heads/v1", GitCredentials(), 60) == served_repo.branch
    assert await resolver.head(served_repo.url, "refs/tags/v1", GitCredentials(), 60) == served_repo.tag
    refs = await asyncio.to_thread(ls_remote, served_repo.url, GitCredentials())
    by_rule = resolve_ref(refs, "v1", peel=True)
    assert by_rule is not None and by_rule == (b"refs/tags/v1", served_repo.tag.encode())

"""`agent init --source-name` (SOURCE_NAME): a workspace pod fetches its program and each policy pack
from git of its own (issue 43) in init containers of their own; a failed one's line names which."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.repo import Repo
from pko.agent.init import add_init_arguments, run_init

from pko.devtools.gitserver import git_commit, serve_git


@pytest.fixture
def pack_repo(tmp_path: Path) -> Iterator[str]:
    repo = Repo.init_bare(str(tmp_path / "packs.git"), mkdir=True)
    git_commit(repo, {"packs/commands/PulumiPolicy.yaml": b"runtime: nodejs\n"}, b"a pack")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    with serve_git(repo) as url:
        yield url


def init(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="agent init")
    add_init_arguments(parser)
    code: int = run_init(parser.parse_args(list(argv)))
    return code


def test_a_failed_fetch_names_its_source(
    pack_repo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SOURCE_NAME", "policy pack 'commands'")
    monkeypatch.setenv("GIT_URL", pack_repo)
    monkeypatch.setenv("GIT_REVISION", "no-such-branch")
    assert init("-t", str(tmp_path / "policy" / "commands")) == 1
    assert capsys.readouterr().err.strip() == (
        f"agent init: policy pack 'commands': revision 'no-such-branch' not found in {pack_repo}"
    )
    monkeypatch.setenv("GIT_REVISION", "main")
    monkeypatch.setenv("GIT_DIR", "packs/commands")
    assert init("-t", str(tmp_path / "policy" / "commands"), "--source-name", "the pack") == 0
    assert (tmp_path / "policy" / "commands" / "packs" / "commands" / "PulumiPolicy.yaml").is_file()
    monkeypatch.setenv("GIT_DIR", "packs/missing")
    assert init("-t", str(tmp_path / "policy" / "other"), "--source-name", "policy pack 'other'") == 1
    assert capsys.readouterr().err.startswith(
        "agent init: policy pack 'other': project directory 'packs/missing' not found"
    )

"""`agent init` end to end: flags and the environment the operator sets, exit codes, stderr, placement."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from dulwich.repo import Repo
from pko.agent.init import add_init_arguments, run_init

SOURCE_VARS = [
    "GIT_URL",
    "GIT_REVISION",
    "GIT_DIR",
    "GIT_SHALLOW",
    "GIT_USERNAME",
    "GIT_PASSWORD",
    "GIT_PASSWORD_FILE",
    "GIT_TOKEN",
    "GIT_TOKEN_FILE",
    "GIT_SSH_PRIVATE_KEY",
    "GIT_SSH_PRIVATE_KEY_FILE",
    "GIT_SSH_KNOWN_HOSTS",
    "GIT_SSH_KNOWN_HOSTS_FILE",
    "SSH_KNOWN_HOSTS",
    "GIT_GITHUB_APP_ID",
    "GIT_GITHUB_APP_INSTALLATION_ID",
    "GIT_GITHUB_APP_PRIVATE_KEY",
    "FLUX_URL",
    "FLUX_DIGEST",
    "FLUX_DIR",
    "FLUX_MAX_UNTAR_SIZE_BYTES",
    "SOURCE_CONTROLLER_LOCALHOST",
    "PROJECT_NAME",
    "PROJECT_RUNTIME",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SOURCE_VARS:
        monkeypatch.delenv(name, raising=False)


def init(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="agent init")
    add_init_arguments(parser)
    code: int = run_init(parser.parse_args(list(argv)))
    return code


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("agent init: ")
    return lines[0]


def tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# --- git ----------------------------------------------------------------------------------------


def test_git_env_as_the_operator_sets_it(
    git_http: Any, source_repo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_URL", git_http.public)
    monkeypatch.setenv("GIT_REVISION", source_repo.master)
    monkeypatch.setenv("GIT_DIR", "proj")
    monkeypatch.setenv("GIT_SHALLOW", "true")
    source, workspace = tmp_path / "share" / "source", tmp_path / "share" / "workspace"
    assert init("-t", str(source), "--workspace-dir", str(workspace)) == 0
    assert (workspace / "Pulumi.yaml").read_text().startswith("name: two")
    assert os.readlink(workspace) == str(source / "proj")
    assert Repo(str(source)).get_shallow()
    assert sorted(p.name for p in (tmp_path / "share").iterdir()) == [
        ".source.pko-source.json",
        "source",
        "workspace",
    ]

    # the init container runs again (pod restart): nothing to do, still success
    assert init("-t", str(source), "--workspace-dir", str(workspace)) == 0


def test_go_style_flags_fetch_a_branch(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    target = tmp_path / "source"
    assert init("-t", str(target), "--git-url", git_http.public, "--git-revision", "feature") == 0
    assert Repo(str(target)).head().decode() == source_repo.feature


def test_basic_auth_from_env_and_files(
    git_http: Any, source_repo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("correct-horse-battery\n")
    monkeypatch.setenv("GIT_URL", git_http.private)
    monkeypatch.setenv("GIT_USERNAME", "alice")
    assert init("-t", str(tmp_path / "a"), "--git-password-file", str(password_file)) == 0
    monkeypatch.setenv("GIT_PASSWORD", "correct-horse-battery")
    assert init("-t", str(tmp_path / "b")) == 0
    assert Repo(str(tmp_path / "b")).head().decode() == source_repo.master


def test_wrong_password_fails_with_one_clean_line(
    git_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GIT_URL", git_http.private)
    monkeypatch.setenv("GIT_USERNAME", "alice")
    monkeypatch.setenv("GIT_PASSWORD", "definitely-wrong")
    target = tmp_path / "source"
    assert init("-t", str(target)) == 1
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert line.startswith(f"agent init: authentication failed for {git_http.private}")
    assert "definitely-wrong" not in captured.err + captured.out
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # the staging directory was cleaned up


def test_missing_revision_and_missing_project_dir(
    git_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GIT_URL", git_http.public)
    monkeypatch.setenv("GIT_REVISION", "release-9")
    assert init("-t", str(tmp_path / "a")) == 1
    assert (
        one_line(capsys.readouterr().err)
        == f"agent init: revision 'release-9' not found in {git_http.public}"
    )

    monkeypatch.setenv("GIT_REVISION", "master")
    monkeypatch.setenv("GIT_DIR", "no/such/dir")
    assert init("-t", str(tmp_path / "b")) == 1
    assert "project directory 'no/such/dir' not found" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "b").exists()


def test_github_app_without_token_is_reported_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GIT_URL", "https://github.com/org/repo.git")
    monkeypatch.setenv("GIT_GITHUB_APP_ID", "123")
    assert init("-t", str(tmp_path / "s")) == 2
    assert "GitHub App authentication" in one_line(capsys.readouterr().err)


def test_ssh_key_and_known_hosts_from_env(
    git_ssh: Any, source_repo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_URL", git_ssh.url)
    monkeypatch.setenv("GIT_REVISION", "v1")
    monkeypatch.setenv("GIT_SSH_PRIVATE_KEY", git_ssh.client_key_pem)
    known = tmp_path / "known_hosts"
    known.write_text(git_ssh.known_hosts)
    monkeypatch.setenv("GIT_SSH_KNOWN_HOSTS_FILE", str(known))
    assert init("-t", str(tmp_path / "src"), "--timeout", "20") == 0
    assert Repo(str(tmp_path / "src")).head().decode() == source_repo.first


# --- artifacts ----------------------------------------------------------------------------------


def test_flux_artifact_with_good_digest(
    artifact_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tar_gz({"app/Pulumi.yaml": b"name: app\nruntime: yaml\n"})
    monkeypatch.setenv("FLUX_URL", artifact_http.serve("/flux/good.tar.gz", data))
    monkeypatch.setenv("FLUX_DIGEST", digest(data))
    monkeypatch.setenv("FLUX_DIR", "app")
    source, workspace = tmp_path / "source", tmp_path / "workspace"
    assert init("-t", str(source), "--workspace-dir", str(workspace)) == 0
    assert (workspace / "Pulumi.yaml").read_text() == "name: app\nruntime: yaml\n"
    assert init("-t", str(source), "--workspace-dir", str(workspace)) == 0  # rerun is a no-op


def test_flux_artifact_with_bad_digest(
    artifact_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tar_gz({"Pulumi.yaml": b"name: app\n"})
    monkeypatch.setenv("FLUX_URL", artifact_http.serve("/flux/bad.tar.gz", data))
    monkeypatch.setenv("FLUX_DIGEST", digest(b"something else"))
    assert init("-t", str(tmp_path / "source")) == 1
    assert "digest mismatch" in one_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_traversal_artifact_is_rejected_and_leaves_nothing(
    artifact_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tar_gz({"ok.txt": b"fine", "../../escaped.txt": b"gotcha"})
    base = tmp_path / "deep" / "share"
    monkeypatch.setenv("FLUX_URL", artifact_http.serve("/flux/evil.tar.gz", data))
    monkeypatch.setenv("FLUX_DIGEST", digest(data))
    assert init("-t", str(base / "source")) == 1
    assert "climbs out of the target directory" in one_line(capsys.readouterr().err)
    assert [p.name for p in tmp_path.rglob("*")] == ["deep", "share"]


def test_untar_size_limit_from_env(
    artifact_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tar_gz({"big": b"0" * 50_000})
    monkeypatch.setenv("FLUX_URL", artifact_http.serve("/flux/big.tar.gz", data))
    monkeypatch.setenv("FLUX_DIGEST", digest(data))
    monkeypatch.setenv("FLUX_MAX_UNTAR_SIZE_BYTES", "10000")
    assert init("-t", str(tmp_path / "a")) == 1
    assert "beyond the limit of 10000 bytes" in one_line(capsys.readouterr().err)
    monkeypatch.setenv("FLUX_MAX_UNTAR_SIZE_BYTES", "-1")
    assert init("-t", str(tmp_path / "b")) == 0
    monkeypatch.setenv("FLUX_MAX_UNTAR_SIZE_BYTES", "lots")
    assert init("-t", str(tmp_path / "c")) == 2


# --- project info and usage ---------------------------------------------------------------------


def test_project_info_writes_a_minimal_pulumi_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECT_NAME", "infra")
    monkeypatch.setenv("PROJECT_RUNTIME", "nodejs")
    assert init("-t", str(tmp_path / "ws")) == 0
    assert yaml.safe_load((tmp_path / "ws" / "Pulumi.yaml").read_text()) == {
        "name": "infra",
        "runtime": "nodejs",
    }


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "nothing to fetch"),
        ({"GIT_URL": "https://x/r.git", "FLUX_URL": "http://x/a.tgz"}, "more than one source"),
        ({"FLUX_URL": "http://x/a.tgz"}, "needs its digest"),
        ({"FLUX_URL": "http://x/a.tgz", "FLUX_DIGEST": "md5:00"}, "unsupported digest algorithm"),
        ({"PROJECT_NAME": "p"}, "needs a runtime"),
        ({"GIT_URL": "ftp://x/r.git"}, "unsupported git URL"),
    ],
)
def test_bad_settings_exit_2(
    env: dict[str, str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert init("-t", str(tmp_path / "t")) == 2
    assert message in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("url", ["ext::sh -c touch% pwned", "fd::17", "foo::bar"])
def test_a_remote_helper_url_is_unsupported_exit_2_and_not_repeated(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GIT_URL", url)
    assert init("-t", str(tmp_path / "t")) == 2
    line = one_line(capsys.readouterr().err)
    assert "unsupported git URL: git remote-helper URLs (<transport>::<address>" in line
    assert url not in line and url.partition("::")[2] not in line
    assert list(tmp_path.iterdir()) == []


def test_foreign_content_in_the_target_is_not_overwritten(
    git_http: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "source"
    target.mkdir()
    (target / "precious.txt").write_text("keep me")
    monkeypatch.setenv("GIT_URL", git_http.public)
    assert init("-t", str(target)) == 2
    assert "is not empty" in one_line(capsys.readouterr().err)
    assert (target / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]

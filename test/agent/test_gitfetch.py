"""Git fetching against real servers on loopback: dulwich smart HTTP (with basic auth) and SSH."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from dulwich.objects import ObjectID
from dulwich.refs import Ref
from dulwich.repo import Repo
from pko.agent.errors import AuthError, HostKeyError, RefNotFound, SourceError, UnreachableError, UsageError
from pko.agent.gitfetch import GitCredentials, Want, fetch_git, parse_remote, resolve_revision

from pko.controllers.stack.branchpoll import BranchResolver, GitLookupError
from pko.devtools.gitserver import same_name_repository, serve_git, server_tls
from pko.git.ssh import load_private_key

SHA_A = ObjectID(b"a" * 40)
SHA_B = ObjectID(b"b" * 40)
SHA_C = ObjectID(b"c" * 40)


# --- revision resolution (pure) ---------------------------------------------------------------


def test_empty_revision_and_head_resolve_to_remote_head() -> None:
    refs = {Ref(b"HEAD"): SHA_A, Ref(b"refs/heads/main"): SHA_A}
    assert resolve_revision("", refs) == Want("ref", SHA_A, Ref(b"HEAD"))
    assert resolve_revision("HEAD", refs) == Want("ref", SHA_A, Ref(b"HEAD"))


def test_tag_wins_over_branch_of_the_same_name_like_git_rev_parse() -> None:
    refs = {Ref(b"refs/heads/v1"): SHA_A, Ref(b"refs/tags/v1"): SHA_B}
    assert resolve_revision("v1", refs) == Want("ref", SHA_B, Ref(b"refs/tags/v1"))


def test_a_full_or_partly_qualified_name_picks_the_branch_over_a_tag() -> None:
    refs = {Ref(b"refs/heads/v1"): SHA_A, Ref(b"refs/tags/v1"): SHA_B}
    assert resolve_revision("refs/heads/v1", refs) == Want("ref", SHA_A, Ref(b"refs/heads/v1"))
    assert resolve_revision("heads/v1", refs) == Want("ref", SHA_A, Ref(b"refs/heads/v1"))
    assert resolve_revision("tags/v1", refs) == Want("ref", SHA_B, Ref(b"refs/tags/v1"))


def test_full_ref_names_and_branches_resolve_exactly() -> None:
    refs = {Ref(b"refs/heads/main"): SHA_A, Ref(b"refs/pull/7/head"): SHA_C}
    assert resolve_revision("main", refs) == Want("ref", SHA_A, Ref(b"refs/heads/main"))
    assert resolve_revision("refs/pull/7/head", refs) == Want("ref", SHA_C, Ref(b"refs/pull/7/head"))


def test_full_sha_is_a_commit_even_when_no_ref_points_at_it() -> None:
    assert resolve_revision("d" * 40, {}) == Want("commit", ObjectID(b"d" * 40))


def test_short_hex_that_names_no_ref_is_scanned_for() -> None:
    assert resolve_revision("abc1234", {Ref(b"refs/heads/main"): SHA_A}) == Want("scan")


def test_unknown_name_resolves_to_nothing() -> None:
    assert resolve_revision("no-such-branch", {Ref(b"refs/heads/main"): SHA_A}) is None


# --- URL parsing (pure) ---------------------------------------------------------------------


def test_https_credentials_are_split_off_and_redacted() -> None:
    remote = parse_remote("https://bob:hunter22@git.example.com:8443/org/repo.git")
    assert remote.transport == "http"
    assert remote.url == "https://git.example.com:8443/org/repo.git"
    assert (remote.username, remote.password) == ("bob", "hunter22")
    assert "hunter22" not in remote.display


def test_scp_like_and_ssh_urls_are_ssh() -> None:
    scp = parse_remote("git@github.com:org/repo.git")
    assert (scp.transport, scp.host, scp.username, scp.path) == ("ssh", "github.com", "git", "org/repo.git")
    no_user = parse_remote("github.com:org/repo.git")  # git's rule: a colon before the first slash
    assert (no_user.transport, no_user.host, no_user.username, no_user.path) == (
        "ssh",
        "github.com",
        None,
        "org/repo.git",
    )
    ssh = parse_remote("ssh://git@example.com:2222/org/repo.git")
    assert (ssh.transport, ssh.host, ssh.port, ssh.path) == ("ssh", "example.com", 2222, "/org/repo.git")


def test_unsupported_scheme_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unsupported git URL"):
        parse_remote("ftp://example.com/repo.git")


@pytest.mark.parametrize("url", ["ext::sh -c touch% pwned", "fd::17"])
def test_a_remote_helper_url_is_a_usage_error_that_does_not_repeat_it(url: str) -> None:
    # a command line, not a URL: redact_url could not take a credential out of it
    with pytest.raises(UsageError, match=r"^unsupported git URL: git remote-helper URLs") as info:
        parse_remote(url)
    assert url not in str(info.value) and "pwned" not in str(info.value)


# --- HTTP fetches -------------------------------------------------------------------------------


def _head(dest: Path) -> tuple[bytes | None, str]:
    repo = Repo(str(dest))
    symref = repo.refs.get_symrefs().get(Ref(b"HEAD"))
    return symref, repo.head().decode()


def test_branch_head_is_checked_out_on_that_branch(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    checkout = fetch_git(git_http.public, "feature", tmp_path)
    assert checkout.commit == source_repo.feature
    assert checkout.ref == "refs/heads/feature"
    assert (tmp_path / "feature.txt").read_text() == "feature\n"
    assert (tmp_path / "proj" / "Pulumi.yaml").read_text().startswith("name: two")
    assert _head(tmp_path) == (b"refs/heads/feature", source_repo.feature)
    repo = Repo(str(tmp_path))
    assert repo.refs[Ref(b"refs/remotes/origin/feature")].decode() == source_repo.feature
    assert repo.get_config().get((b"remote", b"origin"), b"url") == git_http.public.encode()


def test_no_revision_checks_out_the_remote_default_branch(
    git_http: Any, source_repo: Any, tmp_path: Path
) -> None:
    checkout = fetch_git(git_http.public, "", tmp_path)
    assert checkout.commit == source_repo.master
    assert _head(tmp_path) == (b"refs/heads/master", source_repo.master)
    assert not (tmp_path / "feature.txt").exists()


def test_pinned_tip_commit_is_fetched_shallow(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    checkout = fetch_git(git_http.public, source_repo.master, tmp_path, shallow=True)
    assert checkout.commit == source_repo.master
    assert checkout.shallow
    repo = Repo(str(tmp_path))
    assert source_repo.first.encode() not in repo.object_store  # only one commit came over
    symref, head = _head(tmp_path)
    assert symref is None and head == source_repo.master  # a pinned commit leaves HEAD detached


def test_commit_no_ref_points_at_is_found_in_history(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    # dulwich's server refuses a want of an unadvertised commit; the fetcher falls back to all refs.
    checkout = fetch_git(git_http.public, source_repo.first, tmp_path, shallow=True)
    assert checkout.commit == source_repo.first
    assert (tmp_path / "README.md").read_text() == "one\n"


def test_annotated_tag_checks_out_the_tagged_commit(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    checkout = fetch_git(git_http.public, "v1", tmp_path, shallow=True)
    assert checkout.commit == source_repo.first
    assert (tmp_path / "README.md").read_text() == "one\n"
    assert Repo(str(tmp_path)).refs[Ref(b"refs/tags/v1")] != source_repo.first.encode()  # the tag object


def test_abbreviated_sha_is_resolved(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    checkout = fetch_git(git_http.public, source_repo.first[:10], tmp_path)
    assert checkout.commit == source_repo.first


def test_missing_branch_names_revision_and_url(git_http: Any, tmp_path: Path) -> None:
    with pytest.raises(RefNotFound) as info:
        fetch_git(git_http.public, "no-such-branch", tmp_path)
    assert str(info.value) == f"revision 'no-such-branch' not found in {git_http.public}"


def test_commit_reachable_from_no_ref_is_not_found(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    with pytest.raises(RefNotFound, match=f"revision '{source_repo.orphan}' not found in"):
        fetch_git(git_http.public, source_repo.orphan, tmp_path)


def test_basic_auth_with_the_right_password(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    creds = GitCredentials(username="alice", password="correct-horse-battery")
    assert fetch_git(git_http.private, "master", tmp_path, credentials=creds).commit == source_repo.master


def test_token_is_sent_as_basic_auth_password(git_http: Any, source_repo: Any, tmp_path: Path) -> None:
    creds = GitCredentials(token="tok-0123456789abcdef")
    assert fetch_git(git_http.private, "master", tmp_path, credentials=creds).commit == source_repo.master


def test_wrong_password_is_an_auth_error_without_the_password(git_http: Any, tmp_path: Path) -> None:
    creds = GitCredentials(username="alice", password="wrong-password-123")
    with pytest.raises(AuthError) as info:
        fetch_git(git_http.private, "master", tmp_path, credentials=creds)
    message = str(info.value)
    assert message.startswith(f"authentication failed for {git_http.private}")
    assert "wrong-password-123" not in message


def test_no_credentials_for_a_private_repo_says_credentials_are_required(
    git_http: Any, tmp_path: Path
) -> None:
    with pytest.raises(AuthError, match="requires credentials"):
        fetch_git(git_http.private, "master", tmp_path)


def test_password_in_the_url_is_redacted_in_errors_and_not_recorded(
    git_http: Any, source_repo: Any, tmp_path: Path
) -> None:
    port = git_http.base.rsplit(":", 1)[1]
    bad = f"http://alice:not-it-9876@127.0.0.1:{port}/private/repo.git"
    (tmp_path / "bad").mkdir()
    with pytest.raises(AuthError) as info:
        fetch_git(bad, "master", tmp_path / "bad")
    assert "not-it-9876" not in str(info.value) and "alice:***@" in str(info.value)

    good = f"http://alice:correct-horse-battery@127.0.0.1:{port}/private/repo.git"
    dest = tmp_path / "good"
    dest.mkdir()
    assert fetch_git(good, "master", dest).commit == source_repo.master
    config = (dest / ".git" / "config").read_text()
    assert "correct-horse-battery" not in config


def test_unreachable_host_is_reported_as_such(closed_port: int, tmp_path: Path) -> None:
    with pytest.raises(UnreachableError, match=f"cannot reach 127.0.0.1:{closed_port}") as info:
        fetch_git(f"http://127.0.0.1:{closed_port}/repo.git", "main", tmp_path, timeout=10)
    # What happened, not "timed out" (urllib3 2.x makes the connection error a timeout subclass).
    assert "connection refused" in str(info.value) and "timed out" not in str(info.value), info.value


def test_unknown_repository_path_is_a_source_error(git_http: Any, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no git repository at"):
        fetch_git(f"{git_http.base}/public/nope.git", "main", tmp_path)


def test_refuses_a_non_empty_destination(git_http: Any, tmp_path: Path) -> None:
    (tmp_path / "stale").write_text("x")
    with pytest.raises(UsageError, match="not empty"):
        fetch_git(git_http.public, "master", tmp_path)


# --- a branch and a tag of one name ---------------------------------------------------------------


@dataclass
class Served:
    url: str
    branch: str  # head of branches master and v1
    tag: str  # the commit annotated tag v1 tags


@pytest.fixture
def same_name(tmp_path: Path) -> Iterator[Served]:
    """A repository on a loopback smart-HTTP server with branch v1 and tag v1 on different commits."""
    repo = Repo.init_bare(str(tmp_path / "served.git"), mkdir=True)
    made = same_name_repository(repo, {"which.txt": b"tag\n"}, {"which.txt": b"branch\n"}, default="master")
    with serve_git(repo, "/r.git") as url:
        yield Served(url, made.branch, made.tag)


def test_a_name_both_a_tag_and_a_branch_checks_out_the_tag(same_name: Served, tmp_path: Path) -> None:
    """git's rule (pko.git.refs): ``v1`` is the tag; the checkout is its commit, HEAD detached."""
    checkout = fetch_git(same_name.url, "v1", tmp_path / "out")
    assert (checkout.commit, checkout.ref) == (same_name.tag, "refs/tags/v1")
    assert (tmp_path / "out" / "which.txt").read_text() == "tag\n"
    assert _head(tmp_path / "out") == (None, same_name.tag)


@pytest.mark.parametrize("revision", ["refs/heads/v1", "heads/v1"])
def test_the_branch_of_a_shared_name_is_checked_out_by_its_full_name(
    same_name: Served, tmp_path: Path, revision: str
) -> None:
    checkout = fetch_git(same_name.url, revision, tmp_path / "out", shallow=True)
    assert (checkout.commit, checkout.ref) == (same_name.branch, "refs/heads/v1")
    assert (tmp_path / "out" / "which.txt").read_text() == "branch\n"
    assert _head(tmp_path / "out") == (b"refs/heads/v1", same_name.branch)


def test_the_commit_a_stack_resolved_its_branch_to_is_checked_out(same_name: Served, tmp_path: Path) -> None:
    """What a Stack tracking branch v1 hands its Workspace: the commit, not the ambiguous name."""
    checkout = fetch_git(same_name.url, same_name.branch, tmp_path / "out")
    assert checkout.commit == same_name.branch
    assert (tmp_path / "out" / "which.txt").read_text() == "branch\n"


# --- SSH ----------------------------------------------------------------------------------------


def test_ssh_with_key_and_known_hosts(git_ssh: Any, source_repo: Any, tmp_path: Path) -> None:
    creds = GitCredentials(ssh_private_key=git_ssh.client_key_pem, known_hosts=git_ssh.known_hosts)
    checkout = fetch_git(git_ssh.url, "feature", tmp_path, credentials=creds, timeout=20)
    assert checkout.commit == source_repo.feature
    assert (tmp_path / "feature.txt").exists()


def test_ssh_host_missing_from_known_hosts_is_refused(git_ssh: Any, tmp_path: Path) -> None:
    creds = GitCredentials(ssh_private_key=git_ssh.client_key_pem, known_hosts="")
    with pytest.raises(HostKeyError, match="not in known_hosts"):
        fetch_git(git_ssh.url, "master", tmp_path, credentials=creds, timeout=20)


def test_ssh_host_key_mismatch_is_refused(git_ssh: Any, tmp_path: Path) -> None:
    other = paramiko.ECDSAKey.generate()
    known = f"[{git_ssh.host}]:{git_ssh.port} {other.get_name()} {other.get_base64()}\n"
    creds = GitCredentials(ssh_private_key=git_ssh.client_key_pem, known_hosts=known)
    with pytest.raises(HostKeyError, match="does not match known_hosts"):
        fetch_git(git_ssh.url, "master", tmp_path, credentials=creds, timeout=20)


async def test_the_operators_branch_lookup_over_ssh_follows_the_same_rules(
    git_ssh: Any, source_repo: Any, new_ssh_key: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's ls-remote (no ssh client in its image) uses this SSH connection too: the key
    given, only hosts in known_hosts; known_hosts from the environment as go-git reads it."""
    key, url = git_ssh.client_key_pem, git_ssh.url
    creds = GitCredentials(ssh_private_key=key, known_hosts=git_ssh.known_hosts)
    assert await BranchResolver().head(url, "feature", creds, 60) == source_repo.feature

    for env in ("GIT_SSH_KNOWN_HOSTS", "GIT_SSH_KNOWN_HOSTS_FILE", "SSH_KNOWN_HOSTS", "HOME"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts
    known = tmp_path / "known_hosts"
    known.write_text(git_ssh.known_hosts)
    monkeypatch.setenv("SSH_KNOWN_HOSTS", str(known))
    assert (
        await BranchResolver().head(url, "master", GitCredentials(ssh_private_key=key), 60)
        == source_repo.master
    )

    refusals = [
        (GitCredentials(ssh_private_key=key, known_hosts=""), "host key verification failed"),
        (
            GitCredentials(ssh_private_key=new_ssh_key(), known_hosts=git_ssh.known_hosts),
            "authentication failed",
        ),
    ]
    for given, expected in refusals:
        with pytest.raises(GitLookupError) as info:
            await BranchResolver().head(url, "master", given, 60)
        message = str(info.value)
        assert message.startswith(f"listing {url}: {expected}"), message
        assert "PRIVATE KEY" not in message


def test_ssh_wrong_key_is_an_auth_error(git_ssh: Any, new_ssh_key: Any, tmp_path: Path) -> None:
    creds = GitCredentials(ssh_private_key=new_ssh_key(), known_hosts=git_ssh.known_hosts)
    with pytest.raises(AuthError, match="authentication failed for ssh://"):
        fetch_git(git_ssh.url, "master", tmp_path, credentials=creds, timeout=20)


def test_encrypted_key_without_passphrase_is_a_usage_error() -> None:
    encrypted = (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
        .decode()
    )
    with pytest.raises(UsageError, match="encrypted: give its passphrase as GIT_PASSWORD"):
        load_private_key(encrypted)
    with pytest.raises(UsageError, match="could not be decrypted"):
        load_private_key(encrypted, "not-the-passphrase")
    assert load_private_key(encrypted, "passphrase").get_name() == "ssh-ed25519"


def test_text_that_is_not_a_key_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="does not hold a private key"):
        load_private_key("ghp_notakey")


def test_ssh_commit_no_ref_points_at_falls_back_to_history(
    git_ssh: Any, source_repo: Any, tmp_path: Path
) -> None:
    creds = GitCredentials(ssh_private_key=git_ssh.client_key_pem, known_hosts=git_ssh.known_hosts)
    checkout = fetch_git(
        git_ssh.url, source_repo.first, tmp_path, shallow=True, credentials=creds, timeout=20
    )
    assert checkout.commit == source_repo.first
    assert (tmp_path / "README.md").read_text() == "one\n"


@pytest.mark.parametrize("url", ["file:///etc/repo.git", "/var/run/secrets/kubernetes.io/serviceaccount"])
def test_local_git_urls_are_refused_unless_allowed(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GIT_ALLOW_LOCAL", raising=False)
    with pytest.raises(UsageError, match=r"local git URL .* refused: set GIT_ALLOW_LOCAL=true"):
        parse_remote(url)
    monkeypatch.setenv("GIT_ALLOW_LOCAL", "true")
    assert parse_remote(url).transport == "local"


# --- HTTPS with a CA of the server's own ------------------------------------------------------


@pytest.fixture
def git_https(source_repo: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The source repository over HTTPS, its certificate signed by a CA no system trusts: its URL and
    the CA's PEM file."""
    tls = server_tls(tmp_path_factory.mktemp("git-tls"), "127.0.0.1")
    with serve_git(source_repo.repo, "/repo.git", tls=tls) as url:
        yield url, tls.ca


def _no_ca_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO"):
        monkeypatch.delenv(env, raising=False)


def test_a_private_git_ca_is_trusted_once_ssl_cert_file_or_git_ssl_cainfo_names_it(
    git_https: tuple[str, Path], source_repo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch trusts what OpenSSL's environment names (``SSL_CERT_FILE``, which the Go operator's
    agent, Go's crypto/x509, reads too) or git's (``GIT_SSL_CAINFO``); an unknown CA is refused as
    such, before anything is fetched."""
    url, ca = git_https
    _no_ca_given(monkeypatch)
    (untrusted := tmp_path / "untrusted").mkdir()
    with pytest.raises(UnreachableError) as info:
        fetch_git(url, "master", untrusted, timeout=20)
    message = str(info.value)
    assert message.startswith(f"cannot reach {urlsplit(url).netloc} for {url}: "), message
    assert "TLS handshake failed" in message and "CERTIFICATE_VERIFY_FAILED" in message, message
    for env in ("SSL_CERT_FILE", "GIT_SSL_CAINFO"):
        _no_ca_given(monkeypatch)
        monkeypatch.setenv(env, str(ca))
        (dest := tmp_path / env).mkdir()
        checkout = fetch_git(url, "feature", dest, timeout=20)
        assert checkout.commit == source_repo.feature, env
        assert (dest / "feature.txt").read_text() == "feature\n", env


async def test_the_operators_branch_lookup_trusts_a_private_git_ca_given_by_ssl_cert_file(
    git_https: tuple[str, Path], source_repo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's ls-remote (from its own pod) trusts the CA its environment names, as the Go
    operator's (go-git on Go's crypto/x509) does: the same ``SSL_CERT_FILE`` serves both."""
    url, ca = git_https
    _no_ca_given(monkeypatch)
    with pytest.raises(GitLookupError) as info:
        await BranchResolver().head(url, "master", GitCredentials(), 60)
    assert str(info.value).startswith(f"listing {url}: "), info.value
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value), info.value
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert await BranchResolver().head(url, "feature", GitCredentials(), 60) == source_repo.feature


def test_a_cross_origin_redirect_never_carries_the_credentials(tmp_path: Path) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[dict[str, str]] = []

    class Other(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
    other_port = other.server_address[1]

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other_port}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    first = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (other, first):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://alice:s3cret-token@127.0.0.1:{first.server_address[1]}/repo.git"
        with pytest.raises(SourceError):
            fetch_git(url, "main", tmp_path / "out", timeout=10)
    finally:
        first.shutdown()
        other.shutdown()
    assert seen, "the redirect was not followed (the test proves nothing)"
    for headers in seen:
        assert "authorization" not in headers, headers
        assert "s3cret-token" not in " ".join(headers.values())

"""pko/devtools/gitserver.py, the tests' git server: over HTTPS with a CA of its own (trusted by a
client that names it, refused by one that does not, without stopping the server), and serving a clone
that asks for no side-band, as go-git's (the Go operator's fetch) does."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.repo import Repo

from pko.devtools.gitserver import ServerTLS, git_commit, serve_git, server_tls


def _pkt(line: bytes) -> bytes:
    return b"%04x" % (len(line) + 4) + line


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, ServerTLS]]:
    """A repository over HTTPS on loopback: its URL, its head commit and the server's TLS files."""
    repo = Repo.init_bare(str(tmp_path / "repo.git"), mkdir=True)
    head = git_commit(repo, {"Pulumi.yaml": b"name: a\nruntime: yaml\n"}, b"one\n")
    tls = server_tls(tmp_path / "tls", "127.0.0.1")
    with serve_git(repo, tls=tls) as url:
        yield url, head, tls


def _refs(url: str, context: ssl.SSLContext | None) -> bytes:
    with urllib.request.urlopen(f"{url}/info/refs?service=git-upload-pack", timeout=10, context=context) as r:
        body: bytes = r.read()
    return body


def test_https_is_trusted_by_a_client_naming_its_ca_and_refused_otherwise(
    served: tuple[str, str, ServerTLS],
) -> None:
    url, head, tls = served
    assert url.startswith("https://127.0.0.1:") and url.endswith("/repo.git"), url
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _refs(url, ssl.create_default_context())
    # the refused handshake held up nothing: the next client, trusting the CA, is served
    assert head.encode() + b" refs/heads/main" in _refs(url, ssl.create_default_context(cafile=tls.ca))


def test_a_clone_asking_for_no_side_band_gets_the_pack_as_git_sends_it(
    served: tuple[str, str, ServerTLS],
) -> None:
    """go-git's clone (the Go operator's fetch) asks for ofs-delta alone: git's upload-pack answers
    with the pack itself after NAK, where dulwich's refused it (side-band-64k and thin-pack required)."""
    url, head, tls = served
    body = _pkt(f"want {head} ofs-delta agent=go-git/5.x\n".encode()) + b"0000" + _pkt(b"done\n")
    request = urllib.request.Request(
        f"{url}/git-upload-pack",
        data=body,
        headers={"Content-Type": "application/x-git-upload-pack-request"},
    )
    context = ssl.create_default_context(cafile=tls.ca)
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        answer = r.read()
    assert answer[:8] == b"0008NAK\n", answer[:64]
    assert answer[8:12] == b"PACK", answer[:64]  # raw, not in side-band pkt-lines

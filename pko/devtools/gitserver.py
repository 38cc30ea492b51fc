"""Git repositories served on loopback, for tests of either caller of :mod:`pko.git` (the
operator's branch lookup and the agent's fetch): :func:`serve_wsgi`, :func:`serve_git`,
:func:`git_commit` and :func:`same_name_repository` (a branch and a tag of one name). Over plain HTTP,
or over HTTPS with a certificate of a CA of the test's own (:func:`server_tls`), which clients trust as
users trust a private git CA (``SSL_CERT_FILE``)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from dulwich.objects import Blob, Commit, ObjectID, Tag, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend, UploadPackHandler
from dulwich.web import make_wsgi_chain

__all__ = [
    "SameName",
    "ServerTLS",
    "git_app",
    "git_commit",
    "same_name_repository",
    "serve_git",
    "serve_wsgi",
    "server_tls",
]

HANDSHAKE_TIMEOUT = 30.0  # seconds a client has to finish its TLS handshake


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True


@dataclass(frozen=True)
class ServerTLS:
    """A server's certificate and key (PEM files) and the CA that signed it (``ca``: what a client
    trusts, e.g. the file ``SSL_CERT_FILE`` names)."""

    ca: Path
    cert: Path
    key: Path


def server_tls(directory: Path, host: str) -> ServerTLS:
    """A CA of the test's own and a server certificate it signs for the IP address ``host`` (and
    ``localhost``), valid a day, written to ``directory`` (``ca.crt``, ``server.crt``, ``server.key``)."""
    from pko.devtools.fakeapiserver import issue  # cryptography: only for HTTPS

    ca, ca_cert, ca_key = issue("pko test git CA", ca=True)
    server, _, _ = issue(host, issuer=(ca_cert, ca_key), ip=host)
    cert, key = server.write(directory, "server")
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    return ServerTLS(directory / "ca.crt", cert, key)


class _TLSThreading(_Threading):
    """HTTPS: each connection's handshake in its request's thread, so a client that never finishes
    one (or refuses the certificate) holds up no other."""

    context: ssl.SSLContext

    def setup_environ(self) -> None:
        super().setup_environ()
        self.base_environ["HTTPS"] = "on"  # wsgiref's url_scheme: https

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(HANDSHAKE_TIMEOUT)
            request.do_handshake()
            request.settimeout(None)
        except OSError:  # ssl.SSLError too: a client that does not trust the CA
            return
        super().finish_request(request, client_address)


@contextlib.contextmanager
def serve_wsgi(app: Any, host: str = "127.0.0.1", tls: ServerTLS | None = None) -> Iterator[str]:
    """``app`` served on a free port of ``host`` (loopback, or the e2e node's own address, which
    workspace pods reach), a thread per request, without a request log: its base URL. With ``tls``
    (:func:`server_tls`), over HTTPS with its certificate."""
    server: _Threading
    if tls is None:
        server = make_server(host, 0, app, server_class=_Threading, handler_class=_Quiet)
    else:
        https = make_server(host, 0, app, server_class=_TLSThreading, handler_class=_Quiet)
        https.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        https.context.load_cert_chain(tls.cert, tls.key)
        server = https
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'http' if tls is None else 'https'}://{host}:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


class UploadPack(UploadPackHandler):
    """dulwich's upload-pack, serving any client as git's does: dulwich's requires the client to ask
    for side-band-64k, thin-pack and ofs-delta, which go-git (the Go operator's fetch, through the
    Automation API's clone) does not, and refuses it ("Client does not support required capability");
    without side-band it sends the pack as it is, as git does."""

    @classmethod
    def required_capabilities(cls) -> tuple[bytes, ...]:
        return ()


def git_app(repos: Mapping[str, BackendRepo]) -> Any:
    """A WSGI app serving ``repos`` (path -> repository) over git's smart HTTP, to git's clients,
    dulwich's (pko's) and go-git (the Go operator's)."""
    return make_wsgi_chain(DictBackend(dict(repos)), handlers={b"git-upload-pack": UploadPack})


@contextlib.contextmanager
def serve_git(
    repo: Repo, path: str = "/repo.git", host: str = "127.0.0.1", tls: ServerTLS | None = None
) -> Iterator[str]:
    """``repo`` served over git's smart HTTP (HTTPS with ``tls``) at ``path`` (:func:`git_app`): its
    URL."""
    with serve_wsgi(git_app({path: repo}), host, tls) as base:
        yield base + path


def git_commit(
    repo: Repo, files: dict[str, bytes], message: bytes, *, branch: str = "main", when: int | None = None
) -> str:
    """Commit ``files`` (path -> content, ``/`` makes folders) to ``branch`` of ``repo``, after the
    branch's head if it has one, at ``when`` (default: now): the new commit's id."""
    ref = Ref(f"refs/heads/{branch}".encode())
    commit = Commit()
    commit.tree = _tree(repo, files).id
    commit.parents = [repo.refs[ref]] if ref in repo.refs else []
    commit.author = commit.committer = b"Test <test@example.com>"
    commit.commit_time = commit.author_time = int(time.time()) if when is None else when
    commit.commit_timezone = commit.author_timezone = 0
    commit.message = message
    repo.object_store.add_object(commit)
    repo.refs[ref] = commit.id
    return commit.id.decode()


def _tree(repo: Repo, files: dict[str, bytes]) -> Tree:
    tree = Tree()
    folders: dict[str, dict[str, bytes]] = {}
    for path, data in files.items():
        name, slash, rest = path.partition("/")
        if slash:
            folders.setdefault(name, {})[rest] = data
            continue
        blob = Blob.from_string(data)
        repo.object_store.add_object(blob)
        tree.add(name.encode(), 0o100644, blob.id)
    for name, inner in folders.items():
        tree.add(name.encode(), 0o040000, _tree(repo, inner).id)
    repo.object_store.add_object(tree)
    return tree


@dataclass(frozen=True)
class SameName:
    """Branch ``v1`` (and the default branch) at ``branch``; annotated tag ``v1`` of ``tag``."""

    branch: str
    tag: str


def same_name_repository(
    repo: Repo, tagged: dict[str, bytes], head: dict[str, bytes], *, default: str
) -> SameName:
    """Make ``repo`` hold a branch and an annotated tag both named ``v1`` on different commits
    (``tagged``'s files and ``head``'s), the branch also as ``default``: git's rule reads plain
    ``v1`` as the tag, a Stack's branch ``v1`` is the branch."""
    tag_commit = git_commit(repo, tagged, b"tagged\n", branch="tagged", when=1_700_000_000)
    branch_commit = git_commit(repo, head, b"head\n", branch=default, when=1_700_000_100)
    del repo.refs[Ref(b"refs/heads/tagged")]
    tag = Tag()
    tag.name, tag.object = b"v1", (Commit, tag_commit.encode())
    tag.tagger = b"T <t@example.com>"
    tag.tag_time, tag.tag_timezone, tag.message = 1_700_000_050, 0, b"release one"
    repo.object_store.add_object(tag)
    repo.refs[Ref(b"refs/heads/v1")] = ObjectID(branch_commit.encode())
    repo.refs[Ref(b"refs/tags/v1")] = tag.id
    return SameName(branch_commit, tag_commit)

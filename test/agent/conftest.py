"""Fixtures for the source-fetching tests (`agent init`): real servers on 127.0.0.1, started here.

- `source_repo`: a git repository built with dulwich, with branches, tags and history to resolve.
- `git_http`: dulwich's smart-HTTP WSGI app under wsgiref; ``/private/`` requires basic auth.
- `git_ssh`: pko.devtools.gitssh's server (dulwich's upload-pack over paramiko) on loopback.
- `artifact_http`: a plain HTTP server serving byte strings (tarballs) by path.

And for the tests of the agent's apiserver client (test_kubeapi_*): `pki` (a CA and its certificates)
and `fake`, the scripted HTTPS apiserver of pko/devtools/fakeapiserver.py, started with them.

It also registers the session fixtures of pko/devtools/agents.py (`agent_binary`, `auth_world`) for every
test in this directory. A session fixture imported into two test modules is two fixtures, each run
once per session: importing `agent_binary` into both image tests built the agent twice.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dulwich import porcelain
from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import Ref
from dulwich.repo import Repo
from dulwich.server import DictBackend
from dulwich.web import make_wsgi_chain

from pko.devtools.agents import agent_binary, auth_world
from pko.devtools.fakeapiserver import PKI, FakeAPIServer, make_pki
from pko.devtools.gitserver import serve_wsgi
from pko.devtools.gitssh import GitSSH, new_ed25519_openssh, serve_git_ssh

__all__ = ["agent_binary", "auth_world"]

USER = "alice"
PASSWORD = "correct-horse-battery"
TOKEN = "tok-0123456789abcdef"
IDENT = b"Test <test@example.com>"


@dataclass
class SourceRepo:
    """The served repository and the commits tests refer to by role."""

    repo: Repo
    path: Path
    first: str  # master~1, also annotated tag v1; not a ref tip
    master: str  # tip of master, also lightweight tag "light"
    feature: str  # tip of branch "feature"
    orphan: str  # in the object store, reachable from no ref


def _commit(repo: Repo, root: Path, files: dict[str, str], message: str) -> str:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    porcelain.add(repo, [str(root / name) for name in files])
    sha = porcelain.commit(repo, message=message.encode(), author=IDENT, committer=IDENT)
    return sha.decode() if isinstance(sha, bytes) else str(sha)


@pytest.fixture(scope="session")
def source_repo(tmp_path_factory: pytest.TempPathFactory) -> SourceRepo:
    root = tmp_path_factory.mktemp("source-repo")
    repo = Repo.init(str(root), default_branch=b"master")
    first = _commit(
        repo, root, {"README.md": "one\n", "proj/Pulumi.yaml": "name: one\nruntime: yaml\n"}, "one"
    )
    master = _commit(
        repo, root, {"README.md": "two\n", "proj/Pulumi.yaml": "name: two\nruntime: yaml\n"}, "two"
    )
    feature = _commit(repo, root, {"feature.txt": "feature\n"}, "feature work")
    repo.refs[Ref(b"refs/heads/feature")] = ObjectID(feature.encode())
    repo.refs[Ref(b"refs/heads/master")] = ObjectID(master.encode())
    porcelain.tag_create(repo, b"v1", author=IDENT, message=b"release one", annotated=True, objectish=first)
    repo.refs[Ref(b"refs/tags/light")] = ObjectID(master.encode())

    blob = Blob.from_string(b"orphan\n")
    tree = Tree()
    tree.add(b"orphan.txt", 0o100644, blob.id)
    orphan = Commit()
    orphan.tree = tree.id
    orphan.author = orphan.committer = IDENT
    orphan.author_time = orphan.commit_time = 1_700_000_000
    orphan.author_timezone = orphan.commit_timezone = 0
    orphan.message = b"orphan\n"
    for obj in (blob, tree, orphan):
        repo.object_store.add_object(obj)
    return SourceRepo(repo, root, first, master, feature, orphan.id.decode())


def _basic_auth(app: Any) -> Any:
    """Require basic auth under /private/: alice's password, or the token with any username."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO", "").startswith("/private/"):
            header = environ.get("HTTP_AUTHORIZATION", "")
            ok = False
            if header.startswith("Basic "):
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                ok = (user, password) == (USER, PASSWORD) or password == TOKEN
            if not ok:
                start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="git"')])
                return [b"unauthorized\n"]
        return app(environ, start_response)

    return wrapped


@dataclass
class GitHTTP:
    base: str  # http://127.0.0.1:PORT

    @property
    def public(self) -> str:
        return f"{self.base}/public/repo.git"

    @property
    def private(self) -> str:
        return f"{self.base}/private/repo.git"


@pytest.fixture(scope="session")
def git_http(source_repo: SourceRepo) -> Iterator[GitHTTP]:
    repos: dict[str, Any] = {"/public/repo.git": source_repo.repo, "/private/repo.git": source_repo.repo}
    with serve_wsgi(_basic_auth(make_wsgi_chain(DictBackend(repos)))) as base:
        yield GitHTTP(base)


@pytest.fixture(scope="session")
def git_ssh(source_repo: SourceRepo) -> Iterator[GitSSH]:
    with serve_git_ssh({"/repo.git": source_repo.repo}, new_ed25519_openssh()) as server:
        yield server


@dataclass
class ArtifactHTTP:
    base: str
    routes: dict[str, list[tuple[int, bytes]]]  # path -> responses, the last one repeats
    hits: dict[str, int]

    def serve(self, path: str, body: bytes, *, failures: list[int] | None = None) -> str:
        self.routes[path] = [(code, b"failure\n") for code in failures or []] + [(200, body)]
        self.hits[path] = 0
        return f"{self.base}{path}"


@pytest.fixture(scope="session")
def artifact_http() -> Iterator[ArtifactHTTP]:
    routes: dict[str, list[tuple[int, bytes]]] = {}
    hits: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            with lock:
                responses = routes.get(path)
                index = hits.get(path, 0)
                hits[path] = index + 1
            if responses is None:
                status, body = 404, b"not found\n"
            else:
                status, body = responses[min(index, len(responses) - 1)]
            self.send_response(status)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ArtifactHTTP(f"http://127.0.0.1:{server.server_port}", routes, hits)
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def new_ssh_key() -> Any:
    """A factory of fresh ed25519 private keys in OpenSSH format."""
    return new_ed25519_openssh


@pytest.fixture(scope="module")
def pki() -> PKI:
    return make_pki()


@pytest.fixture
async def fake(pki: PKI) -> AsyncIterator[FakeAPIServer]:
    server = FakeAPIServer(pki)
    await server.start()
    yield server
    await server.stop()

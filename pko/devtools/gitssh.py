"""Git over SSH for tests: paramiko's server side running dulwich's upload-pack for
``git-upload-pack <path>`` requests (read-only), user ``git`` with one authorized key. Both callers of
:mod:`pko.git` over SSH meet it: the agent's fetch (test/agent, on loopback) and, on the e2e node's
address, the operator's branch lookup and the workspace's fetch (examples/git-ssh).

:func:`serve_git_ssh` serves ``repos`` (path -> repository) on a thread per connection;
:func:`fixed_host_key` is a host key that is the same in every run, for a known_hosts that must be
written before the server starts (the operator's, at install time). Test keys only: never trust them."""

from __future__ import annotations

import contextlib
import hashlib
import io
import shlex
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from dulwich.protocol import Protocol
from dulwich.repo import Repo
from dulwich.server import BackendRepo, DictBackend
from paramiko.common import (
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)

# git's upload-pack as the suite's HTTPS servers serve it: to clients that ask for no side-band too
# (go-git's clone: the Go operator's fetch), which dulwich's own refuses.
from pko.devtools.gitserver import UploadPack

__all__ = ["GitSSH", "fixed_host_key", "new_ed25519_openssh", "serve_git_ssh"]


def _openssh(key: ed25519.Ed25519PrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()


def new_ed25519_openssh() -> str:
    """A fresh ed25519 private key in OpenSSH format (what ``GIT_SSH_PRIVATE_KEY`` holds)."""
    return _openssh(ed25519.Ed25519PrivateKey.generate())


def fixed_host_key(name: str) -> paramiko.PKey:
    """An ed25519 host key derived from ``name``: the same in every run, public in effect."""
    seed = hashlib.sha256(f"pko test host key: {name}".encode()).digest()
    pem = _openssh(ed25519.Ed25519PrivateKey.from_private_bytes(seed))
    return paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


def known_hosts_line(host: str, port: int, key: paramiko.PKey) -> str:
    """The known_hosts line for ``key`` at ``host``: the bare host on port 22, else ``[host]:port``."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def _read_exact(channel: paramiko.Channel) -> Callable[[int], bytes]:
    def read(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = channel.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    return read


class _GitSSHInterface(paramiko.ServerInterface):
    def __init__(self, authorized: paramiko.PKey, backend: DictBackend) -> None:
        self._authorized = authorized
        self._backend = backend

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if username == "git" and key.get_base64() == self._authorized.get_base64():
            return AUTH_SUCCESSFUL
        return AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_env_request(self, channel: paramiko.Channel, name: bytes, value: bytes) -> bool:
        return True

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        argv = shlex.split(command.decode())
        if len(argv) != 2 or argv[0] != "git-upload-pack":
            return False
        threading.Thread(target=self._serve, args=(channel, argv[1]), daemon=True).start()
        return True

    def _serve(self, channel: paramiko.Channel, path: str) -> None:
        # A client may hang up once it has what it asked for (a branch lookup reads the refs only):
        # nothing is left to tell it then.
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            try:
                proto = Protocol(_read_exact(channel), channel.sendall)
                UploadPack(self._backend, [path], proto).handle()
                channel.send_exit_status(0)
            except (EOFError, OSError, paramiko.SSHException):
                raise
            except Exception as exc:
                channel.sendall_stderr(f"ERROR: {exc}\n".encode())
                channel.send_exit_status(1)
            finally:
                channel.close()


@dataclass
class GitSSH:
    host: str
    port: int
    host_key: paramiko.PKey
    client_key_pem: str  # OpenSSH format, what GIT_SSH_PRIVATE_KEY holds
    transports: list[paramiko.Transport] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"ssh://git@{self.host}:{self.port}/repo.git"

    @property
    def known_hosts(self) -> str:
        return known_hosts_line(self.host, self.port, self.host_key)


@contextlib.contextmanager
def serve_git_ssh(
    repos: Mapping[str, Repo],
    client_key_pem: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    host_key: paramiko.PKey | None = None,
) -> Iterator[GitSSH]:
    """``repos`` served over SSH on ``host`` (``port`` 0: a free one) to user ``git`` with the public
    half of ``client_key_pem``; a fresh ECDSA host key unless one is given."""
    key = host_key or paramiko.ECDSAKey.generate()
    authorized = paramiko.Ed25519Key.from_private_key(io.StringIO(client_key_pem))
    backend_repos: dict[str, BackendRepo] = dict(repos)
    backend = DictBackend(backend_repos)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(16)
    server = GitSSH(host, listener.getsockname()[1], key, client_key_pem)
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            server.transports.append(transport)
            try:
                transport.start_server(server=_GitSSHInterface(authorized, backend))
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        yield server
    finally:
        stop.set()
        # shutdown wakes the thread blocked in accept(); close alone leaves the port bound until then.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for transport in server.transports:
            transport.close()

"""Git over SSH for dulwich, in-process through paramiko, with strict host key checking: the
operator's branch lookups and the agent's fetch.

Why paramiko and not dulwich's default vendor: the default shells out to an `ssh` binary, which
neither the operator's nor the agent's slim image carries, and it needs the key and known_hosts
written to files with the right modes. Here both stay in memory.

Which hosts are trusted is the environment's to say, as go-git (the Go operator's git) reads it:
:func:`known_hosts` takes ``GIT_SSH_KNOWN_HOSTS`` (contents), ``GIT_SSH_KNOWN_HOSTS_FILE`` and
``SSH_KNOWN_HOSTS`` (files), else ``~/.ssh/known_hosts`` and ``/etc/ssh/ssh_known_hosts``.

Invariants: a server whose host key is not in the known_hosts given (or differs from it) is refused
before any credential is sent; no agent, no key files from ``~/.ssh`` and no password authentication
are tried - only the private key the pod was given.
"""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import cast

import paramiko
from dulwich.client import GitClient, SSHGitClient, SSHVendor

from pko.git.credentials import GitCredentials
from pko.git.errors import AuthError, HostKeyError, UnreachableError, UsageError
from pko.git.remote import Remote

__all__ = [
    "DEFAULT_KNOWN_HOSTS_FILES",
    "ParamikoSSHVendor",
    "known_hosts",
    "load_private_key",
    "parse_known_hosts",
    "ssh_client",
]

DEFAULT_KNOWN_HOSTS_FILES = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")

DEFAULT_SSH_USER = "git"
_KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (
    paramiko.Ed25519Key,
    paramiko.ECDSAKey,
    paramiko.RSAKey,
)


def load_private_key(text: str, passphrase: str | None = None) -> paramiko.PKey:
    """Parse an OpenSSH or PEM private key (ed25519, ECDSA or RSA) given as text.

    Raises UsageError naming the problem (encrypted without passphrase, wrong passphrase, not a key);
    the key material never appears in a message.
    """
    if "PRIVATE KEY" not in text:
        raise UsageError(
            "the SSH private key (sshAuth.sshPrivateKey, GIT_SSH_PRIVATE_KEY) does not hold a private key "
            "(expected a '-----BEGIN ... PRIVATE KEY-----' block)"
        )
    normalized = text.strip().replace("\r\n", "\n") + "\n"
    last_error: Exception | None = None
    for key_class in _KEY_CLASSES:
        try:
            return key_class.from_private_key(io.StringIO(normalized), password=passphrase)
        except paramiko.PasswordRequiredException as exc:
            raise UsageError(
                "the SSH private key is encrypted: give its passphrase as GIT_PASSWORD (sshAuth.password)"
            ) from exc
        except (paramiko.SSHException, ValueError, TypeError) as exc:
            last_error = exc
    if passphrase and _is_encrypted(normalized):
        raise UsageError(
            "the SSH private key could not be decrypted with the passphrase given "
            "(GIT_PASSWORD, sshAuth.password)"
        )
    raise UsageError(
        "the SSH private key could not be parsed: only ed25519, ECDSA and RSA keys "
        f"in OpenSSH or PEM format are supported ({type(last_error).__name__})"
    )


def _is_encrypted(text: str) -> bool:
    for key_class in _KEY_CLASSES:
        try:
            key_class.from_private_key(io.StringIO(text), password=None)
        except paramiko.PasswordRequiredException:
            return True
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    return False


def parse_known_hosts(texts: Iterable[str]) -> paramiko.HostKeys:
    """Build a host key set from known_hosts contents (OpenSSH format, hashed names allowed).

    Lines paramiko cannot read (markers such as ``@cert-authority``, unknown key types) are
    skipped, as OpenSSH does; a set with no usable entry is still returned - the connection
    then fails with a HostKeyError that says so.
    """
    keys = paramiko.HostKeys()
    for text in texts:
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except (paramiko.SSHException, ValueError):
                continue
            if entry is None or entry.key is None:
                continue
            for hostname in entry.hostnames:
                keys.add(hostname, entry.key.get_name(), entry.key)
    return keys


def known_hosts_name(host: str, port: int | None) -> str:
    """The name OpenSSH (and paramiko) look a host up by: ``host`` on port 22, else ``[host]:port``."""
    if port is None or port == 22:
        return host
    return f"[{host}]:{port}"


class _ChannelConnection:
    """The socket-like object dulwich's Protocol reads and writes: one exec channel."""

    def __init__(self, client: paramiko.SSHClient, channel: paramiko.Channel) -> None:
        self._client = client
        self._channel = channel
        self._channel.setblocking(True)

    @property
    def stderr(self) -> paramiko.channel.ChannelStderrFile:
        return self._channel.makefile_stderr("rb")

    def can_read(self) -> bool:
        return self._channel.recv_ready()

    def write(self, data: bytes) -> None:
        """Send ``data``, unless the server has ended the command: a server that refuses what was asked
        (a commit no ref points at, for a shallow fetch) says so and hangs up while the client is still
        writing; what it said is then read next, as git does, instead of the write's ``Socket is
        closed``, which looked like a transport failure."""
        try:
            self._channel.sendall(data)
        except OSError:
            if not (self._channel.closed or self._channel.exit_status_ready()):
                raise

    def read(self, n: int | None = None) -> bytes:
        """Read exactly `n` bytes (dulwich's pkt-line reader relies on that) or up to EOF."""
        if n is None:
            chunks = []
            while chunk := self._channel.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)
        buf = bytearray()
        while len(buf) < n:
            chunk = self._channel.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def close(self, timeout: int | None = None) -> None:
        self._channel.close()
        self._client.close()


class ParamikoSSHVendor:
    """A dulwich SSH vendor that authenticates with one in-memory key against known host keys."""

    def __init__(
        self,
        host_keys: paramiko.HostKeys,
        pkey: paramiko.PKey | None,
        timeout: float = 30.0,
        protocol_version: int | None = None,
    ) -> None:
        self._host_keys = host_keys
        self._pkey = pkey
        self._timeout = timeout
        self._protocol_version = protocol_version

    def run_command(
        self,
        host: str,
        command: bytes | str,
        username: str | None = None,
        port: int | None = None,
        password: str | None = None,
        key_filename: str | None = None,
        ssh_command: str | None = None,
        protocol_version: int | None = None,
    ) -> _ChannelConnection:
        """Connect, verify the host key, authenticate with the key and start `command`.

        `password`, `key_filename` and `ssh_command` come from dulwich's generic signature and
        are ignored on purpose: credentials come only from the constructor.
        """
        where = known_hosts_name(host, port)
        if self._host_keys.lookup(where) is None:
            raise HostKeyError(
                f"host key verification failed for {where}: the host is not in known_hosts "
                "(give its key in GIT_SSH_KNOWN_HOSTS, or a known_hosts file in SSH_KNOWN_HOSTS)"
            )
        client = paramiko.SSHClient()
        for name, keys in self._host_keys.items():
            for key_type, key in keys.items():
                client.get_host_keys().add(name, key_type, key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                host,
                port=port or 22,
                username=username or DEFAULT_SSH_USER,
                pkey=self._pkey,
                allow_agent=False,
                look_for_keys=False,
                timeout=self._timeout,
                banner_timeout=self._timeout,
                auth_timeout=self._timeout,
                channel_timeout=self._timeout,
            )
            transport = client.get_transport()
            if transport is None:  # connect() succeeded, so this is only a guard
                raise UnreachableError(f"SSH connection to {where} closed unexpectedly")
            channel = transport.open_session(timeout=self._timeout)
            version = protocol_version if protocol_version is not None else self._protocol_version
            if version:
                # Servers that do not accept env requests ignore this (want_reply is false).
                channel.set_environment_variable("GIT_PROTOCOL", f"version={version}")
            channel.exec_command(command.decode() if isinstance(command, bytes) else command)
        except BaseException as exc:
            client.close()
            raise _translate(exc, where, has_key=self._pkey is not None) from exc
        return _ChannelConnection(client, channel)


def _translate(exc: BaseException, where: str, *, has_key: bool) -> BaseException:
    """Map paramiko and socket failures to the source errors `agent init` reports."""
    if isinstance(exc, HostKeyError | UnreachableError | AuthError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyError(
            f"host key verification failed for {where}: the server's {exc.key.get_name()} key "
            "does not match known_hosts (possible man-in-the-middle, or the host key changed)"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        where_key = "sshAuth.sshPrivateKey, GIT_SSH_PRIVATE_KEY"
        hint = (
            f"check the SSH private key ({where_key})"
            if has_key
            else f"no SSH private key given ({where_key})"
        )
        return AuthError(f"authentication failed for ssh://{where}: {hint}")
    if isinstance(exc, socket.gaierror):
        return UnreachableError(f"cannot reach {where}: name resolution failed ({exc.strerror})")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | ConnectionError):
        return UnreachableError(f"cannot reach {where}: connection refused")
    if isinstance(exc, TimeoutError | socket.timeout):
        return UnreachableError(f"cannot reach {where}: timed out")
    if isinstance(exc, paramiko.SSHException):
        if "not found in known_hosts" in str(exc):
            return HostKeyError(f"host key verification failed for {where}: the host is not in known_hosts")
        return UnreachableError(f"SSH session with {where} failed: {exc}")
    if isinstance(exc, OSError):
        return UnreachableError(f"cannot reach {where}: {exc.strerror or exc}")
    return exc


def ssh_client(remote: Remote, creds: GitCredentials, timeout: float) -> GitClient:
    """A dulwich client for an SSH remote that trusts only ``creds.known_hosts`` and presents only
    ``creds.ssh_private_key``."""
    assert remote.host is not None
    pkey = load_private_key(creds.ssh_private_key, creds.password) if creds.ssh_private_key else None
    vendor = ParamikoSSHVendor(parse_known_hosts([creds.known_hosts or ""]), pkey, timeout=timeout)
    # dulwich types vendors as its SSHVendor class but only calls run_command (duck typing).
    return SSHGitClient(
        remote.host, port=remote.port, username=remote.username, vendor=cast(SSHVendor, vendor)
    )


def known_hosts(env: Mapping[str, str] = os.environ, files: Iterable[str] = ()) -> str:
    """The known_hosts the environment trusts: ``GIT_SSH_KNOWN_HOSTS`` (contents), then ``files``,
    ``GIT_SSH_KNOWN_HOSTS_FILE`` and ``SSH_KNOWN_HOSTS`` (go-git's: a list of files); with none of
    them, the OpenSSH defaults that exist. A file named but unreadable is a :class:`UsageError`."""
    texts: list[str] = []
    if env.get("GIT_SSH_KNOWN_HOSTS"):
        texts.append(env["GIT_SSH_KNOWN_HOSTS"])
    paths = list(files)
    if env.get("GIT_SSH_KNOWN_HOSTS_FILE"):
        paths.append(env["GIT_SSH_KNOWN_HOSTS_FILE"])
    if env.get("SSH_KNOWN_HOSTS"):
        paths += [f for f in env["SSH_KNOWN_HOSTS"].split(os.pathsep) if f]
    texts += [_read(path) for path in paths]
    if not texts:
        texts = [_read(path) for path in DEFAULT_KNOWN_HOSTS_FILES if Path(path).expanduser().is_file()]
    return "\n".join(texts)


def _read(path: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise UsageError(f"cannot read known_hosts from {path}: {exc.strerror or exc}") from None

"""The metrics server's TLS: a certificate from a directory, or a self-signed one made at start.

As controller-runtime's secure metrics server: given a directory (``--metrics-cert-dir``, where
cert-manager or a mounted Secret puts ``tls.crt`` and ``tls.key``), serve that pair and pick up a
renewed one (its files' modification times are compared on each new connection, so a rotated
Secret is served without a restart); otherwise generate a self-signed certificate in memory at
start (Prometheus then scrapes with ``insecure_skip_verify``, or a CA it is given). TLS 1.2 or newer.

The self-signed pair is made by ``cryptography`` in a short-lived child process (``python -m
pko.machinery.servingcert HOST...``, which writes the PEM certificate and key to a pipe), so the
library (about 16 MB resident, issue 44) is never loaded into the serving process for a task done
once at start; a frozen executable (the agent's PyInstaller bundle), which cannot run ``-m``, makes
it in process. The operator starts that child first thing (:func:`start_self_signed`), so it runs
beside the operator's imports of its reconcilers instead of between them and its campaign for the
Lease. The key never touches a disk: ``ssl`` loads certificates from files only, so the PEM is handed
over through an anonymous in-memory file (``memfd_create``, Linux), or a private temporary directory
removed at once where that is missing.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
from typing import Final

__all__ = [
    "CERT_NAME",
    "KEY_NAME",
    "CertSource",
    "default_hosts",
    "self_signed",
    "self_signed_apart",
    "start_self_signed",
]

# controller-runtime's names (and those of a kubernetes.io/tls Secret).
CERT_NAME: Final = "tls.crt"
KEY_NAME: Final = "tls.key"
SELF_SIGNED_VALIDITY: Final = datetime.timedelta(days=365)
# How long the child making a self-signed pair may take (an interpreter start and one import: well
# under a second on an idle machine).
CHILD_TIMEOUT: Final = 120.0
_MODULE: Final = "pko.machinery.servingcert"  # run as the child: python -m _MODULE HOST...
_KEY_BEGIN: Final = b"-----BEGIN PRIVATE KEY-----"


def self_signed(hosts: list[str]) -> tuple[bytes, bytes]:
    """A PEM certificate and key (ECDSA P-256) for ``hosts`` (names or IP addresses), valid a year,
    made in this process (which then holds ``cryptography``: see :func:`self_signed_apart`)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{hosts[0]}@pko-metrics")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + SELF_SIGNED_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def default_hosts() -> list[str]:
    """The names a self-signed certificate is for unless told otherwise (:class:`CertSource`'s)."""
    return ["localhost", socket.gethostname(), "127.0.0.1", "::1"]


# Children started ahead by :func:`start_self_signed`, by their hosts, until taken.
_started: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}


def _in_process() -> bool:
    """A frozen executable (the agent's PyInstaller bundle, whose ``sys.executable`` runs no ``-m``)."""
    return bool(getattr(sys, "frozen", False)) or not sys.executable


def _spawn(hosts: list[str]) -> subprocess.Popen[bytes]:
    # -P: the working directory is not put on the child's path (no module there shadows pko's).
    return subprocess.Popen(
        [sys.executable, "-P", "-m", _MODULE, "--", *hosts],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _reap() -> None:
    """At exit: stop the children started ahead and never taken."""
    while _started:
        _, child = _started.popitem()
        child.kill()
        child.wait()


atexit.register(_reap)


def start_self_signed(hosts: list[str] | None = None) -> None:
    """Start the child making the pair for ``hosts`` (default :func:`default_hosts`) now, so that it
    runs beside the rest of the process's start (the operator calls this before importing its
    reconcilers); :func:`self_signed_apart` for the same hosts then takes its pair. A no-op in a frozen
    executable, or when the child cannot start (``self_signed_apart`` then tries and says why)."""
    hosts = default_hosts() if hosts is None else hosts
    if _in_process() or tuple(hosts) in _started:
        return
    try:
        _started[tuple(hosts)] = _spawn(hosts)
    except OSError:
        return


def self_signed_apart(hosts: list[str]) -> tuple[bytes, bytes]:
    """:func:`self_signed`, made in a child process (``python -m pko.machinery.servingcert HOST...``)
    that hands the certificate and then the key over a pipe: ``cryptography`` is loaded there and
    goes with it; the child :func:`start_self_signed` started for these hosts, if any. In a frozen
    executable, whose ``sys.executable`` is no Python, made in process."""
    if _in_process():
        return self_signed(hosts)
    child = _started.pop(tuple(hosts), None)
    try:
        if child is None:
            child = _spawn(hosts)
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if child is not None:
            child.kill()
            child.wait()
        raise RuntimeError(f"making the self-signed metrics certificate: {exc}") from exc
    cert, sep, key = stdout.partition(_KEY_BEGIN)
    if child.returncode != 0 or not sep or not cert.startswith(b"-----BEGIN CERTIFICATE-----"):
        error = stderr.decode(errors="replace").strip()[-2000:]
        raise RuntimeError(
            f"making the self-signed metrics certificate: {sys.executable} -m {_MODULE} exited "
            f"{child.returncode}: {error or 'no certificate and key on its output'}"
        )
    return cert, sep + key


def _new_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


@contextmanager
def _pem_file(data: bytes) -> Iterator[str]:
    """A path ``ssl`` can read ``data`` from, gone when the block ends."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("pko-metrics-tls")
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="pko-metrics-tls-") as tmp:
        path = Path(tmp) / "pem"
        path.touch(mode=0o600)
        path.write_bytes(data)
        yield str(path)


def _context_from_pem(cert: bytes, key: bytes) -> ssl.SSLContext:
    context = _new_context()
    with _pem_file(cert) as cert_path, _pem_file(key) as key_path:
        context.load_cert_chain(cert_path, key_path)
    return context


@dataclass
class CertSource:
    """The server's ``SSLContext``: :meth:`context` once, for the listening socket; a directory's
    renewed pair is swapped in per connection (an SNI callback, which runs before the handshake)."""

    cert_dir: Path | None = None
    hosts: list[str] = field(default_factory=default_hosts)
    _current: ssl.SSLContext | None = None
    _stamp: tuple[float, float] = (0.0, 0.0)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def context(self) -> ssl.SSLContext:
        """The context to wrap the listening socket with; raises when the directory's pair is unreadable."""
        if self.cert_dir is None:
            return _context_from_pem(*self_signed_apart(self.hosts))
        self._current = self._load()
        outer = _new_context()
        # The outer context only routes each handshake to the current pair (loaded below).
        outer.load_cert_chain(self.cert_dir / CERT_NAME, self.cert_dir / KEY_NAME)
        outer.sni_callback = self._route
        return outer

    def _files(self) -> tuple[Path, Path]:
        assert self.cert_dir is not None
        return self.cert_dir / CERT_NAME, self.cert_dir / KEY_NAME

    def _load(self) -> ssl.SSLContext:
        cert, key = self._files()
        stamp = (cert.stat().st_mtime, key.stat().st_mtime)
        context = _new_context()
        context.load_cert_chain(cert, key)
        self._stamp = stamp
        return context

    def _route(self, sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        with self._lock:
            cert, key = self._files()
            try:
                if (cert.stat().st_mtime, key.stat().st_mtime) != self._stamp:
                    self._current = self._load()
            except (OSError, ssl.SSLError):
                pass  # mid-rotation (one file written, not the other): keep serving the last pair
            current = self._current
        if current is not None:
            sock.context = current


def _main(argv: list[str]) -> int:
    """``python -m pko.machinery.servingcert [--] HOST...``: the PEM certificate, then the key, on stdout."""
    hosts = argv[1:] if argv[:1] == ["--"] else argv
    if not hosts:
        print(f"usage: python -m {_MODULE} [--] HOST...", file=sys.stderr)
        return 2
    cert, key = self_signed(hosts)
    sys.stdout.buffer.write(cert + key)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

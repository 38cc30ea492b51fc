"""The agent's own small Kubernetes API client: where the apiserver is, who the agent is, and JSON POSTs.

The agent talks to the apiserver for two things only, a TokenReview and a SubjectAccessReview per
unknown caller (``pko.agent.auth``). kubernetes-asyncio's client package imports every model and API
(about a quarter of a second, half the agent's start-up imports), and aiohttp alone adds some 80 ms;
this module needs neither: HTTP/1.1 over asyncio streams and the ``ssl`` module, both already loaded.

Connection settings come from, in this order (``connect``):

* a kubeconfig file (``--kubeconfig``, else ``$KUBECONFIG``, several files joined by ``:`` merged as
  kubectl merges them: the first file to set a value wins; read by :mod:`pko.machinery.kubeconfigfile`,
  as the operator reads them, without its HTTP stack): the current context's cluster
  (``server``, ``certificate-authority``/``-data``, ``insecure-skip-tls-verify``,
  ``tls-server-name``) and user (``token``, ``tokenFile``, ``client-certificate``/``-data`` with
  ``client-key``/``-data``). Anything else that would change how the agent connects or who it is
  (``exec``, ``auth-provider``, ``username``/``password``, impersonation, ``proxy-url``) is refused
  with an error naming the field, rather than silently connecting as someone else or nobody;
* in-cluster: ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT``, the pod's projected
  ServiceAccount token and ``ca.crt`` under ``/var/run/secrets/kubernetes.io/serviceaccount``.

A token read from a file (in-cluster, ``tokenFile``) is re-read at most once a minute, as client-go
does, since the kubelet rotates projected tokens; and at once after a 401, when the request is
retried once if the file holds a new token. Environment proxies are not used (nor were they by the
kubernetes-asyncio client this replaces). Nothing here logs: a TokenReview carries the token it
reviews, in the request and echoed in the response. Every request says who sends it:
``User-Agent`` :data:`USER_AGENT` (``pko-agent/<version> (python/<ver>)``, built by
:func:`pko.version.user_agent`), so the apiserver's audit log tells the agent's reviews from the
operator's requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pko.machinery.kubeconfigfile import (
    IN_CLUSTER_DIR,
    ConfigError,
    Kubeconfig,
    in_cluster_server,
    read_kubeconfig,
)
from pko.version import AGENT_PRODUCT, user_agent

SERVICE_ACCOUNT_DIR = IN_CLUSTER_DIR
TOKEN_REFRESH_SECONDS = 60.0  # client-go's cached file token source
MAX_RESPONSE_BYTES = 16 << 20
MAX_IDLE_CONNECTIONS = 4
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
USER_AGENT = user_agent(AGENT_PRODUCT)

# Kubeconfig fields that are understood, or that do not change where or as whom we connect.
_CLUSTER_FIELDS = {
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "insecure-skip-tls-verify",
    "tls-server-name",
    "disable-compression",
    "extensions",
}
_USER_FIELDS = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "extensions",
}


# The connection settings are missing, malformed or ask for something this client does not do.
KubeConfigError = ConfigError


class KubeAPIError(Exception):
    """The apiserver answered with an error status (``status``; ``reason`` is its Status reason)."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"apiserver answered {status}{f' ({reason})' if reason else ''}")
        self.status = status
        self.reason = reason


class KubeProtocolError(ConnectionError):
    """The connection broke or the apiserver's HTTP answer could not be read."""


class FileToken:
    """A bearer token kept in a file that is rotated underneath us: re-read at most every ``period``
    seconds, or at once on ``refresh``; a failed re-read keeps the last good token."""

    def __init__(
        self, path: Path, period: float = TOKEN_REFRESH_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.period = period
        self._clock = clock
        self._token = ""
        self._read_at = 0.0
        self.refresh()
        if not self._token:
            raise KubeConfigError(f"cannot read a token from {path}")

    def get(self) -> str:
        if self._clock() - self._read_at >= self.period:
            self.refresh()
        return self._token

    def refresh(self) -> bool:
        """Re-read the file; True when it now holds another token than before."""
        self._read_at = self._clock()
        try:
            token = self.path.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return False
        if not token or token == self._token:
            return False
        self._token = token
        return True


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


class KubeAPI:
    """JSON over HTTP/1.1 to one apiserver as one identity, with a few kept-alive connections."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        token: str | None = None,
        token_file: FileToken | None = None,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise KubeConfigError(f"server {server!r} is not an http(s) URL")
        self.server = server
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._authority = url.netloc.rpartition("@")[2]
        if url.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context()
        self._ssl = ssl_context if url.scheme == "https" else None
        self._server_hostname = server_hostname if self._ssl is not None else None
        self._token = token
        self._token_file = token_file
        self._idle: list[_Connection] = []
        self._closed = False

    # -- the two reviews -----------------------------------------------------------------------
    async def create_token_review(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """POST a TokenReview; returns its ``status`` (``authenticated``, ``user``, ``audiences``,
        ``error``)."""
        spec: dict[str, Any] = {"token": token}
        if audiences:
            spec["audiences"] = audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        return _status(await self.post(TOKEN_REVIEWS, body))

    async def create_subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        """POST a SubjectAccessReview; returns its ``status`` (``allowed``, ``denied``, ``reason``)."""
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        return _status(await self.post(SUBJECT_ACCESS_REVIEWS, body))

    # -- HTTP ----------------------------------------------------------------------------------
    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON; returns the decoded answer or raises KubeAPIError / OSError."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        token = self._bearer()
        status, data = await self._exchange(path, payload, token)
        if status == 401 and self._token_file is not None and self._token_file.refresh():
            status, data = await self._exchange(path, payload, self._bearer())  # rotated under us
        if not 200 <= status < 300:
            raise KubeAPIError(status, _reason(data))
        try:
            answer = json.loads(data)
        except ValueError:
            raise KubeAPIError(status, "malformed response") from None
        if not isinstance(answer, dict):
            raise KubeAPIError(status, "malformed response")
        return answer

    def _bearer(self) -> str | None:
        if self._token_file is not None:
            return self._token_file.get()
        return self._token

    async def _exchange(self, path: str, payload: bytes, token: str | None) -> tuple[int, bytes]:
        head = [
            f"POST {self._prefix}{path} HTTP/1.1",
            f"Host: {self._authority}",
            "Content-Type: application/json",
            "Accept: application/json",
            f"Content-Length: {len(payload)}",
            f"User-Agent: {USER_AGENT}",
        ]
        if token:
            head.append(f"Authorization: Bearer {token}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + payload
        while True:
            conn, reused = await self._connection()
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                status, data, keep = await _read_response(conn.reader)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                conn.writer.close()
                if reused:
                    continue  # a kept-alive connection the server had closed: once more on a new one
                if isinstance(exc, OSError):
                    raise
                raise KubeProtocolError(f"bad answer from {self._authority}: {exc}") from None
            except BaseException:
                conn.writer.close()  # cancelled or timed out mid-exchange: the connection is unusable
                raise
            self._release(conn, keep)
            return status, data

    async def _connection(self) -> tuple[_Connection, bool]:
        if self._closed:
            raise KubeProtocolError("the client is closed")
        while self._idle:
            conn = self._idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn, True
            conn.writer.close()
        reader, writer = await asyncio.open_connection(
            self._host, self._port, ssl=self._ssl, server_hostname=self._server_hostname
        )
        return _Connection(reader, writer), False

    def _release(self, conn: _Connection, keep: bool) -> None:
        if keep and not self._closed and len(self._idle) < MAX_IDLE_CONNECTIONS:
            self._idle.append(conn)
        else:
            conn.writer.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.writer.close()
        for conn in idle:
            try:
                await conn.writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass

    async def __aenter__(self) -> KubeAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 response: (status, body, whether the connection may be reused)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        version, _, rest = line.decode("latin-1").strip().partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {line[:40]!r}")
        status = int(rest.partition(" ")[0])
        headers: dict[str, str] = {}
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ValueError("malformed header line")
            headers[name.strip().lower()] = value.strip()
        if status >= 200 or status == 101:
            break
        # 1xx (100 Continue, 103 Early Hints): informational; the real answer follows.
    connection = headers.get("connection", "").lower()
    keep = version == "HTTP/1.1" and "close" not in connection
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        size = 0
        while True:
            length = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if length == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                break
            size += length
            if size > MAX_RESPONSE_BYTES:
                raise ValueError("response too large")
            chunks.append(await reader.readexactly(length))
            await reader.readexactly(2)
        return status, b"".join(chunks), keep
    if "content-length" in headers:
        length = int(headers["content-length"])
        if not 0 <= length <= MAX_RESPONSE_BYTES:
            raise ValueError("bad or too large Content-Length")
        return status, await reader.readexactly(length), keep
    if status in (204, 304):
        return status, b"", keep
    data = await reader.read(MAX_RESPONSE_BYTES + 1)  # delimited by the connection's end
    while len(data) <= MAX_RESPONSE_BYTES and (more := await reader.read(MAX_RESPONSE_BYTES + 1 - len(data))):
        data += more
    if len(data) > MAX_RESPONSE_BYTES:
        raise ValueError("response too large")
    return status, data, False


def _reason(data: bytes) -> str:
    """A Status answer's ``reason`` (``Forbidden``, ``TooManyRequests``, ...): never its message,
    which may quote the request."""
    try:
        answer = json.loads(data)
    except ValueError:
        return ""
    reason = answer.get("reason") if isinstance(answer, dict) else None
    return reason if isinstance(reason, str) else ""


def _status(answer: dict[str, Any]) -> dict[str, Any]:
    status = answer.get("status")
    return status if isinstance(status, dict) else {}


# -- settings --------------------------------------------------------------------------------------
def connect(kubeconfig: Path | None = None, environ: Mapping[str, str] | None = None) -> KubeAPI:
    """The agent's client: ``kubeconfig``, else ``$KUBECONFIG``, else in-cluster."""
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return load_kubeconfig([kubeconfig])
    if env.get("KUBECONFIG"):
        return load_kubeconfig([Path(p) for p in env["KUBECONFIG"].split(os.pathsep) if p])
    return load_incluster(env)


def load_incluster(
    environ: Mapping[str, str] | None = None, directory: Path = SERVICE_ACCOUNT_DIR
) -> KubeAPI:
    """The pod's own identity: its ServiceAccount token (rotated: see FileToken) and the cluster CA."""
    env = os.environ if environ is None else environ
    if not env.get("KUBERNETES_SERVICE_HOST") or not env.get("KUBERNETES_SERVICE_PORT"):
        raise KubeConfigError(  # the agent's last resort: say what it looked for first
            "no kubeconfig (--kubeconfig, $KUBECONFIG) and not in a cluster "
            "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset)"
        )
    server = in_cluster_server(env)
    ca = directory / "ca.crt"
    try:
        context = _ssl_context(ca_file=ca)
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"cannot load the cluster CA {ca}: {exc}") from None
    return KubeAPI(server, ssl_context=context, token_file=FileToken(directory / "token"))


def load_kubeconfig(paths: list[Path]) -> KubeAPI:
    """The current context of the kubeconfig file(s) ``paths`` (merged, first value wins)."""
    config = read_kubeconfig(paths)
    if config.user_name and config.user is None:
        raise KubeConfigError(
            f"kubeconfig: user {config.user_name!r} of context {config.context!r} not found"
        )
    cluster, user = config.cluster, config.user or {}
    _refuse_unknown(cluster, _CLUSTER_FIELDS, f"cluster {config.cluster_name!r}")
    _refuse_unknown(user, _USER_FIELDS, f"user {config.user_name!r}")
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError(f"kubeconfig: cluster {config.cluster_name!r} has no server")
    token_path = config.user_path("tokenFile")
    token = user.get("token")
    tls_name = cluster.get("tls-server-name")
    return KubeAPI(
        server,
        ssl_context=_kubeconfig_ssl(config) if server.startswith("https://") else None,
        server_hostname=tls_name if isinstance(tls_name, str) and tls_name else None,
        token=token if isinstance(token, str) and token else None,
        # client-go: the file, re-read, wins over token
        token_file=FileToken(token_path) if token_path is not None else None,
    )


def _kubeconfig_ssl(config: Kubeconfig) -> ssl.SSLContext:
    try:
        return _ssl_context(
            ca_file=config.cluster_path("certificate-authority"),
            ca_data=config.cluster_data("certificate-authority-data"),
            insecure=config.cluster.get("insecure-skip-tls-verify") is True,
            cert_file=config.user_path("client-certificate"),
            cert_data=config.user_data("client-certificate-data"),
            key_file=config.user_path("client-key"),
            key_data=config.user_data("client-key-data"),
        )
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(
            f"kubeconfig: cluster {config.cluster_name!r} / user {config.user_name!r}: {exc}"
        ) from None


def _refuse_unknown(entry: Mapping[str, Any], known: set[str], what: str) -> None:
    for key, value in entry.items():
        if key not in known and value not in (None, "", [], {}, False):
            raise KubeConfigError(f"kubeconfig: {what}: {key!r} is not supported by the agent")


def _ssl_context(
    *,
    ca_file: Path | None = None,
    ca_data: bytes | None = None,
    insecure: bool = False,
    cert_file: Path | None = None,
    cert_data: bytes | None = None,
    key_file: Path | None = None,
    key_data: bytes | None = None,
) -> ssl.SSLContext:
    """TLS as client-go sets it up: the given CA only (else the system's), optional client cert."""
    if insecure and (ca_file or ca_data):
        raise KubeConfigError("insecure-skip-tls-verify and a certificate authority are exclusive")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_data is not None:
        context.load_verify_locations(cadata=ca_data.decode("ascii", "replace"))
    elif ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    else:
        context.load_default_certs()
    if (cert_file or cert_data) and not (key_file or key_data):
        raise KubeConfigError("a client certificate needs its client key (client-key or client-key-data)")
    if (key_file or key_data) and not (cert_file or cert_data):
        raise KubeConfigError("a client key needs its client certificate (client-certificate or -data)")
    if cert_file or cert_data:
        # The ssl module loads a key pair from files only: -data goes through a private scratch dir.
        with tempfile.TemporaryDirectory(prefix="pko-kube-") as scratch:
            if cert_data is not None:
                cert_file = Path(scratch) / "client.crt"
                cert_file.write_bytes(cert_data)
            if key_data is not None:
                key_file = Path(scratch) / "client.key"
                key_file.touch(mode=0o600)
                key_file.write_bytes(key_data)
            context.load_cert_chain(str(cert_file), str(key_file))
    return context

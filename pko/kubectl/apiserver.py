"""The plugin's HTTP client for the apiserver, on the standard library alone (``http.client``, ``ssl``).

Why not kubernetes-asyncio and aiohttp as the operator: the plugin ships as one file a user runs
with any CPython (hack/build_plugin.py), and aiohttp's stack (multidict, yarl, frozenlist,
propcache) comes as C extensions, which cannot load from inside a zip. The plugin makes a handful
of sequential requests (GET, LIST, one merge patch, a pod's log, a watch of one object), which
``http.client`` does as well: one connection per request, so the command's few requests never
share state, and a blocking read that Ctrl-C interrupts at once.

A status outside 2xx raises :class:`ApiError` with the apiserver's ``Status`` message; a network
failure raises ``OSError`` (``TimeoutError``, ``ssl.SSLError``, ``ConnectionError``) or
``http.client.HTTPException``, which :mod:`pko.kubectl.__main__` turns into exit 5.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from pko.machinery.resourcetype import Resource

__all__ = ["ApiError", "ApiServer", "Endpoint", "Resource", "status_message"]

Obj = dict[str, Any]
Query = Sequence[tuple[str, str]]

MERGE_PATCH: Final = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the apiserver is and how to authenticate to it (kubeconfig's cluster and user).

    ``ssl_context`` verifies the server (and holds the client certificate); ``server_name`` is the
    name its certificate must have when not the URL's host (``tls-server-name``); ``proxy`` an
    ``http://`` proxy the connection tunnels through (``CONNECT``)."""

    server: str
    ssl_context: ssl.SSLContext | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    server_name: str | None = None
    proxy: str | None = None


class ApiError(Exception):
    """The apiserver answered outside 2xx: ``status``, ``reason`` and the ``Status`` body."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        """The ``Status`` body's message, else the reason."""
        return status_message(self.body) or self.reason or str(self.status)


def status_message(body: str | bytes) -> str:
    """The ``message`` of a ``Status`` body ("" when it is none)."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    return str(data.get("message") or "") if isinstance(data, dict) else ""


class _TLSConnection(http.client.HTTPSConnection):
    """``HTTPSConnection`` that checks the certificate against ``server_name`` (the URL's host, or
    ``tls-server-name``), also when the socket goes to a proxy."""

    def __init__(
        self, host: str, port: int | None, *, context: ssl.SSLContext, timeout: float, server_name: str
    ) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and the proxy's CONNECT when tunnelling
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class ApiServer:
    """Requests to one apiserver, each on a fresh connection, as ``user_agent``."""

    def __init__(self, endpoint: Endpoint, user_agent: str, timeout: float) -> None:
        self.endpoint = endpoint
        self.user_agent = user_agent
        self.timeout = timeout
        url = urlsplit(endpoint.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"the server {endpoint.server!r} is not an http(s) URL")
        self._url = url
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._proxy = urlsplit(endpoint.proxy) if endpoint.proxy else None
        if self._proxy and (self._proxy.scheme != "http" or not self._proxy.hostname):
            raise ValueError(f"proxy {endpoint.proxy!r}: only http:// proxies are supported")

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        url, proxy = self._url, self._proxy
        host, port = url.hostname or "", self._port
        if proxy:
            connect_host, connect_port = proxy.hostname or "", proxy.port or 80
        else:
            connect_host, connect_port = host, port
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            context = self.endpoint.ssl_context or ssl.create_default_context()
            conn = _TLSConnection(
                connect_host,
                connect_port,
                context=context,
                timeout=timeout,
                server_name=self.endpoint.server_name or host,
            )
        else:
            conn = http.client.HTTPConnection(connect_host, connect_port, timeout=timeout)
        if proxy:
            conn.set_tunnel(host, port)
        return conn

    def _target(self, path: str, query: Query) -> str:
        prefix = self._url.path.rstrip("/")
        return f"{prefix}{path}" + (f"?{urlencode(list(query))}" if query else "")

    def _send(
        self,
        method: str,
        path: str,
        query: Query,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connection(timeout)
        sent = {"User-Agent": self.user_agent, **self.endpoint.headers, **headers}
        try:
            conn.request(method, self._target(path, query), body=body, headers=sent)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def response(
        self,
        method: str,
        path: str,
        *,
        query: Query = (),
        body: Obj | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        """(status, body) of one request, whatever the status."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": accept} | ({"Content-Type": content_type} if data is not None else {})
        conn, resp = self._send(method, path, query, data, headers, self.timeout)
        try:
            return resp.status, resp.read()
        finally:
            conn.close()

    def json(
        self,
        method: str,
        path: str,
        *,
        query: Query = (),
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """The JSON object of a 2xx answer; :class:`ApiError` otherwise."""
        status, data = self.response(method, path, query=query, body=body, content_type=content_type)
        if not 200 <= status < 300:
            raise ApiError(status, http.client.responses.get(status, ""), data.decode("utf-8", "replace"))
        answer = json.loads(data)
        if not isinstance(answer, dict):
            text = data.decode(errors="replace")
            raise json.JSONDecodeError(f"{method} {path}: not a JSON object", text, 0)
        return answer

    def watch(self, path: str, query: Query, read_timeout: float) -> Generator[Obj, None, None]:
        """The events of a watch (``watch=1`` added), one dict each, until the server ends it; a
        read that waits longer than ``read_timeout`` raises ``TimeoutError``."""
        conn, resp = self._send(
            "GET", path, [*query, ("watch", "1")], None, {"Accept": "application/json"}, read_timeout
        )
        try:
            if not 200 <= resp.status < 300:
                data = resp.read().decode("utf-8", "replace")
                raise ApiError(resp.status, resp.reason, data)
            while line := resp.readline():
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event
        except TimeoutError as exc:
            raise TimeoutError(f"no watch event within {read_timeout:g}s") from exc
        finally:
            conn.close()

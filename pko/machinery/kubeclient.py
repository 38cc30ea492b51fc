"""The operator's Kubernetes client: HTTP on aiohttp, JSON in and out, no generated code.

Why not kubernetes-asyncio's ``ApiClient``: importing any part of ``kubernetes_asyncio`` loads its
generated package (859 model and API modules, about 50 MB, issue 44), and the operator never used
the models: :mod:`pko.machinery.resource` sends plain JSON through ``call_api``. This client keeps
the request semantics the operator had through it, and nothing else:

* authentication by an ``Authorization`` header (a bearer token, fixed or re-read from the
  in-cluster token file as the kubelet rotates it) or a client certificate and key;
* the server verified against a CA bundle (file or PEM data), or not at all (``verify_ssl``);
  ``tls_server_name`` when the certificate names another host;
* an explicit proxy, resolved once (:func:`environment_proxy`): the session never consults the
  environment (``trust_env=False``), which on every request would cost two blocking look-ups
  (``~/.netrc`` and the ``*_PROXY`` variables) on the default thread pool;
* pko's own ``User-Agent`` (:data:`OPERATOR_USER_AGENT`, see :func:`pko.version.user_agent`): the
  apiserver names a write without a ``fieldManager`` after it;
* a 2 MiB read buffer (watch events of large objects exceed aiohttp's default line length);
* a status outside 2xx raised as :class:`ApiException` with ``status``, ``reason``, ``body`` (the
  apiserver's ``Status`` as text) and ``headers``, the attributes callers read.

Configuration comes from :mod:`pko.machinery.kubeconfig` (in-cluster, or a kubeconfig file), or,
for tests and tools that hold a kubernetes-asyncio ``Configuration``, from
:meth:`KubeClient.from_configuration` (duck-typed: nothing here imports kubernetes-asyncio).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol

import aiohttp
from yarl import URL

from pko.version import OPERATOR_PRODUCT, user_agent

__all__ = [
    "OPERATOR_USER_AGENT",
    "ApiException",
    "ClientConfig",
    "Credentials",
    "KubeClient",
    "StaticToken",
    "TokenFile",
    "config_of",
    "environment_proxy",
]

OPERATOR_USER_AGENT: Final = user_agent(OPERATOR_PRODUCT, f"aiohttp/{aiohttp.__version__}")

# Watch events of large objects exceed aiohttp's default read buffer (kubernetes-asyncio's value).
READ_BUFSIZE: Final = 2**21
# Connections per client (kubernetes-asyncio's connection_pool_maxsize): watches each hold one.
POOL_SIZE: Final = 100
# How long a token read from a file is used before the file is read again (client-go and
# kubernetes-asyncio: a minute; the kubelet rotates the projected token well before it expires).
TOKEN_REREAD_SECONDS: Final = 60.0
# Query strings remembered per client (writes repeat a few: ``fieldManager``, ``force``); a watch's
# carries its resourceVersion, so the memory is emptied when full rather than grown.
QUERY_MEMORY: Final = 256


class ApiException(Exception):
    """The apiserver answered outside 2xx (or a watch sent an ERROR event).

    ``status`` is the HTTP status (a watch ERROR's ``code``), ``reason`` the HTTP reason or, when the
    body is a ``Status`` with a message, ``"<Status reason>: <message>"``; ``body`` the response as
    text; ``headers`` the response headers (None for a watch event).
    """

    def __init__(
        self,
        status: int,
        reason: str,
        body: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.body = body
        self.headers = headers

    def __str__(self) -> str:
        text = f"({self.status})\nReason: {self.reason}\n"
        if self.headers:
            text += f"HTTP response headers: {self.headers}\n"
        if self.body:
            text += f"HTTP response body: {self.body}\n"
        return text


def status_reason(http_reason: str, body: str) -> str:
    """``"<reason>: <message>"`` from a ``Status`` body with a message, else ``http_reason``."""
    try:
        status = json.loads(body)
    except ValueError:
        return http_reason
    if isinstance(status, dict) and status.get("message"):
        return f"{status.get('reason', http_reason)}: {status['message']}"
    return http_reason


def environment_proxy(server: str) -> str | None:
    """The proxy ``HTTPS_PROXY``/``HTTP_PROXY`` name for ``server``, unless ``NO_PROXY`` exempts it."""
    url = urllib.parse.urlsplit(server)
    if url.hostname and urllib.request.proxy_bypass(url.hostname):
        return None
    return urllib.request.getproxies().get(url.scheme) or None


class Credentials(Protocol):
    """Where a request's ``Authorization`` header comes from (None: send none)."""

    async def authorization(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class StaticToken:
    """A fixed ``Authorization`` value (``Bearer <token>``, or ``Basic ...`` from a kubeconfig)."""

    header: str

    async def authorization(self) -> str | None:
        return self.header


class TokenFile:
    """A bearer token read from ``path``, and read again once it is ``reread`` seconds old: the
    kubelet rotates a projected ServiceAccount token in place (client-go re-reads it the same way)."""

    def __init__(
        self, path: str, *, reread: float = TOKEN_REREAD_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.reread = reread
        self._clock = clock
        self._header = ""
        self._read_at = 0.0
        self._read()

    def _read(self) -> None:
        token = Path(self.path).read_text().strip()
        if not token:
            raise ValueError(f"the token file {self.path} is empty")
        self._header = f"Bearer {token}"
        self._read_at = self._clock()

    async def authorization(self) -> str | None:
        if self._clock() - self._read_at >= self.reread:
            try:
                self._read()
            except (OSError, ValueError):
                pass  # mid-rotation or briefly gone: the last token until the next try
        return self._header


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Where the apiserver is and how to reach it.

    ``ca_file``/``ca_data`` (PEM) verify the server, the system's CAs without either;
    ``cert_file``/``key_file`` or ``cert_data``/``key_data`` (PEM) are the client certificate.
    """

    host: str
    credentials: Credentials | None = None
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    verify_ssl: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context: the CA bundle, the client certificate, ``verify_ssl``."""
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, keyfile=self.key_file)
        elif self.cert_data is not None and self.key_data is not None:
            _load_cert_data(context, self.cert_data, self.key_data)
        if not self.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


def _load_cert_data(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """``ssl`` loads a certificate only from files: written to a private directory (mode 0700, each
    file 0600), loaded, and removed at once."""
    with tempfile.TemporaryDirectory(prefix="pko-client-") as directory:
        paths = (Path(directory) / "client.crt", Path(directory) / "client.key")
        for path, data in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(paths[0], paths[1])


class _ConfigurationKey:
    """A kubernetes-asyncio ``Configuration``'s ``BearerToken`` key, read per request as its
    ``get_api_key_with_prefix`` does: after its ``refresh_api_key_hook`` (in-cluster token
    re-reads, exec plugins), with its prefix."""

    def __init__(self, configuration: Any) -> None:
        self._cfg = configuration

    async def authorization(self) -> str | None:
        cfg = self._cfg
        hook = getattr(cfg, "refresh_api_key_hook", None)
        if hook is not None:
            result = hook(cfg)
            if asyncio.iscoroutine(result):
                await result
        key = (getattr(cfg, "api_key", None) or {}).get("BearerToken")
        if not key:
            return None
        prefix = (getattr(cfg, "api_key_prefix", None) or {}).get("BearerToken")
        return f"{prefix} {key}" if prefix else str(key)


def config_of(configuration: Any) -> ClientConfig:
    """A kubernetes-asyncio ``Configuration``, read duck-typed (``host``, ``api_key``/``api_key_prefix``
    and ``refresh_api_key_hook``, ``ssl_ca_cert``, ``cert_file``/``key_file``, ``verify_ssl``,
    ``tls_server_name``, ``proxy``), as a :class:`ClientConfig`: for kubeconfigs only its loader
    understands (credential plugins), and for tests and tools that hold one."""
    cfg = configuration
    return ClientConfig(
        host=str(cfg.host),
        credentials=_ConfigurationKey(cfg),
        ca_file=getattr(cfg, "ssl_ca_cert", None),
        cert_file=getattr(cfg, "cert_file", None),
        key_file=getattr(cfg, "key_file", None),
        verify_ssl=bool(getattr(cfg, "verify_ssl", True)),
        tls_server_name=getattr(cfg, "tls_server_name", None),
        proxy=getattr(cfg, "proxy", None),
    )


Query = Sequence[tuple[str, str]]


class KubeClient:
    """Requests to one apiserver on one aiohttp session (opened at the first request, on the loop
    that makes it; close the client with ``async with`` or :meth:`close`)."""

    def __init__(
        self, config: ClientConfig, *, user_agent: str = OPERATOR_USER_AGENT, pool_size: int = POOL_SIZE
    ) -> None:
        self.config = config
        self._user_agent = user_agent
        # Sent with every request besides the client's own (e.g. ``Impersonate-User`` in tests).
        self.headers: dict[str, str] = {}
        self._pool_size = pool_size
        # Built now so a bad CA or certificate fails at start, not at the first request.
        self._ssl = config.ssl_context() if config.host.startswith("https:") else None
        self._session: aiohttp.ClientSession | None = None
        # The host parsed once: each request's URL is built from these parts and its path and query,
        # already quoted, instead of parsed and re-quoted from a string (issue 44: a few percent of
        # the operator's CPU at start-up went to yarl parsing every request's URL).
        base = URL(config.host)
        self._scheme, self._authority = base.scheme, base.raw_authority
        self._prefix = base.raw_path.rstrip("/")  # an apiserver behind a path (a proxy's) keeps it
        self._queries: dict[tuple[tuple[str, str], ...], str] = {}

    @classmethod
    def from_configuration(cls, configuration: Any, *, user_agent: str = OPERATOR_USER_AGENT) -> KubeClient:
        """A client for a kubernetes-asyncio ``Configuration`` (see :func:`config_of`), for tests and
        tools that load one."""
        return cls(config_of(configuration), user_agent=user_agent)

    @property
    def host(self) -> str:
        return self.config.host

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session every request goes through (opened on first use)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl or True)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def url(self, path: str, query: Query | None = None) -> URL:
        """The URL of ``path`` (quoted, as :class:`~pko.machinery.resourcetype.Resource` builds it)
        with ``query`` (encoded here, as ``urllib.parse.urlencode`` does)."""
        query_string = ""
        if query:
            key = tuple(query)
            query_string = self._queries.get(key, "")
            if not query_string:
                if len(self._queries) >= QUERY_MEMORY:
                    self._queries.clear()
                query_string = self._queries[key] = urllib.parse.urlencode(key)
        return URL.build(
            scheme=self._scheme,
            authority=self._authority,
            path=self._prefix + path,
            query_string=query_string,
            encoded=True,
        )

    def error(
        self, status: int, reason: str, body: str | None = None, headers: Mapping[str, str] | None = None
    ) -> ApiException:
        """The exception for a failed request or a watch's ERROR event."""
        return ApiException(status, reason, body, headers)

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """Send ``body`` (JSON-encoded unless ``None``) to ``path`` (``?query`` appended); return the
        response, not yet read (the caller releases it), or raise :meth:`error` outside 2xx."""
        headers = {
            **self.headers,
            "Accept": accept,
            "Content-Type": content_type,
            "User-Agent": self._user_agent,
        }
        if self.config.credentials is not None:
            authorization = await self.config.credentials.authorization()
            if authorization:
                headers["Authorization"] = authorization
        resp = await self.session().request(
            method=method,
            url=self.url(path, query),
            headers=headers,
            data=None if body is None else json.dumps(body).encode(),
            timeout=client_timeout or aiohttp.ClientTimeout(),
            proxy=self.config.proxy,
            server_hostname=self.config.tls_server_name,
        )
        if 200 <= resp.status < 300:
            return resp
        try:
            text = await resp.text()
        finally:
            resp.release()
        raise self.error(resp.status, status_reason(resp.reason or "", text), text, resp.headers)

    async def call_json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """:meth:`call`, the response decoded."""
        resp = await self.call(method, path, **kw)
        try:
            data: dict[str, Any] = json.loads(await resp.read())
        finally:
            resp.release()
        return data

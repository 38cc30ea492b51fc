"""The agent's own apiserver client (pko.agent.kubeapi): settings, TLS, token rotation, HTTP/1.1.

Most tests talk to a small HTTPS server here (certificates made with ``cryptography``), which records
what arrived and answers as scripted; the ``cluster`` ones talk to the real kube-apiserver with
in-cluster settings and with a client certificate signed by its CA.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import glob
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pko.agent.kubeapi import (
    FileToken,
    KubeAPI,
    KubeAPIError,
    KubeConfigError,
    connect,
    load_incluster,
    load_kubeconfig,
)

# -- certificates -----------------------------------------------------------------------------------


@dataclass
class Pair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        return cert, key


def _issue(
    common_name: str,
    *,
    issuer: tuple[Any, Any] | None = None,
    ca: bool = False,
    ip: str | None = None,
    organization: str | None = None,
) -> tuple[Pair, Any, Any]:
    """A certificate (and its key and x509 object) signed by ``issuer`` (cert, key), else self-signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    name = x509.Name(attrs)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if ip else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ip)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), critical=False
        )
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    pair = Pair(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return pair, cert, key


@dataclass
class PKI:
    ca: Pair
    server: Pair
    client: Pair
    other_ca: Pair  # signs nothing we trust: a server presenting it must be refused


@pytest.fixture(scope="module")
def pki() -> PKI:
    ca, ca_cert, ca_key = _issue("test-ca", ca=True)
    server, _, _ = _issue("apiserver", issuer=(ca_cert, ca_key), ip="127.0.0.1")
    client, _, _ = _issue("agent", issuer=(ca_cert, ca_key))
    other, _, _ = _issue("other-ca", ca=True)
    return PKI(ca=ca, server=server, client=client, other_ca=other)


# -- a scripted HTTPS server ---------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    peer_cert: dict[str, Any] | None
    connection: int  # which connection (0, 1, ...) carried it


Reply = tuple[int, dict[str, str], bytes]
Handler = Callable[[Request], Reply]


def json_reply(status: int, body: Any, chunked: bool = False, close: bool = False) -> Reply:
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if close:
        headers["Connection"] = "close"
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
        third = max(1, len(data) // 3)
        parts = [data[i : i + third] for i in range(0, len(data), third)]
        return status, headers, b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    headers["Content-Length"] = str(len(data))
    return status, headers, data


def review_reply(request: Request) -> Reply:
    body = dict(request.body)
    body["status"] = {"authenticated": True, "user": {"username": "alice"}, "audiences": ["a"]}
    return json_reply(201, body)


@dataclass
class FakeAPIServer:
    pki: PKI
    require_client_cert: bool = False
    handler: Handler = review_reply
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    close_after_reply: bool = False  # drop every connection after its first answer, unannounced
    delay: float = 0.0  # seconds before each answer

    async def start(self) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory(prefix="fake-apiserver-") as d:
            cert, key = self.pki.server.write(Path(d), "server")
            ctx.load_cert_chain(str(cert), str(key))
        if self.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cadata=self.pki.ca.cert_pem.decode())
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        peer = writer.get_extra_info("peercert")
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) != b"\r\n":
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, path, headers, json.loads(raw) if raw else None, peer, number)
                self.requests.append(request)
                status, reply_headers, body = self.handler(request)
                if self.delay:
                    await asyncio.sleep(self.delay)
                head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in reply_headers.items())
                writer.write(head.encode() + b"\r\n" + body)
                await writer.drain()
                if self.close_after_reply or reply_headers.get("Connection") == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            return
        finally:
            writer.close()

    async def stop(self) -> None:
        self._server.close()
        await self._server.wait_closed()


@pytest.fixture
async def fake(pki: PKI) -> AsyncIterator[FakeAPIServer]:
    server = FakeAPIServer(pki)
    await server.start()
    yield server
    await server.stop()


def write_kubeconfig(
    path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any] | None, as_yaml: bool = False
) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "current-context": "ctx",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg) if as_yaml else json.dumps(cfg))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- kubeconfig variants ------------------------------------------------------------------------------


@pytest.mark.parametrize("as_yaml", [False, True], ids=["json", "yaml"])
async def test_kubeconfig_token_and_ca_data(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path, as_yaml: bool
) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        fake.url,
        {"certificate-authority-data": b64(pki.ca.cert_pem)},
        {"token": "tok-1"},
        as_yaml,
    )
    async with load_kubeconfig([path]) as api:
        status = await api.create_token_review("the-callers-token", ["a", "b"])
    assert status["authenticated"] is True and status["user"]["username"] == "alice"
    (req,) = fake.requests
    assert (req.method, req.path) == ("POST", "/apis/authentication.k8s.io/v1/tokenreviews")
    assert req.headers["authorization"] == "Bearer tok-1"
    assert req.headers["content-type"] == "application/json"
    assert req.body == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "the-callers-token", "audiences": ["a", "b"]},
    }


async def test_kubeconfig_ca_file_relative_to_the_kubeconfig_and_token_file(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "ca.pem").write_bytes(pki.ca.cert_pem)
    (conf / "token").write_text("from-file\n")
    path = write_kubeconfig(
        conf / "kubeconfig",
        fake.url,
        {"certificate-authority": "ca.pem"},
        {"tokenFile": "token", "token": "inline"},  # client-go: the file wins
    )
    async with load_kubeconfig([path]) as api:
        await api.create_subject_access_review({"user": "bob"})
    (req,) = fake.requests
    assert req.path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    assert req.headers["authorization"] == "Bearer from-file"
    assert req.body["kind"] == "SubjectAccessReview" and req.body["spec"] == {"user": "bob"}


@pytest.mark.parametrize("as_data", [True, False], ids=["data", "files"])
async def test_kubeconfig_client_certificate(pki: PKI, tmp_path: Path, as_data: bool) -> None:
    server = FakeAPIServer(pki, require_client_cert=True)
    await server.start()
    try:
        if as_data:
            user = {
                "client-certificate-data": b64(pki.client.cert_pem),
                "client-key-data": b64(pki.client.key_pem),
            }
        else:
            cert, key = pki.client.write(tmp_path / "certs", "agent")
            user = {"client-certificate": str(cert), "client-key": str(key)}
        path = write_kubeconfig(
            tmp_path / "kubeconfig", server.url, {"certificate-authority-data": b64(pki.ca.cert_pem)}, user
        )
        async with load_kubeconfig([path]) as api:
            await api.create_token_review("t", ["a"])
        (req,) = server.requests
        assert req.peer_cert is not None
        assert dict(x[0] for x in req.peer_cert["subject"])["commonName"] == "agent"
        assert "authorization" not in req.headers
        # No scratch copy of the key is left behind.
        assert not glob.glob(os.path.join(tempfile.gettempdir(), "pko-kube-*"))
    finally:
        await server.stop()


async def test_the_server_certificate_is_verified(fake: FakeAPIServer, pki: PKI, tmp_path: Path) -> None:
    wrong = write_kubeconfig(
        tmp_path / "wrong",
        fake.url,
        {"certificate-authority-data": b64(pki.other_ca.cert_pem)},
        {"token": "t"},
    )
    async with load_kubeconfig([wrong]) as api:
        with pytest.raises(ssl.SSLCertVerificationError):
            await api.create_token_review("t", ["a"])
    assert not fake.requests
    insecure = write_kubeconfig(
        tmp_path / "insecure", fake.url, {"insecure-skip-tls-verify": True}, {"token": "t"}
    )
    async with load_kubeconfig([insecure]) as api:
        await api.create_token_review("t", ["a"])
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("cluster", "user", "field"),
    [
        ({}, {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}}, "'exec'"),
        ({}, {"auth-provider": {"name": "oidc"}}, "'auth-provider'"),
        ({}, {"username": "admin", "password": "secret"}, "'username'"),
        ({}, {"token": "t", "as": "someone-else"}, "'as'"),
        ({"proxy-url": "http://proxy:3128"}, {"token": "t"}, "'proxy-url'"),
    ],
)
def test_unsupported_kubeconfig_fields_are_refused_by_name(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], field: str
) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443", cluster, user)
    with pytest.raises(KubeConfigError, match=field) as info:
        load_kubeconfig([path])
    assert "not supported" in str(info.value)
    assert "secret" not in str(info.value)


def test_broken_kubeconfigs_say_what_is_wrong(tmp_path: Path, pki: PKI) -> None:
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        load_kubeconfig([tmp_path / "missing"])
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match="not valid YAML"):
        load_kubeconfig([bad])
    path = write_kubeconfig(tmp_path / "k", "https://127.0.0.1:1", {}, {"token": "t"})
    cfg = json.loads(path.read_text())
    cfg["current-context"] = ""
    path.write_text(json.dumps(cfg))
    with pytest.raises(KubeConfigError, match="no current-context"):
        load_kubeconfig([path])
    cfg["current-context"] = "elsewhere"
    path.write_text(json.dumps(cfg))
    with pytest.raises(KubeConfigError, match="context 'elsewhere' not found"):
        load_kubeconfig([path])
    half = write_kubeconfig(
        tmp_path / "half", "https://127.0.0.1:1", {}, {"client-certificate-data": b64(pki.client.cert_pem)}
    )
    with pytest.raises(KubeConfigError, match="client key"):
        load_kubeconfig([half])
    both = write_kubeconfig(
        tmp_path / "both",
        "https://127.0.0.1:1",
        {"insecure-skip-tls-verify": True, "certificate-authority-data": b64(pki.ca.cert_pem)},
        None,
    )
    with pytest.raises(KubeConfigError, match="exclusive"):
        load_kubeconfig([both])


async def test_kubeconfig_list_merges_first_wins(fake: FakeAPIServer, pki: PKI, tmp_path: Path) -> None:
    ca = {"certificate-authority-data": b64(pki.ca.cert_pem)}
    first = write_kubeconfig(tmp_path / "first", fake.url, ca, {"token": "first"})
    second = write_kubeconfig(tmp_path / "second", "https://127.0.0.1:1", {}, {"token": "second"})
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "absent"), str(first), str(second)])}
    async with connect(None, env) as api:
        await api.create_token_review("t", ["a"])
    assert fake.requests[0].headers["authorization"] == "Bearer first"
    # --kubeconfig wins over $KUBECONFIG.
    async with connect(first, {"KUBECONFIG": str(second)}) as api:
        assert api.server == fake.url


# -- in-cluster and token rotation -------------------------------------------------------------------


def test_incluster_needs_the_service_env(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        connect(None, {})
    with pytest.raises(KubeConfigError, match="cluster CA"):
        load_incluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)


def test_a_file_token_is_reread_at_most_once_a_minute(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    now = [0.0]
    token = FileToken(path, clock=lambda: now[0])
    assert token.get() == "one"
    path.write_text("two")
    now[0] = 59.0
    assert token.get() == "one", "re-read before its period"
    now[0] = 60.0
    assert token.get() == "two"
    path.unlink()  # a failed re-read keeps the last good token
    now[0] = 200.0
    assert token.get() == "two"
    path.write_text("")
    with pytest.raises(KubeConfigError, match="cannot read a token"):
        FileToken(path)


async def test_incluster_token_rotation_and_retry_on_401(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(pki.ca.cert_pem)
    (sa / "token").write_text("old")
    valid = {"old"}

    def handler(request: Request) -> Reply:
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in valid:
            return json_reply(401, {"kind": "Status", "reason": "Unauthorized", "code": 401})
        return review_reply(request)

    fake.handler = handler
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake.port)}
    async with load_incluster(env, sa) as api:
        await api.create_token_review("t", ["a"])
        # The kubelet rotates the token and the apiserver stops accepting the old one: the 401 makes
        # the client re-read the file at once (not a minute later) and send the request again.
        (sa / "token").write_text("new")
        valid.clear()
        valid.add("new")
        await api.create_token_review("t", ["a"])
        assert [r.headers["authorization"] for r in fake.requests] == [
            "Bearer old",
            "Bearer old",
            "Bearer new",
        ]
        # A 401 with no new token in the file is the caller's to handle (no loop).
        valid.clear()
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review("t", ["a"])
        assert info.value.status == 401 and info.value.reason == "Unauthorized"
        assert len(fake.requests) == 4


# -- HTTP ---------------------------------------------------------------------------------------------


async def _api(fake: FakeAPIServer, pki: PKI, tmp_path: Path) -> KubeAPI:
    path = write_kubeconfig(
        tmp_path / "kubeconfig",
        fake.url,
        {"certificate-authority-data": b64(pki.ca.cert_pem)},
        {"token": "t"},
    )
    return load_kubeconfig([path])


async def test_connections_are_kept_alive_and_chunked_answers_read(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    big = "x" * 100_000
    fake.handler = lambda r: json_reply(201, {"status": {"allowed": True, "reason": big}}, chunked=True)
    async with await _api(fake, pki, tmp_path) as api:
        for _ in range(3):
            status = await api.create_subject_access_review({"user": "u"})
            assert status == {"allowed": True, "reason": big}
        assert fake.connections == 1
        # Concurrent requests each get a connection; they are kept for the next ones.
        await asyncio.gather(*(api.create_subject_access_review({"user": "u"}) for _ in range(3)))
        assert fake.connections == 3
        await asyncio.gather(*(api.create_subject_access_review({"user": "u"}) for _ in range(3)))
        assert fake.connections == 3


async def test_a_connection_the_server_dropped_is_replaced(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    fake.close_after_reply = True
    async with await _api(fake, pki, tmp_path) as api:
        for _ in range(3):
            await api.create_token_review("t", ["a"])
            await asyncio.sleep(0.05)
    assert fake.connections == 3 and len(fake.requests) == 3
    fake.close_after_reply = False
    fake.handler = lambda r: json_reply(201, {"status": {}}, close=True)  # announced: not reused
    async with await _api(fake, pki, tmp_path) as api:
        await api.create_token_review("t", ["a"])
        await api.create_token_review("t", ["a"])
    assert fake.connections == 5


async def test_error_answers_carry_status_and_reason_only(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    fake.handler = lambda r: json_reply(
        403,
        {"kind": "Status", "reason": "Forbidden", "message": f"echo {r.body['spec']['token']}", "code": 403},
    )
    async with await _api(fake, pki, tmp_path) as api:
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review("secret-token", ["a"])
    assert (info.value.status, info.value.reason) == (403, "Forbidden")
    assert "secret-token" not in str(info.value)
    fake.handler = lambda r: (503, {"Content-Length": "5"}, b"oops!")
    async with await _api(fake, pki, tmp_path) as api:
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review("t", ["a"])
    assert (info.value.status, info.value.reason) == (503, "")


async def test_a_cancelled_request_does_not_poison_the_pool(
    fake: FakeAPIServer, pki: PKI, tmp_path: Path
) -> None:
    async with await _api(fake, pki, tmp_path) as api:
        await api.create_token_review("t", ["a"])
        fake.delay = 30.0  # the next answer would come too late: the caller gives up (a timeout)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(api.create_token_review("t", ["a"]), 0.5)
        fake.delay = 0.0
        status = await asyncio.wait_for(api.create_token_review("t", ["a"]), 10)
        assert status["authenticated"] is True
    # The abandoned connection was closed, not handed to the next request (whose answer would be
    # the late one).
    assert fake.connections == 2 and [r.connection for r in fake.requests] == [0, 0, 1]


# -- start-up cost ------------------------------------------------------------------------------------


def test_the_agent_imports_neither_kubernetes_asyncio_nor_aiohttp() -> None:
    """Start-up (``serve``'s imports) and the PyInstaller bundle (hack/build-agent.sh excludes both
    packages): no module of pko.agent may import them."""
    code = (
        "import sys, pko.agent.server, pko.agent.cli\n"
        "heavy = lambda: sorted(m for m in sys.modules\n"
        "                       if m.split('.')[0] in ('kubernetes_asyncio', 'aiohttp'))\n"
        "print(heavy())\n"
        "import importlib, pkgutil, pko.agent\n"
        "for m in pkgutil.iter_modules(pko.agent.__path__): importlib.import_module('pko.agent.' + m.name)\n"
        "print(heavy())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout


# -- against the real apiserver ------------------------------------------------------------------------


@pytest.mark.cluster
async def test_incluster_settings_against_the_apiserver(cluster: Any, tmp_path: Path) -> None:
    from urllib.parse import urlsplit

    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    shutil.copyfile(cluster.ca_file, sa / "ca.crt")
    (sa / "token").write_text(cluster.admin_token)
    url = urlsplit(cluster.server)
    env = {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    async with load_incluster(env, sa) as api:
        status = await api.create_token_review("not-a-token", [])
        assert status.get("authenticated") is not True
        allowed = await api.create_subject_access_review(
            {
                "user": "nobody",
                "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"},
            }
        )
        assert allowed.get("allowed") is not True


@pytest.mark.cluster
async def test_client_certificates_signed_by_the_cluster_ca(cluster: Any, tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    pki_dir = Path(cluster.dir) / "pki"
    if not (pki_dir / "ca.key").is_file():
        pytest.skip("needs the client CA key of a control plane started by the tests")
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    ca = {"certificate-authority-data": b64(ca_cert.public_bytes(serialization.Encoding.PEM))}

    def kubeconfig(name: str, organization: str | None) -> Path:
        pair, _, _ = _issue(name, issuer=(ca_cert, ca_key), organization=organization)
        user = {"client-certificate-data": b64(pair.cert_pem), "client-key-data": b64(pair.key_pem)}
        return write_kubeconfig(tmp_path / name, cluster.server, ca, user)

    async with load_kubeconfig([kubeconfig("pko-admin", "system:masters")]) as api:
        status = await api.create_token_review(cluster.admin_token, [])
        assert status["authenticated"] is True
    async with load_kubeconfig([kubeconfig("pko-nobody", None)]) as api:
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review(cluster.admin_token, [])
        assert (info.value.status, info.value.reason) == (403, "Forbidden")

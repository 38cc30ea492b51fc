"""A scripted HTTPS apiserver for the tests of the agent's own apiserver client (pko.agent.kubeapi):
a CA and the certificates it signs (made with ``cryptography``), a server that records what arrived
(the connection that carried it, the client certificate) and answers as a handler says, and the
kubeconfig files that point at it. The agent's client speaks only a few requests over HTTP/1.1; the
server's connection counts and its unannounced drops are what its pool is tested against, which a real
apiserver cannot script.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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


def issue(
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


def make_pki() -> PKI:
    """A CA signing a server certificate for 127.0.0.1 and a client one, and a CA that signs nothing."""
    ca, ca_cert, ca_key = issue("test-ca", ca=True)
    server, _, _ = issue("apiserver", issuer=(ca_cert, ca_key), ip="127.0.0.1")
    client, _, _ = issue("agent", issuer=(ca_cert, ca_key))
    other, _, _ = issue("other-ca", ca=True)
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

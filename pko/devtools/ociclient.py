"""A small client of the OCI distribution API (the registry side of ``docker push``), standard library only.

hack/release.py pushes pko's images with it, so that what it asks before pushing (does the tag exist? may
we push here at all?) and the push itself share one notion of the registry and its credentials, and so
that an image is pushed **by digest**: the manifest's digest is computed here from its bytes, the
registry's ``Docker-Content-Digest`` must agree, and that digest is what the release pins.

Auth follows the distribution spec's challenge: a request answered 401 is retried with the credentials
the ``WWW-Authenticate`` header asks for: ``Basic`` (a registry with htpasswd auth, as a private one is
run) or ``Bearer`` (a token from the realm it names, scoped to the repository: ghcr.io, Docker Hub).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import re
import ssl
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["MANIFEST_TYPES", "Registry", "RegistryError", "RegistryRef", "digest_of"]

# What a manifest request accepts: an OCI image manifest or index, or Docker's v2 schema 2 equivalents.
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    ]
)
_CHUNK = 1 << 20


class RegistryError(RuntimeError):
    """The registry refused or failed a request; the message names the request and its answer."""


@dataclass(frozen=True)
class RegistryRef:
    """``HOST[:PORT]/PATH``: where a release goes (the images at ``HOST/PATH/NAME``, the chart at
    ``HOST/PATH/charts/pko``). ``PATH`` may be empty."""

    host: str
    path: str

    @classmethod
    def parse(cls, text: str) -> RegistryRef:
        text = text.strip().rstrip("/")
        if "://" in text:
            raise ValueError(f"a registry is HOST[:PORT]/PATH, without a scheme: {text!r}")
        host, _, path = text.partition("/")
        if not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", host):
            raise ValueError(f"not a registry host[:port]: {host!r} (in {text!r})")
        if path and not re.fullmatch(r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*", path):
            raise ValueError(f"not a repository path (lower case, '/'-separated): {path!r}")
        return cls(host, path)

    def repository(self, name: str) -> str:
        """The repository of image ``name`` under this ref's path."""
        return f"{self.path}/{name}" if self.path else name

    def __str__(self) -> str:
        return f"{self.host}/{self.path}" if self.path else self.host


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Registry:
    """One registry host, with optional credentials and a CA to trust (a private registry's)."""

    host: str
    username: str = ""
    password: str = ""
    ca_file: Path | None = None
    plain_http: bool = False
    _tokens: dict[str, str] = field(default_factory=dict, repr=False)

    # --- the questions a release asks before it pushes --------------------------------------------

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest ``repository:reference`` names, or None when the registry has no such manifest."""
        status, headers, body = self._request(
            "HEAD", f"/v2/{repository}/manifests/{reference}", repository, headers={"Accept": MANIFEST_TYPES}
        )
        if status == 404:
            return None
        if status != 200:
            raise RegistryError(f"HEAD {self.host}/{repository}:{reference}: HTTP {status} {body[:200]!r}")
        return headers.get("docker-content-digest") or None

    def check_push(self, repository: str) -> None:
        """Raise unless this client may push to ``repository``: start a blob upload and cancel it (the
        registry says 202 only to a writer), so nothing is written."""
        status, headers, body = self._request(
            "POST", f"/v2/{repository}/blobs/uploads/", repository, push=True
        )
        if status != 202:
            raise RegistryError(
                f"the registry {self.host} refuses pushes to {repository}: HTTP {status} {_error_text(body)}"
            )
        location = headers.get("location", "")
        if location:
            self._request("DELETE", location, repository, push=True)

    # --- pushing --------------------------------------------------------------------------------

    def push_blob(self, repository: str, digest: str, path: Path) -> None:
        """Upload the blob at ``path`` (monolithically, streamed) unless the registry has it already."""
        status, _, _ = self._request("HEAD", f"/v2/{repository}/blobs/{digest}", repository, push=True)
        if status == 200:
            return
        status, headers, body = self._request(
            "POST", f"/v2/{repository}/blobs/uploads/", repository, push=True
        )
        if status != 202:
            raise RegistryError(
                f"starting an upload to {self.host}/{repository}: HTTP {status} {_error_text(body)}"
            )
        location = headers["location"]
        sep = "&" if "?" in location else "?"
        size = path.stat().st_size
        with path.open("rb") as f:
            status, _, body = self._request(
                "PUT",
                f"{location}{sep}digest={urllib.parse.quote(digest)}",
                repository,
                push=True,
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                body=f,
            )
        if status != 201:
            raise RegistryError(
                f"uploading {digest} to {self.host}/{repository}: HTTP {status} {_error_text(body)}"
            )

    def push_manifest(self, repository: str, reference: str, manifest: bytes, media_type: str) -> str:
        """PUT ``manifest`` as ``repository:reference``; its digest, which the registry must agree on."""
        digest = digest_of(manifest)
        status, headers, body = self._request(
            "PUT",
            f"/v2/{repository}/manifests/{reference}",
            repository,
            push=True,
            headers={"Content-Type": media_type},
            body=manifest,
        )
        if status != 201:
            raise RegistryError(
                f"putting {self.host}/{repository}:{reference}: HTTP {status} {_error_text(body)}"
            )
        said = headers.get("docker-content-digest")
        if said and said != digest:
            raise RegistryError(
                f"{self.host}/{repository}:{reference}: the registry says {said}, pushed {digest}"
            )
        return digest

    def get_blob(self, repository: str, digest: str) -> bytes:
        status, _, body = self._request("GET", f"/v2/{repository}/blobs/{digest}", repository)
        if status != 200:
            raise RegistryError(f"GET {self.host}/{repository}@{digest}: HTTP {status}")
        if digest_of(body) != digest:
            raise RegistryError(
                f"{self.host}/{repository}@{digest}: the blob's bytes do not match its digest"
            )
        return body

    def get_manifest(self, repository: str, reference: str) -> dict[str, Any]:
        status, _, body = self._request(
            "GET", f"/v2/{repository}/manifests/{reference}", repository, headers={"Accept": MANIFEST_TYPES}
        )
        if status != 200:
            raise RegistryError(
                f"GET {self.host}/{repository}:{reference}: HTTP {status} {_error_text(body)}"
            )
        if reference.startswith("sha256:") and digest_of(body) != reference:
            raise RegistryError(
                f"{self.host}/{repository}@{reference}: the manifest does not match its digest"
            )
        manifest: dict[str, Any] = json.loads(body)
        return manifest

    # --- HTTP -----------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self.plain_http:
            return http.client.HTTPConnection(self.host, timeout=300)
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        return http.client.HTTPSConnection(self.host, timeout=300, context=context)

    def _request(
        self,
        method: str,
        target: str,
        repository: str,
        *,
        push: bool = False,
        headers: dict[str, str] | None = None,
        body: bytes | IO[bytes] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One request, retried once with the credentials a 401's challenge asks for."""
        scope = f"repository:{repository}:{'pull,push' if push else 'pull'}"
        for attempt in range(2):
            sent = dict(headers or {})
            auth = self._authorization(scope)
            if auth:
                sent["Authorization"] = auth
            if body is not None and not isinstance(body, bytes):
                body.seek(0)
            status, answer, data = self._send(method, target, sent, body)
            if status != 401 or attempt:
                return status, answer, data
            self._answer_challenge(answer.get("www-authenticate", ""), scope)
        raise AssertionError("unreachable")

    def _send(
        self, method: str, target: str, headers: dict[str, str], body: bytes | IO[bytes] | None
    ) -> tuple[int, dict[str, str], bytes]:
        url = urllib.parse.urlsplit(target)
        if url.netloc and url.netloc != self.host:
            raise RegistryError(f"{self.host} redirected an upload to another host: {target}")
        path = urllib.parse.urlunsplit(("", "", url.path, url.query, ""))
        conn = self._connection()
        try:
            conn.request(method, path, body=body, headers=headers, encode_chunked=False)
            response = conn.getresponse()
            data = response.read() if method != "HEAD" else b""
            return response.status, {k.lower(): v for k, v in response.getheaders()}, data
        except (OSError, http.client.HTTPException) as exc:
            raise RegistryError(f"{method} https://{self.host}{url.path}: {exc}") from None
        finally:
            conn.close()

    def _authorization(self, scope: str) -> str:
        if scope in self._tokens:
            return f"Bearer {self._tokens[scope]}"
        if self._tokens.get("basic") and self.username:
            return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return ""

    def _answer_challenge(self, challenge: str, scope: str) -> None:
        scheme, _, params_text = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.username:
                raise RegistryError(f"{self.host} asks for credentials: set PKO_REGISTRY_USERNAME/PASSWORD")
            self._tokens["basic"] = "yes"
            return
        if scheme.lower() != "bearer":
            raise RegistryError(f"{self.host}: an auth challenge this client does not speak: {challenge!r}")
        params = dict(re.findall(r'(\w+)="([^"]*)"', params_text))
        query = {"scope": scope}
        if params.get("service"):
            query["service"] = params["service"]
        realm = urllib.parse.urlsplit(params.get("realm", ""))
        conn: http.client.HTTPConnection
        if realm.scheme == "http":
            conn = http.client.HTTPConnection(realm.netloc, timeout=60)
        else:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            conn = http.client.HTTPSConnection(realm.netloc, timeout=60, context=context)
        auth = {}
        if self.username:
            auth["Authorization"] = (
                "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            )
        try:
            conn.request("GET", f"{realm.path}?{urllib.parse.urlencode(query)}", headers=auth)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise RegistryError(f"{realm.netloc} refused a token for {scope}: HTTP {response.status}")
        token = json.loads(data)
        self._tokens[scope] = token.get("token") or token.get("access_token") or ""


def _error_text(body: bytes) -> str:
    """The registry's own words: the ``errors`` of a distribution-spec error body, else the raw start."""
    try:
        errors = json.loads(body).get("errors") or []
        return (
            "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors) or body[:200].decode()
        )
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")

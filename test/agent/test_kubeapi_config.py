"""Where the agent's own apiserver client (pko.agent.kubeapi) finds the apiserver and its credentials:
kubeconfig files (token, CA, client certificate, merged lists; what it refuses, by name; reading and
merging the files is test/machinery/test_kubeconfigfile.py's) and in-cluster settings (the service
environment, a token file re-read as the kubelet rotates it). The apiserver is the scripted HTTPS
server of pko/devtools/fakeapiserver.py, which records what arrived.
"""

from __future__ import annotations

import glob
import json
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pko.agent.kubeapi import FileToken, KubeConfigError, connect, load_incluster, load_kubeconfig

from pko.devtools.fakeapiserver import PKI, FakeAPIServer, b64, write_kubeconfig

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
    """What the agent refuses of a kubeconfig the reader took (broken files: test_kubeconfigfile.py)."""
    with pytest.raises(KubeConfigError, match="cannot read kubeconfig"):
        load_kubeconfig([tmp_path / "missing"])
    path = write_kubeconfig(tmp_path / "k", "https://127.0.0.1:1", {}, {"token": "t"})
    cfg = json.loads(path.read_text())
    cfg["users"][0]["name"] = "someone-else"
    path.write_text(json.dumps(cfg))
    with pytest.raises(KubeConfigError, match="user 'u' of context 'ctx' not found"):
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


# -- in-cluster settings and the token file ---------------------------------------------------------


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

"""The agent's own apiserver client (pko.agent.kubeapi) against the real kube-apiserver: with in-cluster
settings, and with client certificates signed by its CA."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pko.agent.kubeapi import KubeAPIError, load_incluster, load_kubeconfig

from pko.devtools.fakeapiserver import b64, issue, write_kubeconfig


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
        pair, _, _ = issue(name, issuer=(ca_cert, ca_key), organization=organization)
        user = {"client-certificate-data": b64(pair.cert_pem), "client-key-data": b64(pair.key_pem)}
        return write_kubeconfig(tmp_path / name, cluster.server, ca, user)

    async with load_kubeconfig([kubeconfig("pko-admin", "system:masters")]) as api:
        status = await api.create_token_review(cluster.admin_token, [])
        assert status["authenticated"] is True
    async with load_kubeconfig([kubeconfig("pko-nobody", None)]) as api:
        with pytest.raises(KubeAPIError) as info:
            await api.create_token_review(cluster.admin_token, [])
        assert (info.value.status, info.value.reason) == (403, "Forbidden")

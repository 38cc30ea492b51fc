"""The operator's client (pko.machinery.kubeclient) against the real apiserver: each way it
authenticates (a token, a rotated in-cluster token, a client certificate, an exec plugin through
kubernetes-asyncio's loader) and the errors it raises (status, reason, body, headers)."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kube_helpers import etcd_compact

from pko.devtools.localcluster import LocalCluster
from pko.devtools.pki import Cert, sign
from pko.machinery.kubeclient import ApiException, KubeClient, TokenFile
from pko.machinery.kubeconfig import in_cluster_config, kubeconfig_config, load_client_config
from pko.machinery.resource import CONFIGMAPS, NAMESPACES, ResourceClient

pytestmark = pytest.mark.cluster


@pytest.fixture
async def kube(cluster: Any) -> AsyncIterator[KubeClient]:
    cfg = kubeconfig_config(str(cluster.kubeconfig))
    assert cfg is not None
    async with KubeClient(cfg) as api:
        yield api


async def namespaces(api: KubeClient) -> list[str]:
    page = await ResourceClient(api, NAMESPACES).list()
    return [ns["metadata"]["name"] for ns in page.items]


def kubeconfig_for(path: Path, server: str, ca_file: Path, user: dict[str, Any]) -> Path:
    ca = base64.b64encode(ca_file.read_bytes()).decode()
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }
    path.write_text(json.dumps(cfg))
    return path


async def test_errors_carry_the_apiservers_status(kube: KubeClient, namespace: str) -> None:
    """404, 409 and 422 as the apiserver words them: the Status reason and message in ``reason``,
    the Status itself in ``body``, the response headers."""
    cms = ResourceClient(kube, CONFIGMAPS, namespace)
    with pytest.raises(ApiException) as missing:
        await cms.get("absent")
    assert missing.value.status == 404
    assert missing.value.reason == 'NotFound: configmaps "absent" not found'
    assert json.loads(missing.value.body or "")["code"] == 404
    assert missing.value.headers is not None
    assert missing.value.headers["Content-Type"] == "application/json"

    await cms.create({"metadata": {"name": "once"}})
    with pytest.raises(ApiException) as conflict:
        await cms.create({"metadata": {"name": "once"}})
    assert conflict.value.status == 409
    assert conflict.value.reason == 'AlreadyExists: configmaps "once" already exists'

    with pytest.raises(ApiException) as invalid:
        await cms.create({"metadata": {"name": "Not_A_Name"}})
    assert invalid.value.status == 422
    assert invalid.value.reason.startswith('Invalid: ConfigMap "Not_A_Name" is invalid: metadata.name')
    assert json.loads(invalid.value.body or "")["details"]["causes"]


async def test_a_compacted_revision_is_410_gone_for_a_page_and_a_watch(
    nocache_cluster: LocalCluster,
) -> None:
    cfg = kubeconfig_config(str(nocache_cluster.kubeconfig))
    assert cfg is not None
    async with KubeClient(cfg) as api:
        cms = ResourceClient(api, CONFIGMAPS, "default")
        for name in ("a", "b"):
            await cms.create({"metadata": {"name": name}})
        first = await cms.list(limit=1)
        assert first.continue_token
        for name in ("c", "d"):  # etcd moves past the page's revision and the one after it
            await cms.create({"metadata": {"name": name}})
        await etcd_compact(nocache_cluster.etcd_url)
        with pytest.raises(ApiException) as page:
            await cms.list(limit=1, continue_token=first.continue_token)
        assert page.value.status == 410
        assert page.value.reason.startswith("Expired: The provided continue parameter is too old")
        assert page.value.headers is not None
        with pytest.raises(ApiException) as watch:  # an ERROR event in a watch that began 200 OK
            async with cms.watch(resource_version=first.resource_version, timeout_seconds=5) as events:
                async for _ in events:
                    pass
        assert watch.value.status == 410
        assert watch.value.reason.startswith("Expired: ")
        assert json.loads(watch.value.body or "")["object"]["code"] == 410


async def test_in_cluster_credentials_follow_the_rotated_token(cluster: Any, tmp_path: Path) -> None:
    """The in-cluster config against the suite's apiserver, as a pod sees it: the token file is
    read again once it is a minute old, so a rotated (here: revoked, then restored) token applies."""
    (tmp_path / "token").write_text(cluster.admin_token)
    shutil.copyfile(cluster.ca_file, tmp_path / "ca.crt")
    url = urlsplit(cluster.server)
    env = {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    cfg = in_cluster_config(env, tmp_path)
    now = [0.0]
    cfg = dataclasses.replace(cfg, credentials=TokenFile(str(tmp_path / "token"), clock=lambda: now[0]))
    async with KubeClient(cfg) as api:
        assert "default" in await namespaces(api)
        (tmp_path / "token").write_text("revoked")
        assert "default" in await namespaces(api), "read again only once a minute old"
        now[0] += 60
        with pytest.raises(ApiException) as refused:
            await namespaces(api)
        assert refused.value.status == 401
        (tmp_path / "token").write_text(cluster.admin_token)
        now[0] += 60
        assert "default" in await namespaces(api)


async def test_a_client_certificate_inline_or_in_files_authenticates(cluster: Any, tmp_path: Path) -> None:
    pki = Path(cluster.dir) / "pki"
    if not (pki / "ca.key").exists():
        pytest.skip("needs the CA key of a control plane started by the tests")
    sign(
        pki,
        Cert("client", f"/O=system:masters/CN=pko-kubeclient-{uuid.uuid4().hex[:6]}", "clientAuth"),
        tmp_path,
    )
    crt, key = tmp_path / "client.crt", tmp_path / "client.key"
    inline = {
        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    }
    files = {"client-certificate": "client.crt", "client-key": "client.key"}  # relative to the kubeconfig
    for name, user in (("inline", inline), ("files", files)):
        path = kubeconfig_for(tmp_path / name, cluster.server, Path(cluster.ca_file), user)
        cfg = kubeconfig_config(str(path))
        assert cfg is not None and cfg.credentials is None
        async with KubeClient(cfg) as api:
            assert "default" in await namespaces(api), name


async def test_an_exec_plugin_kubeconfig_goes_through_kubernetes_asyncios_loader(
    cluster: Any, tmp_path: Path
) -> None:
    plugin = tmp_path / "get-token"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": cluster.admin_token},
    }
    plugin.write_text(f"#!/bin/sh\necho '{json.dumps(credential)}'\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}
    path = kubeconfig_for(tmp_path / "config", cluster.server, Path(cluster.ca_file), user)
    assert kubeconfig_config(str(path)) is None
    cfg = await load_client_config(str(path), {"PATH": os.environ.get("PATH", "")})
    async with KubeClient(cfg) as api:
        assert "default" in await namespaces(api)

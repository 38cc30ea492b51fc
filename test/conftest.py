"""Session fixtures shared by every test: a real control plane, the CRDs, an API client.

The control plane is etcd + kube-apiserver (+ kube-controller-manager) started by
hack/localcluster.py on free loopback ports, unless $KUBECONFIG points at a cluster to use instead
(then tests that need to stop or restart the apiserver skip).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.devtools.kubectl import kubectl
from pko.devtools.localcluster import LocalCluster

REPO = Path(__file__).resolve().parent.parent

# The stand-in Pulumi CLI (test/fakepulumi): the `fake_pulumi` fixture for agent tests.
pytest_plugins = ["fakepulumi.fixtures"]


class ExternalCluster:
    """A cluster we did not start ($KUBECONFIG): same handle, no lifecycle control."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.dir = kubeconfig.parent
        cfg: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        ctx_name = cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server: str = cluster["server"]
        self.admin_token: str = user.get("token", "")
        self.etcd_url = ""
        self.ca_file = self.dir / "ca.crt"

    def stop_apiserver(self) -> None:
        pytest.skip("needs a control plane started by the tests (unset KUBECONFIG)")

    def start_apiserver(self) -> None:
        pytest.skip("needs a control plane started by the tests (unset KUBECONFIG)")

    def restart_apiserver(self) -> None:
        pytest.skip("needs a control plane started by the tests (unset KUBECONFIG)")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    external = os.environ.get("KUBECONFIG")
    if external:
        yield ExternalCluster(Path(external))
        return
    with tempfile.TemporaryDirectory(prefix="pko-cluster-") as d:
        c = LocalCluster(d).start()
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture(scope="session")
def crds(cluster: Any) -> list[str]:
    """Install config/crd/bases (server-side apply) and wait until every CRD is Established."""
    bases = REPO / "config" / "crd" / "bases"
    files = sorted(bases.glob("*.yaml"))
    assert files, f"no CRDs in {bases}: run hack/gen_crds.py"
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(bases))
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names])
    return names


@pytest.fixture(scope="session")
async def api_client(cluster: Any) -> AsyncIterator[Any]:
    from kubernetes_asyncio import client, config

    from pko.devtools.apiclient import stock_api_client  # kubernetes-asyncio's and machinery's

    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    async with stock_api_client(cfg) as api:
        yield api


@pytest.fixture(scope="module")
async def namespace(request: pytest.FixtureRequest, api_client: Any, crds: list[str]) -> AsyncIterator[str]:
    """A fresh namespace per test module (named after it), with the CRDs installed; deleted afterwards."""
    from kubernetes_asyncio import client

    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    name = f"{module[:40]}-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    await core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        await core.delete_namespace(name)


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A private OCI registry on loopback (hack/registry.py: Distribution, TLS from its own CA, htpasswd)."""
    from pko.devtools import registry

    running = registry.start(tmp_path_factory.mktemp("registry"), "127.0.0.1")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned helm's cache, config and data homes for the module (test/helmtest.py's ``helm``)."""
    return tmp_path_factory.mktemp("helm-home")


def pytest_report_header(config: pytest.Config) -> str:
    mode = f"external ($KUBECONFIG={os.environ['KUBECONFIG']})" if os.environ.get("KUBECONFIG") else "local"
    return f"pko control plane: {mode}"


__all__ = ["ExternalCluster", "json", "kubectl"]

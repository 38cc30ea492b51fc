"""The plugin's own kubeconfig authentication (pko.kubectl.credentials) against the real apiserver:
an exec credential plugin, client certificates inline and from files relative to the kubeconfig,
and what it refuses; the proxy rule without a network."""

from __future__ import annotations

import base64
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from pko.devtools.pki import Cert, sign
from pko.kubectl.credentials import environment_proxy
from pko.kubectl.exitcodes import ExitCode

from . import stacks as fx
from .plugin import Env, kubeconfig_for

EXEC_PLUGIN = """\
import json, os, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False, info
assert info["spec"]["cluster"]["server"].startswith("https://"), info  # provideClusterInfo
assert os.environ["FROM_KUBECONFIG"] == "yes"
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {"token": sys.argv[1]}}))
"""


def _rewrite_user(source: Path, dest: Path, user: dict[str, Any]) -> Path:
    config = yaml.safe_load(source.read_text())
    config["users"][0]["user"] = user
    dest.write_text(yaml.safe_dump(config))
    return dest


@pytest.fixture(scope="module")
async def env(
    api_client: ApiClient, cluster: Any, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("kubectl-pko-credentials")
    e = Env(api_client, namespace, kubeconfig_for(Path(cluster.kubeconfig), tmp / "kubeconfig", namespace))
    await e.put("stacks", fx.stack("web", status=fx.ready_status("web-1")))
    yield e


@pytest.mark.cluster
@pytest.mark.parametrize("api_version", ["v1", "v1beta1"])
async def test_an_exec_credential_plugin(env: Env, cluster: Any, tmp_path: Path, api_version: str) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "creds.py").write_text(EXEC_PLUGIN)
    spec = {
        "apiVersion": f"client.authentication.k8s.io/{api_version}",
        "command": sys.executable,
        "args": [str(tmp_path / "bin" / "creds.py"), cluster.admin_token],
        "env": [{"name": "FROM_KUBECONFIG", "value": "yes"}],
        "interactiveMode": "Never",
        "provideClusterInfo": True,
    }
    kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "config", {"exec": spec})
    result = await env.pko("status", "web", kubeconfig=kubeconfig)
    assert result.code == 0, result.err

    spec["args"] = [str(tmp_path / "bin" / "creds.py"), "not-a-token"]
    kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "c2", {"exec": spec})
    refused = await env.pko("status", "web", kubeconfig=kubeconfig)
    assert refused.code == ExitCode.API_ERROR and "401" in refused.err

    spec["command"] = "bin/missing-plugin"  # relative with a slash: the kubeconfig's directory
    kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "c3", {"exec": spec})
    missing = await env.pko("status", "web", kubeconfig=kubeconfig)
    assert missing.code == ExitCode.API_ERROR
    assert missing.err.startswith(f"error: exec plugin {tmp_path / 'bin' / 'missing-plugin'}: ")


@pytest.mark.cluster
async def test_client_certificates_inline_and_from_files(env: Env, cluster: Any, tmp_path: Path) -> None:
    ca_dir = Path(cluster.ca_file).parent
    if not (ca_dir / "ca.key").is_file():
        pytest.skip("needs the CA key of a control plane the tests started")
    user = Cert("plugin-user", "/O=system:masters/CN=kubectl-pko-test", "clientAuth")
    sign(ca_dir, user, out=tmp_path / "pki")
    crt, key = tmp_path / "pki" / "plugin-user.crt", tmp_path / "pki" / "plugin-user.key"
    inline = {
        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    }
    kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "inline", inline)
    result = await env.pko("status", "web", kubeconfig=kubeconfig)
    assert result.code == 0, result.err

    files = {"client-certificate": "pki/plugin-user.crt", "client-key": "pki/plugin-user.key"}
    kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "files", files)  # relative to its directory
    result = await env.pko("status", "web", kubeconfig=kubeconfig)
    assert result.code == 0, result.err

    kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "half", {"client-key": "pki/plugin-user.key"})
    half = await env.pko("status", "web", kubeconfig=kubeconfig)
    assert half.code == ExitCode.API_ERROR and "without its" in half.err


@pytest.mark.cluster
async def test_the_server_certificate_is_verified(env: Env, tmp_path: Path) -> None:
    config = yaml.safe_load(env.kubeconfig.read_text())
    del config["clusters"][0]["cluster"]["certificate-authority-data"]  # the system's CAs: not ours
    (tmp_path / "no-ca").write_text(yaml.safe_dump(config))
    untrusted = await env.pko("status", "web", kubeconfig=tmp_path / "no-ca")
    assert untrusted.code == ExitCode.API_ERROR and "CERTIFICATE_VERIFY_FAILED" in untrusted.err
    config["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    (tmp_path / "insecure").write_text(yaml.safe_dump(config))
    assert (await env.pko("status", "web", kubeconfig=tmp_path / "insecure")).code == 0


@pytest.mark.cluster
async def test_refused_rather_than_another_identity(env: Env, tmp_path: Path) -> None:
    for user in ({"token": "t", "as": "someone"}, {"auth-provider": {"name": "oidc", "config": {}}}):
        kubeconfig = _rewrite_user(env.kubeconfig, tmp_path / "refused", user)
        result = await env.pko("status", "web", kubeconfig=kubeconfig)
        assert result.code == ExitCode.API_ERROR and "does not support" in result.err, result.err


def test_environment_proxy_as_go() -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "internal.example,.corp"}
    assert environment_proxy("https://api.example:6443", env) == "http://proxy:3128"
    for server in ("https://127.0.0.1:6443", "https://[::1]:6443", "https://localhost:1", "https://a.corp"):
        assert environment_proxy(server, env) is None, server
    assert environment_proxy("https://internal.example", env) is None
    assert environment_proxy("https://api.example", {"https_proxy": "http://p", "no_proxy": "*"}) is None
    assert environment_proxy("http://api.example", env) is None  # no HTTP_PROXY

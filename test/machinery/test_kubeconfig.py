"""The operator's client configuration (pko.machinery.kubeconfig): in-cluster files and env, and what it
makes of a kubeconfig's entries; a user with a credential plugin goes to kubernetes-asyncio. Reading the
files (merging, the current context, broken files): test_kubeconfigfile.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from pko.machinery.kubeclient import StaticToken, TokenFile
from pko.machinery.kubeconfig import ConfigError, in_cluster_config, kubeconfig_config, load_client_config

NO_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in NO_PROXY_ENV:
        monkeypatch.delenv(var, raising=False)


def service_account(directory: Path, token: str = "tok-1") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token + "\n")
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return directory


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any], name: str = "c") -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": name,
                "clusters": [{"name": name, "cluster": cluster}],
                "users": [{"name": name, "user": user}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            }
        )
    )
    return path


async def authorization(credentials: Any) -> str | None:
    assert credentials is not None
    header: str | None = await credentials.authorization()
    return header


async def test_in_cluster_reads_the_service_host_and_the_service_accounts_token_and_ca(
    tmp_path: Path,
) -> None:
    sa = service_account(tmp_path / "sa")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = in_cluster_config(env, sa)
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.ca_file == str(sa / "ca.crt") and cfg.verify_ssl and cfg.proxy is None
    assert isinstance(cfg.credentials, TokenFile)
    assert await authorization(cfg.credentials) == "Bearer tok-1"
    ipv6 = in_cluster_config({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}, sa)
    assert ipv6.host == "https://[fd00::1]:6443"


def test_in_cluster_names_what_is_missing(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_PORT"):
        in_cluster_config({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, service_account(tmp_path / "a"))
    with pytest.raises(ConfigError, match="token"):
        in_cluster_config(env, tmp_path / "absent")
    empty = service_account(tmp_path / "b", token="")
    with pytest.raises(ConfigError, match="empty"):
        in_cluster_config(env, empty)
    (tmp_path / "b" / "token").write_text("t")
    (tmp_path / "b" / "ca.crt").write_text("")
    with pytest.raises(ConfigError, match=r"ca\.crt is empty"):
        in_cluster_config(env, empty)


async def test_the_in_cluster_token_is_read_again_once_a_minute_old(tmp_path: Path) -> None:
    """The kubelet rotates the projected token in place; a minute-old read is refreshed (client-go's
    period), and a file caught mid-rotation (empty) keeps the last token."""
    sa = service_account(tmp_path)
    now = [1000.0]
    source = TokenFile(str(sa / "token"), clock=lambda: now[0])
    (sa / "token").write_text("tok-2")
    now[0] += 59.0
    assert await source.authorization() == "Bearer tok-1"
    now[0] += 1.0
    assert await source.authorization() == "Bearer tok-2"
    (sa / "token").write_text("")
    now[0] += 60.0
    assert await source.authorization() == "Bearer tok-2"
    (sa / "token").write_text("tok-3")
    assert await source.authorization() == "Bearer tok-3"


async def test_a_kubeconfig_token_ca_data_tls_name_and_proxy(tmp_path: Path) -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nX\n").decode()
    path = kubeconfig(
        tmp_path / "config",
        {
            "server": "https://api.example:6443/",
            "certificate-authority-data": ca,
            "tls-server-name": "kubernetes",
            "proxy-url": "http://proxy:3128",
        },
        {"token": "abc"},
    )
    cfg = kubeconfig_config(str(path))
    assert cfg is not None
    assert cfg.host == "https://api.example:6443"
    assert cfg.ca_data == "-----BEGIN CERTIFICATE-----\nX\n" and cfg.ca_file is None
    assert cfg.tls_server_name == "kubernetes" and cfg.proxy == "http://proxy:3128" and cfg.verify_ssl
    assert cfg.credentials == StaticToken("Bearer abc")


async def test_kubeconfig_files_are_relative_to_the_kubeconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("from-file\n")
    path = kubeconfig(
        tmp_path / "config",
        {
            "server": "https://api:6443",
            "certificate-authority": "pki/ca.crt",
            "insecure-skip-tls-verify": True,
        },
        {"tokenFile": "token", "client-certificate": "pki/c.crt", "client-key": "/abs/c.key"},
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://from-env:3128")
    cfg = kubeconfig_config(str(path))
    assert cfg is not None
    assert cfg.ca_file == str(tmp_path / "pki" / "ca.crt")
    assert (cfg.cert_file, cfg.key_file) == (str(tmp_path / "pki" / "c.crt"), "/abs/c.key")
    assert not cfg.verify_ssl
    assert cfg.proxy == "http://from-env:3128"  # no proxy-url: the environment's, resolved once
    assert await authorization(cfg.credentials) == "Bearer from-file"


def test_a_kubeconfig_client_certificate_inline_and_basic_auth(tmp_path: Path) -> None:
    cert, key = base64.b64encode(b"CERT").decode(), base64.b64encode(b"KEY").decode()
    path = kubeconfig(
        tmp_path / "config",
        {"server": "https://api:6443"},
        {"client-certificate-data": cert, "client-key-data": key},
    )
    cfg = kubeconfig_config(str(path))
    assert cfg is not None and (cfg.cert_data, cfg.key_data) == (b"CERT", b"KEY") and cfg.credentials is None
    path = kubeconfig(tmp_path / "basic", {"server": "http://api:8080"}, {"username": "u", "password": "p"})
    cfg = kubeconfig_config(str(path))
    assert cfg is not None
    assert cfg.credentials == StaticToken("Basic " + base64.b64encode(b"u:p").decode())
    lonely = kubeconfig(
        tmp_path / "lonely", {"server": "https://api:6443"}, {"client-certificate-data": cert}
    )
    with pytest.raises(ConfigError, match="needs its key"):
        kubeconfig_config(str(lonely))


async def test_a_token_file_wins_over_a_token_as_in_client_go(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    both = kubeconfig(tmp_path / "both", {"server": "https://a:1"}, {"token": "inline", "tokenFile": "token"})
    cfg = kubeconfig_config(str(both))
    assert cfg is not None and await authorization(cfg.credentials) == "Bearer from-file"


def test_a_user_with_a_credential_plugin_is_left_to_kubernetes_asyncio(tmp_path: Path) -> None:
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}}
    assert kubeconfig_config(str(kubeconfig(tmp_path / "exec", {"server": "https://a:1"}, exec_user))) is None
    provider = {"auth-provider": {"name": "oidc", "config": {}}}
    assert kubeconfig_config(str(kubeconfig(tmp_path / "oidc", {"server": "https://a:1"}, provider))) is None


async def test_the_order_is_kubeconfig_then_in_cluster_then_home(tmp_path: Path) -> None:
    explicit = kubeconfig(tmp_path / "explicit", {"server": "https://explicit:6443"}, {"token": "e"})
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig(home / ".kube" / "config", {"server": "https://home:6443"}, {"token": "h"})
    in_cluster = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert (await load_client_config(str(explicit), in_cluster, home)).host == "https://explicit:6443"
    assert (await load_client_config(None, {}, home)).host == "https://home:6443"
    # In a pod (the default ServiceAccount directory is absent here): the in-cluster loader is chosen.
    with pytest.raises(ConfigError, match="in-cluster config"):
        await load_client_config(None, in_cluster, home)

"""Where the operator's :class:`~pko.machinery.kubeclient.KubeClient` connects, and as whom.

controller-runtime's order: ``--kubeconfig``/``$KUBECONFIG`` (``:``-separated files, merged as
client-go merges them, by :mod:`pko.machinery.kubeconfigfile`, which the agent reads them with too),
else the in-cluster config (``KUBERNETES_SERVICE_HOST``/``_PORT``, the ServiceAccount's token and CA),
else ``~/.kube/config``.

What is read from a kubeconfig: the cluster's ``server``, ``certificate-authority(-data)``,
``insecure-skip-tls-verify``, ``tls-server-name``, ``proxy-url``; the user's ``token``/``tokenFile``,
``client-certificate(-data)`` and ``client-key(-data)``, ``username``/``password``. Relative file
names are relative to the file that names them.

A user that needs a credential plugin (``exec``, or a legacy ``auth-provider`` such as ``gcp`` or
``oidc``) is handed to kubernetes-asyncio's own loader, imported only then: those plugins mint and
refresh short-lived tokens, which its ``Configuration`` re-runs per request. That is the one path on
which the operator process imports kubernetes-asyncio (issue 44: its generated package costs about
50 MB); in a cluster, and with a token or a client certificate, it never does.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pko.machinery.kubeclient import ClientConfig, StaticToken, TokenFile, config_of, environment_proxy
from pko.machinery.kubeconfigfile import (
    IN_CLUSTER_DIR,
    ConfigError,
    in_cluster_server,
    kubeconfig_paths,
    read_kubeconfig,
)

__all__ = ["IN_CLUSTER_DIR", "ConfigError", "in_cluster_config", "kubeconfig_config", "load_client_config"]

# Users whose credentials come from a plugin: kubernetes-asyncio's loader runs those.
PLUGIN_KEYS: Final = ("exec", "auth-provider")


def in_cluster_config(
    environ: Mapping[str, str] | None = None, directory: Path = IN_CLUSTER_DIR
) -> ClientConfig:
    """The pod's ServiceAccount: its token (re-read as the kubelet rotates it) and CA."""
    server = in_cluster_server(os.environ if environ is None else environ)
    token, ca = directory / "token", directory / "ca.crt"
    try:
        credentials = TokenFile(str(token))
        if not ca.read_text().strip():
            raise ConfigError(f"in-cluster config: {ca} is empty")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"in-cluster config: {exc}") from None
    return ClientConfig(server, credentials, ca_file=str(ca), proxy=environment_proxy(server))


def kubeconfig_config(kubeconfig: str) -> ClientConfig | None:
    """The current context of ``kubeconfig`` (``:``-separated files) as a client configuration;
    None when its user needs a credential plugin (see the module docstring)."""
    config = read_kubeconfig(kubeconfig_paths(kubeconfig))
    cluster, user = config.cluster, config.user or {}
    if any(user.get(key) for key in PLUGIN_KEYS):
        return None
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError("kubeconfig: the cluster has no server")
    credentials: StaticToken | TokenFile | None = None
    try:
        if token_file := config.user_path("tokenFile"):  # client-go: the file, re-read, wins over token
            credentials = TokenFile(str(token_file))
        elif user.get("token"):
            credentials = StaticToken(f"Bearer {user['token']}")
        elif user.get("username") and user.get("password"):
            basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
            credentials = StaticToken(f"Basic {basic}")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"kubeconfig: the user's tokenFile: {exc}") from None
    tls: dict[str, Any] = {}
    if server.startswith("https:"):
        if (ca_data := config.cluster_data("certificate-authority-data")) is not None:
            tls["ca_data"] = ca_data.decode()
        elif ca_file := config.cluster_path("certificate-authority"):
            tls["ca_file"] = str(ca_file)
        if (cert_data := config.user_data("client-certificate-data")) is not None:
            tls["cert_data"] = cert_data
        elif cert_file := config.user_path("client-certificate"):
            tls["cert_file"] = str(cert_file)
        if (key_data := config.user_data("client-key-data")) is not None:
            tls["key_data"] = key_data
        elif key_file := config.user_path("client-key"):
            tls["key_file"] = str(key_file)
        if ("cert_data" in tls) != ("key_data" in tls) or ("cert_file" in tls) != ("key_file" in tls):
            raise ConfigError("kubeconfig: a client certificate needs its key, inline or as a file alike")
    return ClientConfig(
        server,
        credentials,
        verify_ssl=not cluster.get("insecure-skip-tls-verify"),
        tls_server_name=str(cluster.get("tls-server-name") or "") or None,
        proxy=str(cluster.get("proxy-url") or "") or environment_proxy(server),
        **tls,
    )


async def _plugin_config(kubeconfig: str) -> ClientConfig:
    """kubernetes-asyncio's loader, for a user with a credential plugin (the only import of it)."""
    from kubernetes_asyncio import client, config  # 50 MB of modules: only on this path

    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    if cfg.proxy is None and cfg.host:
        cfg.proxy = environment_proxy(cfg.host)
    return config_of(cfg)


async def load_client_config(
    kubeconfig: str | None, environ: Mapping[str, str] | None = None, home: Path | None = None
) -> ClientConfig:
    """controller-runtime's order: ``kubeconfig``, in-cluster, ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    if not kubeconfig:
        if env.get("KUBERNETES_SERVICE_HOST"):
            return in_cluster_config(env)
        kubeconfig = str((home or Path.home()) / ".kube" / "config")
    return kubeconfig_config(kubeconfig) or await _plugin_config(kubeconfig)

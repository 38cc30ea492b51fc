"""Where the operator's :class:`~pko.machinery.kubeclient.KubeClient` connects, and as whom.

controller-runtime's order: ``--kubeconfig``/``$KUBECONFIG`` (``:``-separated files, merged as
client-go merges them: the first file to name a cluster, user or context wins, and the first to set
``current-context``; missing files are skipped), else the in-cluster config
(``KUBERNETES_SERVICE_HOST``/``_PORT``, the ServiceAccount's token and CA), else ``~/.kube/config``.

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

import yaml

from pko.machinery.kubeclient import ClientConfig, StaticToken, TokenFile, config_of, environment_proxy

__all__ = ["IN_CLUSTER_DIR", "ConfigError", "in_cluster_config", "kubeconfig_config", "load_client_config"]

IN_CLUSTER_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Users whose credentials come from a plugin: kubernetes-asyncio's loader runs those.
PLUGIN_KEYS: Final = ("exec", "auth-provider")


class ConfigError(Exception):
    """The configuration cannot be loaded; the message says what is missing or wrong."""


def _join_host_port(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


def in_cluster_config(
    environ: Mapping[str, str] | None = None, directory: Path = IN_CLUSTER_DIR
) -> ClientConfig:
    """The pod's ServiceAccount: its token (re-read as the kubelet rotates it) and CA."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"
        )
    token, ca = directory / "token", directory / "ca.crt"
    try:
        credentials = TokenFile(str(token))
        if not ca.read_text().strip():
            raise ConfigError(f"in-cluster config: {ca} is empty")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"in-cluster config: {exc}") from None
    server = f"https://{_join_host_port(host, port)}"
    return ClientConfig(server, credentials, ca_file=str(ca), proxy=environment_proxy(server))


def _entries(configs: list[tuple[Mapping[str, Any], Path]], section: str) -> dict[str, tuple[Any, Path]]:
    """Each named entry of ``section`` with its file's directory; the first of a name wins."""
    key = section.removesuffix("s")
    found: dict[str, tuple[Any, Path]] = {}
    for config, path in configs:
        for entry in config.get(section) or []:
            if isinstance(entry, Mapping) and entry.get("name") and entry["name"] not in found:
                found[str(entry["name"])] = (entry.get(key) or {}, path.parent)
    return found


def _path(value: Any, base: Path) -> str:
    path = Path(str(value)).expanduser()
    return str(path if path.is_absolute() else base / path)


def _data(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise ConfigError(f"kubeconfig: {what} is not base64") from None


def _selected(paths: list[Path]) -> tuple[Mapping[str, Any], Path, Mapping[str, Any], Path]:
    """The current context's cluster and user, each with the directory of its file."""
    configs: list[tuple[Mapping[str, Any], Path]] = []
    for path in paths:
        try:
            parsed = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"kubeconfig {path}: {exc}") from None
        if isinstance(parsed, Mapping):
            configs.append((parsed, path))
    if not configs:
        raise ConfigError(f"no kubeconfig found at {os.pathsep.join(map(str, paths))}")
    current = next((str(c["current-context"]) for c, _ in configs if c.get("current-context")), "")
    contexts = _entries(configs, "contexts")
    if current not in contexts:
        raise ConfigError(f"kubeconfig: the current context {current!r} does not exist")
    context = contexts[current][0]
    clusters, users = _entries(configs, "clusters"), _entries(configs, "users")
    cluster_name, user_name = str(context.get("cluster") or ""), str(context.get("user") or "")
    if cluster_name not in clusters:
        raise ConfigError(f"kubeconfig: context {current!r} names no known cluster ({cluster_name!r})")
    cluster, cluster_dir = clusters[cluster_name]
    user, user_dir = users.get(user_name, ({}, paths[0].parent))
    return cluster, cluster_dir, user, user_dir


def _kubeconfig_paths(kubeconfig: str) -> list[Path]:
    paths = [Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p]
    return list(dict.fromkeys(p for p in paths if p.is_file())) or paths[:1]


def kubeconfig_config(kubeconfig: str) -> ClientConfig | None:
    """The current context of ``kubeconfig`` (``:``-separated files) as a client configuration;
    None when its user needs a credential plugin (see the module docstring)."""
    cluster, cluster_dir, user, user_dir = _selected(_kubeconfig_paths(kubeconfig))
    if any(user.get(key) for key in PLUGIN_KEYS):
        return None
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError("kubeconfig: the cluster has no server")
    credentials: StaticToken | TokenFile | None = None
    try:
        if user.get("token"):
            credentials = StaticToken(f"Bearer {user['token']}")
        elif user.get("tokenFile"):
            credentials = TokenFile(_path(user["tokenFile"], user_dir))
        elif user.get("username") and user.get("password"):
            basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
            credentials = StaticToken(f"Basic {basic}")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"kubeconfig: the user's tokenFile: {exc}") from None
    tls: dict[str, Any] = {}
    if server.startswith("https:"):
        if cluster.get("certificate-authority-data"):
            tls["ca_data"] = _data(
                cluster["certificate-authority-data"], "certificate-authority-data"
            ).decode()
        elif cluster.get("certificate-authority"):
            tls["ca_file"] = _path(cluster["certificate-authority"], cluster_dir)
        if user.get("client-certificate-data"):
            tls["cert_data"] = _data(user["client-certificate-data"], "client-certificate-data")
        elif user.get("client-certificate"):
            tls["cert_file"] = _path(user["client-certificate"], user_dir)
        if user.get("client-key-data"):
            tls["key_data"] = _data(user["client-key-data"], "client-key-data")
        elif user.get("client-key"):
            tls["key_file"] = _path(user["client-key"], user_dir)
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

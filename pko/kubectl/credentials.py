"""From a kubeconfig's cluster and user to an :class:`~pko.kubectl.apiserver.Endpoint`, as client-go does.

What kubectl supports and the plugin does too: the server's CA (``certificate-authority-data`` or a
file; the system's CAs without either), ``insecure-skip-tls-verify``, ``tls-server-name``,
``proxy-url`` (else ``HTTPS_PROXY``/``HTTP_PROXY`` minus ``NO_PROXY``, and never for loopback, as
Go's ``ProxyFromEnvironment``); a client certificate and key (inline or files), a bearer ``token``
or ``tokenFile``, ``username``/``password``, and exec credential plugins
(``client.authentication.k8s.io`` v1 and v1beta1: a token or a client certificate); inside a pod,
the in-cluster config. Relative file names are relative to the kubeconfig file that names them.

What it refuses, rather than silently connecting as someone else: ``auth-provider`` (kubectl's
legacy plugins; use an exec plugin) and impersonation (``as``, ``as-groups``).

A certificate and key given inline are written, for ``ssl`` to load them, to a private temporary
directory that is removed at once.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pko.kubectl.apiserver import Endpoint
from pko.kubectl.exitcodes import ExitCode, PluginError

__all__ = ["IN_CLUSTER_DIR", "endpoint", "environment_proxy", "exec_credential", "in_cluster_endpoint"]

IN_CLUSTER_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_EXEC_VERSIONS: Final = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


def _fail(message: str) -> PluginError:
    return PluginError(ExitCode.API_ERROR, message)


def _path(value: Any, base: Path) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


def _data(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise _fail(f"{what} is not base64") from None


def environment_proxy(server: str, environ: Mapping[str, str]) -> str | None:
    """The proxy ``HTTPS_PROXY``/``HTTP_PROXY`` name for ``server``: none for ``localhost`` or a
    loopback address, nor for a host ``NO_PROXY`` lists."""
    url = urlsplit(server)
    host = url.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    proxies = {k.lower(): v for k, v in environ.items() if k.lower().endswith("_proxy") and v}
    no_proxy = proxies.get("no_proxy", "")
    if no_proxy == "*" or any(
        host == entry or host.endswith("." + entry.lstrip("."))
        for entry in (e.strip() for e in no_proxy.split(","))
        if entry
    ):
        return None
    return proxies.get(f"{url.scheme}_proxy") or None


def _interactive(spec: Mapping[str, Any]) -> bool:
    mode = str(spec.get("interactiveMode") or "IfAvailable")
    available = sys.stdin is not None and sys.stdin.isatty()
    if mode == "Always" and not available:
        command = spec.get("command")
        raise _fail(f"exec plugin {command} needs an interactive terminal (interactiveMode Always)")
    return mode != "Never" and available


def exec_credential(
    spec: Mapping[str, Any], cluster: Mapping[str, Any], base: Path, environ: Mapping[str, str]
) -> Mapping[str, Any]:
    """Run an exec credential plugin (``user.exec``) as client-go runs it and return its
    ``ExecCredential`` ``status`` (``token``, or ``clientCertificateData`` and ``clientKeyData``)."""
    api_version = str(spec.get("apiVersion") or "")
    if api_version not in _EXEC_VERSIONS:
        raise _fail(f"exec plugin apiVersion {api_version!r} is not one of {', '.join(_EXEC_VERSIONS)}")
    command = str(spec.get("command") or "")
    if not command:
        raise _fail("exec plugin without a command")
    if os.sep in command and not Path(command).is_absolute():
        command = str(base / command)  # client-go: a relative path is the kubeconfig's
    interactive = _interactive(spec)
    info: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": interactive},
    }
    if spec.get("provideClusterInfo"):
        extensions = {str(e.get("name")): e.get("extension") for e in cluster.get("extensions") or []}
        info["spec"]["cluster"] = {
            "server": cluster.get("server"),
            "tls-server-name": cluster.get("tls-server-name"),
            "insecure-skip-tls-verify": bool(cluster.get("insecure-skip-tls-verify")),
            "certificate-authority-data": cluster.get("certificate-authority-data"),
            "proxy-url": cluster.get("proxy-url"),
            "config": extensions.get("client.authentication.k8s.io/exec"),
        }
    env = dict(environ)
    env.update({str(e["name"]): str(e["value"]) for e in spec.get("env") or [] if "name" in e})
    env["KUBERNETES_EXEC_INFO"] = json.dumps(info)
    try:
        proc = subprocess.run(
            [command, *(str(a) for a in spec.get("args") or [])],
            env=env,
            stdin=None if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            check=False,
        )
    except OSError as exc:
        hint = f" ({spec['installHint']})" if spec.get("installHint") else ""
        raise _fail(f"exec plugin {command}: {exc.strerror or exc}{hint}") from None
    if proc.returncode != 0:
        raise _fail(f"exec plugin {command} exited {proc.returncode}")
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        raise _fail(f"exec plugin {command} did not print an ExecCredential") from None
    status = answer.get("status") if isinstance(answer, dict) else None
    if not isinstance(status, dict) or answer.get("kind") != "ExecCredential":
        raise _fail(f"exec plugin {command} printed no ExecCredential status")
    if answer.get("apiVersion") != api_version:
        raise _fail(f"exec plugin {command} answered {answer.get('apiVersion')}, not {api_version}")
    if not status.get("token") and not (status.get("clientCertificateData") and status.get("clientKeyData")):
        raise _fail(f"exec plugin {command} gave neither a token nor a client certificate and key")
    return status


def _load_client_cert(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="kubectl-pko-") as d:  # mode 0700
        cert_file, key_file = Path(d) / "client.crt", Path(d) / "client.key"
        for path, data in ((cert_file, cert), (key_file, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        context.load_cert_chain(cert_file, key_file)


def _tls(cluster: Mapping[str, Any], base: Path) -> ssl.SSLContext:
    try:
        if cluster.get("certificate-authority-data"):
            ca = _data(cluster["certificate-authority-data"], "certificate-authority-data").decode()
            context = ssl.create_default_context(cadata=ca)
        elif cluster.get("certificate-authority"):
            context = ssl.create_default_context(cafile=str(_path(cluster["certificate-authority"], base)))
        else:
            context = ssl.create_default_context()
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # ssl.SSLError is an OSError
        raise _fail(f"the cluster's certificate authority: {exc}") from None
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _client_cert(user: Mapping[str, Any], base: Path) -> tuple[bytes, bytes] | None:
    """The user's client certificate and key, inline or from files (None without one)."""
    try:
        cert = (
            _data(user["client-certificate-data"], "client-certificate-data")
            if user.get("client-certificate-data")
            else _path(user["client-certificate"], base).read_bytes()
            if user.get("client-certificate")
            else None
        )
        key = (
            _data(user["client-key-data"], "client-key-data")
            if user.get("client-key-data")
            else _path(user["client-key"], base).read_bytes()
            if user.get("client-key")
            else None
        )
    except OSError as exc:
        raise _fail(f"the user's client certificate: {exc}") from None
    if (cert is None) != (key is None):
        raise _fail("the user has a client certificate without its key, or a key without its certificate")
    return (cert, key) if cert is not None and key is not None else None


def endpoint(
    cluster: Mapping[str, Any],
    user: Mapping[str, Any],
    *,
    cluster_dir: Path,
    user_dir: Path,
    environ: Mapping[str, str],
) -> Endpoint:
    """The endpoint of kubeconfig ``cluster`` (its ``cluster:`` map) authenticated as ``user``;
    ``*_dir``: the directories of the files that defined them."""
    server = str(cluster.get("server") or "")
    if not server:
        raise _fail("the kubeconfig's cluster has no server")
    for refused in ("auth-provider", "as", "as-groups", "as-uid", "as-user-extra"):
        if user.get(refused):
            raise _fail(
                f"the kubeconfig's user sets {refused}, which kubectl pko does not support"
                + (": use an exec credential plugin" if refused == "auth-provider" else "")
            )
    headers: dict[str, str] = {}
    cert = _client_cert(user, user_dir)
    if user.get("exec"):
        status = exec_credential(user["exec"], cluster, user_dir, environ)
        if status.get("token"):
            headers["Authorization"] = f"Bearer {status['token']}"
        else:
            cert = (str(status["clientCertificateData"]).encode(), str(status["clientKeyData"]).encode())
    if "Authorization" not in headers:
        token = str(user.get("token") or "")
        if not token and user.get("tokenFile"):
            try:
                token = _path(user["tokenFile"], user_dir).read_text().strip()
            except OSError as exc:
                raise _fail(f"the user's tokenFile: {exc}") from None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif user.get("username") and user.get("password"):
            basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
    context = _tls(cluster, cluster_dir) if server.startswith("https:") else None
    if cert is not None:
        if context is None:
            raise _fail("a client certificate needs an https:// server")
        try:
            _load_client_cert(context, *cert)
        except (OSError, ValueError) as exc:
            raise _fail(f"the user's client certificate and key: {exc}") from None
    proxy = str(cluster.get("proxy-url") or "") or environment_proxy(server, environ)
    return Endpoint(
        server=server,
        ssl_context=context,
        headers=headers,
        server_name=str(cluster.get("tls-server-name") or "") or None,
        proxy=proxy,
    )


def in_cluster_endpoint(environ: Mapping[str, str], directory: Path = IN_CLUSTER_DIR) -> Endpoint:
    """client-go's in-cluster config: ``KUBERNETES_SERVICE_HOST``/``_PORT``, the ServiceAccount's
    token and CA."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise _fail("in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set")
    if ":" in host:
        host = f"[{host}]"
    try:
        token = (directory / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    except OSError as exc:
        raise _fail(f"in-cluster config: {exc}") from None
    return Endpoint(
        server=f"https://{host}:{port}", ssl_context=context, headers={"Authorization": f"Bearer {token}"}
    )

"""The user's kubeconfig, read as kubectl reads it: which files, which context, which namespace.

kubectl's rules (client-go ``clientcmd``): ``--kubeconfig`` names one file; else ``$KUBECONFIG``
lists files (``:``-separated; missing ones are skipped); else ``~/.kube/config``; with none of
those, inside a pod, the in-cluster config. The files are read and merged by
:mod:`pko.machinery.kubeconfigfile`, the operator's and the agent's reader too (the first file to
name a cluster, user or context wins, and the first to set ``current-context``); ``--context``
overrides the current context, and the default namespace is the context's (``default`` when it
sets none). :mod:`pko.kubectl.credentials` turns the context's cluster and user into an endpoint
(tokens, certificates, exec plugins).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pko.kubectl.apiserver import Endpoint
from pko.kubectl.credentials import endpoint, in_cluster_endpoint
from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.machinery.kubeconfigfile import ConfigError, ContextError, kubeconfig_paths, read_kubeconfig

__all__ = ["Connection", "kubeconfig_files", "load"]

DEFAULT_NAMESPACE: Final = "default"
_SA_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class Connection:
    """Where and as whom to connect, and the default namespace."""

    endpoint: Endpoint
    namespace: str


def kubeconfig_files(flag: str | None, environ: Mapping[str, str], home: Path) -> list[Path]:
    """The files kubectl would read; an explicit ``--kubeconfig`` that does not exist is an error."""
    if flag:
        path = Path(flag).expanduser()
        if not path.is_file():
            raise PluginError(ExitCode.USAGE, f"--kubeconfig {flag}: no such file")
        return [path]
    listed = environ.get("KUBECONFIG", "")
    paths = kubeconfig_paths(listed) if listed else [home / ".kube" / "config"]
    return list(dict.fromkeys(p for p in paths if p.is_file()))


def _in_cluster_namespace(environ: Mapping[str, str]) -> str:
    """client-go's in-cluster default namespace: ``$POD_NAMESPACE``, the ServiceAccount's, else
    ``default``."""
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return _SA_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def load(
    kubeconfig: str | None,
    context: str | None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Connection:
    """The endpoint and default namespace kubectl would use."""
    env = os.environ if environ is None else environ
    files = kubeconfig_files(kubeconfig, env, Path.home() if home is None else home)
    if not files:
        if env.get("KUBERNETES_SERVICE_HOST") and not context:
            return Connection(in_cluster_endpoint(env), _in_cluster_namespace(env))
        raise PluginError(
            ExitCode.API_ERROR, "no kubeconfig: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config"
        )
    try:
        read = read_kubeconfig(files, context)
    except ContextError as exc:
        # a --context that does not exist is a usage error; a file without a usable context is not
        code = ExitCode.USAGE if context else ExitCode.API_ERROR
        raise PluginError(code, f"{exc}" if context else f"{exc}: pass --context") from None
    except ConfigError as exc:
        raise PluginError(ExitCode.API_ERROR, str(exc)) from None
    if read.user_name and read.user is None:
        raise PluginError(ExitCode.API_ERROR, f"the kubeconfig has no user {read.user_name!r}")
    where = endpoint(
        read.cluster, read.user or {}, cluster_dir=read.cluster_dir, user_dir=read.user_dir, environ=env
    )
    return Connection(where, read.namespace or DEFAULT_NAMESPACE)

"""The user's kubeconfig, read as kubectl reads it: which files, which context, which namespace.

kubectl's rules (client-go ``clientcmd``): ``--kubeconfig`` names one file; else ``$KUBECONFIG``
lists files (``:``-separated; missing ones are skipped) merged so that the first file to name a
cluster, user or context wins, and the first to set ``current-context`` wins; else
``~/.kube/config``; with none of those, inside a pod, the in-cluster config. ``--context``
overrides the current context, and the default namespace is the context's (``default`` when it
sets none). The cluster and user of the context are then the first of their names too, and
:mod:`pko.kubectl.credentials` turns them into an endpoint (tokens, certificates, exec plugins).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from pko.kubectl.apiserver import Endpoint
from pko.kubectl.credentials import endpoint, in_cluster_endpoint
from pko.kubectl.exitcodes import ExitCode, PluginError

__all__ = ["Connection", "Selection", "kubeconfig_files", "load", "named", "select_context"]

DEFAULT_NAMESPACE: Final = "default"
_SA_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class Selection:
    """The context to use and its default namespace."""

    context: str
    namespace: str


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
    if listed:
        paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
    else:
        paths = [home / ".kube" / "config"]
    return list(dict.fromkeys(p for p in paths if p.is_file()))


def select_context(configs: Sequence[Mapping[str, Any]], requested: str | None) -> Selection:
    """The context (``requested``, else the first ``current-context`` set) and its namespace, from
    the parsed files in order (the first context of a name wins)."""
    contexts: dict[str, Mapping[str, Any]] = {}
    current = ""
    for config in configs:
        for entry in config.get("contexts") or []:
            if isinstance(entry, Mapping) and entry.get("name") and entry["name"] not in contexts:
                contexts[str(entry["name"])] = entry.get("context") or {}
        current = current or str(config.get("current-context") or "")
    name = requested or current
    if not name:
        raise PluginError(ExitCode.API_ERROR, "the kubeconfig sets no current-context: pass --context")
    if name not in contexts:
        code = ExitCode.USAGE if requested else ExitCode.API_ERROR
        raise PluginError(code, f"context {name!r} does not exist in the kubeconfig")
    return Selection(name, str(contexts[name].get("namespace") or DEFAULT_NAMESPACE))


def _in_cluster_namespace(environ: Mapping[str, str]) -> str:
    """client-go's in-cluster default namespace: ``$POD_NAMESPACE``, the ServiceAccount's, else
    ``default``."""
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return _SA_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def named(
    configs: Sequence[tuple[Mapping[str, Any], Path]], section: str, name: str
) -> tuple[Mapping[str, Any], Path]:
    """The first entry called ``name`` in ``section`` (``clusters``, ``users``) of the parsed files,
    with the directory of its file; an error when none is."""
    key = section.removesuffix("s")
    for config, path in configs:
        for entry in config.get(section) or []:
            if isinstance(entry, Mapping) and entry.get("name") == name:
                return entry.get(key) or {}, path.parent
    raise PluginError(ExitCode.API_ERROR, f"the kubeconfig has no {key} {name!r}")


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
        parsed = [(yaml.safe_load(path.read_text()) or {}, path) for path in files]
    except (OSError, yaml.YAMLError) as exc:
        raise PluginError(ExitCode.API_ERROR, f"cannot read the kubeconfig: {exc}") from None
    configs = [(c, p) for c, p in parsed if isinstance(c, Mapping)]
    selection = select_context([c for c, _ in configs], context)
    chosen = next(
        entry.get("context") or {}
        for config, _ in configs
        for entry in config.get("contexts") or []
        if isinstance(entry, Mapping) and entry.get("name") == selection.context
    )
    cluster, cluster_dir = named(configs, "clusters", str(chosen.get("cluster") or ""))
    user, user_dir = (
        named(configs, "users", str(chosen["user"])) if chosen.get("user") else ({}, files[0].parent)
    )
    where = endpoint(cluster, user, cluster_dir=cluster_dir, user_dir=user_dir, environ=env)
    return Connection(where, selection.namespace)

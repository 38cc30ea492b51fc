"""The user's kubeconfig, read as kubectl reads it: which files, which context, which namespace.

kubectl's rules (client-go ``clientcmd``): ``--kubeconfig`` names one file; else ``$KUBECONFIG``
lists files (``:``-separated; missing ones are skipped) merged so that the first file to name a
cluster, user or context wins, and the first to set ``current-context`` wins; else
``~/.kube/config``; with none of those, inside a pod, the in-cluster config. ``--context``
overrides the current context, and the default namespace is the context's (``default`` when it
sets none). kubernetes-asyncio's own merger lets the *last* file's ``current-context`` win, so
the context is chosen here (:func:`select_context`, pure) and handed to its loader, which does the
authentication (tokens, certificates, exec plugins) exactly as it does for the operator.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from pko.kubectl.exitcodes import ExitCode, PluginError

__all__ = ["Connection", "Selection", "kubeconfig_files", "load", "select_context"]

DEFAULT_NAMESPACE: Final = "default"
_SA_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class Selection:
    """The context to use and its default namespace."""

    context: str
    namespace: str


@dataclass(frozen=True, slots=True)
class Connection:
    """A loaded client configuration (kubernetes-asyncio's) and the default namespace."""

    configuration: Any
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


async def load(
    kubeconfig: str | None,
    context: str | None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> Connection:
    """The client configuration and default namespace kubectl would use."""
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import ConfigException, load_incluster_config
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader, KubeConfigMerger

    env = os.environ if environ is None else environ
    files = kubeconfig_files(kubeconfig, env, Path.home() if home is None else home)
    configuration = Configuration()
    if not files:
        if env.get("KUBERNETES_SERVICE_HOST") and not context:
            try:
                load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except ConfigException as exc:
                raise PluginError(ExitCode.API_ERROR, f"in-cluster config: {exc}") from None
            return Connection(configuration, _in_cluster_namespace(env))
        raise PluginError(
            ExitCode.API_ERROR, "no kubeconfig: pass --kubeconfig, set KUBECONFIG or create ~/.kube/config"
        )
    try:
        parsed = [yaml.safe_load(path.read_text()) or {} for path in files]
    except (OSError, yaml.YAMLError) as exc:
        raise PluginError(ExitCode.API_ERROR, f"cannot read the kubeconfig: {exc}") from None
    selection = select_context([p for p in parsed if isinstance(p, Mapping)], context)
    try:
        merged = KubeConfigMerger(os.pathsep.join(str(p) for p in files))
        loader = KubeConfigLoader(
            config_dict=merged.config, config_base_path=None, active_context=selection.context
        )
        await loader.load_and_set(configuration)
    except (ConfigException, KeyError, ValueError, AssertionError, OSError) as exc:
        raise PluginError(ExitCode.API_ERROR, f"kubeconfig context {selection.context!r}: {exc}") from None
    return Connection(configuration, selection.namespace)

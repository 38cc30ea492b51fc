"""Kubeconfig files read once for both of pko's API clients: the operator's
(:mod:`pko.machinery.kubeconfig` makes a :class:`~pko.machinery.kubeclient.ClientConfig` of it) and the
workspace agent's (:mod:`pko.agent.kubeapi`). Standard library only, so the agent imports it without
the operator's HTTP stack; PyYAML is imported only for a file that is not JSON (our tests and tools
write JSON).

Files are merged as client-go merges a ``:``-separated ``$KUBECONFIG``: missing files of a list are
skipped, the first file to name a cluster, user or context wins, and the first to set
``current-context``. A relative file name is relative to the file that names it, so each entry keeps
the directory of its file. In-cluster, the apiserver is ``KUBERNETES_SERVICE_HOST`` and ``_PORT``.

What a client makes of the entries is its own: the operator also takes basic auth, ``proxy-url`` and
credential plugins; the agent refuses each of those by name. The kubectl plugin
(:mod:`pko.kubectl.kubeconfig`) reads files here too, with its ``--context`` in place of the current
context and the context's namespace as its default.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = [
    "IN_CLUSTER_DIR",
    "ConfigError",
    "ContextError",
    "Kubeconfig",
    "in_cluster_server",
    "kubeconfig_paths",
    "read_kubeconfig",
]

IN_CLUSTER_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_SECTIONS: Final = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))


class ConfigError(Exception):
    """The connection settings are missing, malformed or ask for something the client does not do; the
    message says which (never a credential)."""


class ContextError(ConfigError):
    """The context to use is not set (no ``current-context``) or does not exist."""


def in_cluster_server(environ: Mapping[str, str]) -> str:
    """``https://host:port`` of the in-cluster service environment."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"
        )
    return f"https://[{host}]:{port}" if ":" in host or "%" in host else f"https://{host}:{port}"


def kubeconfig_paths(kubeconfig: str) -> list[Path]:
    """The files of a ``:``-separated list, as named."""
    return [Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p]


@dataclass(frozen=True)
class Kubeconfig:
    """The current context of merged kubeconfig files: its cluster and user (None when the context names
    no user, or one no file defines), each with the directory of the file it came from."""

    context: str
    cluster_name: str
    cluster: Mapping[str, Any]
    cluster_dir: Path
    user_name: str
    user: Mapping[str, Any] | None
    user_dir: Path
    namespace: str = ""
    """The context's namespace ("": it sets none)."""

    def cluster_path(self, key: str) -> Path | None:
        return _path(self.cluster, key, self.cluster_dir)

    def user_path(self, key: str) -> Path | None:
        return _path(self.user or {}, key, self.user_dir)

    def cluster_data(self, key: str) -> bytes | None:
        return _data(self.cluster, key, f"cluster {self.cluster_name!r}")

    def user_data(self, key: str) -> bytes | None:
        return _data(self.user or {}, key, f"user {self.user_name!r}")


def read_kubeconfig(paths: list[Path], context: str | None = None) -> Kubeconfig:
    """The current context of the kubeconfig files ``paths`` (merged, the first value wins), or
    ``context`` when given (kubectl's ``--context``)."""
    merged: dict[str, dict[str, tuple[Mapping[str, Any], Path]]] = {s: {} for s, _ in _SECTIONS}
    current = ""
    existing = [p for p in paths if p.exists()] if len(paths) > 1 else paths
    if not existing:
        raise ConfigError(f"none of the kubeconfig files exist: {', '.join(map(str, paths))}")
    for path in existing:
        doc = _read(path)
        if not current and isinstance(doc.get("current-context"), str):
            current = doc["current-context"]
        for section, inner in _SECTIONS:
            for entry in doc.get(section) or []:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise ConfigError(f"kubeconfig {path}: every entry of {section} needs a name")
                body = entry.get(inner) or {}
                if not isinstance(body, dict):
                    raise ConfigError(
                        f"kubeconfig {path}: {section} {entry['name']!r}: {inner} is not a mapping"
                    )
                merged[section].setdefault(entry["name"], (body, path.parent))
    where = ", ".join(map(str, existing))
    current = context or current
    if not current:
        raise ContextError(f"kubeconfig {where} has no current-context")
    if current not in merged["contexts"]:
        which = "context" if context else "current context"
        raise ContextError(f"kubeconfig {where}: the {which} {current!r} does not exist")
    chosen = merged["contexts"][current][0]
    cluster_name, user_name = chosen.get("cluster"), chosen.get("user") or ""
    if not isinstance(cluster_name, str) or cluster_name not in merged["clusters"]:
        raise ConfigError(f"kubeconfig {where}: cluster {cluster_name!r} of context {current!r} not found")
    if not isinstance(user_name, str):
        raise ConfigError(f"kubeconfig {where}: the user of context {current!r} is not a name")
    cluster, cluster_dir = merged["clusters"][cluster_name]
    user, user_dir = merged["users"].get(user_name, (None, cluster_dir))
    namespace = chosen.get("namespace") or ""
    if not isinstance(namespace, str):
        raise ConfigError(f"kubeconfig {where}: the namespace of context {current!r} is not a name")
    return Kubeconfig(current, cluster_name, cluster, cluster_dir, user_name, user, user_dir, namespace)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    try:
        if text.lstrip().startswith("{"):
            doc = json.loads(text)  # what our tests and tools write; no YAML parser needed
        else:
            import yaml  # only here: the agent's in-cluster and JSON paths never need it

            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # safe: C if built
    except ValueError as exc:  # yaml.YAMLError is not one: caught below
        raise ConfigError(f"kubeconfig {path} is not valid JSON: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"kubeconfig {path} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path} is not a mapping")
    return doc


def _path(entry: Mapping[str, Any], key: str, base: Path) -> Path | None:
    value = entry.get(key)
    if not value:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"kubeconfig: {key} must be a path")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _data(entry: Mapping[str, Any], key: str, what: str) -> bytes | None:
    value = entry.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ConfigError(f"kubeconfig: {what}: {key} is not base64") from None

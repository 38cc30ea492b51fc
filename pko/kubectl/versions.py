"""``kubectl pko version`` (pure): the plugin's version, and the operator's as its Deployment says.

The operator's controller-manager Deployment (config/manager) carries the labels
:data:`OPERATOR_SELECTOR`; it is looked for in every namespace, else (a user who may not list
Deployments cluster-wide) in :data:`OPERATOR_NAMESPACE`, where the manifests install it. Its
version is its ``app.kubernetes.io/version`` label when the installation sets one, and its image
is the ``manager`` container's (the image tag is what a person compares with the plugin's version).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pko.version import VERSION

__all__ = [
    "MANAGER_CONTAINER",
    "OPERATOR_NAMESPACE",
    "OPERATOR_SELECTOR",
    "VERSION_LABEL",
    "Operator",
    "document",
    "operators",
    "text",
]

OPERATOR_SELECTOR: Final = (
    "control-plane=controller-manager,app.kubernetes.io/name=pulumi-kubernetes-operator"
)
OPERATOR_NAMESPACE: Final = "pulumi-kubernetes-operator"
VERSION_LABEL: Final = "app.kubernetes.io/version"
MANAGER_CONTAINER: Final = "manager"
"""The operator's container in its Deployment (config/manager/manager.yaml)."""


@dataclass(frozen=True, slots=True)
class Operator:
    """One operator installation: its Deployment, version label ("" when unset) and manager image."""

    namespace: str
    name: str
    version: str
    image: str


def operators(deployments: Sequence[Mapping[str, Any]]) -> list[Operator]:
    """The operators among ``deployments`` (the selector's matches), sorted by namespace and name."""
    found: list[Operator] = []
    for deployment in deployments:
        meta = deployment.get("metadata") or {}
        containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
        containers = [c for c in containers or [] if isinstance(c, Mapping)]
        manager = next((c for c in containers if c.get("name") == MANAGER_CONTAINER), None)
        if manager is None and containers:
            manager = containers[0]
        found.append(
            Operator(
                namespace=str(meta.get("namespace") or ""),
                name=str(meta.get("name") or ""),
                version=str((meta.get("labels") or {}).get(VERSION_LABEL) or ""),
                image=str((manager or {}).get("image") or ""),
            )
        )
    return sorted(found, key=lambda o: (o.namespace, o.name))


def text(found: Sequence[Operator] | None, unknown: str = "", *, client_only: bool = False) -> str:
    """``Client Version: ...`` then one block per operator; ``found`` None: the server's version is
    unknown (``unknown`` says why); ``client_only``: the first line alone."""
    lines = [f"Client Version: {VERSION}"]
    if not client_only and found is None:
        lines.append(f"Operator Version: unknown ({unknown})")
    elif not client_only and not found:
        lines.append(f"Operator Version: unknown (no operator Deployment found: {OPERATOR_SELECTOR})")
    for operator in [] if client_only else found or []:
        lines += [
            f"Operator Version: {operator.version or 'unknown (no ' + VERSION_LABEL + ' label)'}",
            f"Operator Image: {operator.image or 'unknown'}",
            f"Operator Deployment: {operator.namespace}/{operator.name}",
        ]
    return "".join(line + "\n" for line in lines)


def document(
    found: Sequence[Operator] | None, unknown: str = "", *, client_only: bool = False
) -> dict[str, Any]:
    """The same for ``-o json|yaml``: ``clientVersion``, ``operators`` (None when unknown) and
    ``error`` (why the server's version is unknown)."""
    if client_only:
        return {"clientVersion": VERSION}
    doc: dict[str, Any] = {
        "clientVersion": VERSION,
        "operators": None
        if found is None
        else [
            {"namespace": o.namespace, "name": o.name, "version": o.version or None, "image": o.image}
            for o in found
        ],
    }
    if found is None:
        doc["error"] = unknown
    return doc

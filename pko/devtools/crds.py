"""The one builder of a CustomResourceDefinition of a test's own kind: namespaced, one version ``v1``
(served and stored), the schema of its objects' ``spec`` the caller's. For tests that need a kind no
one else installs (an informer's custom resources, a schema embedded in a CRD); pko's own CRDs are
config/crd's, and a stand-in for another project's CRD is in that project's module (fluxsource.py)."""

from __future__ import annotations

from typing import Any


def namespaced_crd(group: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The CRD ``<kind>s.<group>`` (lower case) whose objects' ``spec`` has the schema ``spec``."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}},
                }
            ],
        },
    }

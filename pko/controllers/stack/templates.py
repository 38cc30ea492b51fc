"""The WorkspaceTemplates a Stack's Workspace is built with (pure; issue 42, a pko extension).

Merged under the Stack's inline ``workspaceTemplate``, lowest first: the operator's default template
(``--default-workspace-template``), then the one ``spec.workspaceTemplateRef`` names (in the Stack's
namespace; another namespace is refused by :mod:`pko.api.validation`). A template that does not
exist (yet) makes the Stack wait (Reconciling, ``WorkspaceTemplateNotFound``) until its creation
wakes it (the Stack controller watches WorkspaceTemplates): the GitOps case is the template applied
in the same sync, after the Stack.

The Workspace carries a digest of the templates' specs (:data:`TEMPLATES_ANNOTATION`): a Stack
with nothing to run re-applies its Workspace only when that digest is not the one it now builds
(:func:`pko.controllers.stack.ensure.roll_for_templates`), so a template changed once rolls each
Workspace that uses it once, and an operator upgrade rolls none.

A template's ``spec.policyPacks`` are not part of the Workspace (nor of that digest): they are the
packs it enforces on the Stack's Updates (:mod:`pko.controllers.stack.policypacks`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pko.api.stack import Stack
from pko.controllers.stack.policypacks import Enforced, enforced_packs
from pko.machinery.resource import Obj
from pko.machinery.store import object_key, split_key

__all__ = [
    "REASON_TEMPLATE_NOT_FOUND",
    "TEMPLATES_ANNOTATION",
    "Templates",
    "default_template_key",
    "index_workspace_template",
    "resolve_templates",
    "templates_digest",
]

TEMPLATES_ANNOTATION: Final = "pulumi.com/workspace-templates-digest"
"""On a Workspace: the digest of the WorkspaceTemplates' specs it was built with (absent: none)."""
REASON_TEMPLATE_NOT_FOUND: Final = "WorkspaceTemplateNotFound"

Lookup = Callable[[str], Obj | None]
"""A WorkspaceTemplate by store key (``namespace/name``); None: it does not exist, or the kind is
not served."""


@dataclass(frozen=True, slots=True)
class Templates:
    """The templates' specs to merge, lowest first, and their digest ("" when none); or, when one
    cannot be had, ``missing``: why, for the Stack's condition, and ``requeue``: when to look again
    (None: a watch event wakes the Stack). ``enforced``: the templates' policy packs, the default
    template's first."""

    layers: tuple[Mapping[str, Any], ...] = ()
    digest: str = ""
    enforced: tuple[Enforced, ...] = ()
    missing: str | None = None
    requeue: float | None = None


def default_template_key(setting: str | None, operator_namespace: str) -> str | None:
    """The store key of the operator's default template: ``namespace/name``, or a bare name in the
    operator's namespace; None when unset."""
    if not setting:
        return None
    namespace, name = split_key(setting.strip())
    return object_key(namespace or operator_namespace, name)


def index_workspace_template(obj: Obj) -> list[str]:
    """Stacks by the WorkspaceTemplate they reference (always in their own namespace)."""
    ref = (obj.get("spec") or {}).get("workspaceTemplateRef") or {}
    namespace = (obj.get("metadata") or {}).get("namespace")
    return [object_key(namespace, str(ref["name"]))] if ref.get("name") else []


def templates_digest(layers: tuple[Mapping[str, Any], ...]) -> str:
    if not layers:
        return ""
    text = json.dumps(list(layers), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def resolve_templates(
    stack: Stack, default_key: str | None, lookup: Lookup, *, served: bool, recheck: float | None = None
) -> Templates:
    """The templates ``stack`` is built with (``served``: the WorkspaceTemplate kind is served and
    its cache synced; when it is not, a Stack that needs one waits with a message that says so and
    looks again after ``recheck`` seconds: no event comes when the cache syncs after it)."""
    wanted: list[tuple[str, str]] = []
    if default_key is not None:
        wanted.append(
            (
                default_key,
                f'the operator\'s default WorkspaceTemplate "{default_key}" (--default-workspace-template) '
                "was not found: create it, or unset the operator's default",
            )
        )
    ref = stack.spec.workspace_template_ref
    if ref is not None:
        key = object_key(stack.metadata.namespace, ref.name)
        wanted.append(
            (
                key,
                f'WorkspaceTemplate "{key}" (spec.workspaceTemplateRef) was not found: create it in the '
                "Stack's namespace, or remove spec.workspaceTemplateRef; the Stack waits for it",
            )
        )
    if not wanted:
        return Templates()
    if not served:
        return Templates(
            missing="the WorkspaceTemplate kind (workspacetemplates.auto.pulumi.com) is not served or not "
            "cached yet: if it stays so, install the operator's CRDs (a Helm upgrade does not update them)",
            requeue=recheck,
        )
    layers: list[Mapping[str, Any]] = []
    enforced: list[Enforced] = []
    for key, message in wanted:
        found = lookup(key)
        if found is None:
            return Templates(missing=message)
        spec = found.get("spec") or {}
        layers.append({k: v for k, v in spec.items() if k in ("metadata", "spec")})
        try:
            enforced += enforced_packs(key, spec)
        except ValueError as err:
            return Templates(missing=f"{err}: fix the template; the Stack waits for it")
    return Templates(tuple(layers), templates_digest(tuple(layers)), tuple(enforced))

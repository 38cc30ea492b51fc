"""``auto.pulumi.com/v1alpha1`` WorkspaceTemplate: Workspace settings shared by many Stacks (pko extension).

A Stack names one with ``spec.workspaceTemplateRef`` (in its own namespace: a reference to another
namespace is refused, as for Programs); the operator may name one more for every Stack
(``--default-workspace-template``). Its ``spec`` has the shape of a Stack's inline
``workspaceTemplate`` (a Workspace's ``metadata`` and ``spec``, every field optional), so settings move
between the two unchanged. The Workspace the Stack controller builds gets, merged over it in this order
with the same strategic-merge rules: the default template, the referenced template, the inline one
(the later wins). The Go operator has no such kind, and ignores ``workspaceTemplateRef``.

Its ``spec.policyPacks`` (issue 43) are enforced on every preview and up of every Stack that uses
the template, beside the Stack's own ``spec.policyPacks``; a Stack cannot remove or change them
(:mod:`pko.controllers.stack.policypacks`).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pko.api import workspace as workspace_api
from pko.api.markers import ApplyConfigurationOf, Extension, ListAtomic
from pko.api.meta import KubeModel, ObjectMeta
from pko.api.stackpolicypacks import MAX_PACKS, PolicyPack
from pydantic import Field

GROUP: Final = workspace_api.GROUP
VERSION: Final = workspace_api.VERSION
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "WorkspaceTemplate"
PLURAL: Final = "workspacetemplates"

WorkspaceApplyConfiguration = Annotated[dict[str, Any], ApplyConfigurationOf(workspace_api.Workspace)]
"""A partial Workspace (``metadata`` and ``spec``) merged over the one the Stack controller builds."""


class EnforcedWorkspace(workspace_api.Workspace):
    """A WorkspaceTemplate's spec: a partial [Workspace](#workspace) (its metadata and spec), and
    the policy packs the template enforces (never part of the Workspace)."""

    policy_packs: (
        Annotated[
            list[PolicyPack], MAX_PACKS, ListAtomic(), Extension("issue43: packs enforced by a template")
        ]
        | None
    ) = None
    """(pko extension) PolicyPacks run on every preview and up of every Stack that uses this
    template, beside the Stack's own spec.policyPacks: a Stack cannot remove or weaken one (its own
    pack of the same name is ignored)."""


TemplateSpec = Annotated[dict[str, Any], ApplyConfigurationOf(EnforcedWorkspace)]
"""A WorkspaceTemplate's spec: a partial Workspace and ``policyPacks``."""


class WorkspaceTemplateReference(KubeModel):
    """A WorkspaceTemplate in the Stack's namespace."""

    name: str
    """Name of the WorkspaceTemplate."""
    namespace: str | None = None
    """(optional) Namespace of the WorkspaceTemplate: only the Stack's own is allowed (kept so that a
    reference to another namespace is refused, not silently read as one to the Stack's)."""


class WorkspaceTemplate(KubeModel):
    """A WorkspaceTemplate (auto.pulumi.com/v1alpha1): its spec is merged into the Workspace of every
    Stack that references it, under the Stack's own workspaceTemplate."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TemplateSpec
    """The settings: a Workspace's metadata and spec, every field optional (the shape of a Stack's
    workspaceTemplate), e.g. spec.image, spec.resources, spec.podTemplate (tolerations,
    nodeSelector, imagePullSecrets, volumes, labels for workload identity); and policyPacks
    (a pko extension): packs enforced on every Stack that uses the template (docs/policy.md)."""


__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "EnforcedWorkspace",
    "TemplateSpec",
    "WorkspaceApplyConfiguration",
    "WorkspaceTemplate",
    "WorkspaceTemplateReference",
]

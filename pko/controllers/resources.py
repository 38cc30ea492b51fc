"""The resource types the reconcilers read and write, and the labels that tie them together.

One place for the Go operator's user-visible names (``../shared`` notes: upstream-api-facts), so a
reconciler, a predicate and a test never spell a label or a field manager twice.
"""

from __future__ import annotations

from typing import Final

# The request annotations are declared with the Stack API (pko.api.stackterms); named here too,
# beside the others.
from pko.api.stackterms import APPROVED_PLAN_ANNOTATION as APPROVED_PLAN_ANNOTATION
from pko.api.stackterms import CANCEL_REQUEST_ANNOTATION as CANCEL_REQUEST_ANNOTATION
from pko.api.stackterms import RECONCILE_REQUEST_ANNOTATION
from pko.api.stackterms import REFRESH_REQUEST_ANNOTATION as REFRESH_REQUEST_ANNOTATION
from pko.machinery.resource import Resource
from pko.machinery.store import index_by_field

STACKS: Final = Resource("pulumi.com", "v1", "stacks", "Stack")
PROGRAMS: Final = Resource("pulumi.com", "v1", "programs", "Program")
WORKSPACES: Final = Resource("auto.pulumi.com", "v1alpha1", "workspaces", "Workspace")
UPDATES: Final = Resource("auto.pulumi.com", "v1alpha1", "updates", "Update")
WORKSPACE_TEMPLATES: Final = Resource(
    "auto.pulumi.com", "v1alpha1", "workspacetemplates", "WorkspaceTemplate"
)
# Updates by the Workspace they run in (``ns/spec.workspaceName``): the Update controller wakes the
# Updates a Workspace's readiness concerns, the Workspace controller holds a pod roll for a running one.
# One function object, as a shared informer's index must be.
UPDATES_BY_WORKSPACE: Final = "update-workspace"
index_updates_by_workspace: Final = index_by_field("spec.workspaceName", namespaced=True)

# Labels on a Workspace's StatefulSet, Service and pod (and the StatefulSet's selector).
WORKSPACE_COMPONENT_LABEL: Final = "auto.pulumi.com/component"
WORKSPACE_NAME_LABEL: Final = "auto.pulumi.com/workspace-name"
WORKSPACE_COMPONENT: Final = "workspace"
# The informers of StatefulSets, Services and Pods cache only what belongs to a workspace.
WORKSPACE_SELECTOR: Final = f"{WORKSPACE_COMPONENT_LABEL}={WORKSPACE_COMPONENT}"

# Labels on the Workspace and Updates a Stack creates.
STACK_COMPONENT_LABEL: Final = "pulumi.com/component"
STACK_NAME_LABEL: Final = "pulumi.com/stack-name"
STACK_COMPONENT: Final = "stack"

# Labels on an Update's outputs Secret.
UPDATE_COMPONENT: Final = "update"
UPDATE_NAME_LABEL: Final = "auto.pulumi.com/update-name"

RECONCILIATION_REQUEST_ANNOTATION: Final = RECONCILE_REQUEST_ANNOTATION
SECRETS_ANNOTATION: Final = "pulumi.com/secrets"
# On an Update's outputs Secret: the outputs left out to keep it bounded (pko.api.limits.MAX_OUTPUTS_BYTES),
# as JSON {"count": n, "keys": [the first 50]}; ``pulumi stack output`` in the workspace pod shows them.
OMITTED_OUTPUTS_ANNOTATION: Final = "pulumi.com/omitted-outputs"
STACK_FINALIZER: Final = "finalizer.stack.pulumi.com"

# Server-side apply field managers, as the Go operator names them.
FIELD_MANAGER: Final = "pulumi-kubernetes-operator"
FIELD_MANAGER_STACK_FINALIZER: Final = "pulumi-kubernetes-operator/stack-finalizer"
FIELD_MANAGER_STACK_STATUS: Final = "pulumi-kubernetes-operator/stack-status"
FIELD_MANAGER_PREREQUISITE: Final = "pulumi-kubernetes-operator/prerequisite-request"
FIELD_MANAGER_PROGRAM_STATUS: Final = "pulumi-kubernetes-operator/program-status"
FIELD_MANAGER_WORKSPACE_STATUS: Final = "pulumi-kubernetes-operator/workspace-status"
FIELD_MANAGER_UPDATE_STATUS: Final = "pulumi-kubernetes-operator/update-status"

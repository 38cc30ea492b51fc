"""``auto.pulumi.com/v1alpha1`` Update: one Pulumi operation (preview, up, destroy, refresh) in a Workspace.

Same fields, names and meaning as the Go operator v2's Update; see docs/updates.md upstream.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pko.api.markers import Extension, ListAtomic
from pko.api.meta import (
    Conditions,
    GoDuration,
    KubeModel,
    NonNegativeInt32,
    NonNegativeInt64,
    ObjectMeta,
    Time,
)
from pko.api.stackpolicypacks import MAX_PACKS, PolicyPack, PolicyViolation
from pydantic import Field

GROUP: Final = "auto.pulumi.com"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "Update"
PLURAL: Final = "updates"

UpdateType = Literal["preview", "up", "destroy", "refresh"]
UPDATE_TYPES: Final[tuple[UpdateType, ...]] = ("preview", "up", "destroy", "refresh")

# Condition types (Progressing/Complete/Failed), as in the Go operator.
CONDITION_PROGRESSING: Final = "Progressing"
CONDITION_COMPLETE: Final = "Complete"
CONDITION_FAILED: Final = "Failed"


_POLICY = "issue43: policy as code"


class UpdateSpec(KubeModel):
    """The desired state of an Update."""

    workspace_name: str | None = None
    """WorkspaceName is the workspace to update."""
    stack_name: str | None = None
    """Specify the Pulumi stack to select for the update."""
    type: UpdateType | None = None
    """Type of the update to perform: preview, up, destroy or refresh."""
    ttl_after_completed: GoDuration | None = None
    """TTL for a completed update object (a duration such as ``24h``)."""
    parallel: NonNegativeInt32 | None = None
    """Parallel is the number of resource operations to run in parallel at once (1 for no parallelism).
    Defaults to unbounded."""
    message: str | None = None
    """Message (optional) to associate with the preview operation."""
    expect_no_changes: bool | None = None
    """Return an error if any changes occur during this update."""
    replace: list[str] | None = None
    """Specify resources to replace."""
    target: list[str] | None = None
    """Specify an exclusive list of resource URNs to update."""
    target_dependents: bool | None = None
    """TargetDependents allows updating of dependent targets discovered but not specified in the Target
    list."""
    refresh: bool | None = None
    """Refresh will run a refresh before the update."""
    continue_on_error: bool | None = None
    """ContinueOnError will continue to perform the update operation despite the occurrence of errors."""
    remove: bool | None = None
    """Remove the stack and its configuration after all resources in the stack have been deleted."""
    run_program: bool | None = None
    """RunProgram runs the program before performing the operation. Applicable to destroy and refresh
    operations."""
    save_plan: Annotated[bool, Extension("issue29: an approved preview's plan is what up runs")] | None = None
    """(pko extension) SavePlan saves the engine's update plan of a preview (``pulumi preview
    --save-plan``) in the workspace pod, for an up that names this Update in ``plan``. Preview only."""
    plan: Annotated[str, Extension("issue29: an approved preview's plan is what up runs")] | None = None
    """(pko extension) Plan names a preview Update (same namespace and workspace, ``savePlan: true``,
    succeeded) whose saved plan this up applies (``pulumi up --plan``): the engine refuses any step
    the plan lacks (``PlanMismatch``). A plan the workspace pod no longer holds (the pod was
    replaced, an earlier up used it) fails ``PlanNotFound``. Up only."""
    preview_only: Annotated[bool, Extension("issue29: drift detection is a read-only refresh")] | None = None
    """(pko extension) PreviewOnly previews the refresh (``pulumi refresh --preview-only``): nothing
    is written to the state; ``status.changes`` lists the resources that drifted. Refresh only."""
    policy_packs: Annotated[list[PolicyPack], MAX_PACKS, ListAtomic(), Extension(_POLICY)] | None = None
    """(pko extension) PolicyPacks run on this preview or up (the Stack's ``spec.policyPacks``): a
    mandatory violation fails it ``PolicyViolation`` before anything changes, a pack that cannot be
    loaded ``PolicyPackFailed``. Preview and up only."""


class ProjectInfo(KubeModel):
    """The Pulumi project name and runtime (``name:`` and ``runtime:`` of Pulumi.yaml)."""

    name: str
    """Name is the Pulumi project name."""
    runtime: str
    """Runtime is the Pulumi runtime declaration."""


class ResourceChange(KubeModel):
    """One resource's step in an operation, as the engine names it."""

    urn: str
    """URN of the resource."""
    type: str
    """Type of the resource, e.g. ``kubernetes:apps/v1:Deployment``."""
    op: str
    """Op is the engine's step: create, update, delete, replace, create-replacement, delete-replaced,
    read, import, ... (never same). For a refresh: update (the resource drifted) or delete (it is
    gone)."""
    paths: Annotated[list[str], ListAtomic()] | None = None
    """Paths are the changed property paths (e.g. ``spec.replicas``), sorted; at most 20 (the first)."""


class ChangeSummary(KubeModel):
    """How many of the user's resources an operation creates, updates, deletes and replaces."""

    create: NonNegativeInt64 = 0
    """Create counts the resources created."""
    update: NonNegativeInt64 = 0
    """Update counts the resources updated in place."""
    delete: NonNegativeInt64 = 0
    """Delete counts the resources deleted."""
    replace: NonNegativeInt64 = 0
    """Replace counts the resources replaced (deleted and created again)."""


class PendingOperation(KubeModel):
    """An operation the Pulumi engine started on a resource and never saw finish (its process was
    killed): whether it happened is unknown, so the resource must be checked where it lives."""

    urn: str
    """URN of the resource."""
    type: str
    """Type is the engine's operation: creating, updating, deleting, reading or importing."""


_PENDING = "fault matrix: a killed engine's pending operations are reported, and cleared once stale"
_BOUNDED = "issue44: no status grows with the program (pko.api.limits)"


class UpdateStatus(KubeModel):
    """The observed state of an Update."""

    observed_generation: NonNegativeInt64 | None = None
    """The .metadata.generation that the status was set based upon."""
    start_time: Time | None = None
    """The start time of the operation."""
    end_time: Time | None = None
    """The end time of the operation."""
    permalink: str | None = None
    """The permalink URL in the Pulumi Console for the operation. Not available for DIY backends."""
    message: str | None = None
    """A message about the result of the operation."""
    outputs: str | None = None
    """Outputs names a secret containing the outputs for this update."""
    conditions: Conditions | None = None
    """The observations of an update's current state: Progressing, Complete, Failed."""
    project_info: ProjectInfo | None = None
    """The Pulumi project name and runtime observed by the agent during this update."""
    resource_changes: (
        Annotated[dict[str, NonNegativeInt64], Extension("issue30: what a destroy is expected to delete")]
        | None
    ) = None
    """(pko extension) ResourceChanges counts the resources by operation ("create", "same", "delete",
    ...): what a preview would do, what an up, refresh or destroy did."""
    changes: (
        Annotated[list[ResourceChange], ListAtomic(), Extension("issue29: approval digests, drift")] | None
    ) = None
    """(pko extension) Changes lists each resource the operation changes (or, for a preview and a
    ``previewOnly`` refresh, would change; for a refresh, each drifted resource), one entry per
    resource and step, sorted by urn, then op; ``same`` steps are left out. Bounded: the first 250
    entries that fit in 128 KiB of JSON, each with its first 20 paths (``changesTruncated``); the
    agent's log lists every one (``resource change`` lines)."""
    change_count: Annotated[NonNegativeInt64, Extension(_BOUNDED)] | None = None
    """(pko extension) ChangeCount is how many entries the whole change set has (``changes`` lists
    the first of them)."""
    changes_truncated: Annotated[bool, Extension(_BOUNDED)] | None = None
    """(pko extension) ChangesTruncated is true when ``changes`` leaves entries or paths out."""
    change_summary: Annotated[ChangeSummary, Extension(_BOUNDED)] | None = None
    """(pko extension) ChangeSummary counts the user's resources by what the operation does to each
    (one per resource; the stack's root resource and providers left out), over the whole change set:
    what a plan's summary and its approval rule read."""
    pending_operations: Annotated[list[PendingOperation], ListAtomic(), Extension(_PENDING)] | None = None
    """(pko extension) PendingOperations lists the operations the stack's state still records as
    started and never finished (an engine killed mid-operation) after this operation: each resource's
    fate is unknown to Pulumi and must be checked by hand (then ``pulumi refresh`` or a later up
    resolves it). Absent when there are none. Bounded as ``changes`` are."""
    cleared_pending_operations: (
        Annotated[list[PendingOperation], ListAtomic(), Extension(_PENDING)] | None
    ) = None
    """(pko extension) ClearedPendingOperations lists the pending operations the workspace removed from
    the state after this operation succeeded, because it made them stale: creates an interrupted
    attempt left whose resource this operation created again (or that nothing declares any more).
    What the interrupted attempt created may still exist outside Pulumi's state: check these URNs."""
    policy_violations: Annotated[list[PolicyViolation], ListAtomic(), Extension(_POLICY)] | None = None
    """(pko extension) PolicyViolations lists what the policy packs reported, mandatory ones first, in
    the engine's order. Bounded as ``changes`` are (``policyViolationCount`` counts them all)."""
    policy_violation_count: Annotated[NonNegativeInt64, Extension(_POLICY)] | None = None
    """(pko extension) PolicyViolationCount is how many violations the packs reported."""


class Update(KubeModel):
    """An Update (auto.pulumi.com/v1alpha1)."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: UpdateSpec = Field(default_factory=UpdateSpec)
    status: UpdateStatus | None = None


__all__ = [
    "API_VERSION",
    "CONDITION_COMPLETE",
    "CONDITION_FAILED",
    "CONDITION_PROGRESSING",
    "GROUP",
    "KIND",
    "PLURAL",
    "UPDATE_TYPES",
    "VERSION",
    "ChangeSummary",
    "PendingOperation",
    "ProjectInfo",
    "ResourceChange",
    "Update",
    "UpdateSpec",
    "UpdateStatus",
    "UpdateType",
]

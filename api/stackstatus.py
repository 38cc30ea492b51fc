"""The ``status`` of a ``pulumi.com/v1`` Stack: the last and current update, the last failure, the
plan awaiting approval, drift and refresh results.

Re-exported by :mod:`pko.api.stack`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pko.api import update as update_api
from pko.api.markers import Extension, ListAtomic
from pko.api.meta import (
    Conditions,
    Int64,
    JSONValue,
    KubeModel,
    NonNegativeInt64,
    Time,
)

StackUpdateStateMessage = Literal["succeeded", "failed"]


class ProjectInfo(KubeModel):
    """The Pulumi project name and runtime, cached to destroy without a source."""

    name: str
    """Name is the Pulumi project name (the name: field in Pulumi.yaml)."""
    runtime: str
    """Runtime is the Pulumi runtime declaration (the runtime: field in Pulumi.yaml)."""


_ENFORCED_PACKS = "issue43: policy packs a WorkspaceTemplate enforces"


class StackUpdateState(KubeModel):
    """The result of the last completed update."""

    generation: Int64 | None = None
    """Generation is the stack generation associated with the update."""
    reconcile_request: str | None = None
    """ReconcileRequest is the stack reconcile request associated with the update."""
    name: str | None = None
    """Name is the name of the Update object."""
    type: update_api.UpdateType | None = None
    """Type is the type of update."""
    state: StackUpdateStateMessage | None = None
    """State is the state of the stack update: succeeded or failed."""
    message: str | None = None
    """Message surfaces any errors or additional information about the update."""
    last_attempted_commit: str | None = None
    """Last commit attempted."""
    last_successful_commit: str | None = None
    """Last commit successfully applied."""
    permalink: str | None = None
    """Permalink is the Pulumi Console URL of the stack operation."""
    last_resync_time: Time | None = None
    """LastResyncTime is the last time a resync of the stack took place."""
    failures: NonNegativeInt64 | None = None
    """Failures records how many times the update has been attempted and failed."""
    policy_packs_digest: Annotated[str, Extension(_ENFORCED_PACKS)] | None = None
    """(pko extension) PolicyPacksDigest is the digest of the policy packs WorkspaceTemplates
    enforced on the update: another digest now means another preview or up."""


class CurrentStackUpdate(KubeModel):
    """The update in flight, if any."""

    generation: Int64 | None = None
    """Generation is the stack generation associated with the update."""
    reconcile_request: str | None = None
    """ReconcileRequest is the stack reconcile request associated with the update."""
    name: str | None = None
    """Name is the name of the Update object."""
    commit: str | None = None
    """Commit is the commit SHA of the planned update."""
    kind: (
        Annotated[Literal["plan", "apply", "refresh", "drift"], Extension("issue29: approval, drift")] | None
    ) = None
    """(pko extension) Kind says what the update is for when it is not the operation the spec calls
    for: plan (a preview saving a plan to approve), apply (the up of an approved plan), refresh (on
    request) or drift (a read-only drift check)."""
    cancel_request: Annotated[str, Extension("issue29: cancel on request")] | None = None
    """(pko extension) CancelRequest is the pulumi.com/cancel-request token that cancelled this
    update (it is being cancelled)."""
    policy_packs_digest: Annotated[str, Extension(_ENFORCED_PACKS)] | None = None
    """(pko extension) PolicyPacksDigest is the digest of the policy packs WorkspaceTemplates
    enforce on this update (docs/policy.md)."""


FailureReason = Literal[
    "ProgramError",
    "ResourceOperationFailed",
    "ConfigInvalid",
    "InstallFailed",
    "AuthFailed",
    "PendingOperations",
    "StackLocked",
    "UpdateConflict",
    "Transient",
    "UpdateLost",
    "OperationFailed",
    "StackNotFound",
    "Cancelled",
    "PolicyViolation",
    "PolicyPackFailed",
]
"""The closed set of failure classes in ``status.lastFailure.reason``."""


class StackFailure(KubeModel):
    """(pko extension) Why the last operation failed, and what the operator does about it."""

    reason: FailureReason
    """Reason classifies the failure: ProgramError, ResourceOperationFailed, ConfigInvalid,
    InstallFailed, AuthFailed, PendingOperations (deterministic: retried slowly, then Stalled),
    StackNotFound (the stack, or the resources the Stack deployed, are not in the backend: Stalled at
    once, never retried by itself), Cancelled (cancelled on request: not retried until the next
    change), PolicyViolation (a mandatory policy of spec.policyPacks: Stalled at once until the
    program, a pack or the spec changes), PolicyPackFailed (a pack did not load: deterministic) or
    StackLocked, UpdateConflict, Transient, UpdateLost (transient: retried quickly)."""
    message: str
    """Message holds the last lines of the error."""
    transient: bool
    """Transient is true when the failure is expected to go away by itself."""
    update_name: str | None = None
    """UpdateName is the Update that failed."""
    counted_failures: NonNegativeInt64 | None = None
    """CountedFailures is how many deterministic failures in a row the stack had with its current spec
    and source; when it exceeds the failure budget the stack is Stalled."""
    lock_owner: str | None = None
    """LockOwner names who holds the stack's lock (StackLocked), when the backend says."""
    pending_operations: Annotated[list[str], ListAtomic()] | None = None
    """PendingOperations lists the URNs of operations Pulumi started but did not finish (PendingOperations):
    resolve them (pulumi refresh --clear-pending-creates, or stack export/import) before the next update."""


class PlanSummary(KubeModel):
    """How many resources a plan creates, updates, deletes and replaces."""

    create: NonNegativeInt64 = 0
    """Create counts the resources created."""
    update: NonNegativeInt64 = 0
    """Update counts the resources updated in place."""
    delete: NonNegativeInt64 = 0
    """Delete counts the resources deleted."""
    replace: NonNegativeInt64 = 0
    """Replace counts the resources replaced (deleted and created again)."""


class StackPlan(KubeModel):
    """(pko extension) The previewed plan an up waits to apply (spec.approval)."""

    digest: str
    """Digest (sha256) of the source revision, config, environment and the preview's change set:
    the value of the pulumi.com/approved-plan annotation that approves this plan."""
    update: str
    """Update is the preview Update that saved the plan."""
    summary: PlanSummary
    """Summary counts the plan's changes."""
    time: Time
    """Time the plan was recorded."""
    inputs: str
    """Inputs is the digest of the revision, config and environment alone: a plan is applied only
    while they are unchanged."""
    commit: str | None = None
    """Commit is the source revision the plan was previewed at."""


class DriftedResource(KubeModel):
    """A resource that differs from the stack's state."""

    urn: str
    """URN of the resource."""
    type: str
    """Type of the resource."""
    paths: Annotated[list[str], ListAtomic()] | None = None
    """Paths are the property paths that differ (absent: the resource is gone)."""
    first_seen: Time
    """FirstSeen is the first check that found this resource drifted (kept while it stays drifted)."""


class StackDrift(KubeModel):
    """(pko extension) The result of the last drift check (spec.driftDetection)."""

    last_check_time: Time | None = None
    """LastCheckTime is when the last check completed."""
    detected: bool = False
    """Detected is true when the last check found drift."""
    resources: Annotated[list[DriftedResource], ListAtomic()] | None = None
    """Resources lists the drifted resources, by urn: the first 250 that fit in 128 KiB of JSON, each
    with its first 20 paths (``truncated``; the agent's log lists every one)."""
    count: Annotated[NonNegativeInt64, Extension("issue44: no status grows with the program")] | None = None
    """(pko extension) Count is how many resources the last check found drifted (``resources`` lists
    the first of them)."""
    truncated: Annotated[bool, Extension("issue44: no status grows with the program")] | None = None
    """(pko extension) Truncated is true when ``resources`` leaves resources or paths out."""
    message: str | None = None
    """Message says why the last check failed, if it did."""


class StackRefreshState(KubeModel):
    """(pko extension) The last refresh run on request (pulumi.com/refresh-request)."""

    name: str | None = None
    """Name is the name of the refresh's Update object."""
    token: str | None = None
    """Token is the pulumi.com/refresh-request token the refresh ran for."""
    state: StackUpdateStateMessage | None = None
    """State is the state of the refresh: succeeded or failed."""
    message: str | None = None
    """Message holds the last lines of the error of a failed refresh."""
    reason: FailureReason | None = None
    """Reason classifies a failure as status.lastFailure.reason does: a transient one (StackLocked,
    UpdateConflict, Transient, UpdateLost) keeps the request pending and is retried after the
    Stack's transient backoff; any other ends the request."""
    failures: NonNegativeInt64 | None = None
    """Failures counts the refreshes of this token that failed in a row (0 after a success)."""
    last_resync_time: Time | None = None
    """LastResyncTime is when the refresh completed (the transient backoff counts from it)."""


class StackStatus(KubeModel):
    """The observed state of a Stack."""

    outputs: dict[str, JSONValue] | None = None
    """Outputs contains the exported stack output variables resulting from a deployment."""
    last_update: StackUpdateState | None = None
    """LastUpdate contains details of the status of the last update."""
    observed_generation: NonNegativeInt64 | None = None
    """ObservedGeneration records the value of .metadata.generation when the controller last processed
    this object."""
    observed_reconcile_request: str | None = None
    """ObservedReconcileRequest records the value of the pulumi.com/reconciliation-request annotation
    when it was last seen."""
    conditions: Conditions | None = None
    """The observations of a stack's current state: Ready, Reconciling, Stalled."""
    current_update: CurrentStackUpdate | None = None
    """CurrentUpdate contains details of the current update, if any."""
    project_info: ProjectInfo | None = None
    """ProjectInfo caches the project name and runtime reported by the agent, to destroy without a
    source."""
    next_retry_time: Annotated[Time, Extension("design.md: retries show status.nextRetryTime")] | None = None
    """(pko extension) NextRetryTime is when a failed update will next be retried."""
    last_failure: (
        Annotated[StackFailure, Extension("issue9: a closed classification of the last failure")] | None
    ) = None
    """(pko extension) LastFailure classifies the last failed operation (cleared by a success)."""
    resource_count: (
        Annotated[NonNegativeInt64, Extension("issue30: a destroy that deletes nothing is not done")] | None
    ) = None
    """(pko extension) ResourceCount is how many resources the stack held after its last successful
    up, refresh or destroy: what a destroy is expected to delete. A destroy that deletes none of
    them (the stack's state was lost) does not release the Stack."""
    plan: Annotated[StackPlan, Extension("issue29: an approval gate on ups")] | None = None
    """(pko extension) Plan is the previewed plan waiting for approval (spec.approval)."""
    drift: Annotated[StackDrift, Extension("issue29: drift detection")] | None = None
    """(pko extension) Drift is the result of the last drift check (spec.driftDetection)."""
    observed_refresh_request: Annotated[str, Extension("issue29: one-off refresh on request")] | None = None
    """(pko extension) ObservedRefreshRequest is the pulumi.com/refresh-request token whose refresh
    last ended for good: it succeeded, or failed for a cause a retry cannot mend (a transient failure
    leaves the request pending: see lastRefresh)."""
    last_refresh: (
        Annotated[StackRefreshState, Extension("issue28: a refresh request survives a transient failure")]
        | None
    ) = None
    """(pko extension) LastRefresh is the result of the last refresh run on request."""
    observed_cancel_request: Annotated[str, Extension("issue29: cancel on request")] | None = None
    """(pko extension) ObservedCancelRequest is the pulumi.com/cancel-request token last acted on."""

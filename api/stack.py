"""``pulumi.com/v1`` Stack: a Pulumi stack kept up to date from a git repo, Flux source or Program.

The field set is the Go operator v2's (docs/stacks.md upstream), including the deprecated fields
users' manifests still carry (``accessTokenSecret``, ``envs``, ``envSecrets``, ``secrets``,
``gitAuthSecret``): they are accepted and keep their Go meaning, which the Stack reconciler maps
onto the Workspace (see each field's docstring). ``status.nextRetryTime`` is our extension.

The same schema is served as the legacy ``pulumi.com/v1alpha1`` (not stored).

The ``@Rule`` decorators are CEL rules the apiserver checks on every write (the Go operator's name
rule, and the cross-field rules its controllers and API docs state); each has a Python twin in
``pko.api.validation``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pko.api import update as update_api
from pko.api import workspace as workspace_api
from pko.api.markers import ApplyConfigurationOf, Extension, Format, ListAtomic, Rule
from pko.api.meta import (
    Conditions,
    GoDuration,
    Int64,
    JSONValue,
    KubeModel,
    NonNegativeInt64,
    ObjectMeta,
    Time,
)
from pydantic import Field

GROUP: Final = "pulumi.com"
VERSION: Final = "v1"
LEGACY_VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "Stack"
PLURAL: Final = "stacks"

MAX_NAME_LENGTH: Final = 42
"""Longest Stack name: derived object names (``<name>-workspace-0``, Update names) must stay valid."""
NAME_TOO_LONG_MESSAGE: Final = (
    f"Stack name must be no more than {MAX_NAME_LENGTH} characters to accommodate workspace pod naming "
    "(name + '-workspace' + 10-char hash must fit within Kubernetes' 63-character label limit)"
)
"""The Go operator's message for its CEL rule ``size(self.metadata.name) <= 42`` (users search for it)."""

RECONCILE_REQUEST_ANNOTATION: Final = "pulumi.com/reconciliation-request"
APPROVED_PLAN_ANNOTATION: Final = "pulumi.com/approved-plan"
"""Set to ``status.plan.digest`` to let the operator apply that plan (``spec.approval``)."""
REFRESH_REQUEST_ANNOTATION: Final = "pulumi.com/refresh-request"
"""Any new token runs one ``refresh``, retried after a transient failure;
``status.observedRefreshRequest`` holds it once it succeeded or failed for good."""
CANCEL_REQUEST_ANNOTATION: Final = "pulumi.com/cancel-request"
"""Any new token cancels the Stack's running Update; ``status.observedCancelRequest`` holds it."""

CONDITION_READY: Final = "Ready"
CONDITION_STALLED: Final = "Stalled"
CONDITION_RECONCILING: Final = "Reconciling"

DEFAULT_RESYNC_FREQUENCY_SECONDS: Final = 60
"""Also the minimum: smaller values (including 0) mean 60."""

ResourceSelectorType = Literal["Env", "FS", "Secret", "Literal"]
EnvSelectorType = Literal["Env", "FS", "Secret", "Literal", "ConfigMap"]
WorkspaceReclaimPolicy = Literal["Retain", "Delete"]
StackUpdateStateMessage = Literal["succeeded", "failed"]


class FSSelector(KubeModel):
    """A file on the operator's file system (deprecated in v2: refused)."""

    path: str
    """Path on the filesystem to use to load information from."""


class EnvSelector(KubeModel):
    """An environment variable of the operator process (deprecated in v2: refused)."""

    name: str
    """Name of the environment variable."""


class SecretSelector(KubeModel):
    """A key of a Kubernetes Secret in the Stack's namespace."""

    namespace: str | None = None
    """Namespace where the Secret is stored. Deprecated; a namespace other than the Stack's is invalid."""
    name: str
    """Name of the Secret."""
    key: str
    """Key within the Secret to use."""


class ConfigMapSelector(KubeModel):
    """A key of a ConfigMap in the Stack's namespace (pko extension, for envRefs)."""

    name: str
    """Name of the ConfigMap."""
    key: str
    """Key within the ConfigMap to use."""


class LiteralRef(KubeModel):
    """A literal value."""

    value: str
    """Value to load."""


def _union_rule(members: tuple[tuple[str, str], ...]) -> Rule:
    """The member named by ``type`` is set, and no other (``members``: (type, field) pairs)."""
    return Rule(
        " && ".join(f"(self.type == '{kind}') == has(self.{field})" for kind, field in members),
        "exactly the field named by type must be set: "
        + ", ".join(f"{field} for {kind}" for kind, field in members),
    )


_REF_MEMBERS: Final = (("Env", "env"), ("FS", "filesystem"), ("Secret", "secret"), ("Literal", "literal"))


@_union_rule(_REF_MEMBERS)
class ResourceRef(KubeModel):
    """Where a value comes from: one of a Secret key or a literal (Env and FS are refused in v2).

    Invariant (a CEL rule, and ``pko.api.validation``): the key named by ``type`` is set, no other is.
    """

    type: ResourceSelectorType
    """SelectorType is required and signifies the type of selector. Must be one of: Env, FS, Secret,
    Literal."""
    filesystem: FSSelector | None = None
    """FileSystem selects a file on the operator's file system."""
    env: EnvSelector | None = None
    """Env selects an environment variable set on the operator process."""
    secret: SecretSelector | None = None
    """SecretRef refers to a Kubernetes Secret."""
    literal: LiteralRef | None = None
    """LiteralRef refers to a literal value."""


@_union_rule((*_REF_MEMBERS, ("ConfigMap", "configMap")))
class EnvRef(ResourceRef):
    """Where an environment variable's value comes from: a ResourceRef, or a ConfigMap key (pko
    extension: upstream has no way to take a plain setting from a ConfigMap)."""

    type: EnvSelectorType  # type: ignore[assignment]
    """SelectorType is required and signifies the type of selector. Must be one of: Env, FS, Secret,
    Literal, ConfigMap."""
    config_map: Annotated[
        ConfigMapSelector | None, Field(alias="configMap"), Extension("issue9: envRefs from a ConfigMap")
    ] = None
    """(pko extension) ConfigMap refers to a key of a ConfigMap in the Stack's namespace."""


class ConfigMapRef(KubeModel):
    """A key of a ConfigMap in the Stack's namespace."""

    name: str
    """Name of the ConfigMap."""
    key: str
    """Key within the ConfigMap to use."""
    json_: Annotated[bool | None, Field(alias="json")] = None
    """JSON indicates the referenced value should be parsed as JSON (structured data) rather than a raw
    string."""


class GitHubAppAuth(KubeModel):
    """GitHub App credentials; all three must reference a Kubernetes Secret."""

    app_id: Annotated[ResourceRef, Field(alias="appID")]
    """AppID is the numeric GitHub App ID, stored as a string in a Kubernetes Secret."""
    installation_id: Annotated[ResourceRef, Field(alias="installationID")]
    """InstallationID is the numeric GitHub App installation ID, stored as a string in a Kubernetes Secret."""
    private_key: ResourceRef
    """PrivateKey is the PEM-encoded RSA private key of the GitHub App, stored in a Kubernetes Secret."""


class SSHAuth(KubeModel):
    """SSH authentication: a private key and an optional passphrase."""

    ssh_private_key: ResourceRef
    """The SSH private key."""
    password: ResourceRef | None = None
    """The passphrase of the private key, if any."""


class BasicAuth(KubeModel):
    """Username and password authentication; both are required."""

    user_name: ResourceRef
    """The username."""
    password: ResourceRef
    """The password."""


@Rule(
    "has(self.accessToken) || has(self.sshAuth) || has(self.basicAuth) || has(self.githubApp)",
    "must specify one of accessToken, sshAuth, basicAuth or githubApp",
)
class GitAuthConfig(KubeModel):
    """Git authentication. When more than one mode is set, the first of sshAuth, accessToken, githubApp,
    basicAuth wins."""

    access_token: ResourceRef | None = None
    """A personal access token."""
    ssh_auth: SSHAuth | None = None
    """SSH private key (and its optional password)."""
    basic_auth: BasicAuth | None = None
    """Basic auth username and password."""
    github_app: GitHubAppAuth | None = None
    """GitHub App (app ID, installation ID and private key)."""


class FluxSourceReference(KubeModel):
    """A Flux source object in the Stack's namespace."""

    api_version: str
    """API version of the source, e.g. source.toolkit.fluxcd.io/v1."""
    kind: str
    """Kind of the source, e.g. GitRepository, OCIRepository, Bucket."""
    name: str
    """Name of the source object."""


class FluxSource(KubeModel):
    """How to fetch source code from a Flux source object."""

    source_ref: FluxSourceReference
    """The Flux source object."""
    dir: str | None = None
    """Dir gives the subdirectory containing the Pulumi project (Pulumi.yaml) within the fetched source."""


class ProgramReference(KubeModel):
    """A Program object in the Stack's namespace."""

    name: str
    """Name of the Program."""


class RequirementSpec(KubeModel):
    """Constraints for a prerequisite to be considered satisfied."""

    succeeded_within_duration: GoDuration | None = None
    """SucceededWithinDuration gives a duration within which the prerequisite must have reached a
    succeeded state; e.g. "1h" means "the prerequisite must be successful, and have become so in the
    last hour"."""


class PrerequisiteRef(KubeModel):
    """Another Stack that must have succeeded before this one runs."""

    name: str
    """Name is the name of the Stack resource that is a prerequisite."""
    requirement: RequirementSpec | None = None
    """Requirement gives specific requirements for the prerequisite; the base requirement is that the
    referenced stack is in a successful state."""


RetrySeconds = Annotated[int, Format("int64"), Field(ge=1)]
"""A retry wait in whole seconds, at least 1 (status times have whole seconds)."""
RetryFactor = Annotated[float, Field(ge=1)]
"""How much a retry wait grows with each failure in a row: at least 1 (1: a fixed wait)."""


class DeterministicRetry(KubeModel):
    """(pko extension) The backoff of deterministic failures: baseSeconds x factor^(n-1) before the
    n-th retry, at most retryMaxBackoffDurationSeconds, and at most maxUpdateFailures retries."""

    base_seconds: RetrySeconds | None = None
    """BaseSeconds is the wait before the first retry. Defaults to the operator's setting (10)."""
    factor: RetryFactor | None = None
    """Factor multiplies the wait with each further failure. Defaults to the operator's setting (3)."""


class TransientRetry(KubeModel):
    """(pko extension) The backoff of transient failures: baseSeconds x factor^(n-1) +-jitter before
    the n-th retry in a row, at most maxSeconds (and retryMaxBackoffDurationSeconds); never Stalled."""

    base_seconds: RetrySeconds | None = None
    """BaseSeconds is the wait before the first retry. Defaults to the operator's setting (5)."""
    factor: RetryFactor | None = None
    """Factor multiplies the wait with each further failure. Defaults to the operator's setting (2)."""
    max_seconds: RetrySeconds | None = None
    """MaxSeconds is the longest wait, after the jitter. Defaults to the operator's setting (300);
    retryMaxBackoffDurationSeconds, if lower, wins."""
    jitter: Annotated[float, Field(ge=0, lt=1)] | None = None
    """Jitter spreads each wait by up to this fraction either way (0.2: +-20%), stable per failed
    Update, so a fleet that failed together does not retry together. Defaults to the operator's
    setting (0.2)."""


class RetryPolicy(KubeModel):
    """(pko extension) How this Stack's failed operations are retried; every field omitted takes
    the operator's setting (its --stack-* flags)."""

    transient: TransientRetry | None = None
    """Transient is the backoff of failures expected to go away by themselves (network, 5xx, 429,
    update conflict, a held lock, a lost Update)."""
    deterministic: DeterministicRetry | None = None
    """Deterministic is the backoff of failures that need a fix (program, config, install, auth,
    pending operations)."""


ApprovalMode = Literal["Never", "Always", "OnDestructive"]


class ApprovalSpec(KubeModel):
    """(pko extension) Whether an up waits for a person to approve its previewed plan."""

    mode: ApprovalMode = "Never"
    """Mode: Never (default: apply at once), Always (every up waits for approval of its plan), or
    OnDestructive (apply at once unless the preview deletes or replaces a resource). A plan waiting
    is in status.plan; approve it with the annotation pulumi.com/approved-plan set to its digest.
    The up then applies exactly that plan (the engine refuses any other change)."""


class DriftDetectionSpec(KubeModel):
    """(pko extension) Periodic read-only refreshes that report resources changed out of band."""

    interval_seconds: Annotated[int, Format("int64"), Field(ge=60)]
    """IntervalSeconds between two drift checks (at least 60)."""
    remediate: bool = False
    """Remediate runs an up (with refresh, through spec.approval) when drift is found, putting the
    resources back as the program declares them. Default false: drift is only reported."""


WorkspaceApplyConfiguration = Annotated[dict[str, Any], ApplyConfigurationOf(workspace_api.Workspace)]
UpdateApplyConfiguration = Annotated[dict[str, Any], ApplyConfigurationOf(update_api.Update)]


def _set(field: str) -> str:
    """CEL: the string field is set and not empty (the Python checks test truthiness)."""
    return f"(has(self.{field}) && self.{field} != '')"


_OTHER_GIT_FIELDS_SET: Final = " || ".join(
    (
        _set("commit"),
        _set("branch"),
        _set("repoDir"),
        "has(self.gitAuth)",
        _set("gitAuthSecret"),
        "(has(self.shallow) && self.shallow)",
    )
)


@Rule(
    f"[{_set('projectRepo')}, has(self.fluxSource), has(self.programRef)].filter(s, s).size() <= 1",
    "only one of projectRepo, fluxSource or programRef may be set",
)
@Rule(
    f"{_set('projectRepo')} || !({_OTHER_GIT_FIELDS_SET})",
    "required when commit, branch, repoDir, gitAuth, gitAuthSecret or shallow is set",
    field_path=".projectRepo",
)
@Rule(f"!{_set('commit')} || !{_set('branch')}", "mutually exclusive with spec.commit", field_path=".branch")
@Rule(
    f"!{_set('projectRepo')} || {_set('commit')} || {_set('branch')}",
    "one of commit or branch is required with projectRepo",
)
@Rule(
    f"!has(self.gitAuth) || !{_set('gitAuthSecret')}",
    "mutually exclusive with spec.gitAuthSecret",
    field_path=".gitAuth",
)
class StackSpec(KubeModel):
    """The desired state of a Pulumi stack managed by the operator."""

    access_token_secret: str | None = None
    """(optional) AccessTokenSecret is the name of a Secret containing the PULUMI_ACCESS_TOKEN (key
    accessToken). Deprecated: use envRefs with a secret entry for PULUMI_ACCESS_TOKEN."""
    envs: list[str] | None = None
    """(optional) Envs is a list of ConfigMap names whose entries are set as environment variables.
    Deprecated: use envRefs."""
    env_refs: dict[str, EnvRef] | None = None
    """(optional) EnvRefs maps environment variable names to where their values come from (a literal or a
    Secret key)."""
    env_secrets: list[str] | None = None
    """(optional) SecretEnvs is a list of Secret names whose entries are set as environment variables.
    Deprecated: use envRefs."""
    backend: str | None = None
    """(optional) Backend is the backend URL to use for all Pulumi operations, e.g. https://app.pulumi.com
    (default), file://./einstein, s3://<bucket>, azblob://<bucket>, gs://<bucket>."""
    stack: str
    """Stack is the fully qualified name of the stack to deploy (<org>/<stack>)."""
    config: dict[str, JSONValue] | None = None
    """(optional) Config is the configuration for this stack: strings or structured values (objects,
    arrays, numbers, booleans). When omitted, configuration is taken from the source."""
    secrets: dict[str, str] | None = None
    """(optional) Secrets is secret configuration given inline. Deprecated: use secretsRef."""
    config_ref: dict[str, ConfigMapRef] | None = None
    """(optional) ConfigRef sets configuration values from ConfigMap keys."""
    secrets_ref: dict[str, ResourceRef] | None = None
    """(optional) SecretRefs is secret configuration given through resource references."""
    secrets_provider: str | None = None
    """(optional) SecretsProvider is used to initialize a stack with alternative encryption, e.g.
    awskms://..., azurekeyvault://..., gcpkms://...; 'default' resets to the default provider."""

    project_repo: str | None = None
    """ProjectRepo is the git repository from which the project code and configuration are fetched."""
    git_auth_secret: str | None = None
    """(optional) GitAuthSecret is the name of a Secret with git credentials (keys sshPrivateKey and
    password, accessToken, or username and password). Deprecated: use gitAuth."""
    git_auth: GitAuthConfig | None = None
    """(optional) GitAuth configures git authentication: SSH private key, personal access token, basic
    auth or GitHub App."""
    repo_dir: str | None = None
    """(optional) RepoDir is the directory of the repository where Pulumi.yaml is located."""
    commit: str | None = None
    """(optional) Commit is the hash of the commit to deploy. Mutually exclusive with branch."""
    branch: str | None = None
    """(optional) Branch is the branch to deploy (simple or fully qualified ref name, e.g.
    refs/heads/master), polled every resyncFrequencySeconds. Mutually exclusive with commit."""
    shallow: bool = False
    """Shallow controls whether the workspace uses a shallow checkout or whether all history is cloned."""
    flux_source: FluxSource | None = None
    """FluxSource specifies how to fetch source code from a Flux source object."""
    program_ref: ProgramReference | None = None
    """ProgramRef refers to a Program object, to be used as the source for the stack."""

    targets: list[str] | None = None
    """(optional) Targets is a list of URNs of resources to update exclusively."""
    target_dependents: bool = False
    """TargetDependents indicates that dependent resources should be updated as well, when using targets."""
    prerequisites: list[PrerequisiteRef] | None = None
    """(optional) Prerequisites is a list of other Stacks, each with a constraint on how long ago it must
    have succeeded."""
    continue_resync_on_commit_match: bool = False
    """(optional) ContinueResyncOnCommitMatch keeps updating the stack every resyncFrequencySeconds even
    when the source revision has not changed (drift detection)."""
    refresh: bool = False
    """(optional) Refresh the stack before it is updated."""
    init_on_create: bool | None = None
    """(deprecated, ignored) InitOnCreate was removed from the Stack API before v1.0. It is accepted
    only so that older manifests, which still set it, apply unchanged."""
    expect_no_refresh_changes: bool = False
    """(optional) ExpectNoRefreshChanges: a refresh is not expected to find changes. Ignored in v2."""
    destroy_on_finalize: bool = False
    """(optional) DestroyOnFinalize destroys the stack when the Stack object is deleted."""
    run_program: bool = False
    """(optional) RunProgram runs the program during destroy operations (when destroyOnFinalize is set)."""
    retry_on_update_conflict: bool = False
    """(optional) RetryOnUpdateConflict retries an update that hit an HTTP 409 conflict (another update in
    progress)."""
    use_local_stack_only: bool = False
    """(optional) UseLocalStackOnly prevents the operator from creating stacks that do not exist."""
    resync_frequency_seconds: NonNegativeInt64 | None = None
    """(optional) ResyncFrequencySeconds: how often to resync (continueResyncOnCommitMatch) and to poll a
    branch. Values below 60 (including 0) mean 60; defaults to 60."""
    service_account_name: str | None = None
    """ServiceAccountName is the Kubernetes service account identity of the stack's workspace."""
    workspace_template: WorkspaceApplyConfiguration | None = None
    """WorkspaceTemplate customizes the Workspace generated for this Stack: it is merged over the
    generated Workspace (metadata, image, resources, volumes, ...)."""
    workspace_reclaim_policy: WorkspaceReclaimPolicy = "Retain"
    """WorkspaceReclaimPolicy: whether the workspace is deleted or retained after the Stack is
    successfully updated. One of Retain (default) or Delete."""
    environment: Annotated[list[str], ListAtomic()] | None = None
    """(optional) Environment specifies the Pulumi ESC environment(s) to use for this stack."""
    update_template: UpdateApplyConfiguration | None = None
    """UpdateTemplate customizes the Updates generated for this Stack: it is merged over each generated
    Update (metadata, retention policy, ...)."""
    retry_max_backoff_duration_seconds: NonNegativeInt64 | None = None
    """RetryMaxBackoffDurationSeconds is the maximum number of seconds to wait before retrying a failed
    update. Defaults to 86400 (24 hours)."""
    preview: bool = False
    """(optional) Preview runs only preview operations, never actual updates."""
    suspend: Annotated[bool, Extension("issue9: spec.suspend, as Flux users know it")] = False
    """(pko extension) Suspend: while true, no new operation (update, refresh, destroy) is started for
    this stack; an operation already running completes and its result is recorded."""
    max_update_failures: (
        Annotated[NonNegativeInt64, Extension("issue9: classified retries, failure budget per Stack")] | None
    ) = None
    """(pko extension) MaxUpdateFailures is how many times a deterministic failure (program, config,
    install or auth error) is retried before the stack is Stalled (UpdateFailed) until its spec or
    source changes. Defaults to the operator's setting (3, as the Go operator). Transient failures
    (network, 5xx, 429, update conflict, a held lock) are retried with a short backoff and do not
    count."""
    retry_policy: Annotated[RetryPolicy, Extension("issue28: retries users can tune")] | None = None
    """(pko extension) RetryPolicy tunes the backoff of failed operations (bases, factors, the
    transient cap and jitter); omitted fields take the operator's settings. The longest wait of any
    retry stays retryMaxBackoffDurationSeconds."""
    approval: Annotated[ApprovalSpec, Extension("issue29: an approval gate on ups")] | None = None
    """(pko extension) Approval makes ups wait for a person to approve the previewed plan."""
    drift_detection: Annotated[DriftDetectionSpec, Extension("issue29: drift detection")] | None = None
    """(pko extension) DriftDetection checks the stack for resources changed out of band every
    intervalSeconds (a read-only refresh), reports them in status.drift and optionally remediates."""

    def resync_frequency(self) -> int:
        """Effective resync period in seconds: the field, but never less than 60 (the Go rule)."""
        return max(self.resync_frequency_seconds or 0, DEFAULT_RESYNC_FREQUENCY_SECONDS)

    def has_git_source(self) -> bool:
        """Whether any of the inline git fields is set (Go's ``GitSource != nil``)."""
        return bool(
            self.project_repo
            or self.commit
            or self.branch
            or self.repo_dir
            or self.git_auth
            or self.git_auth_secret
            or self.shallow
        )


class ProjectInfo(KubeModel):
    """The Pulumi project name and runtime, cached to destroy without a source."""

    name: str
    """Name is the Pulumi project name (the name: field in Pulumi.yaml)."""
    runtime: str
    """Runtime is the Pulumi runtime declaration (the runtime: field in Pulumi.yaml)."""


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
]
"""The closed set of failure classes in ``status.lastFailure.reason``."""


class StackFailure(KubeModel):
    """(pko extension) Why the last operation failed, and what the operator does about it."""

    reason: FailureReason
    """Reason classifies the failure: ProgramError, ResourceOperationFailed, ConfigInvalid,
    InstallFailed, AuthFailed, PendingOperations (deterministic: retried slowly, then Stalled),
    StackNotFound (the stack, or the resources the Stack deployed, are not in the backend: Stalled at
    once, never retried by itself), Cancelled (cancelled on request: not retried until the next
    change) or StackLocked, UpdateConflict, Transient, UpdateLost (transient:
    retried quickly)."""
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
    """Resources lists the drifted resources, by urn."""
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


@Rule(f"size(self.metadata.name) <= {MAX_NAME_LENGTH}", NAME_TOO_LONG_MESSAGE, field_path=".metadata.name")
class Stack(KubeModel):
    """A Stack (pulumi.com/v1; also served as pulumi.com/v1alpha1)."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: StackSpec
    status: StackStatus | None = None


__all__ = [
    "API_VERSION",
    "APPROVED_PLAN_ANNOTATION",
    "CANCEL_REQUEST_ANNOTATION",
    "CONDITION_READY",
    "CONDITION_RECONCILING",
    "CONDITION_STALLED",
    "DEFAULT_RESYNC_FREQUENCY_SECONDS",
    "GROUP",
    "KIND",
    "LEGACY_VERSION",
    "MAX_NAME_LENGTH",
    "NAME_TOO_LONG_MESSAGE",
    "PLURAL",
    "RECONCILE_REQUEST_ANNOTATION",
    "REFRESH_REQUEST_ANNOTATION",
    "VERSION",
    "ApprovalMode",
    "ApprovalSpec",
    "BasicAuth",
    "ConfigMapRef",
    "CurrentStackUpdate",
    "DeterministicRetry",
    "DriftDetectionSpec",
    "DriftedResource",
    "EnvSelector",
    "FSSelector",
    "FailureReason",
    "FluxSource",
    "FluxSourceReference",
    "GitAuthConfig",
    "GitHubAppAuth",
    "LiteralRef",
    "PlanSummary",
    "PrerequisiteRef",
    "ProgramReference",
    "ProjectInfo",
    "RequirementSpec",
    "ResourceRef",
    "ResourceSelectorType",
    "RetryFactor",
    "RetryPolicy",
    "RetrySeconds",
    "SSHAuth",
    "SecretSelector",
    "Stack",
    "StackDrift",
    "StackFailure",
    "StackPlan",
    "StackRefreshState",
    "StackSpec",
    "StackStatus",
    "StackUpdateState",
    "StackUpdateStateMessage",
    "TransientRetry",
    "UpdateApplyConfiguration",
    "WorkspaceApplyConfiguration",
    "WorkspaceReclaimPolicy",
]

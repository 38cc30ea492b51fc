"""``pulumi.com/v1`` Stack: a Pulumi stack kept up to date from a git repo, Flux source or Program.

The field set is the Go operator v2's (docs/stacks.md upstream), including the deprecated fields
users' manifests still carry (``accessTokenSecret``, ``envs``, ``envSecrets``, ``secrets``,
``gitAuthSecret``): they are accepted and keep their Go meaning, which the Stack reconciler maps
onto the Workspace (see each field's docstring). ``status.nextRetryTime`` is our extension.

The same schema is served as the legacy ``pulumi.com/v1alpha1`` (not stored).

The ``@Rule`` decorators are CEL rules the apiserver checks on every write (the Go operator's name
rule, and the cross-field rules its controllers and API docs state); each has a Python twin in
``pko.api.validation``.

The parts of the model are in ``stacksources`` (where the program, config and credentials come
from), ``stackpolicy`` (retry, approval, drift detection) and ``stackstatus``; the annotations,
condition types and reasons in ``stackterms`` (no pydantic: the kubectl plugin reads them too). This
module re-exports them all.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pko.api import update as update_api
from pko.api.markers import ApplyConfigurationOf, Extension, ListAtomic, ListMap, Rule
from pko.api.meta import (
    JSONValue,
    KubeModel,
    NonNegativeInt64,
    ObjectMeta,
)
from pko.api.stackoutputs import OutputsKind, StackOutputs
from pko.api.stackpolicy import (
    ApprovalMode,
    ApprovalSpec,
    DeterministicRetry,
    DriftDetectionSpec,
    RetryFactor,
    RetryPolicy,
    RetrySeconds,
    TransientRetry,
)
from pko.api.stackpolicypacks import MAX_PACKS, PolicyPack, PolicyViolation
from pko.api.stacksources import (
    BasicAuth,
    ConfigMapRef,
    EnvRef,
    EnvSelector,
    FluxSource,
    FluxSourceReference,
    FSSelector,
    GitAuthConfig,
    GitHubAppAuth,
    LiteralRef,
    PrerequisiteRef,
    ProgramReference,
    RequirementSpec,
    ResourceRef,
    ResourceSelectorType,
    SecretSelector,
    SSHAuth,
)
from pko.api.stackstatus import (
    CurrentStackUpdate,
    DriftedResource,
    FailureReason,
    PlanSummary,
    ProjectInfo,
    StackDrift,
    StackFailure,
    StackPlan,
    StackRefreshState,
    StackStatus,
    StackUpdateState,
    StackUpdateStateMessage,
)
from pko.api.stackterms import (
    APPROVED_PLAN_ANNOTATION,
    AWAITING_APPROVAL,
    CANCEL_REQUEST_ANNOTATION,
    CONDITION_INSECURE_TRANSPORT,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    CONDITION_SUSPENDED,
    PLAN_OPS,
    RECONCILE_REQUEST_ANNOTATION,
    REFRESH_REQUEST_ANNOTATION,
    resource_ops,
)
from pko.api.workspacetemplate import WorkspaceApplyConfiguration, WorkspaceTemplateReference
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

DEFAULT_RESYNC_FREQUENCY_SECONDS: Final = 60
"""Also the minimum: smaller values (including 0) mean 60."""

WorkspaceReclaimPolicy = Literal["Retain", "Delete"]


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
    workspace_template_ref: (
        Annotated[WorkspaceTemplateReference, Extension("issue42: shared workspace settings")] | None
    ) = None
    """(pko extension) WorkspaceTemplateRef names a WorkspaceTemplate (auto.pulumi.com) in the Stack's
    namespace whose spec is merged into the Workspace under workspaceTemplate (and over the
    operator's default template). The Stack waits (Reconciling, WorkspaceTemplateNotFound) while it
    does not exist."""
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
    outputs: Annotated[StackOutputs, Extension("issue42: outputs apps can mount")] | None = None
    """(pko extension) Outputs keeps the latest successful up's outputs in one Secret or ConfigMap
    of this name in the Stack's namespace, updated in place, for workloads to mount or read."""
    policy_packs: (
        Annotated[list[PolicyPack], MAX_PACKS, ListMap("name"), Extension("issue43: policy as code")] | None
    ) = None
    """(pko extension) PolicyPacks run on every preview and up (and the approval gate's preview)
    before any resource changes: a mandatory violation fails the Update (``PolicyViolation``) and the
    Stack is Stalled until its program, packs or spec change; advisory ones are recorded on the Update
    and as Warning Events."""

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
    "AWAITING_APPROVAL",
    "CANCEL_REQUEST_ANNOTATION",
    "CONDITION_INSECURE_TRANSPORT",
    "CONDITION_READY",
    "CONDITION_RECONCILING",
    "CONDITION_STALLED",
    "CONDITION_SUSPENDED",
    "DEFAULT_RESYNC_FREQUENCY_SECONDS",
    "GROUP",
    "KIND",
    "LEGACY_VERSION",
    "MAX_NAME_LENGTH",
    "NAME_TOO_LONG_MESSAGE",
    "PLAN_OPS",
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
    "OutputsKind",
    "PlanSummary",
    "PolicyPack",
    "PolicyViolation",
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
    "StackOutputs",
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
    "WorkspaceTemplateReference",
    "resource_ops",
]

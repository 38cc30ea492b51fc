"""``auto.pulumi.com/v1alpha1`` Workspace: the execution environment (a pod) of one Pulumi project.

Same fields, names, enums and defaults as the Go operator v2's Workspace; see docs/workspaces.md
upstream. ``securityProfile`` and ``serviceAccountName`` are defaulted by the CRD (as in Go);
the image and resource defaults depend on other fields, so ``WorkspaceSpec.with_defaults()``
applies them, as the Go workspace controller does before it builds the StatefulSet.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pko.api.k8sschema import EnvFromSource, EnvVar, PodSpec, ResourceRequirements, SecretKeySelector
from pko.api.markers import CrdDefault, Extension, ListAtomic, ListMap, NotInTemplates
from pko.api.meta import (
    Conditions,
    EmbeddedObjectMeta,
    JSONValue,
    KubeModel,
    NonNegativeInt32,
    NonNegativeInt64,
    ObjectMeta,
)
from pydantic import Field, model_validator

GROUP: Final = "auto.pulumi.com"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "Workspace"
PLURAL: Final = "workspaces"

CONDITION_READY: Final = "Ready"
CONDITION_STALLED: Final = "Stalled"

SecurityProfile = Literal["baseline", "restricted"]
PullPolicy = Literal["Always", "Never", "IfNotPresent"]

DEFAULT_SERVICE_ACCOUNT: Final = "default"
DEFAULT_SECURITY_PROFILE: Final[SecurityProfile] = "restricted"
DEFAULT_IMAGES: Final[dict[SecurityProfile, str]] = {
    "baseline": "pulumi/pulumi:latest",
    "restricted": "pulumi/pulumi:latest-nonroot",
}
DEFAULT_REQUESTS: Final[dict[str, str]] = {"memory": "64Mi", "cpu": "100m"}
"""Requests that make an idle workspace cheap and let it burst; no limits (as in Go)."""


class GitHubAppAuth(KubeModel):
    """GitHub App credentials in Secrets; the fetch step exchanges them for an installation token."""

    app_id: Annotated[SecretKeySelector, Field(alias="appID")]
    """A reference to the GitHub App ID (stored as a string) in a Kubernetes Secret."""
    installation_id: Annotated[SecretKeySelector, Field(alias="installationID")]
    """A reference to the GitHub App installation ID (stored as a string) in a Kubernetes Secret."""
    private_key: SecretKeySelector
    """A reference to the PEM-encoded RSA private key of the GitHub App in a Kubernetes Secret."""


class GitAuth(KubeModel):
    """Git credentials, each a Secret key reference."""

    ssh_private_key: SecretKeySelector | None = None
    """SSHPrivateKey should contain a private key for access to the git repo. The repository URL must
    then be in the format git@github.com:org/repository.git."""
    username: SecretKeySelector | None = None
    """Username is the username to use when authenticating to a git repository."""
    password: SecretKeySelector | None = None
    """The password that pairs with a username or as part of an SSH Private Key."""
    token: SecretKeySelector | None = None
    """Token is a Git personal access token in replacement of your password."""
    github_app: GitHubAppAuth | None = None
    """GitHubApp configures GitHub App-based authentication."""


class GitSource(KubeModel):
    """How to fetch the program from a git repository."""

    url: str | None = None
    """URL is the git source control repository from which we fetch the project code and configuration."""
    ref: str | None = None
    """Ref is the git ref (tag, branch, or commit SHA) to fetch."""
    dir: str | None = None
    """Dir is the directory in the repository where Pulumi.yaml is located."""
    auth: GitAuth | None = None
    """Auth contains optional authentication information to use when cloning the repository."""
    shallow: bool | None = None
    """Shallow controls whether the workspace uses a shallow clone or whether all history is cloned."""


class FluxSource(KubeModel):
    """How to fetch a Flux (or Program) source artifact."""

    url: str | None = None
    """URL is the URL of the artifact to fetch."""
    digest: str | None = None
    """Digest is the digest of the artifact to fetch."""
    dir: str | None = None
    """Dir gives the subdirectory containing the Pulumi project within the fetched artifact."""


class PolicyPackSource(KubeModel):
    """(pko extension) A policy pack's own source, which the pod fetches beside the program into
    ``/share/policy/<name>`` (an init container per pack, its credentials only there): what a Stack's
    ``spec.policyPacks[].git`` becomes, at the commit its branch resolved to, or its ``fluxSource``,
    at the artifact's digest."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    """Name of the pack (a DNS label): its directory under ``/share/policy``."""
    git: GitSource | None = None
    """Git is the pack's repository; ``dir`` the pack's directory in it (checked to exist at fetch)."""
    flux: FluxSource | None = None
    """Flux is the artifact holding the pack (its digest checked); ``dir`` the pack's directory in it."""

    @model_validator(mode="after")
    def _one_source(self) -> PolicyPackSource:
        """Exactly one of git or flux (the operator writes it; a Workspace's CRD has no CEL rules)."""
        if (self.git is None) == (self.flux is None):
            raise ValueError("exactly one of git or flux is required")
        return self


class LocalSource(KubeModel):
    """A program already present in the workspace image."""

    dir: str | None = None
    """Dir gives the subdirectory containing the Pulumi project within the workspace image."""


class ProjectInfoSource(KubeModel):
    """Bootstrap from a minimal Pulumi.yaml instead of fetching a source (destroy without a source)."""

    name: str
    """Name is the Pulumi project name to write into the project-info Pulumi.yaml."""
    runtime: str
    """Runtime is the Pulumi runtime to declare in the project-info Pulumi.yaml."""


class ConfigValueFrom(KubeModel):
    """Where a config value is read from inside the pulumi container."""

    env: str | None = None
    """Env is an environment variable in the pulumi container to use as the value."""
    path: str | None = None
    """Path is a path to a file in the pulumi container containing the value."""
    json_: Annotated[bool | None, Field(alias="json")] = None
    """JSON indicates the referenced value should be parsed as JSON (structured data) rather than a raw
    string."""


class ConfigItem(KubeModel):
    """One stack configuration value."""

    key: str
    """Key is the configuration key or path to set."""
    path: bool | None = None
    """Path indicates the key contains a path to a property in a map or list. Incompatible with
    structured values (objects, arrays)."""
    value: JSONValue | None = None
    """Value is the configuration value to set: a string, number, boolean, object or array."""
    value_from: ConfigValueFrom | None = None
    """ValueFrom is a reference to a value from the environment or from a file."""
    secret: bool | None = None
    """Secret marks the configuration value as a secret."""


class WorkspaceStack(KubeModel):
    """A Pulumi stack this workspace manages."""

    name: str
    """The stack name."""
    create: bool | None = None
    """Create the stack if it does not exist."""
    secrets_provider: str | None = None
    """SecretsProvider is the name of the secret provider to use for the stack."""
    config: Annotated[list[ConfigItem], ListMap("key")] | None = None
    """Config is a list of configuration values to set on the stack."""
    environment: Annotated[list[str], ListAtomic()] | None = None
    """Environment is a list of Pulumi ESC environments to import into the stack."""


class EmbeddedPodTemplateSpec(KubeModel):
    """A pod template with reduced metadata (labels and annotations)."""

    metadata: EmbeddedObjectMeta | None = None
    """Labels and annotations for the workspace pod."""
    spec: PodSpec | None = None
    """Specification of the desired behavior of the pod; merged over the pod the operator builds."""


class EmbeddedServiceTemplateSpec(KubeModel):
    """The customisable part of the workspace's headless Service: its metadata."""

    metadata: EmbeddedObjectMeta | None = None
    """Labels and annotations to apply to the Service."""


class WorkspaceSpec(KubeModel):
    """The desired state of a Workspace."""

    service_account_name: Annotated[str, CrdDefault(DEFAULT_SERVICE_ACCOUNT)] = DEFAULT_SERVICE_ACCOUNT
    """ServiceAccountName is the Kubernetes service account identity of the workspace."""
    security_profile: Annotated[SecurityProfile, CrdDefault(DEFAULT_SECURITY_PROFILE)] = (
        DEFAULT_SECURITY_PROFILE
    )
    """SecurityProfile applies a security profile to the workspace: restricted (default; non-root, conforms
    to the Restricted Pod Security Standard) or baseline (root, conforms to the Baseline standard)."""
    image: str | None = None
    """Image is the container image containing the 'pulumi' executable. Defaults by securityProfile:
    pulumi/pulumi:latest (baseline) or pulumi/pulumi:latest-nonroot (restricted)."""
    image_pull_policy: PullPolicy | None = None
    """Image pull policy: Always, Never or IfNotPresent. Defaults to Always if the :latest tag is
    specified, or IfNotPresent otherwise."""
    git: GitSource | None = None
    """Git is the git source containing the Pulumi program."""
    flux: FluxSource | None = None
    """Flux is the flux source containing the Pulumi program."""
    local: LocalSource | None = None
    """Local is the local source containing the Pulumi program."""
    project_info: ProjectInfoSource | None = None
    """ProjectInfo bypasses source fetching and bootstraps a minimal Pulumi.yaml from these fields."""
    env_from: Annotated[list[EnvFromSource], ListAtomic()] | None = None
    """List of sources to populate environment variables in the workspace."""
    env: Annotated[list[EnvVar], ListMap("name")] | None = None
    """List of environment variables to set in the container."""
    resources: ResourceRequirements | None = None
    """Compute Resources required by this workspace (default requests: 64Mi memory, 100m cpu)."""
    pod_template: EmbeddedPodTemplateSpec | None = None
    """PodTemplate defines a PodTemplateSpec for the Workspace's pods."""
    service_template: EmbeddedServiceTemplateSpec | None = None
    """ServiceTemplate defines a template for the Workspace's Service metadata."""
    pulumi_log_level: NonNegativeInt32 | None = None
    """PulumiLogLevel is the log verbosity level to use for the Pulumi CLI. If unset, verbose logging is
    disabled."""
    stacks: Annotated[list[WorkspaceStack], ListMap("name")] | None = None
    """List of stacks this workspace manages."""
    policy_pack_sources: (
        Annotated[
            list[PolicyPackSource], ListMap("name"), NotInTemplates(), Extension("issue43: packs from git")
        ]
        | None
    ) = None
    """(pko extension) PolicyPackSources are policy packs' own sources (git, Flux), each fetched into
    ``/share/policy/<name>`` before the agent starts; the Updates name the packs that run. Set by the
    Stack controller (a template cannot set it)."""

    def default_image(self) -> str:
        """The image used when ``image`` is unset, by security profile."""
        return DEFAULT_IMAGES[self.security_profile]

    def with_defaults(self) -> WorkspaceSpec:
        """A copy with the Go operator's defaulter applied: image by profile, and resource requests.

        A request that is missing or zero gets its default; limits are never added.
        """
        resources: dict[str, Any] = dict(self.resources or {})
        requests: dict[str, Any] = dict(resources.get("requests") or {})
        for name, quantity in DEFAULT_REQUESTS.items():
            if _is_zero_quantity(requests.get(name)):
                requests[name] = quantity
        resources["requests"] = requests
        return self.model_copy(update={"image": self.image or self.default_image(), "resources": resources})


def _is_zero_quantity(value: Any) -> bool:
    """Whether a quantity is absent or zero (``0``, ``"0"``, ``"0m"``, ``"0Mi"``...)."""
    if value is None:
        return True
    text = str(value).strip().lstrip("+")
    digits = text.rstrip("numkMGTPEi")
    try:
        return float(digits or "x") == 0
    except ValueError:
        return False


class WorkspaceStatus(KubeModel):
    """The observed state of a Workspace."""

    observed_generation: NonNegativeInt64 | None = None
    """The .metadata.generation that the status was set based upon."""
    address: str | None = None
    """The address of the workspace agent (host:port)."""
    pulumi_version: str | None = None
    """PulumiVersion is the version of the Pulumi CLI in the workspace."""
    conditions: Conditions | None = None
    """The observations of a workspace's current state: Ready, Stalled."""


class Workspace(KubeModel):
    """A Workspace (auto.pulumi.com/v1alpha1)."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: WorkspaceSpec = Field(default_factory=WorkspaceSpec)
    status: WorkspaceStatus | None = None


__all__ = [
    "API_VERSION",
    "CONDITION_READY",
    "CONDITION_STALLED",
    "DEFAULT_IMAGES",
    "DEFAULT_REQUESTS",
    "DEFAULT_SECURITY_PROFILE",
    "DEFAULT_SERVICE_ACCOUNT",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "ConfigItem",
    "ConfigValueFrom",
    "EmbeddedPodTemplateSpec",
    "EmbeddedServiceTemplateSpec",
    "FluxSource",
    "GitAuth",
    "GitHubAppAuth",
    "GitSource",
    "LocalSource",
    "ProjectInfoSource",
    "PullPolicy",
    "SecurityProfile",
    "Workspace",
    "WorkspaceSpec",
    "WorkspaceStack",
    "WorkspaceStatus",
]

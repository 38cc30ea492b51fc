"""The parts of a ``pulumi.com/v1`` Stack's spec that say where its program, config and credentials
come from: value references and selectors, git auth, Flux and Program sources, prerequisites.

Re-exported by :mod:`pko.api.stack`, whose module docstring says how the schema is built.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pko.api.markers import Extension, Rule
from pko.api.meta import (
    GoDuration,
    KubeModel,
)
from pydantic import Field

ResourceSelectorType = Literal["Env", "FS", "Secret", "Literal"]
EnvSelectorType = Literal["Env", "FS", "Secret", "Literal", "ConfigMap"]


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

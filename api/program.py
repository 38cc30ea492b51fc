"""``pulumi.com/v1`` Program: a Pulumi YAML program written as a Kubernetes object.

The body lives at the top level under ``program:`` (not ``spec:``), as in the Go operator v2;
see docs/programs.md upstream. The Program controller serves it as a tarball artifact whose
address is recorded in ``status.artifact`` (the same shape as a Flux source artifact).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pko.api.markers import Extension
from pko.api.meta import Conditions, JSONValue, KubeModel, NonNegativeInt64, ObjectMeta, Time
from pydantic import Field

GROUP: Final = "pulumi.com"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "Program"
PLURAL: Final = "programs"

ConfigType = Literal["String", "Number", "List<Number>", "List<String>"]

ARTIFACT_DIGEST_PATTERN: Final = r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$"


class Configuration(KubeModel):
    """A config input of the program. Either type or default is required."""

    type: ConfigType | None = None
    """Type is the data type for the parameter: String, Number, List<Number> or List<String>."""
    default: JSONValue | None = None
    """Default is a value of the appropriate type for the template to use if no value is specified."""


class CustomTimeouts(KubeModel):
    """Overrides of the default retry/timeout behaviour of resource provisioning."""

    create: str | None = None
    """Create is the custom timeout for create operations."""
    delete: str | None = None
    """Delete is the custom timeout for delete operations."""
    update: str | None = None
    """Update is the custom timeout for update operations."""


class Options(KubeModel):
    """Pulumi resource options."""

    additional_secret_outputs: list[str] | None = None
    """AdditionalSecretOutputs specifies properties that must be encrypted as secrets."""
    aliases: list[str] | None = None
    """Aliases specifies names that this resource used to have, so that renaming doesn't replace it."""
    custom_timeouts: CustomTimeouts | None = None
    """CustomTimeouts overrides the default retry/timeout behavior for resource provisioning."""
    delete_before_replace: bool | None = None
    """DeleteBeforeReplace overrides the default create-before-delete behavior when replacing."""
    depends_on: list[JSONValue] | None = None
    """DependsOn adds explicit dependencies in addition to the ones in the dependency graph."""
    ignore_changes: list[str] | None = None
    """IgnoreChanges declares that changes to certain properties should be ignored when diffing."""
    import_: Annotated[str | None, Field(alias="import")] = None
    """Import adopts an existing resource from your cloud account under the control of Pulumi."""
    parent: JSONValue | None = None
    """Parent specifies a parent for the resource."""
    protect: bool | None = None
    """Protect prevents accidental deletion of a resource."""
    provider: JSONValue | None = None
    """Provider sets a provider for the resource."""
    providers: dict[str, JSONValue] | None = None
    """Providers sets a map of providers for the resource and its children."""
    version: str | None = None
    """Version specifies a provider plugin version that should be used when operating on a resource."""


class Getter(KubeModel):
    """Reads an existing resource instead of creating one."""

    id: Annotated[str, Field(min_length=1)]
    """The ID of the resource to import."""
    state: dict[str, JSONValue] | None = None
    """State contains the known properties (input and output) of the resource."""


class Resource(KubeModel):
    """A Pulumi resource declared by the program."""

    type: Annotated[str, Field(min_length=1)]
    """Type is the Pulumi type token for this resource."""
    properties: dict[str, JSONValue] | None = None
    """Properties contains the primary resource-specific keys and values to initialize the resource state."""
    options: Options | None = None
    """Options contains all resource options supported by Pulumi."""
    get: Getter | None = None
    """A getter function for the resource. Supplying get is mutually exclusive to properties."""


class ProgramSpec(KubeModel):
    """The Pulumi YAML program."""

    configuration: dict[str, Configuration] | None = None
    """Configuration specifies the Pulumi config inputs to the deployment."""
    resources: dict[str, Resource] | None = None
    """Resources declares the Pulumi resources that will be deployed and managed by the program."""
    variables: dict[str, JSONValue] | None = None
    """Variables specifies intermediate values of the program: expressions that can be re-used."""
    outputs: dict[str, JSONValue] | None = None
    """Outputs specifies the Pulumi stack outputs of the program and how they are computed."""
    packages: dict[str, str] | None = None
    """Packages specifies external packages to be installed before running the program (name to
    specification)."""


class Artifact(KubeModel):
    """A fetchable tarball of the program, in the shape of a Flux source artifact."""

    path: str
    """Path is the relative file path of the artifact in the controller's storage."""
    url: str
    """URL is the HTTP address of the artifact as exposed by the controller."""
    revision: str
    """Revision is a human-readable identifier of the artifact's content (the Program's generation)."""
    digest: Annotated[str, Field(pattern=ARTIFACT_DIGEST_PATTERN)] | None = None
    """Digest is the digest of the file in the form of '<algorithm>:<checksum>'."""
    last_update_time: Time
    """LastUpdateTime is the timestamp corresponding to the last update of the artifact."""
    size: NonNegativeInt64 | None = None
    """Size is the number of bytes in the file."""
    metadata: dict[str, str] | None = None
    """Metadata holds upstream information such as OCI annotations."""


class ProgramStatus(KubeModel):
    """The observed state of a Program."""

    observed_generation: NonNegativeInt64 | None = None
    """ObservedGeneration is the last observed generation of the Program object."""
    artifact: Artifact | None = None
    """Artifact represents the last successful artifact generated by program reconciliation."""
    conditions: Annotated[Conditions, Extension("issue9: an invalid Program gets a condition")] | None = None
    """(pko extension) The observations of the Program's state: Ready, and Stalled with reason
    ProgramInvalid when the program cannot be served."""


class Program(KubeModel):
    """A Program (pulumi.com/v1)."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    program: ProgramSpec = Field(default_factory=ProgramSpec)
    status: ProgramStatus | None = None


__all__ = [
    "API_VERSION",
    "ARTIFACT_DIGEST_PATTERN",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Artifact",
    "ConfigType",
    "Configuration",
    "CustomTimeouts",
    "Getter",
    "Options",
    "Program",
    "ProgramSpec",
    "ProgramStatus",
    "Resource",
]

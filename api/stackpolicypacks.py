"""(pko extension) Policy packs: ``spec.policyPacks`` of a ``pulumi.com/v1`` Stack (and of the Updates
it makes), and the violations an Update records.

A pack is a Pulumi policy pack project (``PulumiPolicy.yaml``: JavaScript/TypeScript with
``@pulumi/policy``, Python with ``pulumi-policy``) in a directory of the workspace: in the workspace
image, or in the program's own source (a path relative to the program's directory), which comes
with the Stack's git source and its auth; in a git repository of its own (``git``: a platform
team's one repository of packs), which the workspace pod fetches beside the program, its credentials
keys of Secrets (as a Workspace's ``git.auth``: the Stack CRD has no room for a second ``gitAuth``);
or in a Flux source's artifact (``fluxSource``, as a Stack's own), fetched the same way at its digest.
The engine runs every pack on each preview and up before any resource changes (``pulumi preview/up
--policy-pack``). Re-exported by :mod:`pko.api.stack`.
"""

from __future__ import annotations

from typing import Annotated, Final

from pko.api.markers import Rule
from pko.api.meta import JSONValue, KubeModel
from pko.api.stacksources import FluxSource
from pko.api.workspace import GitAuth
from pydantic import Field, model_validator

__all__ = [
    "ENFORCEMENT_LEVELS",
    "MAX_PACKS",
    "MAX_POLICY_PACKS",
    "POLICY_PACK_NAME_PATTERN",
    "PolicyPack",
    "PolicyPackGit",
    "PolicyViolation",
]

POLICY_PACK_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A pack's name on the Stack: a DNS label (it names the pack in Events and messages)."""
MAX_POLICY_PACKS: Final = 16
"""Most packs one list holds (a Stack's, an Update's, a template's): a bound the apiserver needs to cost
the list's validation rules (a git source's auth) within its budget; each pack costs a runtime start
per operation, so a list near it is already slow."""
MAX_PACKS: Final = Field(max_length=MAX_POLICY_PACKS)
"""The bound as list metadata (``maxItems``)."""
ENFORCEMENT_LEVELS: Final = ("mandatory", "advisory", "remediate", "disabled")
"""A violation's enforcement level, as ``pulumi policy`` names them: a mandatory violation fails the
operation; advisory and remediate ones are reported; disabled policies do not run."""


@Rule("has(self.branch) != has(self.commit)", "exactly one of branch or commit is required")
class PolicyPackGit(KubeModel):
    """(pko extension) A git repository a policy pack comes from, as a Stack's git source names one
    (``projectRepo``, ``branch`` or ``commit``, credentials from Secrets)."""

    url: Annotated[str, Field(min_length=1, max_length=4096)]
    """URL of the repository, as a Stack's projectRepo."""
    branch: Annotated[str, Field(min_length=1)] | None = None
    """Branch to follow, as a Stack's branch: a new commit runs the Stack again."""
    commit: Annotated[str, Field(min_length=1)] | None = None
    """Commit to fetch (a SHA), instead of a branch."""
    auth: GitAuth | None = None
    """Auth is the repository's credentials: keys of Secrets in the Stack's namespace."""


@Rule("has(self.path) || has(self.git) || has(self.fluxSource)", "one of path, git or fluxSource is required")
@Rule(
    "!has(self.fluxSource) || !has(self.git) && !has(self.path)",
    "with fluxSource, neither git nor path: fluxSource.dir is the pack's directory",
)
@Rule(
    "!has(self.git) || !has(self.path) || !self.path.startsWith('/')",
    "with git, path is a directory inside the repository: relative, without '..'",
    field_path=".path",
)
class PolicyPack(KubeModel):
    """(pko extension) A Pulumi policy pack run on every preview and up of the Stack."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=POLICY_PACK_NAME_PATTERN)]
    """Name of the pack on this Stack (unique in the list): what messages and Events call it when it
    cannot be loaded; a violation names the pack as it declares itself."""
    path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """Path is the pack's directory (holding ``PulumiPolicy.yaml``): with ``git``, in that repository
    (default: its root); else absolute (in the workspace image) or relative to the program's
    directory. Its ``node_modules`` (JavaScript) or virtualenv (Python) must be there or in the
    image."""
    git: PolicyPackGit | None = None
    """Git is the pack's own repository, fetched by the workspace pod beside the program."""
    flux_source: FluxSource | None = None
    """FluxSource is a Flux source whose artifact holds the pack (dir: its directory)."""
    config: dict[str, JSONValue] | None = None
    """Config is the pack's configuration (``pulumi preview --policy-pack-config``): per policy, an
    enforcement level (``"mandatory"``, ``"advisory"``, ``"disabled"``) or an object of the policy's
    settings, e.g. ``{"no-public-services": "mandatory", "cost-centre": {"label": "team"}}``."""

    @model_validator(mode="after")
    def _located(self) -> PolicyPack:
        """One of path, git or fluxSource (the CEL rule's twin here: a pack nothing locates is no pack)."""
        if self.path is None and self.git is None and self.flux_source is None:
            raise ValueError("one of path, git or fluxSource is required")
        return self


class PolicyViolation(KubeModel):
    """(pko extension) One violation a policy pack reported during an Update."""

    policy_pack: str
    """PolicyPack is the pack's name as it declares itself (``new PolicyPack("name", ...)``)."""
    policy_pack_version: str | None = None
    """PolicyPackVersion is the pack's version (its package version)."""
    policy: str
    """Policy is the violated policy's name."""
    enforcement_level: str
    """EnforcementLevel is mandatory (the operation failed), advisory or remediate."""
    urn: str | None = None
    """URN of the resource; absent for a policy over the whole stack."""
    message: str
    """Message is the policy's description and its own message."""

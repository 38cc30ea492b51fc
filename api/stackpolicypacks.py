"""(pko extension) Policy packs: ``spec.policyPacks`` of a ``pulumi.com/v1`` Stack (and of the Updates
it makes), and the violations an Update records.

A pack is a Pulumi policy pack project (``PulumiPolicy.yaml``: JavaScript/TypeScript with
``@pulumi/policy``, Python with ``pulumi-policy``) in a directory of the workspace: in the workspace
image, or in the program's own source (a path relative to the program's directory), which comes
with the Stack's git source and its auth. The engine runs every pack on each preview and up before any
resource changes (``pulumi preview/up --policy-pack``). Re-exported by :mod:`pko.api.stack`.
"""

from __future__ import annotations

from typing import Annotated, Final

from pko.api.meta import JSONValue, KubeModel
from pydantic import Field

__all__ = ["ENFORCEMENT_LEVELS", "POLICY_PACK_NAME_PATTERN", "PolicyPack", "PolicyViolation"]

POLICY_PACK_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A pack's name on the Stack: a DNS label (it names the pack in Events and messages)."""
ENFORCEMENT_LEVELS: Final = ("mandatory", "advisory", "remediate", "disabled")
"""A violation's enforcement level, as ``pulumi policy`` names them: a mandatory violation fails the
operation; advisory and remediate ones are reported; disabled policies do not run."""


class PolicyPack(KubeModel):
    """(pko extension) A Pulumi policy pack run on every preview and up of the Stack."""

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=POLICY_PACK_NAME_PATTERN)]
    """Name of the pack on this Stack (unique in the list): what messages and Events call it when it
    cannot be loaded; a violation names the pack as it declares itself."""
    path: Annotated[str, Field(min_length=1, max_length=4096)]
    """Path is the pack's directory (the one holding ``PulumiPolicy.yaml``) in the workspace: absolute
    (a pack the workspace image ships), or relative to the program's directory (a pack in the
    program's own repository or Program source). Its dependencies must be installed there
    (``node_modules``, or a Python virtualenv the pack's project names), or in the image."""
    config: dict[str, JSONValue] | None = None
    """Config is the pack's configuration (``pulumi preview --policy-pack-config``): per policy, an
    enforcement level (``"mandatory"``, ``"advisory"``, ``"disabled"``) or an object of the policy's
    settings, e.g. ``{"no-public-services": "mandatory", "cost-centre": {"label": "team"}}``."""


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

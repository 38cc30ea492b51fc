"""(pko extension) ``spec.outputs`` of a ``pulumi.com/v1`` Stack: where workloads read its outputs.

The Go operator writes one immutable Secret per Update (``<update>-stack-outputs``, every value
JSON): a new name each run, so nothing can mount it (Go operator #649). ``spec.outputs`` names one
Secret or ConfigMap in the Stack's namespace that pko keeps holding the latest successful up's
outputs. Re-exported by :mod:`pko.api.stack`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pko.api.meta import KubeModel
from pydantic import Field

__all__ = ["DNS_SUBDOMAIN_PATTERN", "OutputsKind", "StackOutputs"]

DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Kubernetes object name (RFC 1123 subdomain; at most 253 characters)."""

OutputsKind = Literal["Secret", "ConfigMap"]


class StackOutputs(KubeModel):
    """(pko extension) One object, with a stable name, that holds the stack's outputs after each
    successful up: updated in place, owned by the Stack (deleted with it), labelled
    pulumi.com/stack-name. An object of that name the Stack does not own is never overwritten."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
    """Name of the Secret or ConfigMap in the Stack's namespace."""
    kind: OutputsKind = "Secret"
    """Kind: Secret (default: every output) or ConfigMap (secret outputs are left out, and listed
    in its pulumi.com/secret-outputs-omitted annotation). A string output is its value as is,
    any other its JSON."""

"""The ``pulumi.com/v1`` Stack's vocabulary beside its models: the annotations a user sets to ask
something of the operator, the condition types and the reasons a person acts on, and the rule that
says what an approved plan does to each resource.

Plain values and one pure function, no pydantic: the controllers, the ``kubectl pko`` plugin (which
must start fast and bundles only what it imports) and the generated reference (docs/reference) all
read them from here, so each is spelled once. :mod:`pko.api.stack` re-exports them with the models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

__all__ = [
    "APPROVED_PLAN_ANNOTATION",
    "AWAITING_APPROVAL",
    "CANCEL_REQUEST_ANNOTATION",
    "CONDITION_INSECURE_TRANSPORT",
    "CONDITION_READY",
    "CONDITION_RECONCILING",
    "CONDITION_STALLED",
    "CONDITION_SUSPENDED",
    "ENFORCED_POLICY_PACKS_ANNOTATION",
    "INSECURE_TRANSPORT_ALLOWED",
    "INSECURE_TRANSPORT_REFUSED",
    "OUTPUTS_NOT_OWNED",
    "OUTPUTS_NOT_WRITTEN",
    "OUTPUTS_WRITE_FAILED",
    "PLAN_OPS",
    "POLICY_PACK_FAILED",
    "POLICY_PACK_OVERRIDDEN",
    "POLICY_VIOLATION",
    "RECONCILE_REQUEST_ANNOTATION",
    "REFRESH_REQUEST_ANNOTATION",
    "SECRET_OUTPUTS_OMITTED_ANNOTATION",
    "SHARD_LABEL",
    "resource_ops",
]

RECONCILE_REQUEST_ANNOTATION: Final = "pulumi.com/reconciliation-request"
"""Any new token starts an Update at once and resets the failure count and the backoff, also of a
Stalled Stack; ``status.observedReconcileRequest`` holds it."""
APPROVED_PLAN_ANNOTATION: Final = "pulumi.com/approved-plan"
"""Set to ``status.plan.digest`` to let the operator apply that plan (``spec.approval``)."""
REFRESH_REQUEST_ANNOTATION: Final = "pulumi.com/refresh-request"
"""Any new token runs one ``refresh``, retried after a transient failure;
``status.observedRefreshRequest`` holds it once it succeeded or failed for good."""
CANCEL_REQUEST_ANNOTATION: Final = "pulumi.com/cancel-request"
"""Any new token cancels the Stack's running Update; ``status.observedCancelRequest`` holds it."""

SHARD_LABEL: Final = "pko.pulumi.com/shard"
"""(extension) The shard a Stack belongs to when several operators split a cluster (Flux's
``sharding.fluxcd.io/key``): each operator's ``--watch-label-selector`` names its value(s), the default
one ``!pko.pulumi.com/shard``; the Stack's Workspace and Updates carry it too. A pko name (``pko.`` under
Pulumi's domain) so it never collides with a label the Go operator may add (docs/sharding.md)."""

CONDITION_READY: Final = "Ready"
CONDITION_STALLED: Final = "Stalled"
CONDITION_RECONCILING: Final = "Reconciling"
CONDITION_SUSPENDED: Final = "Suspended"
CONDITION_INSECURE_TRANSPORT: Final = "InsecureTransport"
"""(extension) True while ``spec.projectRepo`` is ``http://`` and the Stack names credentials for it
(a warning beside Ready/Stalled, as ``EphemeralBackend``); its reason is one of the two below."""

INSECURE_TRANSPORT_ALLOWED: Final = "CredentialsOverPlainHTTP"
"""The Stack runs and its git credentials go over plain HTTP: the operator allows it
(``--allow-insecure-git-credentials``)."""
INSECURE_TRANSPORT_REFUSED: Final = "CredentialsOverPlainHTTPRefused"
"""The Stack is Stalled instead (also the Stalled reason): nothing is sent until the URL is
``https://`` or SSH, or the operator allows it."""

POLICY_VIOLATION: Final = "PolicyViolation"
"""(extension) A mandatory policy of a pack in ``spec.policyPacks`` was violated: the Update's Failed
reason, the Stack's ``lastFailure.reason`` and Stalled reason (no retry mends it: the program, a pack
or the spec must change) and the Warning Event's, one per violated policy; nothing it covers was
changed. The message names the pack, the policy, the resource's URN and the policy's message."""
POLICY_PACK_FAILED: Final = "PolicyPackFailed"
"""(extension) A pack in ``spec.policyPacks`` could not be loaded or run (missing dependencies, a
syntax error, a bad config): the Update's Failed reason and the Stack's ``lastFailure.reason``, retried
as a deterministic failure; the message names the pack in its runtime's own words."""
ENFORCED_POLICY_PACKS_ANNOTATION: Final = "pulumi.com/enforced-policy-packs"
"""(extension) On an Update: which of its ``spec.policyPacks`` a WorkspaceTemplate enforces, as JSON
``{"<pack name>": "<template namespace/name>"}`` (absent: none; the others are the Stack's own)."""
POLICY_PACK_OVERRIDDEN: Final = "PolicyPackOverridden"
"""(extension) A Warning Event when an Update starts: a pack of the Stack's ``spec.policyPacks`` has
the name of one a WorkspaceTemplate enforces, and the template's runs instead (a Stack cannot weaken
an enforced pack)."""

AWAITING_APPROVAL: Final = "AwaitingApproval"
"""The Ready condition's reason while a plan waits for a person to approve it (``spec.approval``)."""

OUTPUTS_NOT_WRITTEN: Final = "OutputsNotWritten"
"""(extension) A condition, True while the object ``spec.outputs`` names does not hold the last
successful up's outputs (a warning beside Ready: the stack itself is up to date); its reason is one
of the two below, also the Warning Event's. Written again every two minutes until it does."""
OUTPUTS_NOT_OWNED: Final = "OutputsObjectNotOwned"
"""An object of that name and kind exists and this Stack does not own it: it is never overwritten."""
OUTPUTS_WRITE_FAILED: Final = "OutputsWriteFailed"
"""The apiserver refused the write (the message says why: RBAC, size, an immutable Secret)."""
SECRET_OUTPUTS_OMITTED_ANNOTATION: Final = "pulumi.com/secret-outputs-omitted"
"""On a ``spec.outputs`` ConfigMap: the (sanitised) keys of the secret outputs left out of it, as a
JSON list; a ConfigMap never holds a secret output."""

PLAN_OPS: Final = ("create", "update", "delete", "replace")
"""What a plan does to one of the user's resources (:func:`resource_ops`), in the order
``status.plan.summary`` counts them."""

_REPLACE_STEPS: Final = frozenset({"replace", "create-replacement", "delete-replaced"})
_CREATE_STEPS: Final = frozenset({"create", "import"})
_DELETE_STEPS: Final = frozenset({"delete", "discard"})


def _bookkeeping(type_: str) -> bool:
    """The stack's root resource and provider instances: the engine's, not the user's."""
    return type_ == "pulumi:pulumi:Stack" or type_.startswith("pulumi:providers:")


def resource_ops(changes: Iterable[Mapping[str, object]]) -> dict[str, str]:
    """What the plan does to each of the user's resources (``create``, ``update``, ``delete`` or
    ``replace``), each counted once (a replacement is one ``replace`` however many steps the engine
    reports for it); the stack's root resource, providers and steps that change nothing are left
    out (the digest still covers them). ``changes``: an Update's ``status.changes``. The one rule
    for the summary the operator records and the lines ``kubectl pko approve`` shows."""
    steps: dict[str, set[str]] = {}
    for change in changes:
        if _bookkeeping(str(change.get("type") or "")):
            continue
        steps.setdefault(str(change.get("urn") or ""), set()).add(str(change.get("op") or ""))
    ops: dict[str, str] = {}
    for urn, kinds in steps.items():
        if kinds & _REPLACE_STEPS:
            ops[urn] = "replace"
        elif kinds & _CREATE_STEPS:
            ops[urn] = "create"
        elif kinds & _DELETE_STEPS:
            ops[urn] = "delete"
        elif "update" in kinds:
            ops[urn] = "update"
    return ops

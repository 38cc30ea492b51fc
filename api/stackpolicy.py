"""(pko extensions) The parts of a ``pulumi.com/v1`` Stack's spec that say how the operator runs its
updates: the retry backoff, the approval of plans, drift detection.

Re-exported by :mod:`pko.api.stack`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pko.api.markers import Format
from pko.api.meta import (
    KubeModel,
)
from pydantic import Field

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

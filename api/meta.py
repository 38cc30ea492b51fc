"""Building blocks shared by every API model: the base model, object metadata, conditions, times.

Wire format: camelCase keys (``alias_generator=to_camel``), Python code uses snake_case
(``populate_by_name``). Unknown keys are ignored on input: the apiserver already prunes what the
CRD schema does not list, so an unknown key can only come from a newer schema and must not stop a
reconciler. ``KubeModel.wire()`` is the one way to turn a model back into an API payload.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pko.api.markers import Format, ListMap, PreserveUnknown
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel


class KubeModel(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready payload: camelCase keys, unset optionals (None) left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- scalars ---------------------------------------------------------------------------------

Int64 = Annotated[int, Format("int64")]
Int32 = Annotated[int, Format("int32")]
NonNegativeInt64 = Annotated[int, Format("int64"), Field(ge=0)]
NonNegativeInt32 = Annotated[int, Format("int32"), Field(ge=0, le=2**31 - 1)]

JSONValue = Annotated[Any, PreserveUnknown()]
"""Any JSON value (Go ``apiextensionsv1.JSON``): strings, numbers, objects, lists, booleans."""


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as ``metav1.Time`` serialises."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Time = Annotated[
    datetime, Format("date-time"), PlainSerializer(format_time, return_type=str, when_used="json")
]
"""A ``metav1.Time``: timezone-aware datetime in Python, ``2024-10-17T20:41:49Z`` on the wire."""


def now() -> datetime:
    """The current time, truncated to whole seconds (what the apiserver would store)."""
    return datetime.now(UTC).replace(microsecond=0)


# Go's time.ParseDuration grammar without a sign: negative durations are never meaningful here.
GO_DURATION_PATTERN = r"^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$"
_GO_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_GO_DURATION_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

GoDuration = Annotated[str, Field(pattern=GO_DURATION_PATTERN)]
"""A ``metav1.Duration`` such as ``1h30m``; kept as the user wrote it, parse with ``parse_go_duration``."""


def parse_go_duration(text: str) -> timedelta:
    """Parse a non-negative Go duration (``"90s"``, ``"1h30m"``, ``"0"``) into a timedelta.

    Raises ValueError for anything ``time.ParseDuration`` would reject, and for negative values.
    """
    body = text[1:] if text.startswith("+") else text
    if body == "0":
        return timedelta(0)
    if not body or not re.fullmatch(GO_DURATION_PATTERN, text):
        raise ValueError(f"invalid duration {text!r}")
    seconds = sum(float(num) * _GO_DURATION_UNITS[unit] for num, unit in _GO_DURATION_PART.findall(body))
    return timedelta(seconds=seconds)


# --- metadata --------------------------------------------------------------------------------


class OwnerReference(KubeModel):
    """A ``metav1.OwnerReference``."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(KubeModel):
    """The parts of ``metav1.ObjectMeta`` reconcilers read and write.

    Extra keys (``managedFields``, ...) are kept, so a read-modify-write does not drop them.
    """

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: Int64 | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    deletion_grace_period_seconds: Int64 | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None


class EmbeddedObjectMeta(KubeModel):
    """Labels and annotations only: the metadata a template may set on an object we create."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


# --- conditions ------------------------------------------------------------------------------

ConditionStatus = Literal["True", "False", "Unknown"]

_CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_MESSAGE_MAX = 32768


class Condition(KubeModel):
    """A ``metav1.Condition``, with the same constraints the Go CRDs declare."""

    type: Annotated[str, Field(max_length=316, pattern=_CONDITION_TYPE_PATTERN)]
    """Type of condition in CamelCase, e.g. ``Ready``."""
    status: ConditionStatus
    """Status of the condition: True, False or Unknown."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=_CONDITION_REASON_PATTERN)]
    """A programmatic identifier (CamelCase) for the condition's last transition."""
    message: Annotated[str, Field(max_length=CONDITION_MESSAGE_MAX)]
    """A human-readable message about the transition; may be empty."""
    last_transition_time: Time
    """When the condition last changed from one status to another."""
    observed_generation: NonNegativeInt64 | None = None
    """The ``.metadata.generation`` the condition was set from."""


Conditions = Annotated[list[Condition], ListMap("type")]


def find_condition(conditions: list[Condition] | None, type_: str) -> Condition | None:
    """The condition of ``type_``, or None."""
    return next((c for c in conditions or [] if c.type == type_), None)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    observed_generation: int | None = None,
    at: datetime | None = None,
) -> bool:
    """Set a condition in place, as ``apimeta.SetStatusCondition`` does; True if anything changed.

    ``lastTransitionTime`` moves only when the status changes; messages longer than the CRD allows
    are cut, so a long error never makes a status write fail.
    """
    if len(message) > CONDITION_MESSAGE_MAX:
        message = message[: CONDITION_MESSAGE_MAX - 3] + "..."
    existing = find_condition(conditions, type_)
    if existing is None:
        conditions.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=at or now(),
                observed_generation=observed_generation,
            )
        )
        return True
    changed = False
    if existing.status != status:
        existing.status = status
        existing.last_transition_time = at or now()
        changed = True
    for attr, value in (
        ("reason", reason),
        ("message", message),
        ("observed_generation", observed_generation),
    ):
        if getattr(existing, attr) != value:
            setattr(existing, attr, value)
            changed = True
    return changed


def remove_condition(conditions: list[Condition], type_: str) -> bool:
    """Remove the condition of ``type_`` in place; True if it was there."""
    before = len(conditions)
    conditions[:] = [c for c in conditions if c.type != type_]
    return len(conditions) != before


def is_condition_true(conditions: list[Condition] | None, type_: str) -> bool:
    """Whether the condition of ``type_`` exists with status True."""
    cond = find_condition(conditions, type_)
    return cond is not None and cond.status == "True"


__all__ = [
    "CONDITION_MESSAGE_MAX",
    "GO_DURATION_PATTERN",
    "Condition",
    "ConditionStatus",
    "Conditions",
    "EmbeddedObjectMeta",
    "GoDuration",
    "Int32",
    "Int64",
    "JSONValue",
    "KubeModel",
    "NonNegativeInt32",
    "NonNegativeInt64",
    "ObjectMeta",
    "OwnerReference",
    "Time",
    "find_condition",
    "format_time",
    "is_condition_true",
    "now",
    "parse_go_duration",
    "remove_condition",
    "set_condition",
]

"""Markers that carry CRD-schema facts on model fields, inside ``typing.Annotated``.

Pydantic ignores metadata objects it does not know, so these markers cost nothing at validation
time; ``pko.api.crdgen`` reads them when it turns a model into an OpenAPI v3 structural schema.
They hold only what a Python type cannot say on its own (integer width, list semantics, a
server-side default, a cross-field rule, "this is one of our extensions").

Every marker is a frozen dataclass, so markers compare by value and are hashable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeVar


@dataclass(frozen=True)
class Format:
    """OpenAPI ``format`` of a scalar, e.g. ``int64``, ``int32`` or ``date-time``."""

    name: str


@dataclass(frozen=True)
class ListMap:
    """A list merged by key under server-side apply (``x-kubernetes-list-type: map``).

    Invariant: every key is a required field of the item model (the apiserver refuses a CRD whose
    map key is neither required nor defaulted).
    """

    keys: tuple[str, ...]

    def __init__(self, *keys: str) -> None:
        object.__setattr__(self, "keys", keys)


@dataclass(frozen=True)
class ListAtomic:
    """A list replaced as a whole under server-side apply (``x-kubernetes-list-type: atomic``)."""


@dataclass(frozen=True)
class PreserveUnknown:
    """Arbitrary JSON, kept verbatim by the apiserver (``x-kubernetes-preserve-unknown-fields``)."""


@dataclass(frozen=True)
class CrdDefault:
    """A default the apiserver applies on write.

    Use only where the Go operator's CRD has the same default; otherwise default in the model.
    """

    value: Any


@dataclass(frozen=True)
class NotInTemplates:
    """A field the controller sets after any template is merged (a template's value is replaced): left
    out of template schemas (``ApplyConfigurationOf``), where it would only cost bytes of the Stack
    CRD (which client-side apply keeps under 256 KiB) and mislead a template's author."""


@dataclass(frozen=True)
class Extension:
    """A field that is ours, not the Go operator's; ``why`` names the issue or design note."""

    why: str


@dataclass(frozen=True)
class ApplyConfigurationOf:
    """The field holds a partial object of ``model`` (every field optional, no defaults).

    The Go operator embeds ``WorkspaceApplyConfiguration`` / ``UpdateApplyConfiguration`` in the
    Stack: a template merged over the object the controller builds. The value stays a plain dict
    so a reconciler can merge it; the schema is ``model``'s with ``required`` and ``default``
    removed from our own models (embedded Kubernetes types keep theirs, as in Go).
    """

    model: type[Any]


_RULES_ATTRIBUTE: Final = "__pko_crd_rules__"

T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule the apiserver evaluates on every write (``x-kubernetes-validations``).

    On a field, ``Annotated[X, Rule(...)]``, ``self`` is the field's value. On a model, as a class
    decorator ``@Rule(...)`` (the spelling of kubebuilder's ``+kubebuilder:validation:XValidation``
    above a Go type), ``self`` is an object of that model: at a CRD root, the whole object
    (``self.metadata.name``). A model's rules are its own: a subclass states its own (``rules_of``).

    ``message`` is what the apiserver reports, at the node's path or at ``field_path`` (a path
    relative to the node, e.g. ``.branch``). Rules are dropped inside templates
    (``ApplyConfigurationOf``): a template is partial, a rule about the whole object would misfire.

    Why here and not only in ``pko.api.validation``: the apiserver refuses the object on create and
    update, so ``kubectl apply`` fails with the message instead of the object being Stalled later.
    CEL rules need Kubernetes >= 1.25 (on by default there). Every rule keeps a Python twin in
    ``pko.api.validation`` (objects stored before a rule existed are still checked); the rule must
    never refuse what the twin accepts.
    """

    rule: str
    message: str
    field_path: str | None = None
    reason: str | None = None

    def render(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry."""
        entry = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            entry["fieldPath"] = self.field_path
        if self.reason is not None:
            entry["reason"] = self.reason
        return entry

    def __call__(self, model: T) -> T:
        """Class decorator: add this rule to ``model``'s own rules (in the order they are written)."""
        setattr(model, _RULES_ATTRIBUTE, (self, *rules_of(model)))
        return model


def rules_of(model: type) -> tuple[Rule, ...]:
    """The rules declared on ``model`` itself with ``@Rule(...)`` (not those of its bases)."""
    rules: tuple[Rule, ...] = vars(model).get(_RULES_ATTRIBUTE, ())
    return rules


__all__ = [
    "ApplyConfigurationOf",
    "CrdDefault",
    "Extension",
    "Format",
    "ListAtomic",
    "ListMap",
    "PreserveUnknown",
    "Rule",
    "rules_of",
]

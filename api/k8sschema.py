"""CRD-ready OpenAPI v3 schemas for the Kubernetes types our CRDs embed (pod template etc.).

Why: a CRD schema prunes every field it does not list, so `workspaceTemplate.spec.podTemplate`
must carry a complete, *current* PodTemplateSpec schema. The raw definitions are imported from a
current Kubernetes release by `hack/import_k8s_openapi.py` into
`api/schemas/k8s-openapi-v<release>.json` (exactly one such file); this module turns one
definition into a schema a CRD can embed.

`k8s_schema(name)` returns a fully inlined (no `$ref`) structural schema. The conversion:

* descriptions are dropped unless asked for: with them a pod template alone is ~340 KB (the Go
  operator's Stack CRD is 1.5 MB), above the 256 KiB annotation in which client-side
  `kubectl apply` keeps the whole CRD; without them it is ~67 KB;
* IntOrString and Quantity become `x-kubernetes-int-or-string: true` with no `type` (Quantity
  also gets its grammar as a `pattern`); the swagger 2 spelling `format: int-or-string` is
  converted the same way. No `anyOf: [integer, string]` (controller-gen's spelling): the
  apiserver implies it, and server-side apply merges int-or-string nodes either way;
* vendor extensions a CRD does not accept (`x-kubernetes-patch-strategy`,
  `x-kubernetes-patch-merge-key`, `x-kubernetes-group-version-kind`, `x-kubernetes-unions`) are
  dropped; `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`, `x-kubernetes-map-type` and CEL
  `x-kubernetes-validations` are kept, so server-side apply merges containers, env, ports,
  volumes... by key as it does for real pods;
* list-map keys: the apiserver refuses a CRD whose `x-kubernetes-list-map-keys` names a property
  that is neither required nor defaulted. Upstream marks such keys with a `+default` the swagger
  does not carry; we restore it (`LIST_MAP_KEY_DEFAULTS`: a port's `protocol` is "TCP", an
  imagePullSecret's `name` is "", as Kubernetes applies to pods), so keyed merging keeps working.
  Any other such key downgrades its list to atomic (replace-whole-list on apply) rather than
  inventing a default;
* embedded ObjectMeta (PodTemplateSpec.metadata, an ephemeral volume's claim template) becomes
  an object with only `EMBEDDED_METADATA_FIELDS` (controller-gen's embedded-metadata style):
  server-managed fields make no sense in a template, and an empty object would prune everything.
  (The Go operator's EmbeddedObjectMeta lists only labels and annotations; ours is a superset.);
* an `object` with neither properties nor additionalProperties gets
  `x-kubernetes-preserve-unknown-fields` (otherwise it would prune all its content).

Invariants (checked by `crd_schema_problems`, enforced by tests against a real kube-apiserver):
every node has a `type` or is int-or-string/preserve-unknown-fields; `properties` and
`additionalProperties` never together; no `$ref`, no `default` except the list-map ones, only
CRD-accepted extensions. The definitions have no recursion; inlining raises if one appears.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeAlias

if TYPE_CHECKING:
    from pydantic import GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import CoreSchema

__all__ = [
    "EMBEDDED_METADATA_FIELDS",
    "K8S_RELEASE",
    "K8S_SOURCE",
    "LIST_MAP_KEY_DEFAULTS",
    "Affinity",
    "Condition",
    "ConfigMapKeySelector",
    "Container",
    "EmbeddedObjectMeta",
    "EnvFromSource",
    "EnvVar",
    "K8sSchemaError",
    "K8sType",
    "LabelSelector",
    "LocalObjectReference",
    "ObjectReference",
    "PodSecurityContext",
    "PodSpec",
    "PodTemplateSpec",
    "ResourceRequirements",
    "SecretKeySelector",
    "SecurityContext",
    "ServiceSpec",
    "Toleration",
    "Volume",
    "VolumeMount",
    "crd_schema_problems",
    "inline_definition",
    "k8s_schema",
]

SCHEMA_DIR: Final = Path(__file__).resolve().parent / "schemas"
_FILE_GLOB: Final = "k8s-openapi-v*.json"
_REF_PREFIX: Final = "#/definitions/"

_CORE: Final = "io.k8s.api.core.v1."
_META: Final = "io.k8s.apimachinery.pkg.apis.meta.v1."
INT_OR_STRING: Final = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
OBJECT_META: Final = _META + "ObjectMeta"

EMBEDDED_METADATA_FIELDS: Final = ("annotations", "finalizers", "generateName", "labels", "name", "namespace")

# (item definition, list-map key) -> the default Kubernetes applies (upstream `+default` markers).
LIST_MAP_KEY_DEFAULTS: Final[Mapping[tuple[str, str], Any]] = {
    (_CORE + "ContainerPort", "protocol"): "TCP",
    (_CORE + "ServicePort", "protocol"): "TCP",
    (_CORE + "LocalObjectReference", "name"): "",  # imagePullSecrets
}

# Closed value sets of the Kubernetes API: the Go `+enum` types, which a current apiserver lists as
# `enum` in its OpenAPI v3 but the swagger v2 we import states only in prose ("One of Always, ...").
# Without them a CRD accepts e.g. `restartPolicy: Sometimes`, and the user learns of it only when the
# workspace StatefulSet is created. Only sets that are closed in every supported release are listed
# (no `Container.restartPolicy`, whose set grows with sidecar restart rules).
ENUMS: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    (_CORE + "PodSpec", "restartPolicy"): ("Always", "OnFailure", "Never"),
    (_CORE + "PodSpec", "dnsPolicy"): ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"),
    (_CORE + "PodSpec", "preemptionPolicy"): ("PreemptLowerPriority", "Never"),
    (_CORE + "Container", "imagePullPolicy"): ("Always", "Never", "IfNotPresent"),
    (_CORE + "Container", "terminationMessagePolicy"): ("File", "FallbackToLogsOnError"),
    (_CORE + "ContainerPort", "protocol"): ("TCP", "UDP", "SCTP"),
    (_CORE + "ServicePort", "protocol"): ("TCP", "UDP", "SCTP"),
    (_CORE + "ServiceSpec", "type"): ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"),
    (_CORE + "ServiceSpec", "sessionAffinity"): ("ClientIP", "None"),
    (_CORE + "ServiceSpec", "externalTrafficPolicy"): ("Cluster", "Local"),
    (_CORE + "ServiceSpec", "internalTrafficPolicy"): ("Cluster", "Local"),
    (_CORE + "ServiceSpec", "ipFamilyPolicy"): ("SingleStack", "PreferDualStack", "RequireDualStack"),
    (_CORE + "Toleration", "operator"): ("Exists", "Equal"),
    (_CORE + "Toleration", "effect"): ("NoSchedule", "PreferNoSchedule", "NoExecute"),
    (_CORE + "NodeSelectorRequirement", "operator"): ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"),
    (_META + "LabelSelectorRequirement", "operator"): ("In", "NotIn", "Exists", "DoesNotExist"),
    (_CORE + "SeccompProfile", "type"): ("Unconfined", "RuntimeDefault", "Localhost"),
    (_CORE + "HTTPGetAction", "scheme"): ("HTTP", "HTTPS"),
    (_CORE + "TopologySpreadConstraint", "whenUnsatisfiable"): ("DoNotSchedule", "ScheduleAnyway"),
    (_CORE + "VolumeMount", "mountPropagation"): ("None", "HostToContainer", "Bidirectional"),
    (_CORE + "PodSecurityContext", "fsGroupChangePolicy"): ("OnRootMismatch", "Always"),
}

# resource.Quantity's serialization grammar (<signedNumber><suffix>, with the decimal SI suffixes
# n, u, m, k, M, G, T, P, E, the binary ones Ki..Ei, or an e/E exponent).
QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

# Keywords copied unchanged from the swagger (all are valid in a CRD's OpenAPI v3 schema).
_COPIED: Final = frozenset(
    {
        "type",
        "format",
        "required",
        "enum",
        "pattern",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-validations",
    }
)
# Swagger keywords a CRD does not accept; they carry no validation we lose.
_DROPPED: Final = frozenset(
    {
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-group-version-kind",
        "x-kubernetes-unions",
    }
)
_CRD_EXTENSIONS: Final = frozenset(
    {
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-validations",
    }
)


class K8sSchemaError(ValueError):
    """A definition cannot be turned into a CRD schema (unknown name, keyword, or a cycle)."""


@functools.cache
def _document() -> dict[str, Any]:
    files = sorted(SCHEMA_DIR.glob(_FILE_GLOB))
    if len(files) != 1:
        raise K8sSchemaError(f"expected exactly one {_FILE_GLOB} in {SCHEMA_DIR}, found {len(files)}")
    document: dict[str, Any] = json.loads(files[0].read_text(encoding="utf-8"))
    return document


def _definitions() -> Mapping[str, Any]:
    definitions: Mapping[str, Any] = _document()["definitions"]
    return definitions


K8S_SOURCE: Final[Mapping[str, str]] = dict(_document()["source"])
K8S_RELEASE: Final[str] = K8S_SOURCE["kubernetesRelease"]


def _int_or_string() -> dict[str, Any]:
    return {"x-kubernetes-int-or-string": True}


class _Converter:
    """Inlines one definition; a fresh instance per call, so no dict is shared between nodes."""

    def __init__(self, definitions: Mapping[str, Any], *, descriptions: bool) -> None:
        self._definitions = definitions
        self._descriptions = descriptions

    def definition(self, name: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
        if name in stack:
            raise K8sSchemaError(f"recursive definition: {' -> '.join((*stack, name))}")
        raw = self._definitions.get(name)
        if raw is None:
            raise K8sSchemaError(f"unknown Kubernetes definition {name!r}")
        stack = (*stack, name)
        if name in (INT_OR_STRING, QUANTITY):
            schema = _int_or_string()
            if name == QUANTITY:
                schema["pattern"] = QUANTITY_PATTERN
            if self._descriptions and "description" in raw:
                schema["description"] = raw["description"]
            return schema
        if name == OBJECT_META:
            raw = {
                "description": raw.get("description", ""),
                "type": "object",
                "properties": {field: raw["properties"][field] for field in EMBEDDED_METADATA_FIELDS},
            }
        schema = self.node(raw, stack, name)
        for (owner, prop), values in ENUMS.items():
            if owner == name:
                target = schema.get("properties", {}).get(prop)
                if target is None or target.get("type") != "string":
                    raise K8sSchemaError(f"ENUMS names {name}.{prop}, which is not a string property")
                target["enum"] = list(values)
        return schema

    def node(self, raw: Mapping[str, Any], stack: tuple[str, ...], where: str) -> dict[str, Any]:
        if "$ref" in raw:
            extra = set(raw) - {"$ref", "description"}
            if extra:
                raise K8sSchemaError(f"{where}: $ref with siblings {sorted(extra)}")
            schema = self.definition(_ref_name(raw["$ref"], where), stack)
            if self._descriptions and "description" in raw:
                schema["description"] = raw["description"]
            return schema
        if raw.get("format") == "int-or-string":
            schema = _int_or_string()
            if self._descriptions and "description" in raw:
                schema["description"] = raw["description"]
            return schema

        schema = {}
        for key, value in raw.items():
            if key == "description":
                if self._descriptions:
                    schema[key] = value
            elif key == "properties":
                schema[key] = {prop: self.node(sub, stack, f"{where}.{prop}") for prop, sub in value.items()}
            elif key in ("items", "additionalProperties"):
                if not isinstance(value, Mapping):
                    raise K8sSchemaError(f"{where}: unsupported {key}={value!r}")
                schema[key] = self.node(value, stack, f"{where}[{key}]")
            elif key in _COPIED:
                schema[key] = copy.deepcopy(value)
            elif key not in _DROPPED:
                raise K8sSchemaError(f"{where}: unsupported keyword {key!r}")

        if schema.get("type") == "object" and not ({"properties", "additionalProperties"} & set(schema)):
            schema["x-kubernetes-preserve-unknown-fields"] = True
        if schema.get("x-kubernetes-list-type") == "map":
            item_ref = raw["items"].get("$ref")
            item_name = _ref_name(item_ref, where) if item_ref else ""
            _resolve_list_map_keys(schema, item_name)
        return schema


def _ref_name(ref: str, where: str) -> str:
    if not ref.startswith(_REF_PREFIX):
        raise K8sSchemaError(f"{where}: unsupported $ref {ref!r}")
    return ref[len(_REF_PREFIX) :]


def _resolve_list_map_keys(schema: dict[str, Any], item_name: str) -> None:
    """Make a list-map installable: every key required or defaulted, else atomic."""
    items = schema["items"]
    required = set(items.get("required", ()))
    keys: list[str] = schema["x-kubernetes-list-map-keys"]
    unknown = [key for key in keys if key not in items.get("properties", {})]
    if unknown:
        raise K8sSchemaError(f"list-map keys {unknown} are not properties of {item_name or 'its items'}")
    missing = [key for key in keys if key not in required and "default" not in items["properties"][key]]
    if all((item_name, key) in LIST_MAP_KEY_DEFAULTS for key in missing):
        for key in missing:
            items["properties"][key]["default"] = LIST_MAP_KEY_DEFAULTS[(item_name, key)]
    else:
        del schema["x-kubernetes-list-map-keys"]
        schema["x-kubernetes-list-type"] = "atomic"


def inline_definition(
    definitions: Mapping[str, Any], definition: str, *, descriptions: bool = False
) -> dict[str, Any]:
    """Convert `definition` from any swagger-2 `definitions` map (see the module docstring)."""
    return _Converter(definitions, descriptions=descriptions).definition(definition)


@functools.cache
def _cached_schema(definition: str, descriptions: bool) -> dict[str, Any]:
    return inline_definition(_definitions(), definition, descriptions=descriptions)


def k8s_schema(definition: str, *, descriptions: bool = False) -> dict[str, Any]:
    """The CRD-ready, fully inlined schema of a Kubernetes definition (e.g. io.k8s.api.core.v1.PodSpec).

    Computed once per (definition, descriptions); each call returns a fresh deep copy that the
    caller may modify. ObjectMeta always comes out in its embedded form.
    """
    return copy.deepcopy(_cached_schema(definition, descriptions))


@dataclass(frozen=True, slots=True)
class K8sType:
    """`typing.Annotated` marker: "this field is the Kubernetes type `definition`".

    The CRD generator looks for it in a field's metadata and embeds `k8s_schema(definition)`;
    pydantic's own JSON schema uses it too, through `__get_pydantic_json_schema__`.
    """

    definition: str

    def __post_init__(self) -> None:
        if self.definition not in _definitions():
            raise K8sSchemaError(f"unknown Kubernetes definition {self.definition!r}")

    def schema(self, *, descriptions: bool = False) -> dict[str, Any]:
        return k8s_schema(self.definition, descriptions=descriptions)

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return self.schema()


PodTemplateSpec: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "PodTemplateSpec")]
PodSpec: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "PodSpec")]
ServiceSpec: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "ServiceSpec")]
Container: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "Container")]
ResourceRequirements: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "ResourceRequirements")]
EnvVar: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "EnvVar")]
EnvFromSource: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "EnvFromSource")]
LocalObjectReference: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "LocalObjectReference")]
ObjectReference: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "ObjectReference")]
SecretKeySelector: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "SecretKeySelector")]
ConfigMapKeySelector: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "ConfigMapKeySelector")]
Volume: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "Volume")]
VolumeMount: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "VolumeMount")]
Toleration: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "Toleration")]
Affinity: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "Affinity")]
SecurityContext: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "SecurityContext")]
PodSecurityContext: TypeAlias = Annotated[dict[str, Any], K8sType(_CORE + "PodSecurityContext")]
LabelSelector: TypeAlias = Annotated[dict[str, Any], K8sType(_META + "LabelSelector")]
Condition: TypeAlias = Annotated[dict[str, Any], K8sType(_META + "Condition")]
# The Workspace's podTemplate/serviceTemplate `metadata` (embedded form, see module docstring).
EmbeddedObjectMeta: TypeAlias = Annotated[dict[str, Any], K8sType(OBJECT_META)]


def _walk(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    """Yield (path, node, is_field_or_item) for every schema node below and including `schema`."""
    yield path, schema, True
    for prop, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{prop}")
    if isinstance(schema.get("items"), Mapping):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")
    for keyword in ("anyOf", "allOf", "oneOf"):
        for index, sub in enumerate(schema.get(keyword, ())):
            for sub_path, node, _ in _walk(sub, f"{path}.{keyword}[{index}]"):
                yield sub_path, node, False


def crd_schema_problems(schema: Mapping[str, Any], path: str = "") -> list[str]:
    """What kube-apiserver would refuse in this CRD schema; empty when none.

    Covers the rules the conversion must keep: structural typing, properties xor
    additionalProperties, no $ref, only CRD extensions, list/map-type placement, list-map keys
    scalar and required-or-defaulted, set items scalar or atomic. Usable on whole CRD schemas.
    (CEL rules are compiled and costed by the apiserver only: the cluster tests install them.)
    """
    problems: list[str] = []
    for where, node, structural in _walk(schema, path):
        at = where or "<root>"
        if "$ref" in node:
            problems.append(f"{at}: $ref")
        for key in node:
            if key.startswith("x-") and key not in _CRD_EXTENSIONS:
                problems.append(f"{at}: extension {key} not accepted")
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        if (
            structural
            and "type" not in node
            and not int_or_string
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            problems.append(f"{at}: no type")
        if int_or_string and "type" in node:
            problems.append(f"{at}: int-or-string with a type")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{at}: both properties and additionalProperties")
        if "x-kubernetes-map-type" in node and node.get("type") != "object":
            problems.append(f"{at}: x-kubernetes-map-type on a non-object")
        list_type = node.get("x-kubernetes-list-type")
        if list_type is not None and node.get("type") != "array":
            problems.append(f"{at}: x-kubernetes-list-type on a non-array")
        if list_type not in (None, "atomic", "set", "map"):
            problems.append(f"{at}: x-kubernetes-list-type {list_type!r}")
        if ("x-kubernetes-list-map-keys" in node) != (list_type == "map"):
            problems.append(f"{at}: x-kubernetes-list-map-keys without list-type map or vice versa")
        items = node.get("items", {})
        if list_type == "map":
            item_props = items.get("properties", {})
            for key in node.get("x-kubernetes-list-map-keys", ()):
                prop = item_props.get(key)
                if prop is None:
                    problems.append(f"{at}: list-map key {key} is not an item property")
                elif prop.get("type") in ("object", "array"):
                    problems.append(f"{at}: list-map key {key} is not scalar")
                elif key not in items.get("required", ()) and "default" not in prop:
                    problems.append(f"{at}: list-map key {key} is neither required nor defaulted")
        if list_type == "set" and items.get("type") in ("object", "array"):
            if items.get("type") == "object" and items.get("x-kubernetes-map-type") != "atomic":
                problems.append(f"{at}: set of non-atomic objects")
            if items.get("type") == "array" and items.get("x-kubernetes-list-type", "atomic") != "atomic":
                problems.append(f"{at}: set of non-atomic lists")
    return problems

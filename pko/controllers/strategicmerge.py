"""A strategic merge of a user's template over an object the operator built (dicts, no I/O).

The Go operator merges ``spec.workspaceTemplate`` and ``spec.updateTemplate`` with
``strategicpatch.StrategicMergePatch``: maps merge key by key, ``null`` deletes a key, lists of
Kubernetes objects that carry a merge key (containers by ``name``, volume mounts by
``mountPath``...) merge item by item, every other list is replaced. That is what users' templates
rely on (add a volume mount to the ``pulumi`` container without restating it), so we do the same
for the lists that appear in a Workspace or an Update. ``$patch`` directives are not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pko.machinery.store import clone

__all__ = ["MERGE_KEYS", "strategic_merge"]

# List field name -> the key that identifies an item (the patchMergeKey of the Kubernetes types).
MERGE_KEYS: Final[Mapping[str, str]] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "hostAliases": "ip",
    "stacks": "name",
    "config": "key",
}


def _merge_list(key: str, base: list[Any], patch: list[Any]) -> list[Any]:
    merge_key = MERGE_KEYS.get(key)
    if merge_key is None or not all(isinstance(i, Mapping) and merge_key in i for i in [*base, *patch]):
        return [clone(item) for item in patch]
    result = list(base)  # each item copied once: merged below, or as it is after
    merged: set[int] = set()
    for item in patch:
        for i, existing in enumerate(result):
            if existing.get(merge_key) == item[merge_key]:
                result[i] = _merge_map(existing, item)
                merged.add(i)
                break
        else:
            merged.add(len(result))
            result.append(_merge_map({}, item))
    return [item if i in merged else clone(item) for i, item in enumerate(result)]


def _merge_map(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(base)  # each value copied once: merged below, or as it is after
    touched: set[str] = set()
    for key, value in patch.items():
        touched.add(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _merge_map(result[key], value)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, Mapping):
            result[key] = _merge_map({}, value)
        else:
            result[key] = clone(value)
    return {key: value if key in touched else clone(value) for key, value in result.items()}


def strategic_merge(base: Mapping[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """``patch`` merged over ``base`` (both left unchanged)."""
    return _merge_map(base, patch or {})

"""A strategic merge of a user's template over an object the operator built (dicts, no I/O).

The Go operator merges ``spec.workspaceTemplate`` and ``spec.updateTemplate`` with
``strategicpatch.StrategicMergePatch``: maps merge key by key, ``null`` deletes a key, lists of
Kubernetes objects that carry a merge key (containers by ``name``, volume mounts by
``mountPath``...) merge item by item, every other list is replaced. That is what users' templates
rely on (add a volume mount to the ``pulumi`` container without restating it), so we do the same
for the lists that appear in a Workspace or an Update. ``$patch`` directives are not supported.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

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
        return copy.deepcopy(patch)
    result = [copy.deepcopy(item) for item in base]
    for item in patch:
        for i, existing in enumerate(result):
            if existing.get(merge_key) == item[merge_key]:
                result[i] = _merge_map(existing, item)
                break
        else:
            result.append(_merge_map({}, item))
    return result


def _merge_map(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = _merge_map(result[key], value)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, Mapping):
            result[key] = _merge_map({}, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def strategic_merge(base: Mapping[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """``patch`` merged over ``base`` (both left unchanged)."""
    return _merge_map(base, patch or {})

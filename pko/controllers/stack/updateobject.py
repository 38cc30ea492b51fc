"""The Update a Stack creates for one operation (pure, no I/O).

As the Go operator's ``newUp``/``newDestroy``: named ``<stack>-<hex unix ms>``, labelled like the
Workspace, controlled by the Workspace and owned (non-controller, blocking deletion) by the Stack,
so the Update survives a Workspace reclaimed after success and a Stack watch still sees it. The
Stack's finalizer on the Update keeps it (and its outputs Secret) until the Stack has recorded its
result; it is part of the created object, so no second write is needed to add it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pko.api.stack import Stack
from pko.api.stackpolicypacks import PolicyPack
from pko.api.stackterms import ENFORCED_POLICY_PACKS_ANNOTATION
from pko.api.update import API_VERSION as UPDATE_API_VERSION
from pko.api.update import KIND as UPDATE_KIND
from pko.api.update import UpdateType
from pko.controllers.resources import STACK_FINALIZER
from pko.controllers.stack.kinds import UpdateKind, spec_kind
from pko.controllers.stack.policypacks import Enforced, merge_policy_packs
from pko.controllers.stack.workspaceobject import pack_commits, stack_labels, stack_owner_reference
from pko.controllers.strategicmerge import strategic_merge

__all__ = [
    "TTL_AFTER_COMPLETED",
    "Run",
    "build_update",
    "update_name",
    "update_type_for",
]

TTL_AFTER_COMPLETED: Final = "24h0m0s"
"""Go's ``metav1.Duration{24h}`` as it serialises."""

Obj = dict[str, Any]


def update_name(stack_name: str, now: datetime | None = None) -> str:
    """``<stack>-<lowercase hex of unix milliseconds>`` (Go: makeUpdateName)."""
    when = now or datetime.now(UTC)
    return f"{stack_name}-{int(when.timestamp() * 1000):x}"


def update_type_for(stack: Stack, *, deleting: bool) -> UpdateType:
    """destroy when finalizing, preview for a preview-only Stack, else up."""
    return spec_kind(preview=stack.spec.preview, deleting=deleting).type


@dataclass(frozen=True, slots=True)
class Run:
    """The Update to start once the Workspace is ready (see :func:`build_update`): one of the
    :mod:`~pko.controllers.stack.kinds`."""

    kind: UpdateKind
    message: str
    refresh: bool | None = None
    plan: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def type(self) -> UpdateType:
        return self.kind.type


def _workspace_controller_reference(workspace: Obj) -> Obj:
    meta = workspace.get("metadata") or {}
    if not meta.get("uid") or not meta.get("name"):
        raise ValueError("the Workspace needs metadata.name and metadata.uid (use the applied object)")
    return {
        "apiVersion": workspace.get("apiVersion", "auto.pulumi.com/v1alpha1"),
        "kind": workspace.get("kind", "Workspace"),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_update(
    stack: Stack,
    workspace: Obj,
    type_: UpdateType,
    message: str,
    *,
    now: datetime | None = None,
    run: Run | None = None,
    enforced: Sequence[Enforced] = (),
) -> Obj:
    """The Update to create for ``stack`` in ``workspace`` (both as read from or written to the API);
    ``run`` adds what its kind needs (a saved plan, the plan to apply, a read-only refresh).
    A preview or up runs the Stack's policy packs (its ``updateTemplate``'s, when that names some)
    after the ``enforced`` ones, set once the template is merged: it cannot remove an enforced one."""
    spec = stack.spec
    name = stack.metadata.name or ""
    update_spec: Obj = {
        "workspaceName": (workspace.get("metadata") or {}).get("name"),
        "stackName": spec.stack,
        "type": type_,
        "ttlAfterCompleted": TTL_AFTER_COMPLETED,
        "message": message,
    }
    if type_ == "destroy":
        update_spec["runProgram"] = spec.run_program
    else:
        if spec.targets:
            update_spec["target"] = list(spec.targets)
        update_spec["targetDependents"] = spec.target_dependents
        update_spec["refresh"] = spec.refresh
    update: Obj = {
        "apiVersion": UPDATE_API_VERSION,
        "kind": UPDATE_KIND,
        "metadata": {
            "name": update_name(name, now),
            "namespace": stack.metadata.namespace,
            "labels": stack_labels(name, stack.metadata.labels),
        },
        "spec": update_spec,
    }
    template = spec.update_template or {}
    if template:
        update = strategic_merge(update, {k: v for k, v in template.items() if k in ("metadata", "spec")})
    meta = update["metadata"]
    meta["name"] = update_name(name, now)
    meta["namespace"] = stack.metadata.namespace
    meta["ownerReferences"] = [
        _workspace_controller_reference(workspace),
        stack_owner_reference(stack, controller=False),
    ]
    meta["finalizers"] = [STACK_FINALIZER]
    if type_ in ("preview", "up"):
        templated = update["spec"].get("policyPacks")
        own = spec.policy_packs if templated is None else [PolicyPack.model_validate(p) for p in templated]
        merged = merge_policy_packs(enforced, own)
        if merged.packs:
            commits = pack_commits(workspace)
            update["spec"]["policyPacks"] = [_pinned(pack.wire(), commits) for pack in merged.packs]
        if merged.sources:
            annotations = meta.setdefault("annotations", {})
            annotations[ENFORCED_POLICY_PACKS_ANNOTATION] = json.dumps(dict(merged.sources), sort_keys=True)
    if run is not None:
        _shape(update, run)
    return update


def _pinned(pack: Obj, commits: Mapping[str, str]) -> Obj:
    """A pack from git as the Update records it: at the commit its Workspace fetched (a branch
    resolved), so the Update says which revision of the pack ran."""
    git, commit = pack.get("git"), commits.get(str(pack.get("name")))
    if git is not None and commit:
        pack["git"] = {**{k: v for k, v in git.items() if k != "branch"}, "commit": commit}
    return pack


def _shape(update: Obj, run: Run) -> None:
    spec, kind = update["spec"], run.kind
    if run.refresh is not None and kind.up_options:
        spec["refresh"] = run.refresh
    if kind.spec_flag:
        spec[kind.spec_flag] = True
    if kind.applies_plan:
        spec["plan"] = run.plan
    if kind.drops_up_options:
        spec.pop("refresh", None)
        spec.pop("targetDependents", None)
    if run.annotations:
        meta = update["metadata"]
        meta["annotations"] = {**(meta.get("annotations") or {}), **run.annotations}

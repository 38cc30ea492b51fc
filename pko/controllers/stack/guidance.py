"""What a person can do about a Stack the operator cannot help on its own: the messages that name
the commands (release a Stack by hand, request a retry), kept apart from the status rules that
use them (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pko.controllers.stack.workspaceobject import ProjectInfoRevision

Obj = dict[str, Any]

__all__ = [
    "StackRef",
    "destroy_from_project_message",
    "release_command",
    "stack_not_found_message",
    "stack_ref",
]


@dataclass(frozen=True, slots=True)
class StackRef:
    """The Stack's name and namespace, for the ``kubectl`` commands a message gives."""

    name: str
    namespace: str


def stack_ref(obj: Obj) -> StackRef:
    """The Stack ``obj`` names, for the commands a message gives."""
    meta = obj.get("metadata") or {}
    return StackRef(str(meta.get("name") or ""), str(meta.get("namespace") or ""))


def release_command(stack: StackRef | None) -> str:
    """The command that releases a Stack by hand (its finalizer removed)."""
    name, namespace = (stack.name, stack.namespace) if stack else ("<name>", "<namespace>")
    return (
        f"""kubectl patch stack {name} -n {namespace} --type=merge -p '{{"metadata":{{"finalizers":[]}}}}'"""
    )


def stack_not_found_message(status: Mapping[str, Any], stack: StackRef | None, update_type: str) -> str:
    """What a user can do about a stack missing from its backend (``lastFailure`` says where it
    was looked for), with what the Stack last knew it held."""
    failure = str((status.get("lastFailure") or {}).get("message") or "the stack is not in its backend")
    known = status.get("resourceCount")
    outputs = sorted((status.get("outputs") or {}).keys())
    held = [f"{known} resource(s)"] if known is not None else []
    if outputs:
        held.append("outputs " + ", ".join(outputs[:10]) + (", ..." if len(outputs) > 10 else ""))
    knew = f"The Stack last knew of {' and '.join(held)}. " if held else ""
    name, namespace = (stack.name, stack.namespace) if stack else ("<name>", "<namespace>")
    retry = (
        f"kubectl annotate stack {name} -n {namespace} --overwrite "
        'pulumi.com/reconciliation-request="$(date +%s)"'
    )
    if update_type != "destroy":
        return f"{failure}. {knew}Put the stack in the backend, then request a retry ({retry})."
    return (
        f"{failure}; nothing was destroyed. {knew}Put the stack's state back in the backend, then "
        f"request a retry ({retry}); or release the Stack, knowing its resources stay behind "
        f"({release_command(stack)})."
    )


def destroy_from_project_message(unavailable: str, project: ProjectInfoRevision) -> str:
    """The Stack's word when its source is gone and the destroy runs in a new workspace pod from
    the saved ``projectInfo``."""
    return (
        f"the source is unavailable ({unavailable}); the destroy runs in a new workspace pod from the "
        f"saved project info (project {project.name!r}, runtime {project.runtime!r}) and the state in "
        "the backend"
    )

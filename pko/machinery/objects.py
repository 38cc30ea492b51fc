"""Object metadata helpers: owner references and finalizers, as controller-runtime's ``controllerutil``.

Owner references are pure edits of a dict (the caller writes the object). Finalizers are written
here with a metadata-only merge patch that carries ``metadata.resourceVersion``: a merge patch
replaces the whole ``finalizers`` list, so without the precondition a concurrent writer's
finalizer could be dropped; with it, a stale object fails with 409 and the reconcile retries.
The patch is filed in ``managedFields`` under ``field_manager``, else the client's field manager
(``pulumi-kubernetes-operator`` by default, as the Go operator adds the Stack finalizer).
"""

from __future__ import annotations

from typing import Any

from pko.machinery.kubeclient import ApiException
from pko.machinery.resource import Obj, ResourceClient, api_error_status

__all__ = [
    "AlreadyOwnedError",
    "add_finalizer",
    "controller_of",
    "has_finalizer",
    "owner_reference",
    "remove_finalizer",
    "set_controller_reference",
    "set_owner_reference",
]


class AlreadyOwnedError(ValueError):
    """The object already has another controller; an object has at most one."""

    def __init__(self, obj: Obj, controller: Obj) -> None:
        meta = obj.get("metadata") or {}
        super().__init__(
            f"{obj.get('kind')} {meta.get('namespace', '')}/{meta.get('name')} is already controlled by "
            f"{controller.get('kind')} {controller.get('name')}"
        )
        self.controller = controller


def _meta(obj: Obj) -> dict[str, Any]:
    meta: dict[str, Any] = obj.setdefault("metadata", {})
    return meta


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def _same_owner(a: Obj, b: Obj) -> bool:
    """One owner, whatever the version it was referenced by (controller-runtime compares group/kind/name)."""
    return (
        _group(str(a.get("apiVersion", ""))) == _group(str(b.get("apiVersion", "")))
        and a.get("kind") == b.get("kind")
        and a.get("name") == b.get("name")
    )


def owner_reference(owner: Obj, *, controller: bool, block_owner_deletion: bool) -> Obj:
    """An ownerReference pointing at ``owner`` (which must have been read: it needs the uid)."""
    meta = owner.get("metadata") or {}
    if not meta.get("uid") or not meta.get("name"):
        raise ValueError("the owner needs metadata.name and metadata.uid (use an object read from the API)")
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": block_owner_deletion,
    }


def _check_scope(owner: Obj, obj: Obj) -> None:
    """Garbage collection ignores a namespaced owner in another namespace (or of a cluster-scoped object)."""
    owner_ns = (owner.get("metadata") or {}).get("namespace")
    if owner_ns and owner_ns != (obj.get("metadata") or {}).get("namespace"):
        raise ValueError(
            f"owner {owner.get('kind')} {owner_ns}/{owner['metadata'].get('name')} must be in the "
            "namespace of what it owns"
        )


def _upsert(obj: Obj, ref: Obj) -> None:
    refs: list[Obj] = list(_meta(obj).get("ownerReferences") or [])
    for i, existing in enumerate(refs):
        if _same_owner(existing, ref):
            refs[i] = ref
            break
    else:
        refs.append(ref)
    _meta(obj)["ownerReferences"] = refs


def set_controller_reference(owner: Obj, obj: Obj, *, block_owner_deletion: bool = True) -> None:
    """Make ``owner`` the controller of ``obj`` (in place): deleting the owner cascades to ``obj``,
    and owner-mapped watches route ``obj``'s events to it.

    Raises :class:`AlreadyOwnedError` if another object is ``obj``'s controller.
    """
    _check_scope(owner, obj)
    ref = owner_reference(owner, controller=True, block_owner_deletion=block_owner_deletion)
    current = controller_of(obj)
    if current is not None and not _same_owner(current, ref):
        raise AlreadyOwnedError(obj, current)
    _upsert(obj, ref)


def set_owner_reference(owner: Obj, obj: Obj, *, block_owner_deletion: bool = False) -> None:
    """Add (or refresh) a non-controller owner reference to ``owner`` on ``obj`` (in place)."""
    _check_scope(owner, obj)
    _upsert(obj, owner_reference(owner, controller=False, block_owner_deletion=block_owner_deletion))


def controller_of(obj: Obj) -> Obj | None:
    """The ownerReference with ``controller: true``, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def has_finalizer(obj: Obj, name: str) -> bool:
    return name in ((obj.get("metadata") or {}).get("finalizers") or [])


async def _write_finalizers(
    client: ResourceClient, obj: Obj, finalizers: list[str], field_manager: str | None
) -> Obj:
    meta = obj.get("metadata") or {}
    patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}
    return await client.patch(
        str(meta["name"]), patch, namespace=meta.get("namespace"), field_manager=field_manager
    )


async def add_finalizer(
    client: ResourceClient, obj: Obj, name: str, *, field_manager: str | None = None
) -> Obj:
    """Add finalizer ``name`` unless present; returns the object as written (or ``obj`` unchanged).

    409 if ``obj`` is stale: let the reconcile retry from the cache.
    """
    if has_finalizer(obj, name):
        return obj
    current = list((obj.get("metadata") or {}).get("finalizers") or [])
    return await _write_finalizers(client, obj, [*current, name], field_manager)


async def remove_finalizer(
    client: ResourceClient, obj: Obj, name: str, *, field_manager: str | None = None
) -> Obj:
    """Remove finalizer ``name`` if present; returns the object as written (or ``obj`` unchanged).

    An object already gone (404) is fine: the finalizer went with it. 409 if ``obj`` is stale.
    """
    if not has_finalizer(obj, name):
        return obj
    remaining = [f for f in obj["metadata"]["finalizers"] if f != name]
    try:
        return await _write_finalizers(client, obj, remaining, field_manager)
    except ApiException as exc:
        if api_error_status(exc) == 404:
            return obj
        raise

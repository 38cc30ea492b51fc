"""Objects the pure (no cluster) controller tests start from, built in one place.

* :func:`workspace`: a Workspace ``my-stack`` in ``ns1``;
* :func:`make_update`: an Update ``s-18f`` in ``ns`` (uid :data:`UPDATE_UID`), owned by its Stack or not;
* :func:`succeeded`: the agent's answer for an ``up`` that succeeded.

A module that needs other defaults binds them once (``functools.partial``) rather than copying.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pko.api.generated.pko.agent import v1 as pb

Obj = dict[str, Any]

UPDATE_UID = "0b6c1f4e-1111-2222-3333-444455556666"


def workspace(spec: Obj, *, generation: int = 1, status: Obj | None = None) -> Obj:
    """A Workspace ``my-stack`` in ``ns1`` (uid ``uid-1``) with ``spec``; a ``status`` only if given."""
    ws: Obj = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "my-stack", "namespace": "ns1", "uid": "uid-1", "generation": generation},
        "spec": spec,
    }
    if status is not None:
        ws["status"] = status
    return ws


def make_update(*, generation: int = 3, owned: bool = False, **spec: Any) -> Obj:
    """An ``up`` of stack ``dev`` in Workspace ``s``, with ``spec`` on top; ``owned``: controlled by
    the Stack ``s``."""
    meta: Obj = {
        "name": "s-18f",
        "namespace": "ns",
        "uid": UPDATE_UID,
        "generation": generation,
        "resourceVersion": "42",
    }
    if owned:
        meta["ownerReferences"] = [
            {"apiVersion": "pulumi.com/v1", "kind": "Stack", "name": "s", "uid": "u", "controller": True}
        ]
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update",
        "metadata": meta,
        "spec": {"workspaceName": "s", "stackName": "dev", "type": "up", **spec},
    }


def succeeded(operation_id: str = "x", **kw: Any) -> pb.OperationResult:
    """A succeeded ``up`` (project ``proj``, runtime ``yaml``), with ``kw`` on top."""
    return pb.OperationResult(
        operation_id=operation_id,
        type=pb.OperationType.UP,
        state=pb.OperationState.SUCCEEDED,
        summary=pb.UpdateSummary(
            start_time=datetime(2025, 1, 2, 3, 0, 0, tzinfo=UTC),
            end_time=datetime(2025, 1, 2, 3, 1, 0, tzinfo=UTC),
            result="succeeded",
            message="deploy it",
        ),
        permalink="file:///x",
        project_info=pb.ProjectInfo(name="proj", runtime="yaml"),
        **kw,
    )

"""Objects the pure (no cluster) controller tests start from, built in one place.

* :func:`workspace`: a Workspace ``my-stack`` in ``ns1``;
* :func:`make_update`: an Update ``s-18f`` in ``ns`` (uid :data:`UPDATE_UID`), owned by its Stack or not;
* :func:`succeeded`: the agent's answer for an ``up`` that succeeded;
* :func:`seed_workspace`: the Workspace of the customized seed Stack (test/data/seeds), and
  :func:`build` / :func:`pod_spec`: the StatefulSet (its pod spec) the workloads make of a Workspace
  with :data:`OPTIONS`; :func:`by_name` and :func:`env_of` read containers, volumes and env there.

A module that needs other defaults binds them once (``functools.partial``) rather than copying.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pko.api.generated.pko.agent import v1 as pb

from pko.controllers.options import ControllerOptions
from pko.controllers.workspace.workloads import desired_statefulset, parse_spec

Obj = dict[str, Any]

UPDATE_UID = "0b6c1f4e-1111-2222-3333-444455556666"
SEED = Path(__file__).parents[1] / "data" / "seeds" / "000-my-stack-customized.yaml"
OPTIONS = ControllerOptions(agent_image="example/agent:v1", agent_image_pull_policy="Always")
RESTRICTED_CAPS = {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}


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


def seed_workspace() -> Obj:
    """The Workspace the customized seed Stack's ``workspaceTemplate`` makes (a fresh copy each call)."""
    stack = yaml.safe_load(SEED.read_text())
    return workspace(copy.deepcopy(stack["spec"]["workspaceTemplate"]["spec"]))


def build(ws: Obj, options: ControllerOptions = OPTIONS) -> Obj:
    """The StatefulSet the workloads make of ``ws``."""
    return desired_statefulset(ws, parse_spec(ws), options)


def pod_spec(ws: Obj, options: ControllerOptions = OPTIONS) -> Obj:
    spec: Obj = build(ws, options)["spec"]["template"]["spec"]
    return spec


def by_name(items: list[Obj], name: str) -> Obj:
    """The one item of ``items`` (containers, volumes) called ``name``."""
    (item,) = [i for i in items if i["name"] == name]
    return item


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}

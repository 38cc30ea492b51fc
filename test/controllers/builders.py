"""Objects the pure (no cluster) controller tests start from, built in one place.

* :func:`workspace`: a Workspace ``my-stack`` in ``ns1``;
* :func:`make_update`: an Update ``s-18f`` in ``ns`` (uid :data:`UPDATE_UID`), owned by its Stack or not;
* :func:`succeeded`: the agent's answer for an ``up`` that succeeded;
* :func:`seed_workspace`: the Workspace of the customized seed Stack (test/data/seeds), and
  :func:`build` / :func:`pod_spec`: the StatefulSet (its pod spec) the workloads make of a Workspace
  with :data:`OPTIONS`; :func:`by_name` and :func:`env_of` read containers, volumes and env there;
* for the pure Stack status tests (test_stack_status, test_stack_retry, test_stack_sync): the time
  :data:`T0`, the operator's default :data:`SETTINGS`, a Stack's :func:`spec` and object
  (:func:`stack_obj`), a finished Update (:func:`update`) and the Update being run (:func:`current`),
  a status after failures (:func:`failed_status`), and its conditions by type (:func:`types`).

A module that needs other defaults binds them once (``functools.partial``) rather than copying.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pko.api.generated.pko.agent import v1 as pb
from pko.api.stack import StackSpec

from pko.controllers.options import ControllerOptions
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.status import record_failed
from pko.controllers.workspace.workloads import desired_statefulset, parse_spec
from pko.machinery.conditions import format_time

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


# --- a Stack's status as the status rules record it (pure) ------------------------------------------

T0 = datetime(2024, 10, 17, 20, 0, 0, tzinfo=UTC)
SETTINGS = RetrySettings()


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", "programRef": {"name": "p"}, **fields})


def stack_obj(generation: int = 1, request: str | None = None, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "s", "namespace": "ns", "generation": generation}
    if request is not None:
        meta["annotations"] = {"pulumi.com/reconciliation-request": request}
    if deleting:
        meta["deletionTimestamp"] = format_time(T0)
    return {"metadata": meta}


def update(
    name: str, type_: str = "up", failed: str | None = None, message: str = "", **status: Any
) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True", "reason": "Updated"}]
    if failed is not None:
        conditions.append({"type": "Failed", "status": "True", "reason": failed})
    return {
        "metadata": {"name": name},
        "spec": {"type": type_},
        "status": {"message": message, "conditions": conditions, **status},
    }


def current(name: str, generation: int = 1, commit: str = "r1", request: str = "") -> dict[str, Any]:
    return {"name": name, "generation": generation, "commit": commit, "reconcileRequest": request}


def types(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def failed_status(times: int, reason: str = "ProgramError", type_: str = "up") -> dict[str, Any]:
    status: dict[str, Any] = {}
    for i in range(times):
        record_failed(status, current(f"s-{i}"), update(f"s-{i}", type_=type_, failed=reason), T0)
    return status

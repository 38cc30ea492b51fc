"""The Stack reconcile's decisions as pure functions (no cluster): ``decide`` (with the source read
it asks for) and ``refused``, branch by branch (the black-box tests in test_stack_reconciler*.py
drive the same paths through a real apiserver)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from pko.api.stack import Stack
from pko.api.validation import parse_stack

from pko.controllers.resources import STACK_FINALIZER
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.plan import (
    SOURCE_UNAVAILABLE_REQUEUE,
    AddFinalizer,
    ApplyWorkspace,
    CreateUpdate,
    Emit,
    Failure,
    Log,
    Observed,
    Plan,
    PruneHistory,
    ReadSource,
    RequestReconcile,
    Resolved,
    Settings,
    Unresolved,
    WriteStatus,
    decide,
    refused,
)
from pko.controllers.stack.reconciler import OWNED_STATUS
from pko.controllers.stack.waits import Awaited
from pko.controllers.stack.workspaceobject import ArtifactRevision
from pko.machinery.controller import Result

Obj = dict[str, Any]
NOW = datetime(2026, 11, 27, 5, 0, 0, tzinfo=UTC)
SETTINGS = Settings(RetrySettings(), lambda profile: f"pulumi/pulumi:{profile or 'restricted'}", OWNED_STATUS)
SOURCE = Resolved(ArtifactRevision("http://a/p/1", "sha256:1", "1"), "sha256:1")
DONE_UP = {"generation": 1, "reconcileRequest": "", "name": "s-1", "type": "up", "state": "succeeded",
           "lastAttemptedCommit": "sha256:1", "lastSuccessfulCommit": "sha256:1",
           "lastResyncTime": "2026-11-27T04:00:00Z", "failures": 0}  # fmt: skip


def stack(spec: Obj | None = None, status: Obj | None = None, *, deleting: bool = False, **meta: Any) -> Obj:
    metadata: Obj = {"name": "s", "namespace": "ns", "uid": "uid-s", "generation": 1,
                     "finalizers": [STACK_FINALIZER], **meta}  # fmt: skip
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-27T04:59:00Z"
    obj: Obj = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": metadata,
        "spec": {"stack": "dev", "programRef": {"name": "p"}, **(spec or {})},
    }
    if status is not None:
        obj["status"] = status
    return obj


def workspace(*, ready: bool = True, stalled: bool = False) -> Obj:
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "reason": "Succeeded"}]
    if stalled:
        conditions.append({"type": "Stalled", "status": "True", "reason": "SpecInvalid", "message": "bad"})
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "s", "namespace": "ns", "uid": "uid-ws", "generation": 2},
        "spec": {"stacks": [{"name": "dev", "create": True}]},
        "status": {"observedGeneration": 2, "conditions": conditions},
    }


def update(name: str = "s-2", *, type_: str = "up", failed: str | None = None, **status: Any) -> Obj:
    conditions = [{"type": "Complete", "status": "True", "reason": "Updated"}]
    conditions.append({"type": "Failed", "status": "True" if failed else "False", "reason": failed or "x"})
    return {
        "metadata": {"name": name, "namespace": "ns", "generation": 1},
        "spec": {"type": type_, "stackName": "dev"},
        "status": {"observedGeneration": 1, "conditions": conditions, **status},
    }


def parsed(obj: Obj) -> Stack:
    model, errors = parse_stack(obj)
    assert model is not None and not errors, errors
    return model


def observed(obj: Obj, **fields: Any) -> Observed:
    return Observed(obj, now=NOW, created=NOW, settings=SETTINGS, **fields)


def reads_source(obj: Obj, **fields: Any) -> bool:
    """Whether deciding ``obj`` asks for the source first (then decides again with it)."""
    plan = decide(observed(obj, **fields))
    if plan.writes != [ReadSource(parsed(obj))]:
        return False
    assert plan.then is not None
    again = plan.then(SOURCE)
    assert kinds(again) == kinds(decide(observed(obj, **fields, source=SOURCE)))
    return True


def kinds(plan: Plan) -> list[str]:
    return [type(w).__name__ for w in plan.writes]


def statuses(plan: Plan) -> list[Obj]:
    return [w.status for w in plan.writes if isinstance(w, WriteStatus)]


def condition(status: Obj, type_: str) -> tuple[str, str, str] | None:
    for c in status.get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"], c["message"]
    return None


# --- the Stack itself --------------------------------------------------------------------------


def test_a_deleted_stack_without_the_finalizer_is_left_alone() -> None:
    plan = decide(observed(stack(deleting=True, finalizers=[])))
    assert plan.writes == [] and plan.result == Result.done()


def test_a_new_stack_gets_the_finalizer_then_its_workspace_then_an_update() -> None:
    obj = stack(finalizers=[])
    plan = decide(observed(obj, source=SOURCE))
    assert kinds(plan) == ["AddFinalizer", "WriteStatus", "ApplyWorkspace"]
    assert isinstance(plan.writes[0], AddFinalizer)
    status = statuses(plan)[0]
    assert condition(status, "Reconciling") == ("True", "StackProcessing", "waiting for workspace readiness")
    apply = plan.writes[2]
    assert isinstance(apply, ApplyWorkspace)
    assert apply.body["spec"]["image"] == "pulumi/pulumi:restricted"
    assert apply.body["spec"]["stacks"] == [{"name": "dev", "create": True}]
    assert plan.then is not None
    rest = plan.then(workspace())
    assert kinds(rest) == ["WriteStatus", "Emit", "CreateUpdate"]
    assert rest.writes[1] == Emit("Normal", "StackUpdateDetected", "Initial stack update")
    create = rest.writes[2]
    assert isinstance(create, CreateUpdate) and create.body["spec"]["type"] == "up"
    assert statuses(rest)[0]["currentUpdate"]["name"] == create.body["metadata"]["name"]
    # a Workspace not Ready yet: nothing more (its status change wakes the Stack)
    waiting = plan.then(workspace(ready=False))
    assert waiting.writes == [] and waiting.result == Result.done()


def test_an_invalid_spec_stalls_with_an_event_and_a_never_run_one_is_released() -> None:
    bad = stack({"programRef": None, "projectRepo": "https://h/r", "commit": "c", "branch": "b"})
    plan = decide(observed(bad))
    assert kinds(plan) == ["Emit", "WriteStatus"]
    emit = plan.writes[0]
    assert isinstance(emit, Emit) and emit.reason == "StackConfigInvalid"
    stalled = condition(statuses(plan)[0], "Stalled")
    assert stalled is not None and stalled[1] == "SpecInvalid"
    released = decide(observed(stack({"programRef": None, "projectRepo": "h", "commit": "c", "branch": "b"},
                                     deleting=True)))  # fmt: skip
    assert kinds(released) == ["RemoveFinalizer"]


def test_a_stack_is_decided_from_the_parse_it_is_given_then_too() -> None:
    """The reconciler parses a Stack once and hands the parse over (``Observed.parsed``): decide
    uses it, and decides again after the source read with the same one."""
    good = stack()
    bad = stack({"programRef": None, "projectRepo": "https://h/r", "commit": "c", "branch": "b"})
    given = parse_stack(bad)
    assert given[1]
    plan = decide(observed(good, parsed=given))
    assert kinds(plan) == ["Emit", "WriteStatus"] and plan.writes[0] == decide(observed(bad)).writes[0]
    first = decide(observed(good, parsed=parse_stack(good)))
    assert first.writes == [ReadSource(parsed(good))] and first.then is not None
    again, fresh = first.then(SOURCE), decide(observed(good, source=SOURCE))
    assert (again.writes, again.result, again.status) == (fresh.writes, fresh.result, fresh.status)


def test_an_ephemeral_backend_is_a_warning_condition_and_one_event_per_generation() -> None:
    spec = {"backend": "file:///tmp/state"}
    plan = decide(observed(stack(spec), source=SOURCE))
    events = [w for w in plan.writes if isinstance(w, Emit)]
    assert [e.reason for e in events] == ["EphemeralBackend"]
    warning = condition(statuses(plan)[0], "EphemeralBackend")
    assert warning is not None and warning[0] == "True" and "container's own filesystem" in warning[2]
    seen = decide(observed(stack(spec, {"observedGeneration": 1}), source=SOURCE))
    assert not any(isinstance(w, Emit) for w in seen.writes)  # this generation was seen: no repeat
    assert condition(statuses(seen)[0], "EphemeralBackend") is not None
    durable = decide(observed(stack({"backend": "s3://bucket"}), source=SOURCE))
    assert condition(statuses(durable)[0], "EphemeralBackend") is None


# --- the Update in flight ----------------------------------------------------------------------


def in_flight(**status: Any) -> Obj:
    current = {"name": "s-2", "generation": 1, "commit": "sha256:1"}
    return stack(status={"lastUpdate": DONE_UP, "currentUpdate": current, **status})


def test_an_update_still_running_is_waited_for() -> None:
    running = update()
    running["status"]["conditions"] = [{"type": "Progressing", "status": "True", "reason": "Progressing"}]
    plan = decide(observed(in_flight(), current_update=running))
    assert kinds(plan) == ["WriteStatus"]
    assert condition(statuses(plan)[0], "Reconciling") == (
        "True",
        "StackProcessing",
        "stack is being processed",
    )
    assert not reads_source(in_flight(), current_update=running)


def test_an_update_that_is_gone_is_a_lost_transient_failure() -> None:
    plan = decide(observed(in_flight(), source=SOURCE))
    assert isinstance(plan.writes[0], Log) and plan.writes[0].event == "current update is gone; moving on"
    status = statuses(plan)[0]
    assert "currentUpdate" not in status and status["lastFailure"]["reason"] == "UpdateLost"


def test_a_completed_update_is_recorded_with_its_outputs_and_the_update_released() -> None:
    done = update(resourceChanges={"create": 3})
    plan = decide(observed(in_flight(), current_update=done, outputs={"url": "u"}, source=SOURCE))
    assert Emit("Normal", "StackCreated", "Successfully updated stack") in plan.writes
    write = next(w for w in plan.writes if isinstance(w, WriteStatus))
    assert write.recorded is done
    assert write.status["outputs"] == {"url": "u"} and write.status["resourceCount"] == 3
    assert write.status["lastUpdate"]["name"] == "s-2" and "currentUpdate" not in write.status
    assert condition(write.status, "Ready") == ("True", "ProcessingCompleted",
                                                "the stack has been processed and is up to date")  # fmt: skip
    assert any(isinstance(w, PruneHistory) for w in plan.writes)


def test_a_failed_update_is_recorded_and_retried_later() -> None:
    failed = update(failed="ProgramError", message="boom")
    plan = decide(observed(in_flight(), current_update=failed, source=SOURCE))
    assert Emit("Warning", "StackUpdateFailure", "Failed to update stack: boom") in plan.writes
    status = statuses(plan)[0]
    assert status["lastFailure"]["reason"] == "ProgramError" and status["nextRetryTime"]
    assert condition(status, "Reconciling") == ("True", "RetryingAfterFailure", "1 update failure(s)")
    assert plan.result.kind == "requeue_after"


# --- deletion --------------------------------------------------------------------------------


def deployed(spec: Obj | None = None, **status: Any) -> Obj:
    body = {"lastUpdate": DONE_UP, "resourceCount": 3, "projectInfo": {"name": "proj", "runtime": "yaml"},
            **status}  # fmt: skip
    return stack({"destroyOnFinalize": True, **(spec or {})}, body, deleting=True)


def test_deleting_without_destroy_releases_the_stack() -> None:
    obj = stack(status={"lastUpdate": DONE_UP}, deleting=True)
    assert not reads_source(obj)
    plan = decide(observed(obj))
    assert kinds(plan) == ["WriteStatus", "RemoveFinalizer"]


def test_a_destroy_runs_in_the_workspace_as_it_is() -> None:
    obj = deployed()
    ready = workspace()
    assert not reads_source(obj, workspace=ready)
    plan = decide(observed(obj, workspace=ready))
    assert "ApplyWorkspace" not in kinds(plan) and plan.then is None
    create = next(w for w in plan.writes if isinstance(w, CreateUpdate))
    assert create.body["spec"]["type"] == "destroy"
    assert create.body["spec"]["workspaceName"] == "s"
    # not Ready yet: the destroy waits for it, without touching it
    waiting = decide(observed(obj, workspace=workspace(ready=False)))
    assert kinds(waiting) == ["WriteStatus"]
    assert condition(statuses(waiting)[0], "Reconciling") == ("True", "StackProcessing",
                                                              "waiting for workspace readiness")  # fmt: skip


def test_without_a_usable_workspace_the_destroy_gets_one_that_never_creates_the_stack() -> None:
    obj = deployed()
    for ws in (None, workspace(ready=False, stalled=True)):
        assert reads_source(obj, workspace=ws)
        plan = decide(observed(obj, workspace=ws, source=SOURCE))
        apply = next(w for w in plan.writes if isinstance(w, ApplyWorkspace))
        assert apply.body["spec"]["stacks"] == [{"name": "dev", "create": False}]
        assert "flux" in apply.body["spec"]


def test_a_destroy_whose_source_is_gone_runs_from_the_saved_project_and_says_so() -> None:
    gone = Unresolved("SourceUnavailable", "unable to retrieve program for stack", Awaited.PROGRAM)
    plan = decide(observed(deployed(), source=gone))
    apply = next(w for w in plan.writes if isinstance(w, ApplyWorkspace))
    assert apply.body["spec"]["projectInfo"] == {"name": "proj", "runtime": "yaml"}
    assert "flux" not in apply.body["spec"] and apply.body["spec"]["stacks"][0]["create"] is False
    note = next(w for w in plan.writes if isinstance(w, Emit))
    assert note.reason == "DestroyFromProjectInfo" and "runs in a new workspace pod" in note.message
    reconciling = condition(statuses(plan)[0], "Reconciling")
    assert reconciling is not None and "unable to retrieve program for stack" in reconciling[2]
    # runProgram needs the program: no saved project will do
    stalled = decide(observed(deployed({"runProgram": True}), source=gone))
    assert kinds(stalled) == ["WriteStatus"]
    assert condition(statuses(stalled)[0], "Stalled") == ("True", "SourceUnavailable",
                                                          "unable to retrieve program for stack")  # fmt: skip
    assert stalled.result == Result.done()  # the Program watch wakes it


def test_a_destroy_that_deleted_nothing_known_stalls_stack_not_found() -> None:
    obj = deployed(currentUpdate={"name": "s-9", "generation": 1})
    nothing = update("s-9", type_="destroy")
    plan = decide(observed(obj, current_update=nothing, workspace=workspace()))
    assert "RemoveFinalizer" not in kinds(plan)
    status = statuses(plan)[-1]
    stalled = condition(status, "Stalled")
    assert stalled is not None and stalled[1] == "StackNotFound"
    assert "the destroy deleted nothing" in stalled[2] and "kubectl patch stack s -n ns" in stalled[2]
    done = update("s-9", type_="destroy", resourceChanges={"delete": 3})
    released = decide(observed(obj, current_update=done, workspace=workspace()))
    assert kinds(released)[-1] == "RemoveFinalizer"


# --- the source, retries, suspension, prerequisites ------------------------------------------


def test_a_source_that_cannot_be_had_stalls_and_waits_for_its_watch_or_looks_again() -> None:
    plan = decide(observed(stack(), source=Unresolved("SourceUnavailable", "no artifact", Awaited.PROGRAM)))
    assert kinds(plan) == ["WriteStatus"] and plan.result == Result.done()  # the Program watch wakes it
    assert condition(statuses(plan)[0], "Stalled") == ("True", "SourceUnavailable", "no artifact")
    failed = Unresolved("SourceUnavailable", "listing failed", Awaited.GIT_REMOTE)  # nothing watches git
    plan = decide(
        observed(stack({"programRef": None, "projectRepo": "https://g/r", "branch": "main"}), source=failed)
    )
    assert plan.result == Result.requeue_after(SOURCE_UNAVAILABLE_REQUEUE)


def test_a_stack_in_sync_is_ready_and_prunes_its_history() -> None:
    plan = decide(observed(stack(status={"lastUpdate": DONE_UP}), source=SOURCE))
    assert kinds(plan) == ["WriteStatus", "PruneHistory"]
    assert condition(statuses(plan)[0], "Ready") is not None
    assert statuses(plan)[0]["conditions"][0]["status"] == "True"


def test_a_suspended_stack_starts_nothing() -> None:
    plan = decide(observed(stack({"suspend": True}), source=SOURCE))
    assert kinds(plan) == ["WriteStatus"]
    assert condition(statuses(plan)[0], "Suspended") is not None


def test_unmet_prerequisites_wait_and_ask_a_stale_one_to_run() -> None:
    spec = {"prerequisites": [{"name": "base", "requirement": {"succeededWithinDuration": "1m"}},
                              {"name": "ghost"}]}  # fmt: skip
    base = stack(status={"lastUpdate": {**DONE_UP, "name": "b-1"}, "observedGeneration": 1}, name="base")
    plan = decide(observed(stack(spec), source=SOURCE, prerequisites={"base": base, "ghost": None}))
    assert RequestReconcile("base", "after-b-1") in plan.writes
    reconciling = condition(statuses(plan)[0], "Reconciling")
    assert reconciling == (
        "True",
        "PrerequisiteNotSatisfied",
        "multiple prerequisites were not satisfied base, ghost",
    )


def test_a_workspace_the_go_operator_refuses_stalls_spec_invalid() -> None:
    spec = {"envRefs": {"X": {"type": "Env", "env": {"name": "Y"}}}}
    plan = decide(observed(stack(spec), source=SOURCE))
    stalled = condition(statuses(plan)[-1], "Stalled")
    assert stalled is not None and stalled[1] == "SpecInvalid"
    assert "ApplyWorkspace" not in kinds(plan)


# --- expected failures -----------------------------------------------------------------------


def test_a_destroy_blocked_by_a_terminating_namespace_stalls_with_how_to_release() -> None:
    obs = observed(deployed(), source=SOURCE)
    plan = decide(obs)
    apply = next(w for w in plan.writes if isinstance(w, ApplyWorkspace))
    body = '{"reason":"Forbidden","message":"namespace ns is being terminated: NamespaceTerminating"}'
    rest = refused(obs, plan, apply, Failure(403, body))
    assert rest is not None and rest.result == Result.requeue_after(SOURCE_UNAVAILABLE_REQUEUE)
    stalled = condition(statuses(rest)[0], "Stalled")
    assert stalled is not None and stalled[1] == "NamespaceTerminating"
    assert "kubectl patch stack s -n ns" in stalled[2]
    assert refused(obs, plan, apply, Failure(500, "etcd timeout")) is None  # not ours: it propagates


def test_an_update_that_could_not_be_created_is_not_named_in_flight() -> None:
    obs = observed(stack(), source=SOURCE)
    plan = decide(obs)
    assert plan.then is not None
    rest = plan.then(workspace())
    create = next(w for w in rest.writes if isinstance(w, CreateUpdate))
    retry = refused(obs, rest, create, Failure(422, "invalid"))
    assert retry is not None and retry.result == Result.requeue()
    assert "currentUpdate" not in statuses(retry)[0]
    assert "currentUpdate" in copy.deepcopy(rest.status)  # the plan it came from is untouched
    assert refused(obs, rest, create, Failure(409, "exists")) is None  # ours, in flight


# --- after a switch from the Go operator: a Workspace naming a digest nobody serves --------------

GO_URL = "http://pulumi-kubernetes-operator.pulumi-kubernetes-operator.svc.cluster.local/programs/ns/p/1"
GO_DIGEST = "sha256:9e9a" + "0" * 60  # what the Go operator packed and recorded
PKO_DIGEST = "sha256:0d24" + "0" * 60  # what pko's artifact server serves for the same Program


def go_workspace(*, url: str = GO_URL, digest: str = GO_DIGEST, stamped: bool = False) -> Obj:
    """The Workspace as the Go operator wrote it: the Program artifact by its own digest, no stamp."""
    ws = workspace()
    ws["spec"]["flux"] = {"url": url, "digest": digest}
    if stamped:
        ws["metadata"]["annotations"] = {"auto.pulumi.com/applied-digest": "0" * 32}
    return ws


def go_in_flight() -> tuple[Obj, Obj]:
    """The Go operator's Stack with its Update in flight (``currentUpdate``), and that Update Progressing."""
    current = {"name": "s-go", "generation": 1, "reconcileRequest": "", "commit": GO_DIGEST}
    done = {**DONE_UP, "lastAttemptedCommit": GO_DIGEST, "lastSuccessfulCommit": GO_DIGEST}
    obj = stack(status={"lastUpdate": done, "currentUpdate": current})
    running = update("s-go")
    running["status"]["conditions"] = [
        {"type": "Progressing", "status": "True", "reason": "Progressing"},
        {"type": "Complete", "status": "False", "reason": "Progressing"},
    ]
    return obj, running


def served(url: str = GO_URL, digest: str = PKO_DIGEST, *, ok: bool = True) -> Resolved:
    return Resolved(ArtifactRevision(url, digest, "1"), digest, ok)


def test_a_go_workspace_is_rewritten_with_the_served_digest_under_the_update_in_flight() -> None:
    obj, running = go_in_flight()
    ws = go_workspace()
    # the source is read although an Update runs: the Workspace may name a digest nobody serves
    assert reads_source(obj, current_update=running, workspace=ws)
    plan = decide(observed(obj, current_update=running, workspace=ws, source=served()))
    assert kinds(plan) == ["WriteStatus", "Log", "ApplyWorkspace"]  # no Update: the one in flight stays
    apply = plan.writes[-1]
    assert isinstance(apply, ApplyWorkspace)
    assert apply.body["spec"]["flux"] == {"url": GO_URL, "digest": PKO_DIGEST}
    assert "auto.pulumi.com/applied-digest" in apply.body["metadata"]["annotations"]
    assert plan.then is None
    assert statuses(plan)[0]["currentUpdate"]["name"] == "s-go"
    assert condition(statuses(plan)[0], "Reconciling") == (
        "True",
        "StackProcessing",
        "stack is being processed",
    )


def test_a_digest_that_is_not_served_yet_is_never_written_under_a_running_update() -> None:
    """The Program status the Go operator left (no Ready condition for this generation): pko's
    Program controller has not packed it yet, so its digest would fail the same way."""
    obj, running = go_in_flight()
    plan = decide(observed(obj, current_update=running, workspace=go_workspace(), source=served(ok=False)))
    assert kinds(plan) == ["WriteStatus"]
    unresolved = Unresolved("SourceUnavailable", "unable to retrieve program for stack")
    plan = decide(observed(obj, current_update=running, workspace=go_workspace(), source=unresolved))
    assert kinds(plan) == ["WriteStatus"]
    assert "Stalled" not in [c["type"] for c in statuses(plan)[0].get("conditions") or []]


def test_a_workspace_pko_wrote_keeps_its_source_under_a_running_update() -> None:
    obj, running = go_in_flight()
    newer = served(url=GO_URL.replace("/1", "/2"))  # the Program's next generation: another URL
    ws = go_workspace(stamped=True)
    plan = decide(observed(obj, current_update=running, workspace=ws, source=newer))
    assert kinds(plan) == ["WriteStatus"]
    same = go_workspace(digest=PKO_DIGEST)
    plan = decide(observed(obj, current_update=running, workspace=same, source=served()))
    assert kinds(plan) == ["WriteStatus"]


def test_a_stamped_workspace_whose_url_now_serves_other_bytes_is_rewritten() -> None:
    """A pko upgrade that packs a Program differently: same URL, another digest."""
    obj, running = go_in_flight()
    plan = decide(
        observed(obj, current_update=running, workspace=go_workspace(stamped=True), source=served())
    )
    assert kinds(plan) == ["WriteStatus", "Log", "ApplyWorkspace"]


def test_a_git_workspace_is_not_looked_up_under_a_running_update() -> None:
    obj, running = go_in_flight()
    assert not reads_source(obj, current_update=running, workspace=workspace())
    assert not reads_source(obj, current_update=running)

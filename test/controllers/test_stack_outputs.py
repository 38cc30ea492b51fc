"""``spec.outputs`` as pure decisions (no cluster): which Update's outputs go into the object, what
the object holds (Secret or ConfigMap), and how a reconcile writes it, refuses a foreign object, or
plans from a refused write. test_stack_outputs_cluster.py runs the same against a real apiserver."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest
from pko.api.stack import StackOutputs

from pko.controllers.secretaccess import SecretAccess
from pko.controllers.stack.outputs import (
    OUTPUTS_RECHECK,
    outputs_body,
    owned_by,
    publishing_update,
    update_outputs,
)
from pko.controllers.stack.plan import Emit, Failure, WriteOutputs, decide, refused
from pko.controllers.stack.steps import OutputsWritten, UpdateOutputs

from .test_stack_plan import (
    DONE_UP,
    SETTINGS,
    SOURCE,
    condition,
    kinds,
    observed,
    parsed,
    stack,
    statuses,
    update,
)

Obj = dict[str, Any]
SPEC = {"outputs": {"name": "app-config"}}
CONFIGMAP_SPEC = {"outputs": {"name": "app-config", "kind": "ConfigMap"}}
VALUES = {"url": "https://x.example", "port": 8080, "tags": ["a", "b"], "password": "hunter2"}


OWED = {"type": "OutputsNotWritten", "status": "True", "reason": "OutputsObjectNotOwned", "message": "m",
        "lastTransitionTime": "2026-11-27T04:00:00Z"}  # fmt: skip


def outputs_secret(values: Obj = VALUES, secret: tuple[str, ...] = ("password",)) -> Obj:
    """An Update's outputs Secret as the Update controller writes it (every value JSON)."""
    data = {k: base64.b64encode(json.dumps(v).encode()).decode() for k, v in values.items()}
    annotations = {"pulumi.com/secrets": json.dumps(secret)}
    return {"metadata": {"name": "s-2-stack-outputs", "annotations": annotations}, "data": data}


def done(**kw: Any) -> Obj:
    return update(outputs="s-2-stack-outputs", **kw)


def in_flight(spec: Obj, *, cancel: str | None = None, kind: str | None = None, **status: Any) -> Obj:
    current: Obj = {"name": "s-2", "generation": 1, "commit": "sha256:1"}
    if cancel:
        current["cancelRequest"] = cancel
    if kind:
        current["kind"] = kind
    return stack(spec, {"lastUpdate": DONE_UP, "currentUpdate": current, **status})


def decoded(body: Obj) -> dict[str, str]:
    if body["kind"] == "ConfigMap":
        return dict(body["data"])
    return {k: base64.b64decode(v).decode() for k, v in body["data"].items()}


# --- which Update's outputs --------------------------------------------------------------------


def test_only_a_successful_up_that_ended_is_published() -> None:
    obj = in_flight(SPEC)
    assert publishing_update(obj, parsed(obj), done(), None) is not None
    assert publishing_update(obj, parsed(obj), done(failed="UpdateFailed"), None) is None
    assert publishing_update(obj, parsed(obj), done(type_="preview"), None) is None
    assert publishing_update(obj, parsed(obj), done(type_="refresh"), None) is None
    assert publishing_update(obj, parsed(obj), update(), None) is None  # no outputs Secret named
    running = done()
    running["status"]["conditions"] = [{"type": "Progressing", "status": "True", "reason": "Progressing"}]
    assert publishing_update(obj, parsed(obj), running, None) is None
    cancelled = in_flight(SPEC, cancel="stop")
    assert publishing_update(cancelled, parsed(cancelled), done(), None) is None
    plan_preview = in_flight(SPEC, kind="plan")
    assert publishing_update(plan_preview, parsed(plan_preview), done(type_="preview"), None) is None
    approved = in_flight(SPEC, kind="apply")
    assert publishing_update(approved, parsed(approved), done(), None) is not None
    plain = in_flight({})
    assert publishing_update(plain, parsed(plain), done(), None) is None  # no spec.outputs
    deleting = stack(SPEC, in_flight(SPEC)["status"], deleting=True)
    assert publishing_update(deleting, parsed(deleting), done(), None) is None


def test_the_last_successful_up_is_published_again_only_while_a_write_is_owed() -> None:
    last = done(name="s-1")
    idle = stack(SPEC, {"lastUpdate": DONE_UP})
    assert publishing_update(idle, parsed(idle), None, last) is None
    owed = stack(SPEC, {"lastUpdate": DONE_UP, "conditions": [OWED]})
    assert publishing_update(owed, parsed(owed), None, last) is last
    failed_since = stack(SPEC, {"lastUpdate": {**DONE_UP, "state": "failed"}, "conditions": [OWED]})
    assert publishing_update(failed_since, parsed(failed_since), None, last) is None


# --- what the object holds ---------------------------------------------------------------------


def test_a_secret_holds_every_output_strings_as_they_are_the_rest_as_json_and_is_owned_by_the_stack() -> None:
    obj = stack(SPEC)
    outputs = update_outputs("s-2", outputs_secret())
    body = outputs_body(obj, StackOutputs(name="app-config"), outputs, None)
    assert (body["kind"], body["type"], body["metadata"]["name"], body["metadata"]["namespace"]) == (
        "Secret", "Opaque", "app-config", "ns")  # fmt: skip
    assert decoded(body) == {
        "url": "https://x.example",
        "port": "8080",
        "tags": '["a", "b"]',
        "password": "hunter2",
    }
    assert body["metadata"]["labels"] == {"pulumi.com/component": "stack", "pulumi.com/stack-name": "s"}
    assert body["metadata"]["annotations"]["pulumi.com/secrets"] == '["password"]'
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("Stack", "s", "uid-s", True)
    assert owned_by(body, obj) and not owned_by(body, stack(SPEC, uid="another-stack"))


def test_a_configmap_never_holds_a_secret_output_and_names_those_it_left_out() -> None:
    outputs = update_outputs("s-2", outputs_secret())
    body = outputs_body(
        stack(CONFIGMAP_SPEC), StackOutputs(name="app-config", kind="ConfigMap"), outputs, None
    )
    assert body["kind"] == "ConfigMap" and "type" not in body
    assert body["data"] == {"url": "https://x.example", "port": "8080", "tags": '["a", "b"]'}
    assert "hunter2" not in json.dumps(body)
    assert body["metadata"]["annotations"] == {"pulumi.com/secret-outputs-omitted": '["password"]'}


def test_an_owned_object_is_updated_in_place_keeping_what_others_added() -> None:
    obj = stack(SPEC)
    first = outputs_body(obj, StackOutputs(name="app-config"), update_outputs("s-2", outputs_secret()), None)
    stored = {**first, "metadata": {**first["metadata"], "uid": "uid-obj", "resourceVersion": "7",
                                    "labels": {**first["metadata"]["labels"], "team": "web"}}}  # fmt: skip
    changed = update_outputs("s-3", outputs_secret({"url": "https://y.example"}, ()))
    body = outputs_body(obj, StackOutputs(name="app-config"), changed, stored)
    assert decoded(body) == {"url": "https://y.example"}  # the old keys are gone
    meta = body["metadata"]
    assert (meta["uid"], meta["resourceVersion"], meta["labels"]["team"]) == ("uid-obj", "7", "web")
    assert meta["annotations"]["pulumi.com/secrets"] == "[]"
    assert meta["ownerReferences"] == first["metadata"]["ownerReferences"]


# --- the reconcile -----------------------------------------------------------------------------


def completed(spec: Obj = SPEC, **fields: Any) -> Any:
    obj = in_flight(spec)
    return observed(obj, current_update=done(), source=SOURCE,
                    update_outputs=update_outputs("s-2", outputs_secret()), **fields)  # fmt: skip


def test_a_successful_up_writes_the_object_first_then_records_the_update() -> None:
    plan = decide(completed())
    [write] = plan.writes
    assert isinstance(write, WriteOutputs) and not write.existing
    assert write.body["metadata"]["name"] == "app-config"
    assert plan.then is not None
    rest = plan.then(OutputsWritten())
    assert (
        Emit("Normal", "OutputsWritten", "outputs of Update s-2 written to Secret app-config") in rest.writes
    )
    assert not any(isinstance(w, WriteOutputs) for w in rest.writes)
    status = statuses(rest)[0]
    assert status["lastUpdate"]["name"] == "s-2" and "currentUpdate" not in status
    assert condition(status, "OutputsNotWritten") is None
    existing = {**write.body, "metadata": {**write.body["metadata"], "resourceVersion": "3"}}
    again = decide(completed(outputs_object=existing)).writes[0]
    assert isinstance(again, WriteOutputs) and again.existing
    assert again.body["metadata"]["resourceVersion"] == "3"


def test_a_configmap_write_says_which_secret_outputs_it_left_out() -> None:
    plan = decide(completed(CONFIGMAP_SPEC))
    assert plan.then is not None
    events = [w for w in plan.then(OutputsWritten()).writes if isinstance(w, Emit)]
    assert Emit("Normal", "OutputsWritten",
                "outputs of Update s-2 written to ConfigMap app-config (secret outputs left out: password)"
                ) in events  # fmt: skip


def test_a_failed_up_writes_nothing() -> None:
    obj = in_flight(SPEC)
    plan = decide(observed(obj, current_update=done(failed="UpdateFailed"), source=SOURCE))
    assert "WriteOutputs" not in kinds(plan)
    assert condition(statuses(plan)[0], "OutputsNotWritten") is None


def test_a_foreign_object_is_never_written_and_the_stack_says_so_and_looks_again() -> None:
    foreign = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-config", "namespace": "ns"}}
    plan = decide(completed(outputs_object=foreign))
    assert "WriteOutputs" not in kinds(plan) and plan.then is None
    status = statuses(plan)[0]
    assert status["lastUpdate"]["name"] == "s-2"  # the Update is recorded all the same
    held = condition(status, "OutputsNotWritten")
    assert held is not None and held[:2] == ("True", "OutputsObjectNotOwned")
    assert "Secret app-config exists and is not owned by this Stack" in held[2]
    assert "delete or rename" in held[2]
    assert condition(status, "Ready") == (
        "True",
        "ProcessingCompleted",
        "the stack has been processed and is up to date",
    )
    warnings = [w for w in plan.writes if isinstance(w, Emit) and w.type == "Warning"]
    assert [w.reason for w in warnings] == ["OutputsObjectNotOwned"]
    assert plan.result.kind == "requeue_after" and plan.result.delay <= OUTPUTS_RECHECK

    # looking again: the last successful up's outputs, still refused; no second Event
    obj = stack(SPEC, {**status, "lastUpdate": {**DONE_UP, "name": "s-2"}})
    outputs = update_outputs("s-2", outputs_secret())
    again = decide(observed(obj, source=SOURCE, update_outputs=outputs, outputs_object=foreign))
    assert not any(isinstance(w, Emit) for w in again.writes)
    assert condition(statuses(again)[0], "OutputsNotWritten") == held
    # once it is gone: written, the condition cleared
    cleared = decide(observed(obj, source=SOURCE, update_outputs=outputs))
    [write] = cleared.writes
    assert isinstance(write, WriteOutputs) and cleared.then is not None
    done_plan = cleared.then(OutputsWritten())
    assert condition(statuses(done_plan)[0], "OutputsNotWritten") is None
    assert done_plan.result == decide(observed(stack(SPEC, {"lastUpdate": DONE_UP}), source=SOURCE)).result


@pytest.mark.parametrize("status", [403, 422])
def test_a_refused_write_is_a_condition_and_the_update_is_recorded(status: int) -> None:
    seen = completed()
    plan = decide(seen)
    write = plan.writes[0]
    body = json.dumps({"kind": "Status", "message": f"secrets is forbidden ({status})", "code": status})
    rest = refused(seen, plan, write, Failure(status, body))
    assert rest is not None
    held = condition(statuses(rest)[0], "OutputsNotWritten")
    assert held is not None and held[:2] == ("True", "OutputsWriteFailed")
    if status == 403:  # the secrets-per-namespace install, not bound in the Stack's namespace
        assert (
            "could not be written to Secret app-config: the operator may not create Secret ns/app-config "
            "(403 Forbidden): bind ClusterRole pko-stack-secrets to the operator's ServiceAccount in "
            "namespace ns with a RoleBinding (docs/install.md, Secrets per namespace); tried again every 120s"
        ) in held[2]
    else:
        assert f"(HTTP {status}): secrets is forbidden ({status}); tried again every 120s" in held[2]
    assert statuses(rest)[0]["lastUpdate"]["name"] == "s-2"


def test_a_refused_update_in_place_names_the_verb_the_kind_and_the_role_the_operator_was_told() -> None:
    told = replace(SETTINGS, access=SecretAccess("ops/pko", "team-pko-secrets"))
    owned = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": "ns"}}
    seen = completed(CONFIGMAP_SPEC)
    owned["metadata"]["ownerReferences"] = [{"uid": seen.obj["metadata"]["uid"]}]
    seen = replace(seen, settings=told, outputs_object=owned)
    plan = decide(seen)
    write = plan.writes[0]
    assert isinstance(write, WriteOutputs) and write.existing
    rest = refused(seen, plan, write, Failure(403, "forbidden"))
    assert rest is not None
    held = condition(statuses(rest)[0], "OutputsNotWritten")
    assert held is not None
    assert (
        "the operator may not update ConfigMap ns/app-config (403 Forbidden): bind ClusterRole "
        "team-pko-secrets to ServiceAccount ops/pko in namespace ns"
    ) in held[2]
    assert rest.result.kind == "requeue_after" and rest.result.delay <= OUTPUTS_RECHECK


def test_removing_spec_outputs_clears_the_condition() -> None:
    obj = stack({}, {"lastUpdate": DONE_UP, "conditions": [OWED]})
    plan = decide(observed(obj, source=SOURCE))
    assert condition(statuses(plan)[0], "OutputsNotWritten") is None


def test_the_update_outputs_parse_the_per_update_secret() -> None:
    outputs = update_outputs("s-2", outputs_secret())
    assert outputs == UpdateOutputs(
        "s-2", {k: json.dumps(v).encode() for k, v in VALUES.items()}, frozenset({"password"})
    )

"""A waiting Stack's requeue, wait by wait (pure; issue 44): no timer where a watch wakes the Stack
(a missing Program or Flux source, its artifact, a pack's Flux source, a prerequisite, its
Workspace), a timer where nothing watches (a Secret, a failed branch lookup, a kind not served, a
terminating namespace). The real-apiserver side: test_stack_waits_cluster.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pko.controllers.stack.plan import ApplyWorkspace, Failure, Unresolved, decide, refused
from pko.controllers.stack.waits import WAITS, Awaited, waits_with
from pko.controllers.stack.watches import artifact_predicate, flux_source_predicate
from pko.machinery.controller import Result

from .test_stack_plan import (
    SETTINGS,
    SOURCE,
    condition,
    deployed,
    kinds,
    observed,
    stack,
    statuses,
    workspace,
)

Obj = dict[str, Any]

GIT = {"programRef": None, "projectRepo": "https://git.example/r.git", "branch": "main"}
REF = {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "repo"}
FLUX = {"programRef": None, "fluxSource": {"sourceRef": REF}}

# (what the source resolver reports, the Stack's spec, the requeue expected: None = only an event)
SOURCE_WAITS: list[tuple[Awaited, Obj, float | None]] = [
    (Awaited.PROGRAM, {}, None),  # the Program watch: created, a new artifact
    (Awaited.FLUX_SOURCE, FLUX, None),  # the Flux watch: created, a new artifact, Ready while none
    (Awaited.SPEC, GIT, None),  # refused as written: the Stack's own watch (a new generation)
    (Awaited.FLUX_KIND, FLUX, 30.0),  # the kind's cache syncing brings no event
    (Awaited.PACK_SOURCE, {}, None),  # the Flux watch, by the Stack's packs or its templates'
    (Awaited.GIT_REMOTE, GIT, 30.0),  # a branch lookup that failed: nothing to watch
    (Awaited.SECRET, GIT, 120.0),  # Secrets are read, never watched (issue 46)
]


@pytest.mark.parametrize(("awaits", "spec", "requeue"), SOURCE_WAITS, ids=[w[0].value for w in SOURCE_WAITS])
def test_a_stack_waiting_on_its_source_looks_again_only_where_no_watch_wakes_it(
    awaits: Awaited, spec: Obj, requeue: float | None
) -> None:
    plan = decide(observed(stack(spec), source=Unresolved("SourceUnavailable", "waiting", awaits)))
    assert kinds(plan) == ["WriteStatus"]
    assert condition(statuses(plan)[0], "Stalled") == ("True", "SourceUnavailable", "waiting")
    assert plan.result == (Result.done() if requeue is None else Result.requeue_after(requeue))


def test_every_source_wait_is_decided() -> None:
    """Each wait the resolver can report has its case above (a new row of the table needs one)."""
    sources = {Awaited.SPEC, Awaited.PROGRAM, Awaited.FLUX_SOURCE, Awaited.FLUX_KIND, Awaited.PACK_SOURCE,
               Awaited.SECRET, Awaited.GIT_REMOTE}  # fmt: skip
    assert {w[0] for w in SOURCE_WAITS} == sources


def test_a_watched_wait_has_no_timer_and_an_unwatched_one_has_one() -> None:
    for awaited, wait in WAITS.items():
        assert (wait.woken_by is None) == (wait.requeue is not None), awaited
    assert set(WAITS) == set(Awaited)


def test_the_secret_recheck_is_the_reconcilers_setting_and_nothing_else_moves() -> None:
    fast = waits_with(secret_recheck=4.0)
    assert fast[Awaited.SECRET].requeue == 4.0
    assert {k: v for k, v in fast.items() if k is not Awaited.SECRET} == {
        k: v for k, v in WAITS.items() if k is not Awaited.SECRET
    }
    settings = replace(SETTINGS, waits=fast)
    missing = Unresolved("SpecInvalid", "no secret", Awaited.SECRET)
    plan = decide(replace(observed(stack(GIT), source=missing), settings=settings))
    assert plan.result == Result.requeue_after(4.0)
    assert waits_with() is WAITS


def test_a_destroy_waiting_on_its_missing_program_has_no_timer_either() -> None:
    gone = Unresolved("SourceUnavailable", "unable to retrieve program for stack", Awaited.PROGRAM)
    plan = decide(observed(deployed({"runProgram": True}), source=gone))  # no saved project will do
    assert kinds(plan) == ["WriteStatus"] and plan.result == Result.done()
    failed = Unresolved("SourceUnavailable", "listing failed", Awaited.GIT_REMOTE)
    plan = decide(observed(deployed({**GIT, "runProgram": True}), source=failed))
    assert plan.result == Result.requeue_after(30.0)


def test_waits_on_other_objects_have_no_timer() -> None:
    # a prerequisite not Ready: its becoming Ready wakes the Stack
    missing = decide(observed(stack({"prerequisites": [{"name": "base"}]}), source=SOURCE))
    reconciling = condition(statuses(missing)[0], "Reconciling")
    assert reconciling is not None and reconciling[1] == "PrerequisiteNotSatisfied"
    assert missing.result == Result.done()
    # the Workspace not Ready yet: its becoming Ready (or Stalled) wakes the Stack
    applying = decide(observed(stack(), source=SOURCE))
    assert applying.then is not None
    waiting = applying.then(workspace(ready=False))
    assert kinds(waiting) == [] and waiting.result == Result.done()


def test_a_destroy_a_terminating_namespace_blocks_keeps_its_timer() -> None:
    obs = observed(deployed(), source=SOURCE)
    plan = decide(obs)
    apply = next(w for w in plan.writes if isinstance(w, ApplyWorkspace))
    body = '{"reason":"Forbidden","message":"namespace ns is being terminated: NamespaceTerminating"}'
    rest = refused(obs, plan, apply, Failure(403, body))
    assert rest is not None and rest.result == Result.requeue_after(30.0)  # Namespaces are not watched


# --- the Flux watch: what wakes a Stack waiting on its source ------------------------------------


def flux(artifact: str | None, ready: tuple[str, str, str] | None, generation: int = 1) -> Obj:
    status: Obj = {"observedGeneration": generation}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready[0], "reason": ready[1], "message": ready[2],
                                 "lastTransitionTime": f"2026-12-07T10:00:0{generation}Z"}]  # fmt: skip
    if artifact is not None:
        status["artifact"] = {
            "url": f"http://sc/{artifact}.tgz",
            "revision": artifact,
            "digest": f"sha256:{artifact}",
        }
    return {"metadata": {"name": "repo", "namespace": "ns", "generation": generation}, "status": status}


def test_the_flux_watch_passes_what_a_waiting_stack_reports() -> None:
    failing = ("False", "GitOperationFailed", "auth failed")
    assert flux_source_predicate(None, flux(None, None))  # created
    assert flux_source_predicate(flux(None, None), None)  # deleted
    assert flux_source_predicate(flux(None, None), flux(None, failing))  # why it has no artifact
    assert flux_source_predicate(flux(None, failing), flux(None, ("False", "GitOperationFailed", "timeout")))
    assert flux_source_predicate(
        flux(None, failing), flux("a", ("True", "Succeeded", "stored"))
    )  # the artifact
    assert flux_source_predicate(flux("a", None), flux("b", None))  # a new revision
    # nothing the Stack reports changed: no event (the Programs' watch never passed these either)
    assert not flux_source_predicate(flux(None, failing), flux(None, failing, generation=2))
    stored = ("True", "Succeeded", "stored")
    assert not flux_source_predicate(flux("a", stored), flux("a", ("False", "GitOperationFailed", "x")))
    assert not artifact_predicate(flux(None, None), flux(None, failing))

"""A live cluster switched from the Go operator v2.9.0 to pko and back, as docs/switching.md says (issue 41).

The Go operator is installed from its own quickstart (hack/build-peer.sh) in place of the suite's pko:
pko's Deployment deleted, its CRDs and everything else kept, as a user who switches the other way would
leave the Go operator's. Under it, at once:

- ``sw-idle``: a Program Stack (state on its claim, as the Go operator's users keep it) whose
  ConfigMap is recorded by uid; it has ``destroyOnFinalize``;
- ``sw-busy``: the same, then its Program changed to add a slow resource (a command that sleeps, then
  appends a line to a log on the state claim), and the switch starts as soon as the Go operator's
  Update for it is ``Progressing``;
- ``sw-stalled``: a Stack whose Program does not exist (``Stalled``, ``SourceUnavailable``).

Switched to pko (the Go Deployment deleted, pko's install applied with ``--force-conflicts``), judged
from outside: the ConfigMaps keep their uids; both Program Stacks are Ready under pko (the commit it
records is its artifact digest) within a bound, never Stalled on the way, with at most one new Update
each, which succeeded (the busy one's removed the lock the Go agent the switch stopped left, if it had
taken one, and says so); the Go operator's Update in flight ended once (``OperationLost``, its start time
the Go operator's), the slow resource ran once (one line in its log), the stack holds no lock; the
Stalled Stack is Stalled for the same reason. Then back to the Go operator, as the page says (each Stack
suspended, no Update in flight, pko's Deployment deleted, ``suspend`` removed, the Workspaces deleted
and the Programs' status cleared, the Go quickstart applied): the same checks with the Go operator's
records, and the Stacks deleted under it: the one with ``destroyOnFinalize`` destroys its ConfigMap, the
others leave theirs. pko is put back as the suite installed it when the module ends, for the modules
after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from .conftest import OPERATOR_NS, REPO, Kube, go_operator_quickstart, with_local_workspace_image
from .stacks import PROGRAM, program, stack

pytestmark = [pytest.mark.timeout(900), pytest.mark.pko_only("switches between the Go operator and pko")]

IDLE, BUSY, STALLED = "sw-idle", "sw-busy", "sw-stalled"
STACKS = (IDLE, BUSY, STALLED)
SLEEP = 20  # the slow resource's seconds: the Go operator's Update for it is still running at the switch
# The resource added while the Go operator runs: it takes SLEEP seconds, then leaves a line on the claim,
# so how often its create finished is readable after any pod roll.
SLOW = """\
    slow:
      type: command:local:Command
      properties:
        create: "sleep {seconds}; echo ran >> /state/{name}.log"
"""
Obj = dict[str, Any]
# The engine's steps that delete or replace a resource (an Update's status.resourceChanges keys).
REPLACING = {"delete", "replace", "create-replacement", "delete-replaced", "discard", "discard-replaced"}


def _manifests(busy_program: str) -> str:
    """Both Programs and the three Stacks (state on claims, the suite's workspace image named, as the
    Go operator's default image cannot be pulled here); only ``sw-idle`` destroys on finalize."""
    docs: list[Obj] = []
    texts = [
        program(IDLE),
        busy_program,
        stack(IDLE, f"programRef:\n    name: {IDLE}"),
        stack(BUSY, f"programRef:\n    name: {BUSY}"),
        stack(STALLED, "programRef:\n    name: sw-no-such-program"),
    ]
    for text in texts:
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    for doc in docs:
        if doc["kind"] == "Stack":
            doc["spec"]["destroyOnFinalize"] = doc["metadata"]["name"] == IDLE
    return with_local_workspace_image(yaml.safe_dump_all(docs))


def _stacks(k: Kube) -> dict[str, Obj]:
    return {
        s["metadata"]["name"]: s for s in k.json("get", "stacks")["items"] if s["metadata"]["name"] in STACKS
    }


def _updates(k: Kube, owner: Obj) -> dict[str, Obj]:
    """The Updates of a Stack, by its uid in their ownerReferences (both operators set it)."""
    uid = owner["metadata"]["uid"]
    return {
        u["metadata"]["name"]: u
        for u in k.json("get", "updates")["items"]
        if any(ref.get("uid") == uid for ref in u["metadata"].get("ownerReferences") or [])
    }


def _describe(k: Kube, updates: list[Obj]) -> list[tuple[str, ...]]:
    """What an assertion about Updates shows: each one's name, type, result and message."""
    return [
        (
            u["metadata"]["name"],
            str((u.get("spec") or {}).get("type")),
            str(k.condition(u, "Failed").get("reason")),
            str((u.get("status") or {}).get("startTime")),
            str((u.get("status") or {}).get("message"))[:300],
        )
        for u in updates
    ]


def _settled(k: Kube, s: Obj | None, commit: Callable[[str], bool]) -> bool:
    """Ready after a successful up whose recorded commit satisfies ``commit`` (which operator wrote it),
    nothing in flight."""
    status = (s or {}).get("status") or {}
    ready = k.condition(s, "Ready")
    last = status.get("lastUpdate") or {}
    return (
        ready.get("status") == "True"
        and ready.get("reason") == "ProcessingCompleted"
        and not status.get("currentUpdate")
        and last.get("state") == "succeeded"
        and commit(str(last.get("lastSuccessfulCommit") or ""))
    )


def _stalled_reason(k: Kube, s: Obj | None) -> str | None:
    c = k.condition(s, "Stalled")
    return str(c.get("reason")) if c.get("status") == "True" else None


def _uids(k: Kube) -> dict[str, str]:
    return {n: k.json("get", "configmap", f"{n}-settings")["metadata"]["uid"] for n in (IDLE, BUSY)}


def _stop_operator(k: Kube) -> None:
    """Delete the operator's Deployment (nothing else) and wait until its pods are gone."""
    deployment = k.get("deployment", "controller-manager", OPERATOR_NS)
    if deployment is None:
        return
    selector = ",".join(f"{a}={b}" for a, b in deployment["spec"]["selector"]["matchLabels"].items())
    k.run("-n", OPERATOR_NS, "delete", "deployment", "controller-manager", "--ignore-not-found")
    k.until(
        "the operator's pods gone",
        lambda: not k.json("-n", OPERATOR_NS, "get", "pods", "-l", selector)["items"],
        180,
        0.5,
    )


def _start_operator(k: Kube, kustomization: str) -> None:
    k.run("apply", "--server-side", "--force-conflicts", "-k", kustomization, timeout=300)
    k.run(
        "-n", OPERATOR_NS, "rollout", "status", "deployment/controller-manager", "--timeout=300s", timeout=320
    )


PKO = str(REPO / "config" / "local")


@pytest.fixture(scope="module")
def go_quickstart(kube: Kube) -> Iterator[str]:
    """The Go operator running in place of the suite's pko; pko back as the suite installed it after."""
    quickstart = str(go_operator_quickstart())
    _stop_operator(kube)
    try:
        _start_operator(kube, quickstart)
        yield quickstart
    finally:
        _stop_operator(kube)
        _start_operator(kube, PKO)
        # What a failed run left: pko takes the Stacks away (a finalizer nothing can run is removed).
        left = [n for n in STACKS if kube.get("stack", n) is not None]
        for name in left:
            kube.run("delete", "stack", name, "--wait=false", check=False)
        try:
            kube.until(
                "the module's Stacks deleted", lambda: all(kube.get("stack", n) is None for n in left), 180
            )
        except AssertionError:
            unstick = '{"metadata":{"finalizers":null}}'
            for name in left:
                kube.run("patch", "stack", name, "--type=merge", "-p", unstick, check=False)
        for kind, names in (("program", (IDLE, BUSY)), ("pvc", tuple(f"{n}-state" for n in STACKS))):
            kube.run("delete", kind, *names, "--ignore-not-found", "--wait=false", check=False)
        kube.run(
            "delete", "configmap", f"{IDLE}-settings", f"{BUSY}-settings", "--ignore-not-found", check=False
        )


class Clock:
    """Seconds since the module's start, and the named marks a report gives."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.marks: dict[str, float] = {}

    def mark(self, what: str, since: float | None = None) -> float:
        took = time.monotonic() - (self.start if since is None else since)
        self.marks[what] = round(took, 1)
        print(f"switch e2e: {what}: {took:.1f}s", flush=True)
        return took


def _until_all(
    k: Kube,
    what: str,
    done: Callable[[dict[str, Obj]], set[str]],
    names: set[str],
    within: float,
    seen: Callable[[dict[str, Obj]], None] | None = None,
) -> dict[str, float]:
    """Poll every Stack at once until ``done`` names all of ``names``; when each got there (seconds)."""
    start = time.monotonic()
    at: dict[str, float] = {}

    def probe() -> bool:
        stacks = _stacks(k)
        if seen is not None:
            seen(stacks)
        for name in done(stacks) - set(at):
            at[name] = round(time.monotonic() - start, 1)
        return names <= set(at)

    k.until(what, probe, within, 0.5)
    return at


def test_go_operator_to_pko_and_back_without_touching_a_resource(kube: Kube, go_quickstart: str) -> None:
    k, clock = kube, Clock()

    # --- Under the Go operator: three Stacks at once.
    k.run("apply", "--server-side", "-f", "-", input=_manifests(program(BUSY)))
    go_ready = _until_all(
        k,
        "the Go operator's Stacks Ready / Stalled",
        lambda ss: (
            {n for n in (IDLE, BUSY) if _settled(k, ss.get(n), lambda c: True)}
            | ({STALLED} if _stalled_reason(k, ss.get(STALLED)) else set())
        ),
        set(STACKS),
        600,
    )
    clock.mark(f"Go operator: Stacks Ready {go_ready}")
    stacks = _stacks(k)
    stalled_reason = _stalled_reason(k, stacks[STALLED])
    uids = _uids(k)
    go_commits = {n: stacks[n]["status"]["lastUpdate"]["lastSuccessfulCommit"] for n in (IDLE, BUSY)}
    # The Go operator records a Program's generation as the commit, pko the artifact's digest.
    assert not any(c.startswith("sha256:") for c in go_commits.values()), go_commits

    # --- An update in flight: sw-busy's Program gains the slow resource; the switch starts once it runs.
    slow = SLOW.format(seconds=SLEEP, name=BUSY)
    k.run("apply", "--server-side", "-f", "-", input=PROGRAM.format(name=BUSY, extra=slow))

    def go_update_running() -> Obj | None:
        current = ((k.get("stack", BUSY) or {}).get("status") or {}).get("currentUpdate") or {}
        update = k.get("update", current["name"]) if current.get("name") else None
        return update if k.condition(update, "Progressing").get("status") == "True" else None

    in_flight = k.until("the Go operator's Update for sw-busy Progressing", go_update_running, 300, 0.5)
    clock.mark("Go operator: sw-busy's Update Progressing")
    before = {n: set(_updates(k, stacks[n])) for n in (IDLE, BUSY)}

    # --- The switch to pko (docs/switching.md, steps 1 and 2).
    switch = time.monotonic()
    _stop_operator(k)
    clock.mark("Go operator's Deployment deleted, its pod gone", switch)
    _start_operator(k, PKO)
    clock.mark("pko applied and rolled out", switch)
    stalled_on_the_way: dict[str, set[str]] = {n: set() for n in (IDLE, BUSY)}

    def note_stalled(ss: dict[str, Obj]) -> None:
        for n in (IDLE, BUSY):
            reason = _stalled_reason(k, ss.get(n))
            if reason:
                stalled_on_the_way[n].add(reason)

    pko_ready = _until_all(
        k,
        "both Program Stacks Ready under pko",
        lambda ss: {n for n in (IDLE, BUSY) if _settled(k, ss.get(n), lambda c: c.startswith("sha256:"))},
        {IDLE, BUSY},
        420,
        note_stalled,
    )
    after_switch = clock.mark(f"pko: Stacks Ready (s after pko rolled out: {pko_ready})", switch)
    stacks = _stacks(k)

    assert _uids(k) == uids, "a resource was replaced across the switch to pko"
    assert stalled_on_the_way == {IDLE: set(), BUSY: set()}, stalled_on_the_way
    for name in (IDLE, BUSY):
        updates = _updates(k, stacks[name])
        new = set(updates) - before[name]
        described = (name, _describe(k, [updates[u] for u in sorted(new)]))
        assert len(new) <= 1, described
        for u in new:
            failed = k.condition(updates[u], "Failed")
            assert (failed.get("status"), failed.get("reason")) == ("False", "UpdateSucceeded"), updates[u]
            # When the switch stopped the Go operator's agent after it took the stack's lock (the rehearsal
            # at 84c8968 met it, the one at a9a0882 did not), that lock (this pod's host name, a process
            # gone since) met pko's up, which removed it and ran again in the same Update, whose message
            # names the lock and what that update left pending. Only the update in flight can leave one.
            message = str((updates[u].get("status") or {}).get("message") or "")
            assert name == BUSY or "removed the stack's lock held by" not in message, described
            # What the engine did: nothing deleted or replaced; sw-idle's up changed nothing at all.
            changes = set((updates[u].get("status") or {}).get("resourceChanges") or {})
            assert not changes & REPLACING, (u, changes)
            assert name == BUSY or changes <= {"same"}, (u, changes)
    # The Go operator's Update in flight: one result, never started again.
    ended = k.json("get", "update", in_flight["metadata"]["name"])
    lost = k.condition(ended, "Failed")
    assert (lost.get("status"), lost.get("reason")) == ("True", "OperationLost"), ended["status"]
    assert k.condition(ended, "Complete").get("status") == "True", ended["status"]
    assert ended["status"].get("startTime") == in_flight["status"].get("startTime"), ended["status"]
    assert len(set(_updates(k, stacks[BUSY])) - before[BUSY]) == 1  # the change ran in one new Update
    # The slow resource's create finished once, and the stack is not locked.
    in_pod = ["exec", f"{BUSY}-workspace-0", "-c", "pulumi", "--", "sh", "-c"]
    assert k.run(*in_pod, f"cat /state/{BUSY}.log").splitlines() == ["ran"]
    assert k.run(*in_pod, "find /state/.pulumi/locks -type f 2>/dev/null || true").strip() == ""
    # The Stalled Stack, reconciled by pko at its start as every Stack (the others are Ready since): Stalled
    # for the same reason.
    stalled = k.json("get", "stack", STALLED)
    assert _stalled_reason(k, stalled) == stalled_reason, stalled["status"]

    # --- Back to the Go operator (docs/switching.md, "Going back").
    back = time.monotonic()
    for name in STACKS:
        k.run("patch", "stack", name, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    k.until(
        "no Update in flight",
        lambda: not any(s["status"].get("currentUpdate") for s in _stacks(k).values()),
        120,
        0.5,
    )
    _stop_operator(k)
    for name in STACKS:
        k.run("patch", "stack", name, "--type=merge", "-p", '{"spec":{"suspend":null}}')
    # The Go operator never rewrites a Workspace naming a digest it does not serve (pko's: its fetch
    # fails "computed digest doesn't match" for good); it makes a deleted one again from its Stack, from
    # the Program's status as it finds it: cleared, it waits until it has packed the Program itself.
    for name in (IDLE, BUSY):
        clear = '[{"op":"remove","path":"/status"}]'
        k.run("patch", "program", name, "--subresource=status", "--type=json", "-p", clear)
    k.run("delete", "workspaces", IDLE, BUSY, "--wait=true")
    before = {n: set(_updates(k, stacks[n])) for n in (IDLE, BUSY)}
    _start_operator(k, go_quickstart)
    clock.mark("Go operator applied and rolled out", back)
    go_again = _until_all(
        k,
        "both Program Stacks Ready under the Go operator again",
        lambda ss: {n for n in (IDLE, BUSY) if _settled(k, ss.get(n), lambda c: not c.startswith("sha256:"))},
        {IDLE, BUSY},
        420,
    )
    clock.mark(f"Go operator: Stacks Ready again {go_again}", back)
    stacks = _stacks(k)
    assert _uids(k) == uids, "a resource was replaced across the switch back"
    for name in (IDLE, BUSY):
        generation = str(k.json("get", "program", name)["metadata"]["generation"])
        assert stacks[name]["status"]["lastUpdate"]["lastSuccessfulCommit"] == generation, stacks[name]
        new = set(_updates(k, stacks[name])) - before[name]
        assert len(new) <= 1, (name, new)
    assert _stalled_reason(k, stacks[STALLED]) == stalled_reason, stacks[STALLED]["status"]

    # --- Deleted under the Go operator: the Stack with destroyOnFinalize destroys what it made.
    gone_start = time.monotonic()
    k.run("delete", "stack", *STACKS, "--wait=false")
    k.until("the Stacks deleted by the Go operator", lambda: not _stacks(k), 300, 0.5)
    clock.mark("Go operator: Stacks deleted", gone_start)
    assert k.get("configmap", f"{IDLE}-settings") is None  # destroyed
    kept = k.get("configmap", f"{BUSY}-settings")  # no destroyOnFinalize: left as it was
    assert kept is not None and kept["metadata"]["uid"] == uids[BUSY]
    clock.mark("module (before pko is put back)")
    print(f"switch e2e: switch to pko {after_switch:.1f}s; marks {clock.marks}", flush=True)

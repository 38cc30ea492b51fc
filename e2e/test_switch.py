"""A live cluster switched from the Go operator v2.9.0 to pko and back, as docs/switching.md says (issue 41).

The Go operator is installed from its own quickstart (hack/build-peer.sh) in place of the suite's pko:
pko's Deployment deleted, its CRDs and everything else kept, as a user who switches the other way would
leave the Go operator's. Both operators' installs trust the suite's git CA (e2e/conftest.py). Under the
Go operator, at once, each Stack creating a ConfigMap recorded by uid:

- ``sw-idle``: a Program Stack (state on its claim, as the Go operator's users keep it); it has
  ``destroyOnFinalize``;
- ``sw-busy``: the same, then its Program changed to add a slow resource (a command that sleeps, then
  appends a line to a log on the state claim), and the switch starts as soon as the Go operator's
  Update for it is ``Progressing``;
- ``sw-git``: a git Stack, its project in a repository served over HTTPS on the node's address;
- ``sw-flux``: a Flux Stack, its project in a GitRepository's artifact (no source-controller: the
  module writes the status it would, pko.devtools.fluxsource, and serves the artifact);
- ``sw-s3``: a Program Stack whose state is in the S3 backend (config/samples/s3's SeaweedFS);
- ``sw-stalled``: a Stack whose Program does not exist (``Stalled``, ``SourceUnavailable``).

Switched to pko (the Go Deployment deleted, pko's install applied with ``--force-conflicts``), judged
from outside: the ConfigMaps keep their uids; every Stack that was Ready is Ready under pko within a
bound, its workspace pod on pko's agent, never Stalled on the way; each Program Stack with at most one
new Update (its recorded commit becomes pko's artifact digest), and the Flux Stack too (the Go operator
records the source's revision, pko the artifact's digest), which succeeded and replaced nothing
(the busy one's removed the lock the Go agent the switch stopped left, if it had taken one, and says
so); the git Stack with none (both operators record its commit alike); the Go operator's Update in
flight ended once (``OperationLost``, its start time the Go operator's), the slow resource ran once
(one line in its log), the stack holds no lock; the Stalled Stack is Stalled for the same reason. Then
back to the Go operator, as the page says (each Stack suspended, no Update in flight, pko's Deployment
deleted, ``suspend`` removed, the Program Stacks' Workspaces deleted and their Programs' status
cleared, the Go quickstart applied): the same checks with the Go operator's records and agent, and the
Stacks deleted under it: the one with ``destroyOnFinalize`` destroys its ConfigMap, the others leave
theirs. pko is put back as the suite installed it when the module ends, for the modules after it, and
the object store removed. The module needs SeaweedFS, so it runs with the S3 modules, late.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from dulwich.repo import Repo

from pko.devtools.fluxsource import GITREPOSITORY_CRD, artifact_app, tarball
from pko.devtools.gitserver import ServerTLS, git_commit, serve_git, serve_wsgi
from pko.devtools.stacks import stack as stack_object

from .conftest import (
    NODE_IP,
    OPERATOR_NS,
    REPO,
    Kube,
    go_install,
    pko_install,
    trusting_git_ca,
    with_local_workspace_image,
)
from .stacks import PROGRAM, flux_source_ready, program, stack

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.pko_only("switches between the Go operator and pko"),
    pytest.mark.usefixtures("seaweedfs_image"),
]

IDLE, BUSY, STALLED, GIT, S3, FLUX = "sw-idle", "sw-busy", "sw-stalled", "sw-git", "sw-s3", "sw-flux"
STACKS = (IDLE, BUSY, STALLED, GIT, S3, FLUX)
DEPLOYED = (IDLE, BUSY, GIT, S3, FLUX)  # the Stacks Ready under each operator, each with a ConfigMap
PROGRAMS = (IDLE, BUSY, S3)  # the Program Stacks (and their Programs' names)
# config/samples/s3's object store (SeaweedFS in the cluster, its keys in a Secret), as that sample's
# Stack names it: sw-s3 keeps its state there.
S3_SAMPLE = REPO / "config" / "samples" / "s3"
S3_BACKEND = yaml.safe_load((S3_SAMPLE / "pulumi_v1_stack.yaml").read_text())["spec"]["backend"]
# sw-git's project, in a repository of its own served over HTTPS (the suite's CA, which both operators'
# installs and the Stack's pods trust), and sw-flux's, in a Flux GitRepository's artifact (the stand-in
# for source-controller, pko.devtools.fluxsource, as e2e/test_languages.py serves examples/flux-source):
# each the suite's Program (a ConfigMap) as a project of its own (_project).
FLUX_SOURCE = f"""\
fluxSource:
    sourceRef:
      apiVersion: source.toolkit.fluxcd.io/v1
      kind: GitRepository
      name: {FLUX}
    dir: app"""
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


def _project(name: str) -> bytes:
    """The suite's Program ``name`` (e2e/stacks.py) as a Pulumi YAML project's ``Pulumi.yaml``."""
    body = yaml.safe_load(program(name))["program"]
    return yaml.safe_dump({"name": name, "runtime": "yaml", **body}).encode()


def _s3_stack() -> Obj:
    """sw-s3: its Program's state in the object store, with the store's keys from its Secret."""
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    env: dict[str, Obj] = {
        key: {"type": "Secret", "secret": {"name": "seaweedfs-s3", "key": key}} for key in keys
    }
    env["PULUMI_CONFIG_PASSPHRASE"] = {"type": "Literal", "literal": {"value": "e2e-switch-passphrase"}}
    return stack_object(
        S3,
        "default",
        serviceAccountName="pulumi",
        stack="dev",
        programRef={"name": S3},
        backend=S3_BACKEND,
        envRefs=env,
    )


def _manifests(busy_program: str, git_url: str) -> str:
    """The Programs and the six Stacks (state on claims but sw-s3's, the suite's workspace image named,
    as the Go operator's default image cannot be pulled here); only ``sw-idle`` destroys on finalize."""
    docs: list[Obj] = [_s3_stack()]
    texts = [
        program(IDLE),
        busy_program,
        program(S3),
        stack(IDLE, f"programRef:\n    name: {IDLE}"),
        stack(BUSY, f"programRef:\n    name: {BUSY}"),
        stack(STALLED, "programRef:\n    name: sw-no-such-program"),
        trusting_git_ca(stack(GIT, f"projectRepo: {git_url}\n  branch: main\n  repoDir: app")),
        stack(FLUX, FLUX_SOURCE),
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
    return {n: k.json("get", "configmap", f"{n}-settings")["metadata"]["uid"] for n in DEPLOYED}


def _on_pko_agent(k: Kube, name: str) -> bool | None:
    """Whether the Stack's workspace pod, Ready, runs pko's agent (its ``bootstrap`` init container
    copies the agent from pko's agent image, the Go operator's from its own); None while no pod is
    Ready."""
    pod = k.get("pod", f"{name}-workspace-0")
    if (
        not pod
        or pod["metadata"].get("deletionTimestamp")
        or k.condition(pod, "Ready").get("status") != "True"
    ):
        return None
    (bootstrap,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "bootstrap"]
    return "pko-agent" in bootstrap["image"]


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


def _start_operator(k: Kube, install: str) -> None:
    k.run("apply", "--server-side", "--force-conflicts", "-f", "-", input=install, timeout=300)
    k.run(
        "-n", OPERATOR_NS, "rollout", "status", "deployment/controller-manager", "--timeout=300s", timeout=320
    )


@dataclass(frozen=True)
class Installs:
    """The two operators' installs as the suite applies them (trusting its git CA), sw-git's source and
    the revision and digest of sw-flux's artifact."""

    go: str
    pko: str
    git_url: str
    git_head: str
    flux_revision: str
    flux_digest: str


@pytest.fixture(scope="module")
def flux_source(kube: Kube) -> Iterator[tuple[str, str]]:
    """The GitRepository ``sw-flux`` (its CRD alone, no source-controller) with the status
    source-controller writes once it has stored the artifact this fixture serves on the node's
    address: its revision and digest. The kind is removed at the end."""
    k = kube
    artifact, digest = tarball({"app/Pulumi.yaml": _project(FLUX)})
    revision = f"main@sha1:{hashlib.sha1(artifact).hexdigest()}"
    path = f"/gitrepository/default/{FLUX}/{digest[7:19]}.tar.gz"
    source = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": {"name": FLUX},
        "spec": {"interval": "5m", "ref": {"branch": "main"}},
    }
    try:
        with serve_wsgi(artifact_app(path, artifact), host=NODE_IP) as base:
            flux_source_ready(k, yaml.safe_dump(source), FLUX, base + path, digest, revision)
            yield revision, digest
    finally:
        crd = GITREPOSITORY_CRD["metadata"]["name"]
        k.run("delete", "crd", crd, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(scope="module")
def object_store(kube: Kube) -> Iterator[None]:
    """config/samples/s3's SeaweedFS and its keys (not the sample's Stack), Ready; removed at the end."""
    docs = [d for d in yaml.safe_load_all(kube.run("kustomize", str(S3_SAMPLE))) if d]
    store = yaml.safe_dump_all([d for d in docs if d["kind"] not in ("Stack", "Program")])
    kube.apply(store)
    try:
        kube.run("rollout", "status", "deployment/seaweedfs", "--timeout=300s", timeout=320)
        yield
    finally:
        kube.run(
            "delete", "--ignore-not-found", "--wait=true", "-f", "-", input=store, timeout=300, check=False
        )


@pytest.fixture(scope="module")
def installs(
    kube: Kube,
    git_tls: ServerTLS,
    object_store: None,
    flux_source: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installs]:
    """The Go operator running in place of the suite's pko, sw-git's repository served; pko back as the
    suite installed it after (the Stacks left by a failed run taken away first, the sources after)."""
    repo = Repo.init_bare(str(tmp_path_factory.mktemp("switch-git") / "app.git"), mkdir=True)
    head = git_commit(repo, {"app/Pulumi.yaml": _project(GIT)}, b"sw-git")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    ca = git_tls.ca.read_text()
    pko = pko_install(kube, ca)
    with serve_git(repo, "/switch/app.git", host=NODE_IP, tls=git_tls) as url:
        _stop_operator(kube)
        try:
            go = go_install(kube, ca)
            _start_operator(kube, go)
            yield Installs(go, pko, url, head, *flux_source)
        finally:
            _stop_operator(kube)
            _start_operator(kube, pko)
            _take_away(kube)


def _take_away(k: Kube) -> None:
    """What a failed run left: pko takes the Stacks away (a finalizer nothing can run is removed), then
    their Programs, claims and ConfigMaps."""
    left = [n for n in STACKS if k.get("stack", n) is not None]
    for name in left:
        k.run("delete", "stack", name, "--wait=false", check=False)
    try:
        k.until("the module's Stacks deleted", lambda: all(k.get("stack", n) is None for n in left), 180)
    except AssertionError:
        unstick = '{"metadata":{"finalizers":null}}'
        for name in left:
            k.run("patch", "stack", name, "--type=merge", "-p", unstick, check=False)
    for kind, names in (("program", PROGRAMS), ("pvc", tuple(f"{n}-state" for n in STACKS))):
        k.run("delete", kind, *names, "--ignore-not-found", "--wait=false", check=False)
    settings = [f"{n}-settings" for n in DEPLOYED]
    k.run("delete", "configmap", *settings, "--ignore-not-found", check=False)


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


def test_go_operator_to_pko_and_back_without_touching_a_resource(kube: Kube, installs: Installs) -> None:
    k, clock = kube, Clock()

    def git_commit_is(commit: str) -> bool:
        return commit == installs.git_head

    # --- Under the Go operator: five Stacks at once.
    k.run("apply", "--server-side", "-f", "-", input=_manifests(program(BUSY), installs.git_url))
    go_ready = _until_all(
        k,
        "the Go operator's Stacks Ready / Stalled",
        lambda ss: (
            {n for n in DEPLOYED if _settled(k, ss.get(n), lambda c: True)}
            | ({STALLED} if _stalled_reason(k, ss.get(STALLED)) else set())
        ),
        set(STACKS),
        600,
    )
    clock.mark(f"Go operator: Stacks Ready {go_ready}")
    stacks = _stacks(k)
    stalled_reason = _stalled_reason(k, stacks[STALLED])
    uids = _uids(k)
    go_commits = {n: stacks[n]["status"]["lastUpdate"]["lastSuccessfulCommit"] for n in DEPLOYED}
    # The Go operator records a Program's generation as the commit, pko the artifact's digest; a git
    # Stack's commit is the branch's head for both.
    assert not any(go_commits[n].startswith("sha256:") for n in PROGRAMS), go_commits
    assert go_commits[GIT] == installs.git_head, go_commits
    assert go_commits[FLUX] == installs.flux_revision, go_commits  # pko records the digest (below)
    assert not any(_on_pko_agent(k, n) for n in DEPLOYED)

    # --- An update in flight: sw-busy's Program gains the slow resource; the switch starts once it runs.
    slow = SLOW.format(seconds=SLEEP, name=BUSY)
    k.run("apply", "--server-side", "-f", "-", input=PROGRAM.format(name=BUSY, extra=slow))

    def go_update_running() -> Obj | None:
        current = ((k.get("stack", BUSY) or {}).get("status") or {}).get("currentUpdate") or {}
        update = k.get("update", current["name"]) if current.get("name") else None
        return update if k.condition(update, "Progressing").get("status") == "True" else None

    in_flight = k.until("the Go operator's Update for sw-busy Progressing", go_update_running, 300, 0.5)
    clock.mark("Go operator: sw-busy's Update Progressing")
    before = {n: set(_updates(k, stacks[n])) for n in DEPLOYED}

    # --- The switch to pko (docs/switching.md, steps 1 and 2).
    switch = time.monotonic()
    _stop_operator(k)
    clock.mark("Go operator's Deployment deleted, its pod gone", switch)
    _start_operator(k, installs.pko)
    clock.mark("pko applied and rolled out", switch)
    stalled_on_the_way: dict[str, set[str]] = {n: set() for n in DEPLOYED}

    def note_stalled(ss: dict[str, Obj]) -> None:
        for n in DEPLOYED:
            reason = _stalled_reason(k, ss.get(n))
            if reason:
                stalled_on_the_way[n].add(reason)

    def under_pko(ss: dict[str, Obj]) -> set[str]:
        """Settled with pko's records: a Program's digest, the Flux artifact's digest; a git Stack's
        head, in a pod on pko's agent."""
        done = {n for n in PROGRAMS if _settled(k, ss.get(n), lambda c: c.startswith("sha256:"))}
        if _settled(k, ss.get(FLUX), installs.flux_digest.__eq__):
            done.add(FLUX)
        if _settled(k, ss.get(GIT), git_commit_is) and _on_pko_agent(k, GIT):
            done.add(GIT)
        return done

    pko_ready = _until_all(k, "every Stack Ready under pko", under_pko, set(DEPLOYED), 420, note_stalled)
    after_switch = clock.mark(f"pko: Stacks Ready (s after pko rolled out: {pko_ready})", switch)
    stacks = _stacks(k)

    assert _uids(k) == uids, "a resource was replaced across the switch to pko"
    assert stalled_on_the_way == {n: set() for n in DEPLOYED}, stalled_on_the_way
    for name in DEPLOYED:
        updates = _updates(k, stacks[name])
        new = set(updates) - before[name]
        described = (name, _describe(k, [updates[u] for u in sorted(new)]))
        # A git Stack's commit is recorded alike by both operators: no up (docs/switching.md).
        assert len(new) <= (0 if name == GIT else 1), described
        for u in new:
            failed = k.condition(updates[u], "Failed")
            assert (failed.get("status"), failed.get("reason")) == ("False", "UpdateSucceeded"), updates[u]
            # When the switch stopped the Go operator's agent after it took the stack's lock (the rehearsal
            # at 84c8968 met it, the one at a9a0882 did not), that lock (this pod's host name, a process
            # gone since) met pko's up, which removed it and ran again in the same Update, whose message
            # names the lock and what that update left pending. Only the update in flight can leave one.
            message = str((updates[u].get("status") or {}).get("message") or "")
            assert name == BUSY or "removed the stack's lock held by" not in message, described
            # What the engine did: nothing deleted or replaced; the idle Stacks' ups changed nothing.
            changes = set((updates[u].get("status") or {}).get("resourceChanges") or {})
            assert not changes & REPLACING, (u, changes)
            assert name == BUSY or changes <= {"same"}, (u, changes)
        k.until(f"{name}'s pod on pko's agent (adopted)", lambda n=name: _on_pko_agent(k, n), 60, 0.5)
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
    # A git or Flux Stack's Workspace names the repository and commit, or the artifact's URL and digest,
    # which the Go operator writes alike: kept.
    for name in PROGRAMS:
        clear = '[{"op":"remove","path":"/status"}]'
        k.run("patch", "program", name, "--subresource=status", "--type=json", "-p", clear)
    k.run("delete", "workspaces", *PROGRAMS, "--wait=true")
    before = {n: set(_updates(k, stacks[n])) for n in DEPLOYED}
    _start_operator(k, installs.go)
    clock.mark("Go operator applied and rolled out", back)

    def under_go(ss: dict[str, Obj]) -> set[str]:
        done = {n for n in PROGRAMS if _settled(k, ss.get(n), lambda c: not c.startswith("sha256:"))}
        if _settled(k, ss.get(GIT), git_commit_is) and _on_pko_agent(k, GIT) is False:
            done.add(GIT)
        if _settled(k, ss.get(FLUX), installs.flux_revision.__eq__) and _on_pko_agent(k, FLUX) is False:
            done.add(FLUX)
        return done

    go_again = _until_all(k, "every Stack Ready under the Go operator again", under_go, set(DEPLOYED), 420)
    clock.mark(f"Go operator: Stacks Ready again {go_again}", back)
    stacks = _stacks(k)
    assert _uids(k) == uids, "a resource was replaced across the switch back"
    for name in DEPLOYED:
        recorded = stacks[name]["status"]["lastUpdate"]["lastSuccessfulCommit"]
        if name in PROGRAMS:
            assert recorded == str(k.json("get", "program", name)["metadata"]["generation"]), stacks[name]
        new = set(_updates(k, stacks[name])) - before[name]
        assert len(new) <= 1, (name, new)
        assert _on_pko_agent(k, name) is False, name  # its pod on the Go operator's agent again
    assert _stalled_reason(k, stacks[STALLED]) == stalled_reason, stacks[STALLED]["status"]

    # --- Deleted under the Go operator: the Stack with destroyOnFinalize destroys what it made.
    gone_start = time.monotonic()
    k.run("delete", "stack", *STACKS, "--wait=false")
    k.until("the Stacks deleted by the Go operator", lambda: not _stacks(k), 300, 0.5)
    clock.mark("Go operator: Stacks deleted", gone_start)
    assert k.get("configmap", f"{IDLE}-settings") is None  # destroyed
    for name in (BUSY, GIT, S3, FLUX):  # no destroyOnFinalize: left as it was
        kept = k.get("configmap", f"{name}-settings")
        assert kept is not None and kept["metadata"]["uid"] == uids[name], name
    clock.mark("module (before pko is put back)")
    print(f"switch e2e: switch to pko {after_switch:.1f}s; marks {clock.marks}", flush=True)

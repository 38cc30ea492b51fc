"""Git credentials over plain HTTP, decided without a cluster: which Stacks would send credentials in
clear (:func:`insecure_credentials`), the refusal the plan makes of their source by default, the
``InsecureTransport`` condition and its Warning Event once per change (the reconciler tests in
test_stack_insecuretransport_cluster.py drive the same through a real apiserver and git server)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pko.api.stack import Stack
from pko.api.stackterms import (
    CONDITION_INSECURE_TRANSPORT,
    INSECURE_TRANSPORT_ALLOWED,
    INSECURE_TRANSPORT_REFUSED,
)
from pko.api.validation import parse_stack

from pko.controllers.resources import STACK_FINALIZER
from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.insecuretransport import (
    REFUSED_REASON,
    insecure_credentials,
    mark_insecure_transport,
    refusal,
)
from pko.controllers.stack.plan import (
    ApplyWorkspace,
    Emit,
    Observed,
    Plan,
    ReadSource,
    Resolved,
    Settings,
    WriteStatus,
    decide,
)
from pko.controllers.stack.reconciler import OWNED_STATUS
from pko.controllers.stack.waits import Awaited
from pko.controllers.stack.workspaceobject import GitRevision
from pko.machinery.controller import Result
from pko.settings.operator import Settings as OperatorSettings

Obj = dict[str, Any]
NOW = datetime(2026, 12, 7, 1, 0, 0, tzinfo=UTC)
LATER = datetime(2026, 12, 7, 2, 0, 0, tzinfo=UTC)
REFUSING = Settings(RetrySettings(), lambda _: "pulumi/pulumi:latest-nonroot", OWNED_STATUS)
ALLOWING = replace(REFUSING, allow_insecure_git_credentials=True)
URL = "http://git.mirror.svc/org/repo.git"


def ref(name: str, key: str) -> Obj:
    return {"type": "Secret", "secret": {"name": name, "key": key}}


BASIC = {"basicAuth": {"userName": ref("creds", "user"), "password": ref("creds", "password")}}
TOKEN = {"accessToken": ref("creds", "token")}
APP = {
    "githubApp": {
        "appID": ref("app", "id"),
        "installationID": ref("app", "inst"),
        "privateKey": ref("app", "k"),
    }
}
SSH_KEY = {"sshAuth": {"sshPrivateKey": ref("creds", "key")}}
SSH_KEY_PASSPHRASE = {"sshAuth": {"sshPrivateKey": ref("creds", "key"), "password": ref("creds", "pass")}}


def stack_obj(spec: Obj, status: Obj | None = None, *, deleting: bool = False) -> Obj:
    metadata: Obj = {
        "name": "s",
        "namespace": "ns",
        "uid": "uid-s",
        "generation": 1,
        "finalizers": [STACK_FINALIZER],
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-07T00:59:00Z"
    obj: Obj = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": metadata,
        "spec": {"stack": "dev", **spec},
    }
    if status is not None:
        obj["status"] = status
    return obj


def parsed(spec: Obj) -> Stack:
    model, errors = parse_stack(stack_obj(spec))
    assert model is not None and not errors, errors
    return model


def git(url: str = URL, **more: Any) -> Obj:
    return {"projectRepo": url, "branch": "main", **more}


def condition(status: Obj) -> tuple[str, str, str] | None:
    for c in status.get("conditions") or []:
        if c["type"] == CONDITION_INSECURE_TRANSPORT:
            return c["status"], c["reason"], c["message"]
    return None


def stalled(status: Obj) -> tuple[str, str] | None:
    for c in status.get("conditions") or []:
        if c["type"] == "Stalled":
            return c["reason"], c["message"]
    return None


def events(plan: Plan) -> list[tuple[str, str]]:
    return [(w.type, w.reason) for w in plan.writes if isinstance(w, Emit)]


def last_status(plan: Plan) -> Obj:
    written = [w.status for w in plan.writes if isinstance(w, WriteStatus)]
    assert written, plan.writes
    return written[-1]


@pytest.mark.parametrize(
    ("spec", "sent"),
    [
        (git(gitAuth=BASIC), ("spec.gitAuth.basicAuth",)),
        (git(gitAuth=TOKEN), ("spec.gitAuth.accessToken",)),
        (git(gitAuth=APP), ("spec.gitAuth.githubApp",)),
        # its keys are not read to decide: the fetch takes any username, password or accessToken in it
        (git(gitAuthSecret="legacy"), ("spec.gitAuthSecret",)),
        (git("http://bob:s3cret@git.mirror.svc/org/repo.git"), ("a password in spec.projectRepo",)),
        (git("HTTP://git.mirror.svc/r.git", gitAuth=TOKEN), ("spec.gitAuth.accessToken",)),
        (git(" http://git.mirror.svc/r.git", gitAuth=TOKEN), ("spec.gitAuth.accessToken",)),
    ],
)
def test_credentials_for_a_plain_http_repository_are_found(spec: Obj, sent: tuple[str, ...]) -> None:
    found = insecure_credentials(parsed(spec))
    assert found is not None and found.sent == sent
    assert "s3cret" not in found.url


@pytest.mark.parametrize(
    "spec",
    [
        git(),  # an in-cluster mirror without credentials: unchanged, no condition
        git("http://bob@git.mirror.svc/r.git"),  # a user name alone is no secret
        git(gitAuth=SSH_KEY),  # an SSH key is never sent over HTTP
        git(gitAuth=SSH_KEY_PASSPHRASE),  # nor its passphrase (pko.git.credentials)
        git("https://github.com/org/repo.git", gitAuth=BASIC),
        git("ssh://git@github.com/org/repo.git", gitAuth=SSH_KEY_PASSPHRASE),
        git("git@github.com:org/repo.git", gitAuthSecret="legacy"),
        # a Flux source's artifact is fetched anonymously (its digest checked): nothing to send
        {
            "fluxSource": {
                "sourceRef": {
                    "apiVersion": "source.toolkit.fluxcd.io/v1",
                    "kind": "GitRepository",
                    "name": "g",
                }
            }
        },
        {"programRef": {"name": "p"}},
    ],
)
def test_no_credentials_over_plain_http_no_finding(spec: Obj) -> None:
    stack = parsed(spec)
    assert insecure_credentials(stack) is None
    assert refusal(stack, allowed=False) is None
    status: Obj = {}
    assert mark_insecure_transport(status, stack, False, 1, NOW) == [] and condition(status) is None


def test_the_refusal_names_the_scheme_the_setting_and_the_fix() -> None:
    refused = refusal(parsed(git(gitAuth=BASIC)), allowed=False)
    assert refused is not None and refused.reason == REFUSED_REASON == INSECURE_TRANSPORT_REFUSED
    setting = OperatorSettings.allow_insecure_git_credentials
    for words in (
        URL,
        "plain HTTP",
        "spec.gitAuth.basicAuth",
        setting.flag,
        setting.env[0],
        "https://",
        "SSH",
    ):
        assert words in refused.message, words
    # nothing changes until the spec does (its watch wakes the Stack), or the operator restarts
    assert refused.awaits is Awaited.SPEC and REFUSING.requeue(refused.awaits) is None
    assert refusal(parsed(git(gitAuth=BASIC)), allowed=True) is None


def test_refused_by_default_stalled_before_any_read_no_workspace() -> None:
    obj = stack_obj(git(gitAuth=BASIC))
    plan = decide(Observed(obj, now=NOW, created=NOW, settings=REFUSING))
    assert not any(isinstance(w, (ReadSource, ApplyWorkspace)) for w in plan.writes)  # no Secret, no lookup
    assert plan.then is None and plan.result == Result.done()
    status = last_status(plan)
    reason, message = stalled(status) or ("", "")
    assert reason == INSECURE_TRANSPORT_REFUSED and "--allow-insecure-git-credentials" in message
    assert condition(status) == ("True", INSECURE_TRANSPORT_REFUSED, message)
    assert events(plan) == [("Warning", INSECURE_TRANSPORT_REFUSED)]


def test_allowed_it_runs_with_the_condition_and_one_warning() -> None:
    obj = stack_obj(git(gitAuth=TOKEN))
    first = decide(Observed(obj, now=NOW, created=NOW, settings=ALLOWING))
    assert isinstance(first.writes[-1], ReadSource)  # the source is read as for any Stack
    assert first.then is not None
    source = Resolved(GitRevision(URL, "a" * 40), "a" * 40)
    plan = first.then(source)
    assert any(isinstance(w, ApplyWorkspace) for w in plan.writes)
    assert events(plan) == [("Warning", INSECURE_TRANSPORT_ALLOWED)]
    status = plan.status
    found = condition(status)
    assert found is not None and found[:2] == ("True", INSECURE_TRANSPORT_ALLOWED)
    assert "spec.gitAuth.accessToken is sent over it unencrypted" in found[2] and stalled(status) is None


def test_the_warning_is_recorded_once_per_change_not_per_reconcile() -> None:
    stack = parsed(git(gitAuth=TOKEN))
    status: Obj = {}
    assert [e.reason for e in mark_insecure_transport(status, stack, True, 1, NOW)] == [
        INSECURE_TRANSPORT_ALLOWED
    ]
    before = condition(status)
    assert mark_insecure_transport(status, stack, True, 2, LATER) == []  # unchanged: no Event
    assert condition(status) == before
    # the verdict changes (the operator restarted without the setting): a new Warning
    assert [e.reason for e in mark_insecure_transport(status, stack, False, 2, LATER)] == [
        INSECURE_TRANSPORT_REFUSED
    ]
    # the URL changes: the message names the new one, so one more
    moved = parsed(git("http://other.mirror.svc/r.git", gitAuth=TOKEN))
    emitted = mark_insecure_transport(status, moved, False, 3, LATER)
    assert len(emitted) == 1 and "other.mirror.svc" in emitted[0].message
    # fixed (https): the condition goes, silently
    fixed = parsed(git("https://other.mirror.svc/r.git", gitAuth=TOKEN))
    assert mark_insecure_transport(status, fixed, False, 4, LATER) == [] and condition(status) is None


def test_a_stack_decided_again_with_the_condition_already_recorded_emits_nothing() -> None:
    obj = stack_obj(git(gitAuth=BASIC))
    first = decide(Observed(obj, now=NOW, created=NOW, settings=REFUSING))
    again = stack_obj(git(gitAuth=BASIC), status=last_status(first))
    again["status"]["observedGeneration"] = 1
    plan = decide(Observed(again, now=LATER, created=LATER, settings=REFUSING))
    assert events(plan) == [] and stalled(last_status(plan) if plan.writes else plan.status) is not None


def test_a_refused_stack_being_deleted_destroys_from_its_saved_project_without_credentials() -> None:
    spec = git(gitAuth=BASIC, destroyOnFinalize=True)
    status = {
        "projectInfo": {"name": "app", "runtime": "yaml"},
        "lastUpdate": {"state": "succeeded", "generation": 1},
    }
    obj = stack_obj(spec, status=status, deleting=True)
    plan = decide(Observed(obj, now=NOW, created=NOW, settings=REFUSING))
    assert not any(isinstance(w, ReadSource) for w in plan.writes)
    assert plan.then is not None  # the Workspace is applied, then the destroy planned from it
    applied = [w for w in plan.writes if isinstance(w, ApplyWorkspace)]
    assert len(applied) == 1
    workspace_spec = applied[0].body["spec"]
    assert "git" not in workspace_spec and workspace_spec["projectInfo"]["name"] == "app"

"""Git credentials over plain HTTP through the Stack reconciler, a real apiserver and a real git server
on loopback that asks for basic auth and records every request: refused by default (Stalled, a
Warning Event, no Workspace, and the server never sees the credentials), run when the operator
allows it (with the ``InsecureTransport`` condition and one Warning Event), and plain HTTP without
credentials unchanged. The decisions themselves: test_stack_insecuretransport.py."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo
from dulwich.server import DictBackend
from dulwich.web import make_wsgi_chain
from pko.api.stackterms import (
    CONDITION_INSECURE_TRANSPORT,
    INSECURE_TRANSPORT_ALLOWED,
    INSECURE_TRANSPORT_REFUSED,
)
from pko.api.validation import parse_stack

from pko.controllers.options import ControllerOptions
from pko.controllers.resources import STACKS, WORKSPACES
from pko.controllers.stack import reconciler as stack_controller
from pko.controllers.stack.steps import Unresolved
from pko.devtools.gitserver import git_commit, serve_wsgi
from pko.devtools.kstatus import kstatus
from pko.devtools.operatorharness import new_manager, running
from pko.devtools.waiting import wait_until
from pko.machinery.resource import EVENTS, SECRETS, Obj, ResourceClient

USER = "mirror-user"
PASSWORD = "plain-http-passw0rd-4b1e"  # must never reach the server unless the operator allows it


@dataclass
class RecordingGit:
    """Smart HTTP for one repository at ``/private/repo.git`` (basic auth required) and
    ``/public/repo.git`` (none), recording the basic-auth user of every request (None: none sent)."""

    repo: Repo
    base: str = ""
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._app = make_wsgi_chain(
            DictBackend({"/private/repo.git": self.repo, "/public/repo.git": self.repo})
        )

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO") or "")
        header = str(environ.get("HTTP_AUTHORIZATION") or "")
        user: str | None = None
        password: str | None = None
        if header.lower().startswith("basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        self.seen.append((path, user))
        if path.startswith("/private/") and (user, password) != (USER, PASSWORD):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="git"')])
            return [b"unauthorized\n"]
        return self._app(environ, start_response)  # type: ignore[no-any-return]

    def requests_to(self, prefix: str) -> list[str | None]:
        """The basic-auth users of the requests under ``prefix`` so far."""
        return [user for path, user in self.seen if path.startswith(prefix)]


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingGit]:
    root: Path = tmp_path_factory.mktemp("insecure-git")
    repo = Repo.init_bare(str(root))
    git_commit(repo, {"Pulumi.yaml": b"name: mirrored\nruntime: yaml\n"}, b"first", branch="master")
    server = RecordingGit(repo)
    with serve_wsgi(server) as base:
        server.base = base
        yield server


@dataclass
class Cluster:
    namespace: str
    stacks: ResourceClient
    workspaces: ResourceClient
    events: ResourceClient
    reconciler: stack_controller.StackReconciler

    async def conditions(self, name: str) -> dict[str, tuple[str, str, str]]:
        obj = await self.stacks.get(name, self.namespace)
        return {
            c["type"]: (c["status"], c["reason"], c["message"])
            for c in (obj.get("status") or {}).get("conditions") or []
        }

    async def wait_condition(self, name: str, type_: str, reason: str) -> dict[str, tuple[str, str, str]]:
        seen: list[dict[str, tuple[str, str, str]]] = [{}]

        async def holds() -> bool:
            seen[0] = await self.conditions(name)
            got = seen[0].get(type_)
            return got is not None and got[:2] == ("True", reason)

        try:
            await wait_until(f"{name}: {type_}={reason}", holds, within=30.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; conditions: {seen[0]}") from None
        return seen[0]

    async def warnings(self, name: str) -> list[tuple[str, str, int]]:
        """(type, reason, count) of every Event about Stack ``name``."""
        listing = await self.events.list(field_selector=f"involvedObject.name={name}")
        return [(str(e.get("type")), str(e.get("reason")), int(e.get("count") or 1)) for e in listing.items]

    async def reconcile_again(self, name: str, token: str) -> None:
        """Ask for one more reconcile (same generation) and wait until it was observed."""
        request = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": token}}}
        await self.stacks.patch(name, request, namespace=self.namespace)

        async def observed() -> bool:
            obj = await self.stacks.get(name, self.namespace)
            return (obj.get("status") or {}).get("observedReconcileRequest") == token

        await wait_until(f"{name}: reconciliation request {token} observed", observed, within=30.0)


@contextlib.asynccontextmanager
async def operator(api_client: Any, namespace: str, *, allow: bool) -> AsyncIterator[Cluster]:
    """The stack controller alone, with ``--allow-insecure-git-credentials`` as ``allow``."""
    manager = new_manager(api_client, namespace, shutdown_grace_period=5.0)
    options = ControllerOptions(allow_insecure_git_credentials=allow)
    reconciler = stack_controller.setup(manager, options)
    async with running(manager):
        yield Cluster(
            namespace,
            ResourceClient(api_client, STACKS, namespace=namespace),
            ResourceClient(api_client, WORKSPACES, namespace=namespace),
            ResourceClient(api_client, EVENTS, namespace=namespace),
            reconciler,
        )


async def create_stack(
    api_client: Any, namespace: str, name: str, url: str, *, with_credentials: bool
) -> Obj:
    spec: Obj = {"stack": "dev", "projectRepo": url, "branch": "master"}
    if with_credentials:
        secret = f"{name}-git"
        await ResourceClient(api_client, SECRETS, namespace=namespace).create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": namespace},
                "stringData": {"username": USER, "password": PASSWORD},
            }
        )
        spec["gitAuth"] = {
            "basicAuth": {
                "userName": {"type": "Secret", "secret": {"name": secret, "key": "username"}},
                "password": {"type": "Secret", "secret": {"name": secret, "key": "password"}},
            }
        }
    body = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": namespace},
    }
    created: Obj = await ResourceClient(api_client, STACKS, namespace=namespace).create(
        {**body, "spec": spec}
    )
    return created


async def test_credentials_over_plain_http_are_refused_by_default_and_never_sent(
    api_client: Any, namespace: str, git_server: RecordingGit
) -> None:
    name = f"refused-{uuid.uuid4().hex[:6]}"
    url = f"{git_server.base}/private/repo.git"
    async with operator(api_client, namespace, allow=False) as cluster:
        before = len(git_server.seen)
        await create_stack(api_client, namespace, name, url, with_credentials=True)
        conditions = await cluster.wait_condition(name, "Stalled", INSECURE_TRANSPORT_REFUSED)
        message = conditions["Stalled"][2]
        for words in (url, "plain HTTP", "--allow-insecure-git-credentials", "https://", "SSH"):
            assert words in message, (words, message)
        assert conditions[CONDITION_INSECURE_TRANSPORT] == ("True", INSECURE_TRANSPORT_REFUSED, message)
        assert conditions["Ready"][:2] == ("False", "NotReadyStalled")
        obj = await cluster.stacks.get(name, namespace)
        assert kstatus(obj) == "Failed"  # Flux health checks and kpt see a failure to act on
        await cluster.reconcile_again(name, "again")
        assert await cluster.warnings(name) == [("Warning", INSECURE_TRANSPORT_REFUSED, 1)]  # once
        assert await cluster.workspaces.get_or_none(name, namespace) is None

        # The source resolver refuses too (the branch lookup is the operator's own request).
        stack, errors = parse_stack(obj)
        assert stack is not None and not errors
        resolved = await cluster.reconciler.sources.resolve(obj, stack)
        assert isinstance(resolved, Unresolved) and resolved.reason == INSECURE_TRANSPORT_REFUSED
        assert git_server.seen[before:] == []  # not one request: no credentials, no lookup


async def test_allowed_by_the_operator_the_stack_runs_with_the_condition_and_one_warning(
    api_client: Any, namespace: str, git_server: RecordingGit
) -> None:
    name = f"allowed-{uuid.uuid4().hex[:6]}"
    url = f"{git_server.base}/private/repo.git"
    head = git_server.repo.refs[b"refs/heads/master"].decode()
    async with operator(api_client, namespace, allow=True) as cluster:
        before = len(git_server.seen)
        await create_stack(api_client, namespace, name, url, with_credentials=True)

        async def workspace() -> bool:
            return await cluster.workspaces.get_or_none(name, namespace) is not None

        await wait_until(f"workspace {name}", workspace, within=30.0)
        ws = await cluster.workspaces.get(name, namespace)
        assert ws["spec"]["git"]["url"] == url and ws["spec"]["git"]["ref"] == head
        assert USER in git_server.requests_to("/private/") and len(git_server.seen) > before  # looked up
        conditions = await cluster.conditions(name)
        status, reason, message = conditions[CONDITION_INSECURE_TRANSPORT]
        assert (status, reason) == ("True", INSECURE_TRANSPORT_ALLOWED)
        assert "spec.gitAuth.basicAuth is sent over it unencrypted" in message and url in message
        assert "Stalled" not in conditions
        await cluster.reconcile_again(name, "again")
        warnings = [w for w in await cluster.warnings(name) if w[0] == "Warning"]
        assert warnings == [("Warning", INSECURE_TRANSPORT_ALLOWED, 1)]  # once per change, not per reconcile


async def test_plain_http_without_credentials_runs_as_before(
    api_client: Any, namespace: str, git_server: RecordingGit
) -> None:
    name = f"mirror-{uuid.uuid4().hex[:6]}"
    url = f"{git_server.base}/public/repo.git"
    async with operator(api_client, namespace, allow=False) as cluster:
        await create_stack(api_client, namespace, name, url, with_credentials=False)

        async def workspace() -> bool:
            return await cluster.workspaces.get_or_none(name, namespace) is not None

        await wait_until(f"workspace {name}", workspace, within=30.0)
        assert (await cluster.workspaces.get(name, namespace))["spec"]["git"]["url"] == url
        conditions = await cluster.conditions(name)
        assert CONDITION_INSECURE_TRANSPORT not in conditions and "Stalled" not in conditions
        reasons = {w[1] for w in await cluster.warnings(name)}
        assert not reasons & {INSECURE_TRANSPORT_ALLOWED, INSECURE_TRANSPORT_REFUSED}
        assert set(git_server.requests_to("/public/")) == {None}  # anonymous, as the Stack asks

"""The Stack and Program examples of docs/stacks.md and the README run: applied as a user would, they
deploy as the page says.

The YAML blocks of docs/stacks.md that are preceded by an ``<!-- example: NAME -->`` comment are
applied; a block preceded by ``<!-- status: NAME -->`` is what ``kubectl get stack -o yaml`` shows for
example NAME, and is compared with the real status. Unmarked blocks (fragments) are skipped.
Every example names the ``default`` namespace; the test moves namespaced objects into its own
namespace and gives the ClusterRoleBinding a unique name.

* ``service-account``: the workspace ServiceAccount and its ``system:auth-delegator`` binding,
  applied first (no fixture grants it: the page's step is what makes the agents accept the operator);
* ``program-stack``: end to end (real operator, play-kubelet, agents with the stand-in Pulumi CLI,
  whose image environment supplies a file backend and a passphrase, so the access token the
  example references is set but unused); then deleted, which runs the destroy;
* ``git-stack``: end to end, with ``projectRepo`` replaced by a local dulwich HTTP git server
  serving ``random-yaml/Pulumi.yaml`` on ``master`` (the token is sent, the server ignores it);
* ``flux-stack``: Flux's CRDs are not installed here, so its Stack is checked with a server-side
  dry run only (the GitRepository is not applied); ``test_stack_reconciler_sources`` covers Flux sources;
* ``first-stack``, the README's first Stack: its Program and Stack pass a server-side dry run.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dulwich.repo import Repo
from kubernetes_asyncio.client import ApiClient, ApiException

from pko.controllers.resources import STACKS, UPDATES, WORKSPACES
from pko.devtools.gitserver import git_commit, serve_git
from pko.devtools.kubectl import kubectl
from pko.devtools.operatorharness import Operator
from pko.devtools.playkubelet import PlayKubelet
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition
from pko.machinery.resource import EVENTS, ResourceClient

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "stacks.md"
README = REPO / "README.md"
APPLIED = {"service-account", "program-stack", "git-stack"}
DRY_RUN = {"flux-stack"}
README_DRY_RUN = {"first-stack"}
ACCESS_TOKEN = "pul-readme-example-token-0123456789"
GIT_TOKEN = "ghp-readme-example-token-0123456789"
# The page's git example sends its token to github.com over https; here the loopback git server
# is plain HTTP, so the operator must allow credentials over it (docs/stacks.md, InsecureTransport).
OPERATOR_OPTIONS = {"allow_insecure_git_credentials": True}

_MARKED = re.compile(r"<!-- (example|status): ([a-z0-9-]+) -->\n```yaml\n(.*?)```", re.DOTALL)


# --- the pages -------------------------------------------------------------------------------


def marked_blocks(page: Path = PAGE) -> dict[tuple[str, str], list[Obj]]:
    """(kind of mark, name) -> the YAML documents of that block of ``page``."""
    blocks: dict[tuple[str, str], list[Obj]] = {}
    for mark, name, body in _MARKED.findall(page.read_text()):
        assert (mark, name) not in blocks, f"two blocks of {page.name} marked {mark}: {name}"
        blocks[(mark, name)] = [d for d in yaml.safe_load_all(body) if d]
    return blocks


def localize(docs: list[Obj], namespace: str) -> list[Obj]:
    """The documents moved from ``default`` into the test's namespace."""
    out = json.loads(json.dumps(docs))
    for doc in out:
        meta = doc["metadata"]
        if doc["kind"] == "ClusterRoleBinding":
            meta["name"] = f"{meta['name']}-{namespace}"
            for subject in doc.get("subjects") or []:
                subject["namespace"] = namespace
        else:
            assert meta.get("namespace") == "default", f"{doc['kind']} {meta['name']}: say the namespace"
            meta["namespace"] = namespace
    return out


def test_the_pages_mark_their_examples() -> None:
    blocks = marked_blocks()
    names = {name for mark, name in blocks if mark == "example"}
    assert names == APPLIED | DRY_RUN, names
    assert ("status", "program-stack") in blocks
    kinds = [d["kind"] for d in blocks[("example", "service-account")]]
    assert kinds == ["ServiceAccount", "ClusterRoleBinding"]
    binding = blocks[("example", "service-account")][1]
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    for name in ("program-stack", "git-stack", "flux-stack"):
        stack = next(d for d in blocks[("example", name)] if d["kind"] == "Stack")
        assert stack["spec"]["serviceAccountName"] == "pulumi", name
    readme = marked_blocks(README)
    assert {name for _, name in readme} == README_DRY_RUN, readme
    assert [d["kind"] for d in readme[("example", "first-stack")]] == ["Program", "Stack"]


# --- the cluster -----------------------------------------------------------------------------


async def run_kubectl(cluster: Any, *args: str, input: str | None = None) -> str:
    proc = await asyncio.to_thread(kubectl, cluster, *args, input=input)
    return proc.stdout


async def apply(cluster: Any, docs: list[Obj], *extra: str) -> str:
    body = yaml.safe_dump_all(docs, sort_keys=False)
    return await run_kubectl(cluster, "apply", "--server-side", *extra, "-f", "-", input=body)


class Env:
    def __init__(
        self, api: ApiClient, cluster: Any, namespace: str, operator: Operator, kubelet: PlayKubelet
    ) -> None:
        self.api = api
        self.cluster = cluster
        self.ns = namespace
        self.operator = operator
        self.kubelet = kubelet
        self.blocks = marked_blocks()
        self.stacks = ResourceClient(api, STACKS, namespace)
        self.workspaces = ResourceClient(api, WORKSPACES, namespace)
        self.updates = ResourceClient(api, UPDATES, namespace)

    def example(self, name: str) -> list[Obj]:
        return localize(self.blocks[("example", name)], self.ns)

    async def stack(self, name: str) -> Obj | None:
        try:
            return await self.stacks.get(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def ready(self, name: str) -> Obj:
        async def probe() -> Obj | None:
            stack = await self.stack(name)
            found = get_condition(((stack or {}).get("status") or {}).get("conditions"), "Ready")
            if found is not None and found.get("status") == "True":
                return stack
            return None

        try:
            stack: Obj = await wait_until(f"Stack {name} Ready", probe, within=240.0)
        except AssertionError as exc:
            current = await self.stack(name)
            raise AssertionError(
                f"{exc}\nstatus: {(current or {}).get('status')}\n{self.kubelet.describe()}"
            ) from None
        return stack

    async def kubectl(self, *args: str) -> str:
        return await run_kubectl(self.cluster, "-n", self.ns, *args)


@pytest.fixture(scope="module")
async def env(
    api_client: ApiClient, cluster: Any, namespace: str, operator: Operator, kubelet: PlayKubelet
) -> AsyncIterator[Env]:
    e = Env(api_client, cluster, namespace, operator, kubelet)
    # The page's prerequisites: the ServiceAccount with system:auth-delegator, the access token.
    docs = e.example("service-account")
    await apply(cluster, docs)
    await e.kubectl(
        "create", "secret", "generic", "pulumi-api-secret", f"--from-literal=accessToken={ACCESS_TOKEN}"
    )
    try:
        yield e
    finally:
        binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
        await asyncio.to_thread(
            kubectl, cluster, "delete", "clusterrolebinding", binding["metadata"]["name"], check=False
        )


def _same_shape(expected: Any, actual: Any, path: str = "status") -> None:
    """``actual`` has what the page shows: the same keys, equal scalars except times, names and
    generated values (compared by type)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: {actual!r}"
        assert set(expected) == set(actual), f"{path}: shown {sorted(expected)}, got {sorted(actual)}"
        for key in expected:
            _same_shape(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{path}: {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _same_shape(e, a, f"{path}[{i}]")
    else:
        assert type(expected) is type(actual), f"{path}: the page shows {expected!r}, got {actual!r}"


_GENERATED = (
    "lastTransitionTime",
    "lastResyncTime",
    "name",
    "lastAttemptedCommit",
    "lastSuccessfulCommit",
    "resourceCount",  # the fake engine has no provider resource: one fewer than the real one
)


def _scalars(obj: Any, path: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_scalars(value, f"{path}.{key}"))
        return out
    if isinstance(obj, list):
        out = {}
        for i, value in enumerate(obj):
            out.update(_scalars(value, f"{path}[{i}]"))
        return out
    return {path: obj}


async def test_program_example_deploys_with_the_status_the_page_shows(env: Env) -> None:
    docs = env.example("program-stack")
    assert [d["kind"] for d in docs] == ["Program", "Stack"]
    await apply(env.cluster, docs)
    name = docs[1]["metadata"]["name"]
    stack = await env.ready(name)
    status = stack["status"]

    shown = env.blocks[("status", "program-stack")][0]["status"]
    # The page shows Pulumi Cloud's permalink; the stand-in's file backend has none.
    assert shown["lastUpdate"].pop("permalink", "").startswith("https://app.pulumi.com/")
    _same_shape(shown, status)
    # Equal, except what differs per run (times, generated names and commits) and generated values.
    expected = _scalars(shown)
    actual = _scalars(status)
    for path, value in expected.items():
        if path.rsplit(".", 1)[-1] in _GENERATED or path.startswith(".outputs.petName"):
            continue
        assert actual[path] == value, f"status{path}: the page shows {value!r}, got {actual[path]!r}"
    # The Stack's config (petLength: 3) reached the program.
    length = docs[1]["spec"]["config"]["petLength"]
    assert len(status["outputs"]["petName"].split("-")) == length
    assert status["outputs"]["password"] == "[secret]"

    # The access token is referenced, never copied into an object the operator writes.
    workspace = await env.workspaces.get(name)
    updates = (await env.updates.list(label_selector=f"pulumi.com/stack-name={name}")).items
    for obj in (stack, workspace, *updates):
        assert ACCESS_TOKEN not in json.dumps(obj), obj["kind"]
    env_var = next(e for e in workspace["spec"]["env"] if e["name"] == "PULUMI_ACCESS_TOKEN")
    assert env_var["valueFrom"]["secretKeyRef"] == {"name": "pulumi-api-secret", "key": "accessToken"}

    events = (
        await ResourceClient(env.api, EVENTS, env.ns).list(field_selector=f"involvedObject.name={name}")
    ).items
    stack_events = [e for e in events if e["involvedObject"]["kind"] == "Stack"]
    assert {"StackUpdateDetected", "StackCreated"} <= {e["reason"] for e in stack_events}, stack_events
    # kubectl describe's "From" column, as the page shows it.
    assert {(e.get("source") or {}).get("component") for e in stack_events} == {"pulumi-kubernetes-operator"}

    # kubectl get stacks: the columns the page shows, and this Stack's row.
    shown_listing = re.search(r"^\$ kubectl get stacks\n(.*)\n(.*)\n", PAGE.read_text(), re.M)
    assert shown_listing, "docs/stacks.md shows no `kubectl get stacks`"
    header, row = (await env.kubectl("get", "stacks")).splitlines()[:2]
    assert header.split() == shown_listing.group(1).split()
    assert row.split()[:3] == shown_listing.group(2).split()[:3] and row.split()[4] == "True"

    # kubectl delete stack: destroyOnFinalize runs a destroy, then the Stack, Workspace and Updates go.
    await env.kubectl("delete", "stack", name, "--wait=false")

    async def gone() -> bool:
        return await env.stack(name) is None

    await wait_until("the Stack destroyed and released", gone, within=240.0)
    destroys = [
        e
        for e in (
            await ResourceClient(env.api, EVENTS, env.ns).list(field_selector=f"involvedObject.name={name}")
        ).items
        if e["reason"] == "StackUpdateDetected" and e["message"] == "Stack marked for deletion"
    ]
    assert destroys, "no destroy ran"


# --- git -------------------------------------------------------------------------------------


_RANDOM_YAML = """\
name: random-yaml
runtime: yaml
resources:
  password:
    type: random:RandomPassword
    properties:
      length: 16
outputs:
  password: ${password.result}
"""


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    repo = Repo.init_bare(str(tmp_path_factory.mktemp("git")))
    files = {"random-yaml/Pulumi.yaml": _RANDOM_YAML.encode()}
    head = git_commit(repo, files, b"random-yaml", branch="master")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/master")
    with serve_git(repo, "/examples.git") as url:
        yield url, head


async def test_git_example_deploys_the_branch_head(env: Env, git_server: tuple[str, str]) -> None:
    url, head = git_server
    docs = env.example("git-stack")
    stack_doc = next(d for d in docs if d["kind"] == "Stack")
    stack_doc["spec"]["projectRepo"] = url
    secret = stack_doc["spec"]["gitAuth"]["accessToken"]["secret"]
    await env.kubectl(
        "create", "secret", "generic", secret["name"], f"--from-literal={secret['key']}={GIT_TOKEN}"
    )
    await apply(env.cluster, docs)
    name = stack_doc["metadata"]["name"]
    stack = await env.ready(name)
    last = stack["status"]["lastUpdate"]
    assert (last["state"], last["type"], last["lastSuccessfulCommit"]) == ("succeeded", "up", head)
    assert stack["status"]["outputs"] == {"password": "[secret]"}
    workspace = await env.workspaces.get(name)
    assert GIT_TOKEN not in json.dumps(workspace) and GIT_TOKEN not in json.dumps(stack)
    assert workspace["spec"]["git"]["ref"] == head
    insecure = get_condition(stack["status"]["conditions"], "InsecureTransport")
    assert insecure is not None and insecure["reason"] == "CredentialsOverPlainHTTP", insecure


async def test_flux_example_is_accepted_by_the_apiserver(env: Env) -> None:
    docs = [d for d in env.example("flux-stack") if d["kind"] == "Stack"]
    assert docs, "the Flux example has no Stack"
    out = await apply(env.cluster, docs, "--dry-run=server")
    assert "serverside-applied (server dry run)" in out, out


async def test_the_readme_first_stack_is_accepted_by_the_apiserver(env: Env) -> None:
    docs = localize(marked_blocks(README)[("example", "first-stack")], env.ns)
    out = await apply(env.cluster, docs, "--dry-run=server")
    assert out.count("serverside-applied (server dry run)") == 2, out

"""Stacks on the real Pulumi engine: the real operator, apiserver and kube-controller-manager, and the
play-kubelet running real agents with the CLI, the YAML language host and pulumi-kubernetes that
hack/build-pulumi.sh builds from their Go modules.

Programs deploy Kubernetes objects into the test namespace through pulumi-kubernetes, with the
workspace pod's ServiceAccount (a Role here lets it manage ConfigMaps and Deployments), as the
operator's canonical use does. Each Pulumi operation the operator drives runs here at least once:
up, preview, refresh (picking up drift made out of band), destroy, outputs with secrets masked,
``spec.targets``, ``expectNoChanges``, a Python project from git (the Python language host and a
dynamic provider), and the engine's own errors (a YAML error, a provider error, a
missing plugin) surfacing on the Stack in the engine's words.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dulwich.repo import Repo
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient, ApiException

from pko.devtools.gitserver import git_commit, serve_git
from pko.devtools.realpulumi import make_real_pulumi
from pko.devtools.waiting import wait_until

from .conftest import operator_env
from .test_stack import Env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

Obj = dict[str, Any]
KUBELET_OPTIONS = {"engine": make_real_pulumi}
WORKSPACE_SA = "default"


async def _let_programs_manage_objects(api_client: ApiClient, namespace: str) -> None:
    """A Role for the workspace ServiceAccount: the programs' ConfigMaps and Deployments."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    rules = [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": [""],
            "resources": ["pods", "events", "persistentvolumeclaims"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    await rbac.create_namespaced_role(namespace, {"metadata": {"name": "pulumi-programs"}, "rules": rules})
    await rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "pulumi-programs"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pulumi-programs"},
            "subjects": [{"kind": "ServiceAccount", "name": WORKSPACE_SA, "namespace": namespace}],
        },
    )


env = operator_env(Env, service_account=WORKSPACE_SA, prepare=_let_programs_manage_objects)


def config_map(env: Env, name: str, data: dict[str, str]) -> Obj:
    return {
        "type": "kubernetes:core/v1:ConfigMap",
        "properties": {"metadata": {"name": name, "namespace": env.ns}, "data": data},
    }


async def configmap(env: Env, name: str) -> Obj | None:
    try:
        found: Obj = await client.CoreV1Api(env.api).read_namespaced_config_map(name, env.ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return env.api.sanitize_for_serialization(found)  # type: ignore[no-any-return]


async def next_run(env: Env, name: str, after: str, request: str) -> Obj:
    """Ask for another run (the reconciliation-request annotation) and wait until it is recorded."""
    patch = {"metadata": {"annotations": {"pulumi.com/reconciliation-request": request}}}
    await env.stacks.patch(name, patch)

    async def recorded() -> Obj | None:
        current = await env.get(env.stacks, name)
        last = ((current or {}).get("status") or {}).get("lastUpdate") or {}
        return (
            current
            if last.get("name") not in (None, after) and last.get("reconcileRequest") == request
            else None
        )

    stack: Obj = await wait_until(f"{name}: the run for {request!r}", recorded, within=300)
    return stack


async def failed_with(env: Env, name: str) -> Obj:
    async def probe() -> Obj | None:
        stack = await env.get(env.stacks, name)
        status = (stack or {}).get("status") or {}
        return (
            stack
            if (status.get("lastUpdate") or {}).get("state") == "failed" and status.get("lastFailure")
            else None
        )

    return await env.stack_until(name, f"{name}: a failed update", probe, within=300)


async def test_up_creates_kubernetes_objects_masks_secrets_and_destroy_removes_them(env: Env) -> None:
    body = {
        "resources": {"settings": config_map(env, "real-settings", {"greeting": "hello"})},
        "outputs": {
            "greeting": "${settings.data.greeting}",
            "uid": {"fn::secret": "${settings.metadata.uid}"},
        },
    }
    await env.create_program("real", body)
    await env.create_stack("real", {"programRef": {"name": "real"}, "destroyOnFinalize": True})
    stack = await env.condition("real", "Ready", "ProcessingCompleted", within=600)
    status = stack["status"]
    assert status["outputs"] == {"greeting": "hello", "uid": "[secret]"}, status
    last = status["lastUpdate"]
    assert (last["state"], last["type"]) == ("succeeded", "up"), last
    created = await configmap(env, "real-settings")
    assert created is not None and created["data"] == {"greeting": "hello"}, created
    assert status["projectInfo"]["runtime"] == "yaml"

    await env.stacks.delete("real")

    async def gone() -> bool:
        return await env.get(env.stacks, "real") is None and await configmap(env, "real-settings") is None

    await wait_until("the stack destroyed and released", gone, within=300)


async def test_refresh_picks_up_drift_made_out_of_band(env: Env) -> None:
    body = {"resources": {"cm": config_map(env, "drifting-cm", {"value": "desired"})}}
    await env.create_program("drifting", body)
    await env.create_stack("drifting", {"programRef": {"name": "drifting"}})
    stack = await env.condition("drifting", "Ready", "ProcessingCompleted", within=600)
    core = client.CoreV1Api(env.api)
    await core.patch_namespaced_config_map("drifting-cm", env.ns, {"data": {"value": "changed by hand"}})

    # Without refresh, pulumi-kubernetes diffs the program against the state it last wrote: no change.
    stack = await next_run(env, "drifting", stack["status"]["lastUpdate"]["name"], "no-refresh")
    assert stack["status"]["lastUpdate"]["state"] == "succeeded"
    assert (await configmap(env, "drifting-cm") or {})["data"] == {"value": "changed by hand"}

    # With refresh, the engine reads the object back first, sees the drift and puts it right.
    await env.stacks.patch("drifting", {"spec": {"refresh": True}})

    async def restored() -> bool:
        return (await configmap(env, "drifting-cm") or {}).get("data") == {"value": "desired"}

    await wait_until("the drift undone by refresh + up", restored, within=300)


async def test_targets_deploy_only_the_targeted_resource(env: Env) -> None:
    body = {
        "resources": {
            "wanted": config_map(env, "targets-wanted", {"a": "1"}),
            "skipped": config_map(env, "targets-skipped", {"b": "2"}),
        }
    }
    await env.create_program("targeted", body)
    urn = "urn:pulumi:dev::targeted::kubernetes:core/v1:ConfigMap::wanted"
    await env.create_stack("targeted", {"programRef": {"name": "targeted"}, "targets": [urn]})
    await env.condition("targeted", "Ready", "ProcessingCompleted", within=600)
    assert await configmap(env, "targets-wanted") is not None
    assert await configmap(env, "targets-skipped") is None


async def test_a_preview_stack_changes_nothing(env: Env) -> None:
    body = {"resources": {"cm": config_map(env, "previewed-cm", {"a": "1"})}}
    await env.create_program("previewed", body)
    await env.create_stack("previewed", {"programRef": {"name": "previewed"}, "preview": True})
    stack = await env.condition("previewed", "Ready", "ProcessingCompleted", within=600)
    last = stack["status"]["lastUpdate"]
    assert (last["state"], last["type"]) == ("succeeded", "preview"), last
    assert await configmap(env, "previewed-cm") is None


async def test_an_update_expecting_no_changes_fails_when_the_engine_proposes_some(env: Env) -> None:
    """expectNoChanges is an Update's field: on a workspace where nothing is deployed yet (a preview-only
    Stack made it), an `up` expecting no changes fails, in the engine's own words. The real engine
    checks after the update (so the ConfigMap exists): `pulumi up --expect-no-changes` deploys, then
    errors if anything changed."""
    body = {"resources": {"cm": config_map(env, "unexpected-cm", {"a": "1"})}}
    await env.create_program("unexpected", body)
    await env.create_stack("unexpected", {"programRef": {"name": "unexpected"}, "preview": True})
    await env.condition("unexpected", "Ready", "ProcessingCompleted", within=600)
    ws = await env.workspaces.get("unexpected")
    owner = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "name": "unexpected",
        "uid": ws["metadata"]["uid"],
        "controller": True,
    }
    update = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update",
        "metadata": {"name": "unexpected-by-hand", "namespace": env.ns, "ownerReferences": [owner]},
        "spec": {"workspaceName": "unexpected", "stackName": "dev", "type": "up", "expectNoChanges": True},
    }
    await env.updates.create(update)

    async def complete() -> Obj | None:
        found = await env.get(env.updates, "unexpected-by-hand")
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        return found if any(c["type"] == "Complete" and c["status"] == "True" for c in conditions) else None

    done = await wait_until("the hand-made update complete", complete, within=300)
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True", done["status"]
    message = done["status"].get("message", "")
    assert "no changes were expected for update but changes were proposed" in message, done["status"]
    assert "no changes were expected" in failed["message"], failed


@pytest.mark.parametrize(
    ("name", "resources", "words"),
    [
        # a YAML error: the language host's own words about the unknown reference
        ("yaml-error", {"cm": {"type": "kubernetes:core/v1:ConfigMap",
                               "properties": {"data": "${nowhere.x}"}}},
         "nowhere"),
        # a provider error: the apiserver refuses the name, pulumi-kubernetes says so
        ("provider-error", {"cm": {"type": "kubernetes:core/v1:ConfigMap",
                                   "properties": {"metadata": {"name": "Not_A_Valid_Name"}}}},
         "Not_A_Valid_Name"),
        # a missing plugin: nothing is downloaded, the engine names the plugin
        ("missing-plugin", {"pw": {"type": "random:index/randomPassword:RandomPassword",
                                   "properties": {"length": 8}}},
         "random"),
    ],
)  # fmt: skip
async def test_engine_errors_reach_the_stack_in_the_engines_words(
    env: Env, name: str, resources: Obj, words: str
) -> None:
    for resource in resources.values():
        metadata = resource["properties"].get("metadata")
        if metadata is not None:
            metadata["namespace"] = env.ns
    await env.create_program(name, {"resources": resources})
    await env.create_stack(name, {"programRef": {"name": name}})
    stack = await failed_with(env, name)
    failure = stack["status"]["lastFailure"]
    assert words in failure["message"] or words in stack["status"]["lastUpdate"].get("message", ""), failure
    assert failure["transient"] is False, failure
    ready = next(c for c in stack["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False", ready


# --- a Python project from git -----------------------------------------------------------------------

PYTHON_MAIN = b"""\
import pulumi
from pulumi.dynamic import CreateResult, Resource, ResourceProvider


class Greeter(ResourceProvider):
    def create(self, props):
        return CreateResult(id_="greeter-1", outs={"greeting": props["name"].upper()})


class Greeting(Resource):
    greeting: pulumi.Output[str]

    def __init__(self, name, who, opts=None):
        super().__init__(Greeter(), name, {"name": who, "greeting": None}, opts)


greeting = Greeting("hello", pulumi.Config().get("who") or "world")
pulumi.export("greeting", greeting.greeting)
"""


@pytest.fixture(scope="module")
def python_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A git server on 127.0.0.1 with a Python project under app/ on branch main."""
    repo = Repo.init_bare(str(tmp_path_factory.mktemp("pygit")))
    files = {"app/Pulumi.yaml": b"name: pygreeter\nruntime: python\n", "app/__main__.py": PYTHON_MAIN}
    git_commit(repo, files, b"python project")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    with serve_git(repo, "/py.git") as url:
        yield url


async def test_a_python_project_from_git_runs_with_a_dynamic_provider(env: Env, python_repo: str) -> None:
    spec = {"projectRepo": python_repo, "branch": "main", "repoDir": "app", "config": {"who": "pko"}}
    await env.create_stack("pygit", spec)
    stack = await env.condition("pygit", "Ready", "ProcessingCompleted", within=600)
    assert stack["status"]["outputs"] == {"greeting": "PKO"}, stack["status"]
    assert stack["status"]["projectInfo"]["runtime"] == "python"

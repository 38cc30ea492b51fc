"""The secrets-per-namespace install on a real apiserver with RBAC (issue 46, least privilege).

The operator runs as its ServiceAccount with config/default + config/components/secrets-per-namespace:
the manager's ClusterRole without Secret and ConfigMap rights, and the component's ClusterRole bound
(RoleBinding) only where the test binds it, as a platform team would. The role is installed under
another name (:data:`ROLE`, as the chart names it with a name override) and the operator told that
name (``--stack-secrets-role``, which the chart sets): every refusal names the role that exists.

In a namespace without that binding the operator cannot GET a Secret there (a real GET answers 403,
and so does a SubjectAccessReview), and a Stack whose gitAuth names a Secret is Stalled with a message
that says what to bind, to whom, where; no hot loop. Once the RoleBinding is there the Stack deploys
(its gitAuth read, its Update's outputs Secret written and read), and a namespace without the binding
stays closed. A Stack that names no Secret runs its Update, whose outputs Secret the operator may not
create: a Warning Event on the Update names the binding, and the outcome is recorded once it exists.
An outputs Secret the operator wrote but may not read back (a platform team's own Role, without
``get``) is named the same way, by a Warning Event on the Stack, whose Update stays unrecorded until
the operator may read it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiException

from pko.controllers.resources import RECONCILIATION_REQUEST_ANNOTATION
from pko.controllers.secretaccess import STACK_SECRETS_ROLE
from pko.devtools.kubectl import run as run_kubectl
from pko.devtools.operatorharness import Operator
from pko.devtools.waiting import wait_until
from pko.machinery.conditions import get_condition, is_true
from pko.machinery.resource import SECRETS, Resource, ResourceClient

from .conftest import operator_env, operator_options
from .test_secret_rights import OPERATOR_OPTIONS as RIGHTS_OPTIONS
from .test_secret_rights import PASSWORD, USER, Env, can_i, private_git

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

__all__ = ["OPERATOR_OPTIONS", "private_git"]  # the fixture and options, used by name

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "config" / "components" / "secrets-per-namespace"
MANAGER_ROLE = "pulumi-kubernetes-operator-controller-manager"
CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
# The component's ClusterRole as installed here: renamed, as the chart renames it (fullnameOverride).
ROLE = f"team-pko-{STACK_SECRETS_ROLE}"
OPERATOR_OPTIONS = {**RIGHTS_OPTIONS, "stack_secrets_role": ROLE}


def component_install(tmp: Path) -> list[Obj]:
    """``kubectl kustomize`` of config/default with the component, as docs/install.md writes it."""
    (tmp / "config").symlink_to(REPO / "config")
    (tmp / "kustomization.yaml").write_text(
        "resources: [config/default]\ncomponents: [config/components/secrets-per-namespace]\n"
    )
    return [d for d in yaml.safe_load_all(run_kubectl("kustomize", str(tmp)).stdout) if d]


@pytest.fixture(scope="module")
async def operator(
    api_client: client.ApiClient,
    cluster: Any,
    crds: list[str],
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Operator]:
    """conftest's operator, its ClusterRole swapped for the component's manager ClusterRole (named
    apart: the session's other modules share the shipped one) and the component's ClusterRole
    installed as :data:`ROLE`, bound nowhere."""
    options = operator_options(OPERATOR_OPTIONS)
    op = Operator(api_client, cluster, options, rbac=True)
    await op.setup(tmp_path_factory.mktemp("operator"))
    objs = component_install(tmp_path_factory.mktemp("install"))
    manager_role = next(
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == MANAGER_ROLE
    )
    stack_secrets = next(
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == STACK_SECRETS_ROLE
    )
    roles = ResourceClient(api_client, CLUSTER_ROLES)
    bindings = ResourceClient(api_client, CLUSTER_ROLE_BINDINGS)
    own_role = f"{MANAGER_ROLE}-{op.namespace}"
    shipped_binding = next(
        b for b in (await bindings.list()).items if b["metadata"]["name"].endswith(f"-{op.namespace}")
    )
    await bindings.delete(shipped_binding["metadata"]["name"])
    await roles.apply(
        {**manager_role, "metadata": {"name": own_role}, "apiVersion": "rbac.authorization.k8s.io/v1"},
        field_manager="pko-tests",
    )
    renamed = {**stack_secrets, "metadata": {**stack_secrets["metadata"], "name": ROLE}}
    await roles.apply(renamed, field_manager="pko-tests")  # cluster-wide, as the chart installs it
    await bindings.create(
        {
            "metadata": {"name": own_role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": own_role},
            "subjects": [{"kind": "ServiceAccount", "name": op.service_account, "namespace": op.namespace}],
        }
    )
    try:
        await op.start()
        yield op
    finally:
        await op.teardown()
        for res, name in ((CLUSTER_ROLE_BINDINGS, own_role), (CLUSTER_ROLES, own_role)):
            try:
                await ResourceClient(api_client, res).delete(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


env = operator_env(Env)


def _secret_ref(name: str, key: str) -> Obj:
    return {"type": "Secret", "secret": {"name": name, "key": key}}


async def _stalled(env: Env, name: str) -> Obj:
    async def probe() -> Obj | None:
        stack = await env.get(env.stacks, name)
        found = get_condition(((stack or {}).get("status") or {}).get("conditions"), "Stalled")
        return found if found is not None and found.get("status") == "True" else None

    return await env.stack_until(name, "the Stack Stalled", probe, within=120)


def example_binding(env: Env) -> Obj:
    """role_binding.example.yaml, for this install: :data:`ROLE`, this test's operator account."""
    binding: Obj = yaml.safe_load((COMPONENT / "role_binding.example.yaml").read_text())
    binding["roleRef"]["name"] = ROLE
    binding["subjects"] = [
        {"kind": "ServiceAccount", "name": env.operator.service_account, "namespace": env.operator.namespace}
    ]
    return binding


async def test_the_stack_says_what_to_bind_until_the_binding_is_there(env: Env, private_git: str) -> None:
    operator_api = env.operator.api
    assert operator_api is not None
    await env.secrets.create(
        {"metadata": {"name": "git-basic"}, "stringData": {"username": USER, "password": PASSWORD}}
    )

    # Without the RoleBinding: the operator's own GET is refused, and the apiserver says so when asked.
    with pytest.raises(ApiException) as denied:
        await ResourceClient(operator_api, SECRETS, env.ns).get("git-basic")
    assert denied.value.status == 403
    assert not can_i(env, "get", "secrets", "-n", env.ns)
    assert not can_i(env, "get", "configmaps", "-n", env.ns)
    assert not can_i(env, "create", "secrets", "-n", env.ns)

    await env.create_stack(
        "gated",
        {
            "projectRepo": private_git,
            "branch": "main",
            "repoDir": "app",
            "gitAuth": {
                "basicAuth": {
                    "userName": _secret_ref("git-basic", "username"),
                    "password": _secret_ref("git-basic", "password"),
                }
            },
        },
    )
    stalled = await _stalled(env, "gated")
    account = f"{env.operator.namespace}/{env.operator.service_account}"
    assert stalled["reason"] == "SecretForbidden"
    assert (
        f"the operator may not read Secret {env.ns}/git-basic (403 Forbidden): bind ClusterRole "
        f"{ROLE} to ServiceAccount {account} in namespace {env.ns}"
    ) in stalled["message"]
    # Waiting, not looping: the Stack is not written again while nothing changes.
    before = (await env.stacks.get("gated"))["metadata"]["resourceVersion"]
    await asyncio.sleep(5.0)
    assert (await env.stacks.get("gated"))["metadata"]["resourceVersion"] == before
    assert await env.workspaces.get_or_none("gated") is None

    # A Stack that names no Secret deploys, but its Update may not create its outputs Secret: a
    # Warning Event on the Update says what to bind; the outcome waits for the binding.
    await env.create_program("plain", {"outputs": {"greeting": "hi"}})
    await env.create_stack("published", {"programRef": {"name": "plain"}})

    async def current_update() -> str | None:
        stack = await env.get(env.stacks, "published")
        return ((stack or {}).get("status") or {}).get("currentUpdate", {}).get("name")

    update = await env.stack_until("published", "its Update", current_update, within=120)
    events = await env.events_for(update, reason="SecretForbidden", within=180)
    warning = next(e for e in events if e.get("reason") == "SecretForbidden")
    assert warning["type"] == "Warning"
    assert (
        f"the operator may not create Secret {env.ns}/{update}-stack-outputs (403 Forbidden): bind "
        f"ClusterRole {ROLE} to ServiceAccount {account} in namespace {env.ns}"
    ) in warning["message"]
    assert not is_true(((await env.stacks.get("published")).get("status") or {}).get("conditions"), "Ready")

    # The platform team binds the role in this namespace (role_binding.example.yaml, its subject this
    # test's operator account).
    await ResourceClient(env.api, ROLE_BINDINGS, env.ns).create(example_binding(env))
    await wait_until("the binding in force", lambda: can_i(env, "get", "secrets", "-n", env.ns), within=30)
    # The Stack looks again on its Secret timer; a reconcile request makes it now.
    await env.stacks.patch(
        "gated", {"metadata": {"annotations": {RECONCILIATION_REQUEST_ANNOTATION: "bound"}}}
    )
    stack = await env.condition("gated", "Ready", "ProcessingCompleted")
    assert stack["status"]["outputs"] == {"greeting": "hello"}
    assert await ResourceClient(operator_api, SECRETS, env.ns).get_or_none("git-basic") is not None
    # The waiting outcome is recorded on the Update's next try (SECRET_FORBIDDEN_RETRY).
    published = await env.condition("published", "Ready", "ProcessingCompleted", within=120)
    assert published["status"]["outputs"] == {"greeting": "hi"}

    # Elsewhere, still nothing: the binding is this namespace's only.
    assert not can_i(env, "get", "secrets", "-n", "kube-system")
    with pytest.raises(ApiException) as elsewhere:
        await ResourceClient(operator_api, SECRETS, "kube-system").get_or_none("anything")
    assert elsewhere.value.status == 403


async def test_an_outputs_secret_the_operator_may_not_read_back_is_named_on_the_stack(env: Env) -> None:
    """The Stack reads its Update's outputs Secret before deciding; a refused read (403) is worded as
    every refused Secret is (pko.controllers.secretaccess), not left to the generic reconcile error."""
    bindings, roles = ResourceClient(env.api, ROLE_BINDINGS, env.ns), ResourceClient(env.api, ROLES, env.ns)
    binding = example_binding(env)
    if await bindings.get_or_none(binding["metadata"]["name"]) is not None:  # the test above bound it
        await bindings.delete(binding["metadata"]["name"])
    # A platform team's own Role: the operator may create Secrets here, not read them.
    writer: Obj = {"metadata": {"name": "outputs-writer"}}
    rules = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    await roles.create({**writer, "rules": rules})
    await bindings.create(
        {
            **writer,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "outputs-writer"},
            "subjects": binding["subjects"],
        }
    )
    here = ("secrets", "-n", env.ns)
    await wait_until(
        "create but not get", lambda: can_i(env, "create", *here) and not can_i(env, "get", *here), within=30
    )

    await env.create_program("unread", {"outputs": {"greeting": "hello again"}})
    await env.create_stack("unread", {"programRef": {"name": "unread"}})

    events = await env.events_for("unread", reason="SecretForbidden", within=240)
    warning = next(e for e in events if e.get("reason") == "SecretForbidden")
    assert warning["involvedObject"]["kind"] == "Stack"
    stack = await env.stacks.get("unread")
    update = stack["status"]["currentUpdate"]["name"]
    account = f"{env.operator.namespace}/{env.operator.service_account}"
    assert warning["type"] == "Warning"
    assert warning["message"] == (
        f"the operator may not read Secret {env.ns}/{update}-stack-outputs (403 Forbidden): bind "
        f"ClusterRole {ROLE} to ServiceAccount {account} in namespace {env.ns} with a RoleBinding "
        "(docs/install.md, Secrets per namespace)"
    )
    # The Update completed and wrote its Secret; the Stack records nothing it could not read.
    assert not is_true((stack.get("status") or {}).get("conditions"), "Ready")
    assert "outputs" not in stack["status"]
    before = stack["metadata"]["resourceVersion"]
    await asyncio.sleep(5.0)  # waiting on the Secret timer, not looping
    assert (await env.stacks.get("unread"))["metadata"]["resourceVersion"] == before

    # Bound: the next look reads the Secret and records the Update with its outputs.
    await bindings.create(binding)
    await wait_until("the binding in force", lambda: can_i(env, "get", *here), within=30)
    request = {"metadata": {"annotations": {RECONCILIATION_REQUEST_ANNOTATION: "bound"}}}
    await env.stacks.patch("unread", request)
    done = await env.condition("unread", "Ready", "ProcessingCompleted", within=120)
    assert done["status"]["outputs"] == {"greeting": "hello again"}

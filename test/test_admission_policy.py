"""Who may approve a Stack's plan, enforced by the real kube-apiserver (config/admission).

The policy, its binding and the roles are applied from the kustomize output of ``config/default``
(test/kubectl/admission.py). Users are impersonated by the admin (``Impersonate-User``) and get
their permissions from ordinary RoleBindings in the module's namespace, as a cluster's users would:

* ``alice``: the built-in ``edit`` (which aggregates pko's edit role: update on stacks, no approve);
* ``bob``: ``pko-stack-approver``; ``carol``: the built-in ``admin`` (approve by aggregation);
* ``dave``: ``edit`` plus ``approve`` on the Stack named ``web`` only (resourceNames);
* the operator's ServiceAccount with the operator's ClusterRole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubectl.admission import APPROVED_PLAN, POLICY, installed, kubectl, probe_stack, wait_enforced
from kubernetes_asyncio.client import ApiClient, ApiException

from pko.devtools.apiclient import new_api_client
from pko.kubectl.cluster import STACKS
from pko.machinery.resource import Resource, ResourceClient

pytestmark = [pytest.mark.cluster]

Obj = dict[str, Any]
OPERATOR = "system:serviceaccount:pulumi-kubernetes-operator:controller-manager"
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)


@dataclass
class Env:
    api: ApiClient
    ns: str

    @asynccontextmanager
    async def as_user(self, user: str) -> AsyncIterator[ResourceClient]:
        """The namespace's Stacks as ``user`` (the admin impersonating them)."""
        api = new_api_client(self.api.configuration)
        api.set_default_header("Impersonate-User", user)
        try:
            yield ResourceClient(api, STACKS, self.ns, field_manager="pko-test")
        finally:
            await api.close()

    async def stack(self, name: str, annotations: dict[str, str] | None = None) -> Obj:
        """Create a Stack as the admin (who may approve: system:masters)."""
        body = probe_stack(name)
        body["metadata"]["annotations"] = annotations or {}
        return await ResourceClient(self.api, STACKS, self.ns, field_manager="pko-test").create(body)

    async def may(self, user: str, verb: str, name: str = "") -> bool:
        review = {
            "spec": {
                "user": user,
                "resourceAttributes": {
                    "group": "pulumi.com",
                    "resource": "stacks",
                    "verb": verb,
                    "namespace": self.ns,
                    "name": name,
                },
            }
        }
        answer = await ResourceClient(self.api, ACCESS_REVIEWS).create(review)
        return bool(answer["status"].get("allowed"))


def _annotate(value: str | None) -> Obj:
    return {"metadata": {"annotations": {APPROVED_PLAN: value}}}


async def _refused(call: Any) -> str:
    """Await ``call``, which must be refused by the policy: the apiserver's message."""
    with pytest.raises(ApiException) as caught:
        await call
    assert caught.value.status == 403, caught.value.body
    message = str(caught.value.reason)
    assert POLICY in message, message
    return message


@pytest.fixture(scope="module")
def policy(cluster: Any, crds: list[str]) -> Iterator[Path]:
    with installed(Path(cluster.kubeconfig)):
        yield Path(cluster.kubeconfig)


@pytest.fixture(scope="module")
async def env(api_client: ApiClient, namespace: str, policy: Path) -> AsyncIterator[Env]:
    e = Env(api_client, namespace)
    bindings = ResourceClient(api_client, ROLEBINDINGS, namespace, field_manager="pko-test")
    await ResourceClient(api_client, ROLES, namespace, field_manager="pko-test").create(
        {
            "metadata": {"name": "approve-web"},
            "rules": [
                {
                    "apiGroups": ["pulumi.com"],
                    "resources": ["stacks"],
                    "resourceNames": ["web"],
                    "verbs": ["approve"],
                }
            ],
        }
    )
    grants = [
        ("alice", "ClusterRole", "edit"),
        ("bob", "ClusterRole", "pko-stack-approver"),
        ("carol", "ClusterRole", "admin"),
        ("dave", "ClusterRole", "edit"),
        ("dave", "Role", "approve-web"),
    ]
    for user, kind, role in grants:
        await bindings.create(
            {
                "metadata": {"name": f"{user}-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }
        )
    await bindings.create(
        {
            "metadata": {"name": "operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "pulumi-kubernetes-operator-controller-manager",
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": "controller-manager",
                    "namespace": "pulumi-kubernetes-operator",
                }
            ],
        }
    )
    # The built-in edit and admin pick up pko's roles through the controller-manager's aggregation.
    for _ in range(120):
        if await e.may("alice", "update") and await e.may("carol", "approve"):
            break
        await asyncio.sleep(0.5)
    wait_enforced(policy, namespace, "alice")
    yield e


async def test_the_apiserver_type_checks_the_policy_without_warnings(env: Env, policy: Path) -> None:
    for _ in range(60):
        vap = json.loads(kubectl(policy, "get", f"validatingadmissionpolicy/{POLICY}", "-o", "json").stdout)
        status = vap.get("status") or {}
        if status.get("observedGeneration") == vap["metadata"]["generation"]:
            break
        await asyncio.sleep(0.5)
    assert status.get("observedGeneration") == vap["metadata"]["generation"], status
    # Against the Stack CRD's schema: a misspelt field or a wrong type would be a warning here.
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status


async def test_roles_grant_approve_to_approvers_and_admins_only(env: Env) -> None:
    assert await env.may("alice", "update") and not await env.may("alice", "approve")
    assert await env.may("bob", "approve") and await env.may("bob", "patch")
    assert await env.may("carol", "approve")
    assert await env.may("dave", "approve", "web") and not await env.may("dave", "approve", "db")
    assert not await env.may(OPERATOR, "approve")
    assert await env.may(OPERATOR, "update")


async def test_an_editor_may_not_approve_and_is_told_why(env: Env) -> None:
    await env.stack("edited")
    async with env.as_user("alice") as alice:
        message = await _refused(alice.patch("edited", _annotate("sha256:one")))
        assert (
            f'user "alice" may not approve a plan of Stack {env.ns}/edited: setting the annotation '
            f'pulumi.com/approved-plan needs the verb "approve" on stacks.pulumi.com in namespace {env.ns} '
            f"(a RoleBinding there to the ClusterRole pko-stack-approver grants it)"
        ) in message
        # Creating a Stack already approved is approving too.
        await _refused(alice.create(probe_stack("pre-approved")))
        assert await alice.get_or_none("pre-approved") is None
    current = await ResourceClient(env.api, STACKS, env.ns).get("edited")
    assert APPROVED_PLAN not in (current["metadata"].get("annotations") or {})


async def test_an_editor_changes_everything_else_of_an_approved_stack(env: Env) -> None:
    await env.stack("approved", {APPROVED_PLAN: "sha256:one"})
    async with env.as_user("alice") as alice:
        await alice.patch(
            "approved",
            {
                "metadata": {
                    "labels": {"team": "web"},
                    "annotations": {"pulumi.com/reconciliation-request": "r1"},
                },
                "spec": {"refresh": True},
            },
        )
        # A full update that carries the approval unchanged is no approval.
        obj = await alice.get("approved")
        obj["spec"]["stack"] = "prod"
        await alice.replace(obj)
        # Setting the same value again changes nothing.
        await alice.patch("approved", _annotate("sha256:one"))
        # Changing it is approving another plan.
        await _refused(alice.patch("approved", _annotate("sha256:two")))
        # Withdrawing an approval is never privileged.
        await alice.patch("approved", _annotate(None))
        final = await alice.get("approved")
    assert APPROVED_PLAN not in final["metadata"]["annotations"]
    assert (final["spec"]["stack"], final["spec"]["refresh"], final["metadata"]["labels"]["team"]) == (
        "prod",
        True,
        "web",
    )


async def test_an_approver_and_an_admin_may_approve(env: Env) -> None:
    await env.stack("reviewed")
    async with env.as_user("bob") as bob:
        await bob.patch("reviewed", _annotate("sha256:one"))
        await bob.patch("reviewed", _annotate("sha256:two"))
        assert await bob.get_or_none("reviewed") is not None
    async with env.as_user("carol") as carol:
        await carol.patch("reviewed", _annotate("sha256:four"))
        assert (await carol.get("reviewed"))["metadata"]["annotations"][APPROVED_PLAN] == "sha256:four"
        await carol.create(probe_stack("carols", "sha256:three"))
        assert (await carol.get("carols"))["metadata"]["annotations"][APPROVED_PLAN] == "sha256:three"


async def test_approval_can_be_granted_for_named_stacks(env: Env) -> None:
    await env.stack("web")
    await env.stack("db")
    async with env.as_user("dave") as dave:
        await dave.patch("web", _annotate("sha256:one"))
        message = await _refused(dave.patch("db", _annotate("sha256:one")))
        assert f"Stack {env.ns}/db" in message


async def test_the_operator_is_unaffected_since_it_never_approves(env: Env) -> None:
    await env.stack("operated", {APPROVED_PLAN: "sha256:one"})
    async with env.as_user(OPERATOR) as operator:
        await operator.patch("operated", {"metadata": {"finalizers": ["pulumi.com/finalizer"]}})
        obj = await operator.get("operated")
        obj["metadata"]["annotations"]["pulumi.com/observed"] = "yes"
        await operator.replace(obj)
        await operator.patch("operated", {"status": {"observedGeneration": 1}}, subresource="status")
        # It holds no approve, and the policy does not exempt it.
        await _refused(operator.patch("operated", _annotate("sha256:two")))
        await operator.patch("operated", {"metadata": {"finalizers": None}})
    final = await ResourceClient(env.api, STACKS, env.ns).get("operated")
    assert final["metadata"]["annotations"][APPROVED_PLAN] == "sha256:one"
    assert final["status"]["observedGeneration"] == 1

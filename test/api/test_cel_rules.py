"""The CRDs' CEL rules (``pko.api.markers.Rule``) on a real kube-apiserver, and their Python twins.

Each case is one mistake: the apiserver refuses the create with 422, naming the field and the
rule's message, and ``pko.api.validation`` (the operator's own check, kept for objects stored
before a rule existed) refuses the same object at the same field. Each good neighbour is accepted
by both: a CEL rule must never refuse what the operator accepts.
"""

from __future__ import annotations

import copy
import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pko.api.stack import MAX_NAME_LENGTH, NAME_TOO_LONG_MESSAGE
from pko.api.validation import parse_stack

from pko.devtools.stacks import stack as build_stack

pytestmark = pytest.mark.cluster

SECRET = {"type": "Secret", "secret": {"name": "s", "key": "k"}}
FLUX = {"sourceRef": {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "name": "r"}}


stack = functools.partial(build_stack, stack="org/project/dev")


GIT: dict[str, Any] = {"projectRepo": "https://github.com/pulumi/examples", "branch": "master"}

# id -> (spec, field the apiserver and Python name, the rule's message)
REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "git-and-program": (
        {**GIT, "programRef": {"name": "p"}},
        "spec",
        "only one of projectRepo, fluxSource or programRef may be set",
    ),
    "flux-and-program": (
        {"fluxSource": FLUX, "programRef": {"name": "p"}},
        "spec",
        "only one of projectRepo, fluxSource or programRef may be set",
    ),
    "branch-without-repo": (
        {"branch": "main"},
        "spec.projectRepo",
        "required when commit, branch, repoDir, gitAuth, gitAuthSecret or shallow is set",
    ),
    "commit-and-branch": ({**GIT, "commit": "abc"}, "spec.branch", "mutually exclusive with spec.commit"),
    "repo-without-revision": (
        {"projectRepo": GIT["projectRepo"]},
        "spec",
        "one of commit or branch is required with projectRepo",
    ),
    "gitauth-and-gitauthsecret": (
        {**GIT, "gitAuth": {"accessToken": SECRET}, "gitAuthSecret": "creds"},
        "spec.gitAuth",
        "mutually exclusive with spec.gitAuthSecret",
    ),
    "empty-gitauth": (
        {**GIT, "gitAuth": {}},
        "spec.gitAuth",
        "must specify one of accessToken, sshAuth, basicAuth or githubApp",
    ),
    "envref-type-member-mismatch": (
        {**GIT, "envRefs": {"TOKEN": {"type": "Secret", "literal": {"value": "x"}}}},
        "spec.envRefs[TOKEN]",
        "exactly the field named by type must be set",
    ),
    "envref-two-members": (
        {**GIT, "envRefs": {"TOKEN": {**SECRET, "literal": {"value": "x"}}}},
        "spec.envRefs[TOKEN]",
        "exactly the field named by type must be set",
    ),
    "secretsref-configmap": (
        {**GIT, "secretsRef": {"k": {"type": "Literal", "configMap": {"name": "c", "key": "k"}}}},
        "spec.secretsRef[k]",
        "exactly the field named by type must be set",
    ),
    "gitauth-ref-without-secret": (
        {**GIT, "gitAuth": {"accessToken": {"type": "Secret"}}},
        "spec.gitAuth.accessToken",
        "exactly the field named by type must be set",
    ),
}

ACCEPTED: dict[str, dict[str, Any]] = {
    "git-branch": GIT,
    "git-commit": {"projectRepo": GIT["projectRepo"], "commit": "abc", "shallow": True, "repoDir": "d"},
    "flux": {"fluxSource": FLUX},
    "program": {"programRef": {"name": "p"}},
    "empty-strings-are-unset": {**GIT, "commit": "", "gitAuthSecret": ""},
    "gitauth": {**GIT, "gitAuth": {"accessToken": SECRET, "sshAuth": {"sshPrivateKey": SECRET}}},
    "gitauthsecret": {**GIT, "gitAuthSecret": "creds"},
    "envref-configmap-and-literal": {
        **GIT,
        "envRefs": {
            "A": {"type": "ConfigMap", "configMap": {"name": "c", "key": "k"}},
            "B": {"type": "Literal", "literal": {"value": "v"}},
            "C": SECRET,
        },
        "secretsRef": {"k": SECRET},
    },
}


async def create(api_client: Any, obj: dict[str, Any]) -> None:
    api = client.CustomObjectsApi(api_client)
    ns = obj["metadata"]["namespace"]
    version = obj["apiVersion"].split("/")[1]
    await api.create_namespaced_custom_object("pulumi.com", version, ns, "stacks", obj)
    await api.delete_namespaced_custom_object("pulumi.com", version, ns, "stacks", obj["metadata"]["name"])


async def refused(api_client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """The apiserver's Status for a create that must be refused as Invalid."""
    with pytest.raises(ApiException) as raised:
        await create(api_client, obj)
    assert raised.value.status == 422, raised.value.body
    status: dict[str, Any] = json.loads(raised.value.body or "{}")
    return status


def python_errors(obj: dict[str, Any]) -> list[str]:
    parsed, errors = parse_stack(copy.deepcopy(obj))
    assert parsed is not None
    return [str(e) for e in errors]


def name() -> str:
    return f"cel-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("spec", "field", "message"), REFUSED.values(), ids=REFUSED.keys())
async def test_rule_refuses_with_its_message_at_its_field_as_the_operator_does(
    api_client: Any, crds: list[str], namespace: str, spec: dict[str, Any], field: str, message: str
) -> None:
    obj = stack(name(), namespace, **spec)
    status = await refused(api_client, obj)
    causes = [(c["field"], c["message"]) for c in status["details"]["causes"]]
    assert any(f == field and message in m for f, m in causes), causes
    assert f"{field}: Invalid value: {message}" in status["message"]
    errors = python_errors(obj)
    assert any(e.startswith(field) for e in errors), errors


@pytest.mark.parametrize("spec", ACCEPTED.values(), ids=ACCEPTED.keys())
async def test_good_neighbours_are_accepted_by_both(
    api_client: Any, crds: list[str], namespace: str, spec: dict[str, Any]
) -> None:
    obj = stack(name(), namespace, **spec)
    assert python_errors(obj) == []
    await create(api_client, obj)


@pytest.mark.parametrize(
    ("make", "version"),
    [(lambda n: "a" * n, "v1"), (lambda n: "s" * (n - 4) + "-dev", "v1alpha1")],
    ids=["v1", "v1alpha1"],
)
async def test_stack_name_rule_takes_42_characters_and_refuses_43(
    api_client: Any, crds: list[str], namespace: str, make: Callable[[int], str], version: str
) -> None:
    """The Go operator's rule, `size(self.metadata.name) <= 42`, with its message, on both versions."""
    longest = stack(make(MAX_NAME_LENGTH), namespace, **GIT)
    longest["apiVersion"] = f"pulumi.com/{version}"
    assert python_errors(longest) == []
    await create(api_client, longest)

    too_long = copy.deepcopy(longest)
    too_long["metadata"]["name"] = make(MAX_NAME_LENGTH + 1)
    status = await refused(api_client, too_long)
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": f"Invalid value: {NAME_TOO_LONG_MESSAGE}",
            "field": "metadata.name",
        }
    ]
    assert python_errors(too_long) == [f"metadata.name: {NAME_TOO_LONG_MESSAGE}"]


async def test_generated_names_are_checked_too(api_client: Any, crds: list[str], namespace: str) -> None:
    """generateName: the rule sees the generated name (37 + 5 random characters = 42 is fine)."""
    obj = stack("", namespace, **GIT)
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = "g" * (MAX_NAME_LENGTH - 5)
    api = client.CustomObjectsApi(api_client)
    created = await api.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", obj)
    assert len(created["metadata"]["name"]) == MAX_NAME_LENGTH
    obj["metadata"]["generateName"] = "g" * (MAX_NAME_LENGTH - 4)
    with pytest.raises(ApiException) as raised:
        await api.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", obj)
    assert raised.value.status == 422 and NAME_TOO_LONG_MESSAGE in (raised.value.body or "")


async def test_an_update_that_breaks_a_rule_is_refused(
    api_client: Any, crds: list[str], namespace: str
) -> None:
    obj = stack(name(), namespace, **GIT)
    api = client.CustomObjectsApi(api_client)
    await api.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", obj)
    with pytest.raises(ApiException) as raised:
        await api.patch_namespaced_custom_object(
            "pulumi.com", "v1", namespace, "stacks", obj["metadata"]["name"],
            {"spec": {"programRef": {"name": "p"}}}, _content_type="application/merge-patch+json",
        )  # fmt: skip
    assert raised.value.status == 422
    assert "only one of projectRepo, fluxSource or programRef may be set" in (raised.value.body or "")

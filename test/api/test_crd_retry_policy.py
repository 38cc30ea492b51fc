"""``spec.retryPolicy`` (issue 28) on a real kube-apiserver: nonsense is refused on write, naming the
field and the bound, exactly where the operator's own parse (``pko.api.validation``) refuses it;
a sensible policy is stored as written (fractions included) and means what the operator reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pko.api.validation import parse_stack

from pko.controllers.retrysettings import RetrySettings
from pko.controllers.stack.retry import for_stack
from pko.devtools.stacks import stack as build_stack
from pko.devtools.stacks import unique_name

pytestmark = pytest.mark.cluster

MERGE = "application/merge-patch+json"

# id -> (retryPolicy, the field, what the apiserver says of it)
REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "zero-base": ({"transient": {"baseSeconds": 0}}, "transient.baseSeconds", "greater than or equal to 1"),
    "negative-base": (
        {"deterministic": {"baseSeconds": -10}},
        "deterministic.baseSeconds",
        "greater than or equal to 1",
    ),
    "shrinking-factor": (
        {"deterministic": {"factor": 0.5}},
        "deterministic.factor",
        "greater than or equal to 1",
    ),
    "zero-factor": ({"transient": {"factor": 0}}, "transient.factor", "greater than or equal to 1"),
    "zero-cap": ({"transient": {"maxSeconds": 0}}, "transient.maxSeconds", "greater than or equal to 1"),
    "jitter-of-one": ({"transient": {"jitter": 1}}, "transient.jitter", "less than 1"),
    "negative-jitter": ({"transient": {"jitter": -0.2}}, "transient.jitter", "greater than or equal to 0"),
    "fractional-seconds": ({"transient": {"baseSeconds": 1.5}}, "transient.baseSeconds", "integer"),
}


def stack(namespace: str, policy: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return build_stack(
        unique_name("retry"),
        namespace,
        **{"stack": "org/project/dev", "programRef": {"name": "p"}, "retryPolicy": policy, **spec},
    )


def stacks(api_client: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


async def refusal(api_client: Any, obj: dict[str, Any]) -> str:
    """The apiserver's message for a create that must be refused as Invalid."""
    with pytest.raises(ApiException) as raised:
        await stacks(api_client).create_namespaced_custom_object(
            "pulumi.com", "v1", obj["metadata"]["namespace"], "stacks", obj
        )
    assert raised.value.status == 422, raised.value.body
    message: str = json.loads(raised.value.body or "{}")["message"]
    return message


@pytest.mark.parametrize(("policy", "field", "says"), REFUSED.values(), ids=REFUSED.keys())
async def test_nonsense_is_refused_naming_the_field_as_the_operator_does(
    api_client: Any, namespace: str, policy: dict[str, Any], field: str, says: str
) -> None:
    obj = stack(namespace, policy)
    message = await refusal(api_client, obj)
    assert f"spec.retryPolicy.{field}:" in message and says in message, message
    parsed, errors = parse_stack(obj)
    assert parsed is None and [e.path for e in errors] == [f"spec.retryPolicy.{field}"]


async def test_a_policy_is_stored_as_written_and_read_as_the_stacks_settings(
    api_client: Any, namespace: str
) -> None:
    policy = {
        "transient": {"baseSeconds": 1, "factor": 1.5, "maxSeconds": 30, "jitter": 0.25},
        "deterministic": {"baseSeconds": 60, "factor": 1},
    }
    obj = stack(namespace, policy, retryMaxBackoffDurationSeconds=600, maxUpdateFailures=2)
    api = stacks(api_client)
    created = await api.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", obj)
    assert created["spec"]["retryPolicy"] == policy
    parsed, errors = parse_stack(created)
    assert parsed is not None and errors == []
    assert for_stack(parsed.spec, RetrySettings()) == RetrySettings(
        max_update_failures=2,
        deterministic_base=60,
        deterministic_factor=1,
        transient_base=1,
        transient_factor=1.5,
        transient_cap=30,
        jitter=0.25,
        max_backoff=600,
    )
    # Every field is optional: an empty policy (all the operator's settings) is fine too...
    await api.create_namespaced_custom_object("pulumi.com", "v1", namespace, "stacks", stack(namespace, {}))
    # ...and an update that breaks a bound is refused like a create.
    with pytest.raises(ApiException) as raised:
        await api.patch_namespaced_custom_object(
            "pulumi.com", "v1", namespace, "stacks", obj["metadata"]["name"],
            {"spec": {"retryPolicy": {"deterministic": {"factor": 0.9}}}}, _content_type=MERGE,
        )  # fmt: skip
    assert raised.value.status == 422
    assert "spec.retryPolicy.deterministic.factor" in (raised.value.body or "")

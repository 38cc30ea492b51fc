"""``spec.approval`` and ``spec.driftDetection`` (issue 29) on a real kube-apiserver: a drift interval
under 60 s and an unknown approval mode are refused on write, as the operator's own parse refuses
them; an upstream manifest without either applies unchanged and means "no approval, no drift"."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pko.api.validation import parse_stack

from pko.devtools.stacks import stack as build_stack
from pko.devtools.stacks import unique_name

pytestmark = pytest.mark.cluster


def stack(namespace: str, **spec: Any) -> dict[str, Any]:
    return build_stack(
        unique_name("gate"), namespace, **{"stack": "org/project/dev", "programRef": {"name": "p"}, **spec}
    )


async def create(api_client: Any, obj: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = await client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "pulumi.com", "v1", obj["metadata"]["namespace"], "stacks", obj
    )
    return created


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"driftDetection": {"intervalSeconds": 59}}, "spec.driftDetection.intervalSeconds", "60"),
        ({"driftDetection": {"remediate": True}}, "spec.driftDetection.intervalSeconds", "Required"),
        ({"approval": {"mode": "Sometimes"}}, "spec.approval.mode", "Unsupported value"),
    ],
    ids=["interval-under-a-minute", "interval-missing", "unknown-mode"],
)
async def test_nonsense_is_refused_naming_the_field_as_the_operator_does(
    api_client: Any, namespace: str, spec: dict[str, Any], field: str, says: str
) -> None:
    await refused_naming(api_client, stack(namespace, **spec), field, says)


async def refused_naming(api_client: Any, obj: dict[str, Any], field: str, says: str) -> None:
    """The apiserver refuses ``obj`` (422) naming ``field`` and saying ``says``, and the operator's own
    parse names the same field."""
    with pytest.raises(ApiException) as raised:
        await create(api_client, obj)
    assert raised.value.status == 422, raised.value.body
    message = json.loads(raised.value.body or "{}")["message"]
    assert field in message and says in message, message
    parsed, errors = parse_stack(obj)
    assert parsed is None and [e.path for e in errors] == [field], errors


async def test_an_upstream_manifest_means_no_approval_and_no_drift_detection(
    api_client: Any, namespace: str
) -> None:
    created = await create(api_client, stack(namespace))
    assert "approval" not in created["spec"] and "driftDetection" not in created["spec"]
    parsed, errors = parse_stack(created)
    assert parsed is not None and not errors
    assert parsed.spec.approval is None and parsed.spec.drift_detection is None


async def test_the_fields_are_stored_as_written_with_their_defaults(api_client: Any, namespace: str) -> None:
    created = await create(api_client, stack(namespace, approval={}, driftDetection={"intervalSeconds": 60}))
    parsed, _ = parse_stack(created)
    assert parsed is not None and parsed.spec.approval is not None and parsed.spec.drift_detection
    assert parsed.spec.approval.mode == "Never"
    assert (parsed.spec.drift_detection.interval_seconds, parsed.spec.drift_detection.remediate) == (
        60,
        False,
    )

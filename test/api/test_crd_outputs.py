"""``spec.outputs`` (issue 42) on a real kube-apiserver: a kind other than Secret or ConfigMap, a
name that is no object name, or none, are refused on write, as the operator's own parse refuses
them; a valid one is stored as written (kind defaults to Secret in the model)."""

from __future__ import annotations

from typing import Any

import pytest
from pko.api.validation import parse_stack

from .test_crd_approval_drift import create, refused_naming, stack

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(
    ("outputs", "field", "says"),
    [
        ({"name": "app", "kind": "Deployment"}, "spec.outputs.kind", "Unsupported value"),
        ({"name": "App_Outputs"}, "spec.outputs.name", "should match"),
        ({"name": "x" * 254}, "spec.outputs.name", "253"),
        ({"kind": "Secret"}, "spec.outputs.name", "Required"),
    ],
    ids=["unknown-kind", "not-a-dns-subdomain", "too-long", "name-missing"],
)
async def test_nonsense_is_refused_naming_the_field_as_the_operator_does(
    api_client: Any, namespace: str, outputs: dict[str, Any], field: str, says: str
) -> None:
    await refused_naming(api_client, stack(namespace, outputs=outputs), field, says)


async def test_a_valid_one_is_stored_as_written(api_client: Any, namespace: str) -> None:
    created = await create(api_client, stack(namespace, outputs={"name": "web.outputs"}))
    assert created["spec"]["outputs"] == {"name": "web.outputs"}
    parsed, errors = parse_stack(created)
    assert parsed is not None and not errors and parsed.spec.outputs is not None
    assert (parsed.spec.outputs.name, parsed.spec.outputs.kind) == ("web.outputs", "Secret")

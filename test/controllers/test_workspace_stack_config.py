"""A Workspace stack's config items as the reconciler writes them (pure: no cluster): values,
secrets, JSON detection against the CLI's version, and path keys."""

from __future__ import annotations

import pytest
from pko.api.workspace import WorkspaceSpec

from pko.controllers.workspace.workloads import SpecInvalid, parse_spec

from .builders import workspace


def test_config_items_and_json_detection() -> None:
    from pko.controllers.workspace.reconciler import config_items
    from pko.controllers.workspace.status import has_json_config, incompatible

    spec = parse_spec(
        workspace(
            {
                "stacks": [
                    {
                        "name": "dev",
                        "config": [
                            {"key": "s", "value": "text", "secret": True},
                            {"key": "n", "value": {"a": [1, True]}},
                            {"key": "e", "valueFrom": {"env": "X"}},
                            {"key": "p", "valueFrom": {"path": "/f", "json": True}, "path": False},
                        ],
                    }
                ]
            }
        )
    )
    items = config_items(spec.stacks[0])  # type: ignore[index]
    assert [i.key for i in items] == ["s", "n", "e", "p"]
    assert items[0].value is not None and items[0].value.to_dict() == "text" and items[0].secret is True
    assert items[1].value is not None and items[1].value.to_dict() == {"a": [1, True]}
    assert items[2].value_from is not None and items[2].value_from.env == "X"
    assert items[3].value_from is not None and items[3].value_from.path == "/f" and items[3].value_from.json
    assert has_json_config(spec)
    assert incompatible(spec, "3.201.9") is not None
    assert incompatible(spec, "v3.202.0") is None
    plain = parse_spec(workspace({"stacks": [{"name": "dev", "config": [{"key": "k", "value": "v"}]}]}))
    assert not has_json_config(plain) and incompatible(plain, "3.0.0") is None


def test_path_keys_refuse_structured_values() -> None:
    from pko.controllers.workspace.reconciler import config_items

    body = workspace({"stacks": [{"name": "d", "config": [{"key": "a.b", "path": True, "value": [1]}]}]})
    with pytest.raises(SpecInvalid, match="a path key cannot take a structured value"):
        parse_spec(body)  # the Workspace stalls before any pod is made
    spec = WorkspaceSpec.model_validate(body["spec"])
    with pytest.raises(ValueError, match="path=true"):
        config_items(spec.stacks[0])  # type: ignore[index]  # and the config writer refuses it too

"""docs/security.md's rights tables are what hack/gen_rbac.py generates from the installs' RBAC now,
and the check notices drift (a rule added to config/ without regenerating)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pko.controllers.secretaccess import STACK_SECRETS_ROLE
from pko.devtools import gen_rbac


def test_committed_tables_match_the_rbac() -> None:
    assert gen_rbac.main(["--check"]) == 0, "docs/security.md is out of date: run hack/gen_rbac.py"


def test_check_fails_on_drift(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built = gen_rbac.build
    renders: dict[str, list[dict[str, Any]]] = {}  # each overlay rendered once: three runs of four

    def with_a_new_rule(kubectl: str, overlay: str) -> list[dict[str, Any]]:
        if overlay not in renders:
            renders[overlay] = built(kubectl, overlay)
        objs = copy.deepcopy(renders[overlay])
        for obj in objs:
            if obj["kind"] == "ClusterRole" and obj["metadata"]["name"].endswith("controller-manager"):
                obj["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]})
        return objs

    page = tmp_path / "security.md"
    page.write_text(gen_rbac.PAGE.read_text())
    monkeypatch.setattr(gen_rbac, "PAGE", page)
    monkeypatch.setattr(gen_rbac, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(gen_rbac, "build", with_a_new_rule)
    assert gen_rbac.main(["--check"]) == 1
    assert gen_rbac.main([]) == 0  # rewritten
    assert '| `""` (core) | `secrets` | `list` | cluster-wide |' in page.read_text()
    assert gen_rbac.main(["--check"]) == 0


def test_the_operator_rows_say_where_each_rule_holds() -> None:
    objs = gen_rbac.build("kubectl", "namespaced")
    rows = gen_rbac.operator_rows(objs)
    secrets = [r for r in rows if "`secrets`" in r]
    assert secrets and all("cluster-wide" not in r for r in secrets)
    assert any("`tokenreviews`" in r and r.endswith("cluster-wide |") for r in rows)


def test_the_secrets_per_namespace_component_moves_its_rules_out_of_the_cluster_wide_rights() -> None:
    """Its table: the rules the component's ClusterRole grants where bound, which the operator's
    cluster-wide roles no longer hold; a component that left them cluster-wide too is refused."""
    default = gen_rbac.build("kubectl", "default")
    component = gen_rbac.build("kubectl", gen_rbac.SECRETS_PER_NAMESPACE)
    role, rules = gen_rbac.moved_rules(default, component)
    assert role == STACK_SECRETS_ROLE
    assert rules == [
        {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "create", "update"]}
    ]
    assert not [r for r in gen_rbac.operator_rows(component) if "`secrets`" in r]
    page = gen_rbac.PAGE.read_text()
    assert (
        '| `""` (core) | `secrets`, `configmaps` | `get`, `create`, `update` | each namespace where bound |'
        in page
    )
    added = next(o for o in component if o["kind"] == "ClusterRole" and o["metadata"]["name"] == role)
    with pytest.raises(SystemExit, match="change nothing else"):
        gen_rbac.moved_rules(default, [*default, added])

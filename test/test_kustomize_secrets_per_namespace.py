"""The secrets-per-namespace opt-in, rendered (issue 46): config/components/secrets-per-namespace in an
overlay of config/default, and the chart's ``rbac.secretsPerNamespace``. The manager's ClusterRole
loses exactly its rule on Secrets and ConfigMaps, which the ClusterRole ``pko-stack-secrets`` holds
instead (bound per namespace by the platform team: test/controllers/test_secrets_per_namespace.py);
the default renders are unchanged. The chart tells the operator the name it gives that role (renamed
by nameOverride/fullnameOverride), so a refused Secret's message names a role that exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from helmtest import by_key, config_default, env_of, manager, template
from test_kustomize import CONFIG, build, find

from pko.__main__ import parse_settings
from pko.controllers.secretaccess import STACK_SECRETS_ROLE, SecretAccess

COMPONENT = CONFIG / "components" / "secrets-per-namespace"
MANAGER_ROLE = "pulumi-kubernetes-operator-controller-manager"
SECRETS_RULE = {
    "apiGroups": [""],
    "resources": ["secrets", "configmaps"],
    "verbs": ["get", "create", "update"],
}

Obj = dict[str, Any]


def overlay(tmp_path: Path) -> list[Obj]:
    """config/default with the component, as docs/install.md tells users to write it."""
    root = tmp_path / "install"
    root.mkdir()
    # kustomize refuses absolute paths and paths outside the root's tree: link config/ in.
    (root / "config").symlink_to(CONFIG)
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["config/default"],
                "components": ["config/components/secrets-per-namespace"],
            }
        )
    )
    return build(root)


def without_secrets_rule(rules: list[Obj]) -> list[Obj]:
    assert rules.count(SECRETS_RULE) == 1, rules
    return [r for r in rules if r != SECRETS_RULE]


def test_the_component_moves_the_secrets_rule_to_pko_stack_secrets(tmp_path: Path) -> None:
    default = build(CONFIG / "default")
    objs = overlay(tmp_path)
    before = find(default, "ClusterRole", MANAGER_ROLE)["rules"]
    after = find(objs, "ClusterRole", MANAGER_ROLE)["rules"]
    assert after == without_secrets_rule(before)
    assert not any({"secrets", "configmaps"} & set(r.get("resources", [])) for r in after)
    role = find(objs, "ClusterRole", STACK_SECRETS_ROLE)
    assert role["rules"] == [SECRETS_RULE]
    assert "namespace" not in role["metadata"]
    # Nothing else changes, and the component binds nothing: the platform team does, per namespace.
    key = lambda o: (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))  # noqa: E731
    assert {key(o) for o in objs} - {key(o) for o in default} == {("ClusterRole", STACK_SECRETS_ROLE, None)}
    unchanged = {key(o): o for o in default if o["metadata"]["name"] != MANAGER_ROLE}
    assert all(o == unchanged[key(o)] for o in objs if key(o) in unchanged)
    assert not [o for o in objs if o.get("roleRef", {}).get("name") == STACK_SECRETS_ROLE]


def test_the_example_binding_names_the_role_and_the_operators_account() -> None:
    binding = yaml.safe_load((COMPONENT / "role_binding.example.yaml").read_text())
    sa = find(build(CONFIG / "default"), "ServiceAccount", "controller-manager")
    assert binding["kind"] == "RoleBinding"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": STACK_SECRETS_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "controller-manager", "namespace": sa["metadata"]["namespace"]}
    ]


def test_the_chart_value_renders_what_the_component_does(tmp_path: Path) -> None:
    default = by_key(template(tmp_path))
    opted = by_key(template(tmp_path, "--set", "rbac.secretsPerNamespace=true"))
    manager_key = ("ClusterRole", MANAGER_ROLE, None)
    assert default[manager_key]["rules"] == find(config_default(), "ClusterRole", MANAGER_ROLE)["rules"]
    assert ("ClusterRole", STACK_SECRETS_ROLE, None) not in default
    assert opted[manager_key]["rules"] == without_secrets_rule(default[manager_key]["rules"])
    component = find(overlay(tmp_path), "ClusterRole", STACK_SECRETS_ROLE)
    assert opted[("ClusterRole", STACK_SECRETS_ROLE, None)]["rules"] == component["rules"]
    assert set(opted) - set(default) == {("ClusterRole", STACK_SECRETS_ROLE, None)}
    # The namespaced install's Roles hold the rule already: the value changes nothing there.
    namespaced = by_key(template(tmp_path, "--set", "rbac.namespaced=true"))
    both = by_key(
        template(tmp_path, "--set", "rbac.namespaced=true", "--set", "rbac.secretsPerNamespace=true")
    )
    assert both == namespaced


def stack_secrets_roles(objs: list[Obj]) -> list[str]:
    """The names of the rendered ClusterRoles that grant the Secrets rule alone."""
    return [
        o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole" and o["rules"] == [SECRETS_RULE]
    ]


def test_the_chart_tells_the_operator_the_name_it_gives_the_role(tmp_path: Path) -> None:
    opted = ("--set", "rbac.secretsPerNamespace=true")
    # Not opted in: no variable, config/default's Deployment as it is (the operator's default name).
    assert "STACK_SECRETS_ROLE" not in env_of(manager(template(tmp_path))[1])
    for overrides, expected in (
        ((), STACK_SECRETS_ROLE),
        (("--set", "fullnameOverride=team-pko"), "team-pko-pko-stack-secrets"),
        (("--set", "nameOverride=platform"), "platform"),
    ):
        objs = template(tmp_path, *opted, *overrides)
        (role,) = stack_secrets_roles(objs)
        assert expected in role and (role == STACK_SECRETS_ROLE) == (not overrides), (overrides, role)
        env = env_of(manager(objs)[1])
        assert env["STACK_SECRETS_ROLE"] == role, overrides
        # The operator parses it, and its refusals name that role.
        options = parse_settings([], {"STACK_SECRETS_ROLE": env["STACK_SECRETS_ROLE"]}).controller_options()
        assert options.stack_secrets_role == role
        message = SecretAccess.of(options).forbidden("team-a", "git", verb="read")
        assert f"bind ClusterRole {role} to ServiceAccount " in message, message
    # The namespaced install and rbac.create=false render no such role, and no variable.
    for other in (("--set", "rbac.namespaced=true"), ("--set", "rbac.create=false")):
        objs = template(tmp_path, *opted, *other)
        assert not stack_secrets_roles(objs) and "STACK_SECRETS_ROLE" not in env_of(manager(objs)[1])

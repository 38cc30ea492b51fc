"""Shared WorkspaceTemplates (issue 42) as pure functions: which templates a Stack is built with, the
merge order (operator default < referenced < the Stack's inline workspaceTemplate), the wait for a
missing one, the refusal of another namespace, and the one re-apply of an idle Stack's Workspace
when its templates changed (the control-plane test is test_stack_templates_cluster.py)."""

from __future__ import annotations

from typing import Any

from pko.api.validation import parse_stack

from pko.controllers.stack.ensure import workspace_body
from pko.controllers.stack.plan import ApplyWorkspace, Emit, decide
from pko.controllers.stack.templates import (
    REASON_TEMPLATE_NOT_FOUND,
    TEMPLATES_ANNOTATION,
    Templates,
    default_template_key,
    index_workspace_template,
    resolve_templates,
)
from pko.controllers.stack.workspaceobject import build_workspace
from pko.machinery.controller import Result

from .test_stack_plan import DONE_UP, SETTINGS, SOURCE, condition, kinds, observed, parsed, stack, statuses

Obj = dict[str, Any]

DEFAULT: Obj = {
    "metadata": {"labels": {"team": "platform", "azure.workload.identity/use": "false"}},
    "spec": {
        "image": "registry/pulumi:default",
        "podTemplate": {
            "spec": {
                "nodeSelector": {"pool": "pulumi"},
                "tolerations": [{"key": "pulumi", "operator": "Exists"}],
                "imagePullSecrets": [{"name": "regcred"}],
                "containers": [{"name": "pulumi", "resources": {"requests": {"cpu": "1"}}}],
            }
        },
    },
}
SHARED: Obj = {
    "metadata": {"labels": {"azure.workload.identity/use": "true"}},
    "spec": {
        "image": "registry/pulumi:shared",
        "podTemplate": {
            "spec": {
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "containers": [{"name": "pulumi", "resources": {"requests": {"memory": "1Gi"}}}],
            }
        },
    },
}


def template(namespace: str, name: str, spec: Obj) -> Obj:
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "WorkspaceTemplate",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


CLUSTER = {"ops/base": template("ops", "base", DEFAULT), "ns/shared": template("ns", "shared", SHARED)}


def lookup(key: str) -> Obj | None:
    return CLUSTER.get(key)


def test_the_merge_order_is_default_then_referenced_then_inline() -> None:
    inline = {"spec": {"image": "registry/pulumi:inline"}}
    obj = stack({"workspaceTemplateRef": {"name": "shared"}, "workspaceTemplate": inline}, uid="u")
    model = parsed(obj)
    templates = resolve_templates(model, "ops/base", lookup, served=True)
    assert templates.missing is None and len(templates.layers) == 2
    ws = build_workspace(model, None, templates=templates.layers)
    assert ws["spec"]["image"] == "registry/pulumi:inline"  # inline wins
    pod = ws["spec"]["podTemplate"]["spec"]
    assert pod["nodeSelector"] == {"pool": "pulumi"}  # the default alone sets these
    assert pod["tolerations"] == [{"key": "pulumi", "operator": "Exists"}]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["volumes"] == [{"name": "cache", "emptyDir": {}}]  # the referenced one adds a volume
    (container,) = pod["containers"]  # merged by name, both resources kept
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    labels = ws["metadata"]["labels"]
    assert labels["team"] == "platform" and labels["azure.workload.identity/use"] == "true"
    assert labels["pulumi.com/stack-name"] == "s"  # the Stack's own labels stay
    assert ws["metadata"]["name"] == "s" and ws["metadata"]["namespace"] == "ns"

    without_inline = parsed(stack({"workspaceTemplateRef": {"name": "shared"}}, uid="u"))
    ws = build_workspace(without_inline, None, templates=templates.layers)
    assert ws["spec"]["image"] == "registry/pulumi:shared"  # referenced over the default
    only_default = resolve_templates(parsed(stack(uid="u")), "ops/base", lookup, served=True)
    assert build_workspace(parsed(stack(uid="u")), None, templates=only_default.layers)["spec"]["image"] == (
        "registry/pulumi:default"
    )


def test_templates_never_rename_or_re_home_the_workspace() -> None:
    hostile = {"metadata": {"name": "other", "namespace": "elsewhere"}, "spec": {}}
    ws = build_workspace(parsed(stack(uid="u")), None, templates=[hostile])
    assert (ws["metadata"]["name"], ws["metadata"]["namespace"]) == ("s", "ns")
    assert ws["metadata"]["ownerReferences"][0]["name"] == "s"


def test_the_body_names_the_templates_digest_and_none_without_templates() -> None:
    model = parsed(stack({"workspaceTemplateRef": {"name": "shared"}}, uid="u"))
    templates = resolve_templates(model, None, lookup, served=True)
    body = workspace_body(model, None, SETTINGS.workspace_image, deleting=False, templates=templates)
    assert body["metadata"]["annotations"][TEMPLATES_ANNOTATION] == templates.digest != ""
    plain = workspace_body(parsed(stack(uid="u")), None, SETTINGS.workspace_image, deleting=False,
                           templates=Templates())  # fmt: skip
    assert TEMPLATES_ANNOTATION not in plain["metadata"]["annotations"]
    changed = {**CLUSTER, "ns/shared": template("ns", "shared", {"spec": {"image": "x"}})}
    again = resolve_templates(model, None, changed.get, served=True)
    assert again.digest != templates.digest


def test_a_missing_template_says_which_and_what_to_do() -> None:
    model = parsed(stack({"workspaceTemplateRef": {"name": "nope"}}, uid="u"))
    missing = resolve_templates(model, None, lookup, served=True).missing
    assert missing is not None and '"ns/nope"' in missing and "remove spec.workspaceTemplateRef" in missing
    default_missing = resolve_templates(parsed(stack(uid="u")), "ops/gone", lookup, served=True).missing
    assert default_missing is not None and "--default-workspace-template" in default_missing
    not_served = resolve_templates(model, None, lookup, served=False, recheck=30.0)
    assert not_served.missing is not None and "install" in not_served.missing
    assert not_served.requeue == 30.0  # no event comes when the kind's cache syncs later
    assert resolve_templates(model, None, lookup, served=True).requeue is None  # the watch wakes it
    assert resolve_templates(parsed(stack(uid="u")), None, lookup, served=False) == Templates()


def test_the_default_template_setting_and_the_index() -> None:
    assert default_template_key(None, "pko-system") is None
    assert default_template_key("base", "pko-system") == "pko-system/base"
    assert default_template_key("ops/base", "pko-system") == "ops/base"
    assert index_workspace_template(stack({"workspaceTemplateRef": {"name": "shared"}})) == ["ns/shared"]
    assert index_workspace_template(stack()) == []


def test_a_reference_to_another_namespace_is_refused() -> None:
    obj = stack({"workspaceTemplateRef": {"name": "shared", "namespace": "ops"}})
    _, errors = parse_stack(obj)
    assert [(e.path, e.message) for e in errors] == [
        ("spec.workspaceTemplateRef.namespace", "cross-namespace refs are not allowed")
    ]
    plan = decide(observed(obj))
    assert condition(statuses(plan)[-1], "Stalled")[1] == "SpecInvalid"  # type: ignore[index]
    own = stack({"workspaceTemplateRef": {"name": "shared", "namespace": "ns"}})
    assert parse_stack(own)[1] == []


def test_a_stack_waits_for_its_missing_template_without_polling() -> None:
    obj = stack({"workspaceTemplateRef": {"name": "nope"}})
    templates = resolve_templates(parsed(obj), None, lookup, served=True)
    plan = decide(observed(obj, source=SOURCE, templates=templates))
    assert "ApplyWorkspace" not in kinds(plan) and "CreateUpdate" not in kinds(plan)
    reconciling = condition(statuses(plan)[-1], "Reconciling")
    assert reconciling is not None and reconciling[1] == REASON_TEMPLATE_NOT_FOUND
    assert condition(statuses(plan)[-1], "Stalled") is None
    assert plan.result == Result.done()  # no polling: the WorkspaceTemplate watch wakes it


def test_a_new_stack_applies_its_workspace_with_the_templates() -> None:
    obj = stack({"workspaceTemplateRef": {"name": "shared"}})
    templates = resolve_templates(parsed(obj), "ops/base", lookup, served=True)
    plan = decide(observed(obj, source=SOURCE, templates=templates))
    (apply,) = [w for w in plan.writes if isinstance(w, ApplyWorkspace)]
    assert apply.body["spec"]["image"] == "registry/pulumi:shared"
    assert apply.body["metadata"]["annotations"][TEMPLATES_ANNOTATION] == templates.digest


def applied(obj: Obj, templates: Templates) -> Obj:
    """The Workspace as the API holds it after the Stack applied it with ``templates``, Ready."""
    body = workspace_body(parsed(obj), SOURCE.source, SETTINGS.workspace_image, deleting=False,
                          templates=templates)  # fmt: skip
    return {**body, "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_an_idle_stack_re_applies_its_workspace_once_when_its_templates_change() -> None:
    obj = stack({"workspaceTemplateRef": {"name": "shared"}}, {"lastUpdate": DONE_UP})
    before = resolve_templates(parsed(obj), None, lookup, served=True)
    ws = applied(obj, before)
    # unchanged templates: the idle Stack writes no Workspace
    plan = decide(observed(obj, source=SOURCE, templates=before, workspace=ws))
    assert kinds(plan) == ["WriteStatus", "PruneHistory"]
    changed = {**CLUSTER, "ns/shared": template("ns", "shared", {"spec": {"image": "registry/pulumi:v2"}})}
    after = resolve_templates(parsed(obj), None, changed.get, served=True)
    plan = decide(observed(obj, source=SOURCE, templates=after, workspace=ws))
    assert kinds(plan) == ["WriteStatus", "PruneHistory", "Emit", "ApplyWorkspace"]
    assert [w.reason for w in plan.writes if isinstance(w, Emit)] == ["WorkspaceTemplateChanged"]
    body = plan.writes[-1].body  # type: ignore[union-attr]
    assert body["spec"]["image"] == "registry/pulumi:v2"
    assert body["spec"]["flux"] == ws["spec"]["flux"]  # at the revision it already runs
    # once applied, the next reconcile writes nothing more
    plan = decide(observed(obj, source=SOURCE, templates=after, workspace=applied(obj, after)))
    assert kinds(plan) == ["WriteStatus", "PruneHistory"]
    # a Workspace built before templates existed is not rolled by an operator upgrade
    plain = stack(status={"lastUpdate": DONE_UP})
    plan = decide(observed(plain, source=SOURCE, workspace=applied(plain, Templates())))
    assert kinds(plan) == ["WriteStatus", "PruneHistory"]

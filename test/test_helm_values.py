"""The chart's values for platform teams (issue 39), rendered with the real helm: each renders what it
says, the schema refuses what it should, and the objects stay consistent with each other (every name a
binding, a policy binding or the manager's arguments refer to is an object of the same render). One
cluster test applies a render with every value set to the test apiserver (a server-side dry run), so
the API server itself validates what the values produce.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtest import (
    CHART,
    Obj,
    app_version,
    by_key,
    config_namespace,
    env_of,
    manager,
    refused,
    template,
)

from pko.devtools.kubectl import kubectl

pytestmark = pytest.mark.timeout(900)  # the first test may build helm (hack/build-helm.sh)

DIGEST = "sha256:" + "cd" * 32


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def names(objs: list[Obj], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in of_kind(objs, kind)}


def operator_subjects(objs: list[Obj]) -> set[tuple[str, str]]:
    """(binding kind, ServiceAccount name) of every binding subject that is a ServiceAccount."""
    return {
        (b["kind"], s["name"])
        for b in objs
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in b["subjects"]
        if s["kind"] == "ServiceAccount"
    }


def assert_consistent(objs: list[Obj]) -> None:
    """Every reference between the chart's objects names an object of this render."""
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objs}
    deploy, container = manager(objs)
    sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
    for binding in of_kind(objs, "RoleBinding") + of_kind(objs, "ClusterRoleBinding"):
        ref = binding["roleRef"]
        assert (ref["kind"], ref["name"]) in rendered, binding["metadata"]["name"]
        assert {s["name"] for s in binding["subjects"]} == {sa}, binding["metadata"]["name"]
    for policy_binding in of_kind(objs, "ValidatingAdmissionPolicyBinding"):
        assert ("ValidatingAdmissionPolicy", policy_binding["spec"]["policyName"]) in rendered
    token_role = next(r for r in of_kind(objs, "Role") if "token-request" in r["metadata"]["name"])
    assert token_role["rules"][0]["resourceNames"] == [sa]
    # Workspace pods fetch Program artifacts through the Service the manager advertises.
    adv = next(a for a in container["args"] if a.startswith("--program-fs-adv-addr="))
    service = adv.removeprefix("--program-fs-adv-addr=").split(".")[0]
    fileserver = next(o for o in of_kind(objs, "Service") if o["metadata"]["name"] == service)
    assert adv == f"--program-fs-adv-addr={service}.$(POD_NAMESPACE):80"
    # ... whose port 80 reaches the port the manager's file server listens on, on the manager's pods.
    (port,) = [p for p in fileserver["spec"]["ports"] if p["port"] == 80]
    (listening,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert f"--program-fs-addr=:{listening['containerPort']}" in container["args"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert fileserver["spec"]["selector"].items() <= pod_labels.items()
    assert fileserver["metadata"]["namespace"] == deploy["metadata"]["namespace"]


# ---------------------------------------------------------------------------------- the schema


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ("imagee.tag=x", "additional properties 'imagee' not allowed"),
        ("serviceAccount.nmae=x", "additional properties 'nmae' not allowed"),
        ("replicaCount=abc", "/replicaCount': got string, want integer"),
        ("rbac.create=maybe", "/rbac/create': got string, want boolean"),
        ("controller.logLevel=verbose", "/controller/logLevel'"),
        ("leaderElection.leaseDuration=a minute", "/leaderElection/leaseDuration'"),
        ("image.digest=latest", "/image/digest'"),
        ("podDisruptionBudget.minAvailable=half", "/podDisruptionBudget/minAvailable'"),
        ("fullnameOverride=Platform_PKO", "/fullnameOverride'"),
    ],
)
def test_the_schema_refuses_a_mistyped_key_or_a_wrong_type(helm_home: Path, setting: str, error: str) -> None:
    message = refused(helm_home, "--set", setting)
    assert "don't meet the specifications of the schema" in message
    assert error in message


def test_the_schema_describes_exactly_the_default_values() -> None:
    """values.yaml and values.schema.json come from one description: every key of one is in the other."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def keys(values: dict[str, Any], schema: dict[str, Any], path: str) -> None:
        assert schema["additionalProperties"] is False, path
        assert set(values) == set(schema["properties"]), path
        for name, value in values.items():
            sub = schema["properties"][name]
            if sub.get("additionalProperties") is False:
                keys(value, sub, f"{path}{name}.")

    keys(values, schema, "")


def test_kube_version_is_the_oldest_kubernetes_serving_the_admission_policy(helm_home: Path) -> None:
    assert "kubeVersion" in refused(helm_home, "--kube-version", "1.29.9")
    template(helm_home, "--kube-version", "1.30.0")
    template(helm_home, "--kube-version", "v1.30.4-eks-0123abc")


# ---------------------------------------------------------------------------------- the images


def test_images_compose_registry_repository_tag_and_digest(helm_home: Path) -> None:
    objs = template(
        helm_home,
        "--set", "image.registry=registry.example", "--set", "image.repository=platform/pko",
        "--set", "image.tag=0.9.1", "--set", f"image.digest={DIGEST}",
        "--set", "agent.image.registry=registry.example", "--set", "agent.image.repository=pko-agent",
        "--set", "workspace.image.registry=registry.example",
        "--set", "workspace.image.repository=platform/pko-workspace",
        "--set", f"workspace.image.digest={DIGEST}",
    )  # fmt: skip
    _, container = manager(objs)
    # A release pins NAME:VERSION@sha256:...; an empty tag is the chart's appVersion, never `latest`.
    assert container["image"] == f"registry.example/platform/pko:0.9.1@{DIGEST}"
    env = env_of(container)
    assert env["AGENT_IMAGE"] == f"registry.example/pko-agent:{app_version()}"
    assert env["WORKSPACE_IMAGE"] == f"registry.example/platform/pko-workspace:{app_version()}@{DIGEST}"

    from pko.__main__ import parse_settings

    literal = {k: v for k, v in env.items() if isinstance(v, str)}
    settings = parse_settings(container["args"], {**literal, "POD_NAMESPACE": "ops"})
    assert settings.workspace_image == env["WORKSPACE_IMAGE"]


def test_the_source_trees_tags_are_empty_and_no_workspace_image_is_set_by_default(helm_home: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for image in (values["image"], values["agent"]["image"], values["workspace"]["image"]):
        assert image["tag"] == ""
    _, container = manager(template(helm_home))
    assert container["image"] == f"pko:{app_version()}"
    assert "WORKSPACE_IMAGE" not in env_of(container)
    assert "DEFAULT_WORKSPACE_TEMPLATE" not in env_of(container)


def test_the_default_workspace_template_reaches_the_operators_setting(helm_home: Path) -> None:
    _, container = manager(template(helm_home, "--set", "workspace.defaultTemplate=platform/base"))
    env = env_of(container)
    assert env["DEFAULT_WORKSPACE_TEMPLATE"] == "platform/base"
    from pko.__main__ import parse_settings

    literal = {k: v for k, v in env.items() if isinstance(v, str)}
    settings = parse_settings(container["args"], {**literal, "POD_NAMESPACE": "ops"})
    assert settings.controller_options().default_workspace_template == "platform/base"


# ------------------------------------------------------------------------ ServiceAccount and RBAC


def test_an_existing_service_account_is_used_by_name(helm_home: Path) -> None:
    objs = template(helm_home, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=pko-wi")
    assert not of_kind(objs, "ServiceAccount")
    deploy, _ = manager(objs)
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "pko-wi"
    assert {name for _, name in operator_subjects(objs)} == {"pko-wi"}
    assert_consistent(objs)
    assert "serviceAccount.create=false needs serviceAccount.name" in refused(
        helm_home, "--set", "serviceAccount.create=false"
    )


def test_service_account_annotations_and_name_for_workload_identity(helm_home: Path) -> None:
    role = "arn:aws:iam::123456789012:role/pko"
    objs = template(
        helm_home,
        "--set", "serviceAccount.name=pko-irsa",
        "--set-string", f"serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn={role}",
    )  # fmt: skip
    (sa,) = of_kind(objs, "ServiceAccount")
    assert sa["metadata"]["name"] == "pko-irsa"
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}
    assert_consistent(objs)


def test_rbac_create_false_leaves_out_the_operators_own_roles_and_bindings(helm_home: Path) -> None:
    default = template(helm_home)
    objs = template(helm_home, "--set", "rbac.create=false")
    assert not of_kind(objs, "RoleBinding") and not of_kind(objs, "ClusterRoleBinding")
    assert not of_kind(objs, "Role")
    gone = names(default, "ClusterRole") - names(objs, "ClusterRole")
    assert gone == {"pulumi-kubernetes-operator-controller-manager"}
    # The user-facing roles grant the operator nothing; they stay.
    assert "pko-stack-approver" in names(objs, "ClusterRole")
    assert of_kind(objs, "ServiceAccount") and of_kind(objs, "Deployment")


def test_extra_rules_are_appended_to_the_managers_cluster_role(helm_home: Path, tmp_path: Path) -> None:
    rule = {"apiGroups": ["source.example.io"], "resources": ["buckets"], "verbs": ["get", "list", "watch"]}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"rbac": {"extraRules": [rule]}}))
    default = by_key(template(helm_home))
    objs = by_key(template(helm_home, "--values", str(values)))
    key = ("ClusterRole", "pulumi-kubernetes-operator-controller-manager", None)
    assert objs[key]["rules"] == [*default[key]["rules"], rule]


# ---------------------------------------------------------------------------------- names


def test_fullname_override_renames_every_object_and_every_reference_follows(helm_home: Path) -> None:
    objs = template(helm_home, "--set", "fullnameOverride=pko-b", "--set", "namespace.create=true")
    named = [o for o in objs if o["kind"] not in ("CustomResourceDefinition", "Namespace")]
    assert all(o["metadata"]["name"].startswith("pko-b") for o in named), [
        o["metadata"]["name"] for o in named
    ]
    assert names(objs, "Service") == {"pko-b", "pko-b-metrics"}
    assert names(objs, "Deployment") == {"pko-b-controller-manager"}
    assert names(objs, "ServiceAccount") == {"pko-b-controller-manager"}
    assert "pko-b-stack-approver" not in names(objs, "ClusterRole")  # config's name, prefixed
    assert "pko-b-pko-stack-approver" in names(objs, "ClusterRole")
    assert_consistent(objs)
    _, container = manager(objs)
    assert "--program-fs-adv-addr=pko-b.$(POD_NAMESPACE):80" in container["args"]
    # The CRDs and the namespace are not the release's to rename.
    assert names(objs, "Namespace") == {config_namespace()}


def test_name_override_prefixes_names_with_the_release_as_the_go_chart_does(helm_home: Path) -> None:
    objs = template(helm_home, "--set", "nameOverride=operator")
    assert names(objs, "Service") == {"pko-operator", "pko-operator-metrics"}
    assert_consistent(objs)
    # Labels stay config/'s: NetworkPolicies select the operator pods by app.kubernetes.io/name.
    deploy, _ = manager(objs)
    assert deploy["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == (
        "pulumi-kubernetes-operator"
    )


def test_default_names_are_config_defaults_and_consistent(helm_home: Path) -> None:
    assert_consistent(template(helm_home))


# ---------------------------------------------------------------------------------- the pod


def test_extra_volumes_priority_class_and_probes_land_on_the_manager(helm_home: Path, tmp_path: Path) -> None:
    values: dict[str, Any] = {
        "extraVolumes": [{"name": "git-ca", "configMap": {"name": "corporate-ca"}}],
        "extraVolumeMounts": [{"name": "git-ca", "mountPath": "/etc/ssl/git", "readOnly": True}],
        "priorityClassName": "platform-critical",
        # Helm merges a map into the default: null drops a key of config/'s probe, or the whole probe.
        "livenessProbe": {"httpGet": None, "exec": {"command": ["true"]}, "initialDelaySeconds": None},
        "readinessProbe": None,
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    default_deploy, default_container = manager(template(helm_home))
    deploy, container = manager(template(helm_home, "--values", str(path)))
    pod = deploy["spec"]["template"]["spec"]
    # config's /tmp first, the extra ones after it.
    assert pod["volumes"] == [*default_deploy["spec"]["template"]["spec"]["volumes"], *values["extraVolumes"]]
    assert container["volumeMounts"] == [*default_container["volumeMounts"], *values["extraVolumeMounts"]]
    assert pod["priorityClassName"] == "platform-critical"
    assert container["livenessProbe"] == {"exec": {"command": ["true"]}, "periodSeconds": 20}
    assert default_container["livenessProbe"]["periodSeconds"] == 20
    assert "readinessProbe" not in container
    assert "priorityClassName" not in default_deploy["spec"]["template"]["spec"]
    # The default probes are config/'s (the drift test compares the whole Deployment).
    assert default_container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_pod_disruption_budget(helm_home: Path) -> None:
    assert not of_kind(template(helm_home), "PodDisruptionBudget")
    objs = template(helm_home, "--set", "podDisruptionBudget.enabled=true", namespace="ops")
    (pdb,) = of_kind(objs, "PodDisruptionBudget")
    deploy, _ = manager(objs)
    assert pdb["metadata"]["namespace"] == "ops"
    assert pdb["metadata"]["name"] == deploy["metadata"]["name"]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": deploy["spec"]["selector"]}
    (pdb,) = of_kind(
        template(
            helm_home,
            "--set",
            "podDisruptionBudget.enabled=true",
            "--set",
            "podDisruptionBudget.minAvailable=50%",
        ),
        "PodDisruptionBudget",
    )
    assert pdb["spec"]["minAvailable"] == "50%" and "maxUnavailable" not in pdb["spec"]
    (pdb,) = of_kind(
        template(
            helm_home,
            "--set",
            "podDisruptionBudget.enabled=true",
            "--set",
            "podDisruptionBudget.maxUnavailable=0",
        ),
        "PodDisruptionBudget",
    )
    assert pdb["spec"]["maxUnavailable"] == 0  # 0 is a bound (no voluntary eviction), not "unset"
    assert "not both" in refused(
        helm_home,
        "--set", "podDisruptionBudget.enabled=true",
        "--set", "podDisruptionBudget.minAvailable=1", "--set", "podDisruptionBudget.maxUnavailable=1",
    )  # fmt: skip


# ------------------------------------------------------------------ the apiserver accepts it all

EVERYTHING: dict[str, Any] = {
    "fullnameOverride": "pko-dryrun",
    "namespace": {"create": True},
    "serviceAccount": {"name": "pko-dryrun-sa", "annotations": {"iam.example.com/role": "pko"}},
    "rbac": {
        "extraRules": [{"apiGroups": ["source.example.io"], "resources": ["buckets"], "verbs": ["get"]}]
    },
    "image": {"registry": "registry.example", "tag": "0.9.1", "digest": DIGEST},
    "workspace": {"image": {"repository": "pko-workspace"}},
    "extraVolumes": [{"name": "known-hosts", "configMap": {"name": "known-hosts"}}],
    "extraVolumeMounts": [{"name": "known-hosts", "mountPath": "/etc/ssh/known", "readOnly": True}],
    "priorityClassName": "system-cluster-critical",
    "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
    "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http-probes"}, "timeoutSeconds": 5},
}


@pytest.mark.cluster
def test_the_apiserver_accepts_a_render_with_every_value_set(
    cluster: Any, crds: list[str], helm_home: Path, tmp_path: Path
) -> None:
    """A server-side dry run: the real apiserver validates every object (PDB, volumes, the extra
    rule, the renamed admission policy binding) without keeping any."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(EVERYTHING))
    namespace = "helm-dryrun"
    objs = template(helm_home, "--values", str(path), namespace=namespace)
    ordered = [o for o in objs if o["kind"] == "Namespace"]
    kubectl(cluster, "create", "namespace", namespace)
    try:
        body = [o for o in objs if o["kind"] not in ("Namespace", "CustomResourceDefinition")]
        assert {o["kind"] for o in body} >= {"PodDisruptionBudget", "ServiceAccount", "ClusterRole"}
        out = kubectl(
            cluster,
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=pko-test",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": body}),
        ).stdout
        assert "poddisruptionbudget.policy/pko-dryrun-controller-manager serverside-applied" in out
        assert ordered[0]["metadata"]["name"] == namespace
    finally:
        kubectl(cluster, "delete", "namespace", namespace, "--wait=false", check=False)


def test_the_prometheus_rule_is_config_prometheus_rule_when_enabled(helm_home: Path) -> None:
    assert not of_kind(template(helm_home), "PrometheusRule")
    objs = template(
        helm_home, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=kps",
        namespace="monitoring",
    )  # fmt: skip
    (rule,) = of_kind(objs, "PrometheusRule")
    shipped = yaml.safe_load((CHART.parents[1] / "config" / "prometheus" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == shipped["spec"]
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"

"""The Kustomize tree under config/: every overlay builds, with what users and the operator rely on.

These tests build each overlay with kubectl's built-in kustomize and check the namespace, names, flags,
the restricted security context and least-privilege RBAC. test_kustomize_install.py applies
`config/default` to the real control plane as docs/install.md says and asks the apiserver what the
operator's account may do.
"""

from __future__ import annotations

import functools
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.devtools.kubectl import run as run_kubectl

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"
OVERLAYS = ("crd", "rbac", "manager", "default", "quickstart", "samples", "namespaced")
NAMESPACE = "pulumi-kubernetes-operator"


@functools.cache
def build(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize <path>` as a list of objects (cached: callers must not modify it)."""
    out = run_kubectl("kustomize", str(path)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def identity(obj: dict[str, Any]) -> tuple[str, str, str | None]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


@pytest.fixture(scope="module")
def default_objs() -> list[dict[str, Any]]:
    return build(CONFIG / "default")


@pytest.fixture(scope="module")
def manager_container(default_objs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = find(default_objs, "Deployment", "controller-manager")
    containers: list[dict[str, Any]] = deploy["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "manager")


# ---------------------------------------------------------------- pure: overlays build


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds(overlay: str) -> None:
    objs = build(CONFIG / overlay)
    assert objs, f"config/{overlay} built no objects"
    for o in objs:
        assert o.get("apiVersion") and o.get("kind") and o.get("metadata", {}).get("name"), o


def test_default_puts_every_namespaced_object_in_the_operator_namespace(
    default_objs: list[dict[str, Any]],
) -> None:
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for o in default_objs:
        if o["kind"] in cluster_scoped:
            assert "namespace" not in o["metadata"], o["metadata"]
        else:
            assert o["metadata"].get("namespace") == NAMESPACE, (o["kind"], o["metadata"])
    assert [o["metadata"]["name"] for o in default_objs if o["kind"] == "Namespace"] == [NAMESPACE]


def test_default_includes_the_crds_rbac_and_manager(default_objs: list[dict[str, Any]]) -> None:
    crd_names = {o["metadata"]["name"] for o in default_objs if o["kind"] == "CustomResourceDefinition"}
    assert crd_names == {
        "stacks.pulumi.com",
        "programs.pulumi.com",
        "workspaces.auto.pulumi.com",
        "workspacetemplates.auto.pulumi.com",
        "updates.auto.pulumi.com",
    }
    find(default_objs, "ServiceAccount", "controller-manager")
    find(default_objs, "ClusterRole", "pulumi-kubernetes-operator-controller-manager")
    find(default_objs, "Role", "leader-election-role")
    find(default_objs, "Deployment", "controller-manager")
    find(default_objs, "ValidatingAdmissionPolicy", "pulumi-kubernetes-operator-plan-approval")
    find(default_objs, "ValidatingAdmissionPolicyBinding", "pulumi-kubernetes-operator-plan-approval")


def test_plan_approval_is_enforced_by_a_policy_not_a_webhook(default_objs: list[dict[str, Any]]) -> None:
    policy = find(default_objs, "ValidatingAdmissionPolicy", "pulumi-kubernetes-operator-plan-approval")
    binding = find(
        default_objs, "ValidatingAdmissionPolicyBinding", "pulumi-kubernetes-operator-plan-approval"
    )
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == (
        ["pulumi.com"],
        ["stacks"],
        ["CREATE", "UPDATE"],
    )
    (validation,) = policy["spec"]["validations"]
    assert validation["reason"] == "Forbidden"  # 403, as RBAC refuses
    assert ".check('approve').allowed()" in validation["expression"]
    assert not [o for o in default_objs if o["kind"].startswith("ValidatingWebhook")]


def test_approving_is_granted_on_purpose(default_objs: list[dict[str, Any]]) -> None:
    def approves(role: dict[str, Any]) -> bool:
        return any(
            "approve" in r.get("verbs", []) and "stacks" in r.get("resources", [])
            for r in role.get("rules") or []
        )

    roles = {o["metadata"]["name"]: o for o in default_objs if o["kind"] == "ClusterRole"}
    assert {name for name, role in roles.items() if approves(role)} == {
        "pko-stack-approver",
        "pulumi-kubernetes-operator-approve",
    }
    aggregated = roles["pulumi-kubernetes-operator-approve"]["metadata"]["labels"]
    assert aggregated.get("rbac.authorization.k8s.io/aggregate-to-admin") == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in aggregated
    standalone = roles["pko-stack-approver"]["metadata"]["labels"]
    assert not [k for k in standalone if k.startswith("rbac.authorization.k8s.io/aggregate-to")]


def test_every_binding_names_the_operator_service_account(default_objs: list[dict[str, Any]]) -> None:
    bindings = [o for o in default_objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) >= 3
    for b in bindings:
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "controller-manager", "namespace": NAMESPACE}
        ]
        role_kind, role_name = b["roleRef"]["kind"], b["roleRef"]["name"]
        if role_name != "system:auth-delegator":
            find(default_objs, role_kind, role_name)


def test_manager_flags_match_the_operator_cli(manager_container: dict[str, Any]) -> None:
    args = manager_container["args"]
    assert "--leader-elect" in args
    assert "--metrics-bind-address=:8383" in args
    assert "--health-probe-bind-address=:8081" in args
    assert "--program-fs-addr=:9090" in args
    assert "--program-fs-adv-addr=pulumi-kubernetes-operator.$(POD_NAMESPACE):80" in args
    assert "--log-level=info" in args and "--log-format=json" in args
    env = {
        e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in manager_container["env"]
    }
    assert env == {
        "POD_NAMESPACE": "metadata.namespace",
        # the leader election's predecessor rule: a restarted container takes its pod's Lease at once
        "POD_NAME": "metadata.name",
        "POD_SA_NAME": "spec.serviceAccountName",
        "AGENT_IMAGE": "pko-agent:latest",
        "AGENT_IMAGE_PULL_POLICY": "IfNotPresent",
    }
    ports = {p["name"]: p["containerPort"] for p in manager_container["ports"]}
    assert ports == {"http-metrics": 8383, "http-fileserver": 9090, "http-probes": 8081}
    assert manager_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert manager_container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert manager_container["resources"]["requests"].keys() >= {"cpu", "memory"}


def test_manager_args_are_accepted_by_the_operator_cli(
    default_objs: list[dict[str, Any]], manager_container: dict[str, Any]
) -> None:
    from pko.__main__ import parse_settings

    env = {"POD_NAMESPACE": NAMESPACE, "POD_SA_NAME": "controller-manager"}
    # The kubelet expands $(VAR) references to the container's env before exec.
    argv = [a.replace("$(POD_NAMESPACE)", NAMESPACE) for a in manager_container["args"]]
    settings = parse_settings(argv, env)
    assert settings.leader_elect
    assert settings.leader_election_namespace == NAMESPACE
    assert settings.metrics_bind_address == ":8383"
    assert settings.health_probe_bind_address == ":8081"
    assert settings.program_fs_addr == ":9090"
    assert settings.program_fs_adv_addr == f"pulumi-kubernetes-operator.{NAMESPACE}:80"
    assert (settings.log_level, settings.log_format) == ("info", "json")
    pod = find(default_objs, "Deployment", "controller-manager")["spec"]["template"]["spec"]
    # Kubernetes must not SIGKILL the manager while it still drains in-flight reconciles.
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace_period


def test_manager_runs_under_the_restricted_pod_security_profile(
    default_objs: list[dict[str, Any]], manager_container: dict[str, Any]
) -> None:
    pod = find(default_objs, "Deployment", "controller-manager")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "controller-manager"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = manager_container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_services_select_the_manager_pod(
    default_objs: list[dict[str, Any]], manager_container: dict[str, Any]
) -> None:
    pod_labels = find(default_objs, "Deployment", "controller-manager")["spec"]["template"]["metadata"][
        "labels"
    ]
    port_names = {p["name"] for p in manager_container["ports"]}
    fileserver = find(default_objs, "Service", "pulumi-kubernetes-operator")
    metrics = find(default_objs, "Service", "pulumi-kubernetes-operator-metrics")
    for svc in (fileserver, metrics):
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    assert [(p["port"], p["targetPort"]) for p in fileserver["spec"]["ports"]] == [(80, "http-fileserver")]
    assert [(p["port"], p["targetPort"]) for p in metrics["spec"]["ports"]] == [(8383, "http-metrics")]


def test_manager_image_is_overridable_with_kustomize_images(tmp_path: Path) -> None:
    # kustomize accepts only relative paths to other kustomizations.
    base = os.path.relpath(CONFIG / "default", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        textwrap.dedent(
            f"""\
            resources:
              - {base}
            images:
              - name: pko
                newName: registry.example/pko
                newTag: v9.9.9
            """
        )
    )
    deploy = find(build(tmp_path), "Deployment", "controller-manager")
    images = [c["image"] for c in deploy["spec"]["template"]["spec"]["containers"]]
    assert images == ["registry.example/pko:v9.9.9"]


def test_quickstart_adds_the_default_pulumi_workspace_identity(default_objs: list[dict[str, Any]]) -> None:
    objs = build(CONFIG / "quickstart")
    sa = find(objs, "ServiceAccount", "pulumi")
    assert sa["metadata"]["namespace"] == "default"
    crb = find(objs, "ClusterRoleBinding", "default:pulumi:system:auth-delegator")
    assert crb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:auth-delegator",
    }
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "pulumi", "namespace": "default"}]
    # Everything config/default installs is in the quickstart too.
    assert {identity(o) for o in default_objs} <= {identity(o) for o in objs}


# Cluster-scoped resources the operator's rules name: a namespaced install leaves them out of its Role.
CLUSTER_SCOPED_RESOURCES = {"nodes", "tokenreviews", "subjectaccessreviews"}


def test_the_namespaced_install_binds_the_operator_by_a_role_in_the_watched_namespace(
    default_objs: list[dict[str, Any]],
) -> None:
    """config/namespaced: the operator's rules on namespaced resources are a Role of the watched
    namespace, exactly those of the cluster-wide ClusterRole (so the two cannot drift); its
    ClusterRole keeps only the token and access reviews; the Deployment watches that namespace."""
    objs = build(CONFIG / "namespaced")
    full = find(default_objs, "ClusterRole", "pulumi-kubernetes-operator-controller-manager")["rules"]
    role = find(objs, "Role", "pulumi-kubernetes-operator-watched")
    assert role["rules"] == [r for r in full if not set(r["resources"]) & CLUSTER_SCOPED_RESOURCES]
    binding = find(objs, "RoleBinding", "pulumi-kubernetes-operator-watched")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == NAMESPACE
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "controller-manager", "namespace": NAMESPACE}
    ]

    cut = find(objs, "ClusterRole", "pulumi-kubernetes-operator-controller-manager")["rules"]
    assert {res for r in cut for res in r["resources"]} == {"tokenreviews", "subjectaccessreviews"}
    assert all(r["verbs"] == ["create"] for r in cut)
    operator_bindings = [
        o
        for o in objs
        if o["kind"] == "ClusterRoleBinding" and o["subjects"][0]["name"] == "controller-manager"
    ]
    assert [b["roleRef"]["name"] for b in operator_bindings] == [
        "pulumi-kubernetes-operator-controller-manager"
    ]

    deploy = find(objs, "Deployment", "controller-manager")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WATCH_NAMESPACES"] == NAMESPACE
    # Everything else is config/default's, unchanged.
    rest = {identity(o) for o in objs} - {identity(role), identity(binding)}
    assert rest == {identity(o) for o in default_objs}


def test_the_namespaced_install_watches_the_namespace_its_role_is_set_to(tmp_path: Path) -> None:
    """One place to change: `kustomize edit set namespace` in config/namespaced/watched."""
    import shutil

    shutil.copytree(CONFIG, tmp_path / "config")
    watched = tmp_path / "config" / "namespaced" / "watched" / "kustomization.yaml"
    watched.write_text(watched.read_text().replace(f"namespace: {NAMESPACE}", "namespace: team-a"))
    objs = build(tmp_path / "config" / "namespaced")
    assert find(objs, "Role", "pulumi-kubernetes-operator-watched")["metadata"]["namespace"] == "team-a"
    binding = find(objs, "RoleBinding", "pulumi-kubernetes-operator-watched")
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["subjects"][0]["namespace"] == NAMESPACE  # the operator's account stays where it is
    deploy = find(objs, "Deployment", "controller-manager")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WATCH_NAMESPACES"] == "team-a"


def test_sample_stack_deploys_the_sample_program_with_its_state_on_a_claim() -> None:
    objs = build(CONFIG / "samples")
    program = find(objs, "Program", "hello")
    stack = find(objs, "Stack", "hello")
    assert stack["spec"]["programRef"] == {"name": program["metadata"]["name"]}
    assert stack["spec"]["backend"].startswith("file:///")
    assert stack["spec"]["serviceAccountName"] == "pulumi"  # created by config/quickstart
    state_dir = stack["spec"]["backend"].removeprefix("file://")
    pod = stack["spec"]["workspaceTemplate"]["spec"]["podTemplate"]["spec"]
    mounts = [m for c in pod["containers"] for m in c.get("volumeMounts", []) if c["name"] == "pulumi"]
    assert [m["mountPath"] for m in mounts] == [state_dir], "the file backend must live on a mounted volume"
    # ... a PersistentVolumeClaim, so the state outlives the workspace pod (never an emptyDir)
    (volume,) = pod["volumes"]
    assert volume["name"] == mounts[0]["name"]
    claim = find(objs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert "storageClassName" not in claim["spec"]  # the cluster's default class
    # The program's resources are Kubernetes objects the workspace's ServiceAccount may manage.
    kinds = {r["type"] for r in program["program"]["resources"].values()}
    assert kinds == {"kubernetes:core/v1:ConfigMap", "kubernetes:apps/v1:Deployment"}
    binding = find(objs, "RoleBinding", "pulumi-hello")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pulumi"}]
    assert program["program"]["outputs"]["greeting"] == {"fn::secret": '${page.data["index.html"]}'}

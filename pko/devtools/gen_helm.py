#!/usr/bin/env python3
"""Write charts/pko, the Helm chart, from what `kubectl kustomize config/default` renders.

Usage:
    hack/gen_helm.py                      # (re)write charts/pko and the values table of docs/helm.md
    hack/gen_helm.py --check              # exit 1 and list the files that differ from what config/ gives
    hack/gen_helm.py --kubectl PATH ...   # the kubectl whose kustomize to run (default: `kubectl` on
                                          # PATH; hack/test.sh puts the control plane's first)

Kustomize stays the primary install path, and the chart cannot drift from it: every object of the chart
is an object of config/default, with values substituted at fixed places, and rendered with the default
values it is that object again, but for the image tags, which are the chart's appVersion where config/
says `latest` (test/test_helm_chart.py renders it with the real helm and compares).
Where the values go, and nothing else:

- the namespace: wherever kustomize's namespace transformer puts it (found by rendering config/default
  a second time under a sentinel namespace and taking the fields that change), and in the
  ``system:serviceaccount:<ns>:`` user names of strings such as CEL expressions, becomes
  ``{{ .Release.Namespace }}``; the Namespace object itself is rendered only with
  ``namespace.create=true`` (Helm's release namespace exists before the chart's objects do);
- every object's name becomes ``pko.objname`` of config's name (config's name unless nameOverride or
  fullnameOverride), and so does every reference to it (roleRef, the admission policy binding's
  policyName, the file server Service in ``--program-fs-adv-addr``); the manager's ServiceAccount is
  ``pko.serviceAccountName`` wherever config names it (the Deployment, binding subjects, the token
  request Role's resourceNames, ``system:serviceaccount:`` strings), rendered only with
  ``serviceAccount.create``; the operator's own Roles, ClusterRoles and their bindings (those bound to
  that ServiceAccount) only with ``rbac.create``, the manager's ClusterRole with ``rbac.extraRules``;
- ``app.kubernetes.io/managed-by: kustomize`` says ``{{ .Release.Service }}`` (Helm);
- the manager Deployment: replicas, the manager, agent and workspace images and pull policies,
  resources, both security contexts, probes, the grace period, priorityClassName, ``--leader-elect``
  and the log flags, optional environment (leader election timings, WATCH_NAMESPACE, KUBE_API_TIMEOUT,
  FLUX_MAX_UNTAR_SIZE_BYTES, EVENTS_ADDRESS, WORKSPACE_IMAGE, DEFAULT_WORKSPACE_TEMPLATE, WORKSPACE_METRICS,
  STACK_SECRETS_ROLE with rbac.secretsPerNamespace, extraEnv),
  extra volumes and mounts, pod annotations and labels, scheduling (nodeSelector, affinity,
  tolerations), imagePullSecrets;
- the metrics Service (the Service whose only port is named ``http-metrics``) exists only while
  ``metrics.service.enabled``; a ServiceMonitor for it is added with ``serviceMonitor.enabled``, a
  PodMonitor of the workspace agents' metrics with ``podMonitor.enabled`` (helm_podmonitor.py), a
  PodDisruptionBudget for the manager with ``podDisruptionBudget.enabled``, config/prometheus's
  PrometheusRule with ``prometheusRule.enabled`` (its spec in files/, helm_templates.py).

The values are described once, in helm_values.py, with config/'s settings as their defaults:
values.yaml, values.schema.json and the values table of docs/helm.md are written from that description.
Anything config/ changes that the generator relies on (one Deployment, its ``manager`` container, the
``--leader-elect``, ``--log-*`` and ``--program-fs-adv-addr`` flags, the metrics port, the probes)
fails the generator with the reason rather than producing a chart that quietly differs. The CRDs go to
charts/pko/crds/ unchanged (Helm installs them before the templates and never upgrades or deletes them).

Hand-kept, not written here (the --check leaves them alone): charts/pko/README.md, and docs/helm.md
but for its values table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from pko.devtools import helm_namespaced, helm_podmonitor, helm_templates, helm_values
from pko.devtools.helm_markers import (
    MARK,
    NS_MARK,
    Markers,
    Obj,
    apply_markers,
    dump,
    one,
    with_items,
    with_key,
)
from pko.devtools.helm_names import Names
from pko.version import VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DEFAULT = REPO_ROOT / "config" / "default"
CHART = REPO_ROOT / "charts" / "pko"
PROMETHEUS_RULE = REPO_ROOT / "config" / "prometheus" / "prometheusrule.yaml"
DOCS = REPO_ROOT / "docs" / "helm.md"
# Written by hand, not by this script (the --check leaves it alone).
HAND_WRITTEN = frozenset({CHART / "README.md"})
# docs/helm.md is hand-written but for the values table between these lines.
TABLE_BEGIN = "<!-- values: generated by hack/gen_helm.py from pko/devtools/helm_values.py -->"
TABLE_END = "<!-- end of the generated values -->"
SENTINEL_NAMESPACE = "pko-helm-sentinel-namespace"
MANAGED_BY = "app.kubernetes.io/managed-by"
METRICS_PORT = "http-metrics"
METRICS_READER_RULES = [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


# ------------------------------------------------------------------------------------ rendering config/


def kustomize(kubectl: str, path: Path) -> list[Obj]:
    proc = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"gen_helm: {kubectl} kustomize {path} failed:\n{proc.stderr}")
    # libyaml's loader where PyYAML has it (the CRDs take a second to parse in pure Python).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(proc.stdout, Loader=loader) if doc]


def render_config(kubectl: str) -> tuple[list[Obj], list[Obj]]:
    """config/default as kustomize renders it, and the same under a sentinel namespace (an overlay that
    only sets ``namespace:``): the fields that differ are those that hold the install namespace."""
    objs = kustomize(kubectl, CONFIG_DEFAULT)
    with tempfile.TemporaryDirectory(prefix="gen-helm-") as tmp:
        # Kustomize refuses absolute paths to a base: name it relative to the overlay.
        base = os.path.relpath(CONFIG_DEFAULT, tmp)
        (Path(tmp) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"namespace: {SENTINEL_NAMESPACE}\nresources:\n  - {base}\n"
        )
        moved = kustomize(kubectl, Path(tmp))
    if len(objs) != len(moved):
        raise SystemExit("gen_helm: the sentinel-namespace render has a different number of objects")
    return objs, moved


def config_namespace(objs: list[Obj]) -> str:
    namespaces = {o["metadata"]["namespace"] for o in objs if "namespace" in o["metadata"]}
    if len(namespaces) != 1:
        raise SystemExit(
            f"gen_helm: config/default puts objects in {sorted(namespaces)}, expected one namespace"
        )
    return str(namespaces.pop())


def mark_namespace(obj: Any, moved: Any, namespace: str) -> Any:
    """``obj`` with the install namespace replaced by NS_MARK wherever kustomize moved it (``moved`` is the
    same object under the sentinel namespace), and in ``system:serviceaccount:<ns>:`` user names."""
    if isinstance(obj, dict):
        if not isinstance(moved, dict) or moved.keys() != obj.keys():
            raise SystemExit(f"gen_helm: the sentinel render differs in shape at {obj!r:.200}")
        return {k: mark_namespace(v, moved[k], namespace) for k, v in obj.items()}
    if isinstance(obj, list):
        if not isinstance(moved, list) or len(moved) != len(obj):
            raise SystemExit(f"gen_helm: the sentinel render differs in shape at {obj!r:.200}")
        return [mark_namespace(v, m, namespace) for v, m in zip(obj, moved, strict=True)]
    if isinstance(obj, str):
        if obj != moved:
            if moved != obj.replace(namespace, SENTINEL_NAMESPACE):
                raise SystemExit(f"gen_helm: {obj!r} changes under another namespace other than by its name")
            return obj.replace(namespace, NS_MARK)
        return obj.replace(f"system:serviceaccount:{namespace}:", f"system:serviceaccount:{NS_MARK}:")
    if obj != moved:
        raise SystemExit(f"gen_helm: {obj!r} changes under another namespace")
    return obj


# ---------------------------------------------------------------------------------------- the chart


def parse_image(ref: str) -> dict[str, str]:
    """``[registry/]repository[:tag][@digest]`` split the way the chart's ``pko.image`` joins it back."""
    rest, _, digest = ref.partition("@")
    registry = ""
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, remainder
    tag = ""
    if ":" in rest.rsplit("/", 1)[-1]:
        rest, _, tag = rest.rpartition(":")
    image = {"registry": registry, "repository": rest, "tag": tag, "digest": digest}
    if join_image(image) != ref:
        raise SystemExit(f"gen_helm: cannot split image reference {ref!r}")
    return image


def join_image(image: dict[str, str]) -> str:
    """What the chart's ``pko.image`` helper renders, given a tag (the Python twin, to check
    parse_image): ``REGISTRY/REPOSITORY:TAG@DIGEST``."""
    ref = (image["registry"] + "/" if image["registry"] else "") + image["repository"]
    ref += ":" + image["tag"] if image["tag"] else ""
    return ref + ("@" + image["digest"] if image["digest"] else "")


def helm_labels(obj: Obj) -> None:
    labels = obj["metadata"].get("labels") or {}
    if labels.get(MANAGED_BY) == "kustomize":
        labels[MANAGED_BY] = MARK + "MANAGED_BY"


def template_deployment(deploy: Obj, markers: Markers, found: dict[str, Any]) -> None:
    """Put the values' markers into the manager Deployment, and record config's settings in ``found``
    (the values' defaults: helm_values.py)."""
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    meta = spec["template"].setdefault("metadata", {})
    container_name = meta.get("annotations", {}).get("kubectl.kubernetes.io/default-container", "manager")
    container = one(
        [c for c in pod["containers"] if c["name"] == container_name], f"container {container_name}"
    )

    found["replicas"] = spec.get("replicas", 1)
    spec["replicas"] = markers.new_inline("REPLICAS", "{{ .Values.replicaCount | int64 }}")

    if "annotations" in deploy["metadata"]:
        raise SystemExit(
            "gen_helm: config/ annotates the Deployment: make it deploymentAnnotations' default first"
        )
    deploy["metadata"]["annotations"] = markers.new_block(
        "DEPLOYMENT_ANNOTATIONS", with_key(".Values.deploymentAnnotations")
    )
    # Added to the pod template's own annotations and labels (the selector's labels stay as they are).
    meta.setdefault("annotations", {})[
        markers.new_block("POD_ANNOTATIONS", with_items(".Values.podAnnotations"))
    ] = None
    meta.setdefault("labels", {})[markers.new_block("POD_LABELS", with_items(".Values.podLabels"))] = None

    found["image"] = parse_image(container["image"])
    found["image_pull_policy"] = container.get("imagePullPolicy", "IfNotPresent")
    env = container.setdefault("env", [])
    agent_image = one([e for e in env if e["name"] == "AGENT_IMAGE"], "AGENT_IMAGE variable")
    agent_policy = one([e for e in env if e["name"] == "AGENT_IMAGE_PULL_POLICY"], "AGENT_IMAGE_PULL_POLICY")
    found["agent_image"] = parse_image(agent_image["value"])
    found["agent_pull_policy"] = agent_policy["value"]
    agent_image["value"] = markers.new_inline(
        "AGENT_IMAGE", '{{ include "pko.image" (dict "image" .Values.agent.image "chart" .Chart) | quote }}'
    )
    agent_policy["value"] = markers.new_inline(
        "AGENT_PULL_POLICY", "{{ .Values.agent.image.pullPolicy | quote }}"
    )

    args = container.get("args", [])
    if "--leader-elect" not in args:
        raise SystemExit(
            "gen_helm: the manager's args have no --leader-elect (the leaderElection.enabled value)"
        )
    new_args: list[str] = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if arg == "--leader-elect":
            new_args.append(
                markers.new_block(
                    "LEADER_ELECT", "{{- if .Values.leaderElection.enabled }}\n- --leader-elect\n{{- end }}"
                )
            )
        elif flag in ("--log-level", "--log-format"):
            key = "logLevel" if flag == "--log-level" else "logFormat"
            found["log_level" if key == "logLevel" else "log_format"] = value
            new_args.append(
                markers.new_inline(
                    key.upper(),
                    f'{{{{ printf "{flag}=%s" (include "pko.string" .Values.controller.{key}) | quote }}}}',
                )
            )
        else:
            new_args.append(arg)
    if not {"log_level", "log_format"} <= found.keys():
        raise SystemExit("gen_helm: the manager's args lack --log-level=... or --log-format=...")
    container["args"] = new_args

    optional = (
        ("LEADER_ELECTION_ID", ".Values.leaderElection.id"),
        ("LEADER_ELECTION_LEASE_DURATION", ".Values.leaderElection.leaseDuration"),
        ("LEADER_ELECTION_RENEW_DEADLINE", ".Values.leaderElection.renewDeadline"),
        ("LEADER_ELECTION_RETRY_PERIOD", ".Values.leaderElection.retryPeriod"),
        ("WATCH_NAMESPACE", ".Values.watchNamespace"),
        ("KUBE_API_TIMEOUT", ".Values.kubeAPI.timeout"),
        ("FLUX_MAX_UNTAR_SIZE_BYTES", ".Values.flux.maxUntarSizeBytes"),
        ("EVENTS_ADDRESS", ".Values.flux.eventsAddress"),
        ("ALLOW_INSECURE_GIT_CREDENTIALS", ".Values.git.allowInsecureCredentials"),
        ("DEFAULT_WORKSPACE_TEMPLATE", ".Values.workspace.defaultTemplate"),
        ("WORKSPACE_METRICS", ".Values.workspace.metrics"),
    )
    own = {name for name, _ in optional} | {"WORKSPACE_IMAGE"} | helm_namespaced.OWN_ENV
    taken = sorted(own & {e["name"] for e in env})
    if taken:
        raise SystemExit(f"gen_helm: config/ sets {taken} itself: the chart's values would duplicate them")
    optional_env = "\n".join(
        f"{{{{- with {value} }}}}\n- name: {name}\n"
        '  value: {{ include "pko.string" . | quote }}\n{{- end }}'
        for name, value in optional
    )
    # The workspace image only when it names a repository (else the operator's own default).
    optional_env += (
        "\n{{- if .Values.workspace.image.repository }}\n- name: WORKSPACE_IMAGE\n"
        '  value: {{ include "pko.image" (dict "image" .Values.workspace.image "chart" .Chart) | quote }}'
        "\n{{- end }}"
    )
    optional_env += "\n" + helm_namespaced.manager_env()
    env.append(markers.new_block("OPTIONAL_ENV", optional_env))
    env.append(markers.new_block("EXTRA_ENV", with_items(".Values.extraEnv")))

    needed = {"resources", "securityContext", "livenessProbe", "readinessProbe"}
    if "terminationGracePeriodSeconds" not in pod or not needed <= container.keys():
        raise SystemExit(
            "gen_helm: the manager pod lacks terminationGracePeriodSeconds, resources, securityContext "
            "or a probe"
        )
    found["resources"] = container["resources"]
    found["security_context"] = container["securityContext"]
    found["liveness_probe"] = container["livenessProbe"]
    found["readiness_probe"] = container["readinessProbe"]
    found["pod_security_context"] = pod.get("securityContext", {})
    found["grace"] = pod["terminationGracePeriodSeconds"]
    pod["terminationGracePeriodSeconds"] = markers.new_inline(
        "GRACE", "{{ .Values.terminationGracePeriodSeconds | int64 }}"
    )
    pod["securityContext"] = markers.new_block("POD_SECURITY", with_key(".Values.podSecurityContext"))
    for key, marker, value in (
        ("imagePullSecrets", "PULL_SECRETS", ".Values.imagePullSecrets"),
        ("nodeSelector", "NODE_SELECTOR", ".Values.nodeSelector"),
        ("affinity", "AFFINITY", ".Values.affinity"),
        ("tolerations", "TOLERATIONS", ".Values.tolerations"),
        ("priorityClassName", "PRIORITY_CLASS", ".Values.priorityClassName"),
    ):
        if key in pod:
            raise SystemExit(f"gen_helm: config/ sets the pod's {key}: make it the value's default first")
        pod[key] = markers.new_block(marker, with_key(value))
    # Extra volumes after config's (the read-only root filesystem's /tmp).
    if "volumes" in pod:
        pod["volumes"].append(markers.new_block("EXTRA_VOLUMES", with_items(".Values.extraVolumes")))
    else:
        pod["volumes"] = markers.new_block("EXTRA_VOLUMES", with_key(".Values.extraVolumes"))

    # The container's name first: a block marker must not sit on a list item's `- ` line.
    rest = {k: v for k, v in container.items() if k != "name"}
    rest["image"] = markers.new_inline(
        "IMAGE", '{{ include "pko.image" (dict "image" .Values.image "chart" .Chart) | quote }}'
    )
    rest["imagePullPolicy"] = markers.new_inline("PULL_POLICY", "{{ .Values.image.pullPolicy }}")
    rest["resources"] = markers.new_block("RESOURCES", with_key(".Values.resources"))
    rest["securityContext"] = markers.new_block("SECURITY", with_key(".Values.securityContext"))
    rest["livenessProbe"] = markers.new_block("LIVENESS", with_key(".Values.livenessProbe"))
    rest["readinessProbe"] = markers.new_block("READINESS", with_key(".Values.readinessProbe"))
    if "volumeMounts" in rest:
        rest["volumeMounts"].append(
            markers.new_block("EXTRA_MOUNTS", with_items(".Values.extraVolumeMounts"))
        )
    else:
        rest["volumeMounts"] = markers.new_block("EXTRA_MOUNTS", with_key(".Values.extraVolumeMounts"))
    container.clear()
    container.update({"name": container_name, **rest})


def file_name(obj: Obj) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def build_chart(objs: list[Obj], moved: list[Obj], version: str) -> dict[str, str]:
    """The chart's files (path in the chart -> text) from config/default's objects (``moved``: the same
    under the sentinel namespace)."""
    return build(objs, moved, version)[0]


def build(
    objs: list[Obj], moved: list[Obj], version: str
) -> tuple[dict[str, str], tuple[helm_values.Node, ...]]:
    """The chart's files, and the description of its values they were written from."""
    namespace = config_namespace(objs)
    text = json.dumps(objs)
    if MARK in text or SENTINEL_NAMESPACE in text:
        raise SystemExit(f"gen_helm: config/default contains {MARK} or {SENTINEL_NAMESPACE}")
    files: dict[str, str] = {}
    found: dict[str, Any] = {}
    header = "# Generated by hack/gen_helm.py from `kubectl kustomize config/default`. DO NOT EDIT.\n"

    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        files[f"crds/{crd['metadata']['name']}.yaml"] = header + dump(crd)

    deploy = one([o for o in objs if o["kind"] == "Deployment"], "Deployment")
    prefix = (deploy["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
    if not prefix:
        raise SystemExit("gen_helm: the Deployment has no app.kubernetes.io/name label (the names' prefix)")
    found["name_prefix"] = prefix
    sa_name = deploy["spec"]["template"]["spec"].get("serviceAccountName", "")
    one(
        [o for o in objs if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == sa_name],
        f"ServiceAccount {sa_name!r} (the manager pod's)",
    )
    names = Names.of(objs, namespace, sa_name)
    services = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    metrics_services = [
        o
        for o in objs
        if o["kind"] == "Service" and any(p.get("name") == METRICS_PORT for p in o["spec"].get("ports", []))
    ]
    metrics = one(metrics_services, f"Service with a port named {METRICS_PORT}")
    if any(p.get("name") != METRICS_PORT for p in metrics["spec"]["ports"]):
        raise SystemExit(f"gen_helm: Service {metrics['metadata']['name']} serves more than {METRICS_PORT}")
    found["metrics_service"] = metrics["metadata"]["name"]
    reader = one(
        [o for o in objs if o["kind"] == "ClusterRole" and o.get("rules") == METRICS_READER_RULES],
        "ClusterRole that grants get on /metrics alone (the metrics reader the PodMonitor is bound to)",
    )
    reader_role = reader["metadata"]["name"]

    stack_secrets = yaml.safe_load((REPO_ROOT / helm_namespaced.STACK_SECRETS_ROLE_FILE).read_text())
    if len(stack_secrets["rules"]) != 1:
        raise SystemExit(f"gen_helm: {helm_namespaced.STACK_SECRETS_ROLE_FILE} should hold one rule")

    templated_objs = []
    for obj, other in zip(objs, moved, strict=True):
        if obj["kind"] == "CustomResourceDefinition":
            continue
        if "namespace" not in obj["metadata"]:
            # Cluster-scoped in config's render; an overlay's `namespace:` may still set it on kinds
            # kustomize's schema does not know (config/default takes it off ValidatingAdmissionPolicies).
            other["metadata"].pop("namespace", None)
        templated_objs.append((obj, mark_namespace(obj, other, namespace)))
    # The operator's own RBAC: the bindings of its ServiceAccount and the roles they grant.
    operator_bindings = [t for _, t in templated_objs if names.binds_operator(t)]
    operator_roles = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in operator_bindings}
    manager_role = one(
        [
            o
            for o in objs
            if (o["kind"], o["metadata"]["name"]) in operator_roles and o["kind"] == "ClusterRole"
        ],
        "ClusterRole bound to the manager (rbac.extraRules go there)",
    )

    for obj, templated in templated_objs:
        markers = Markers()
        names.add_to(markers)
        helm_labels(templated)
        markers.inline[MARK + "MANAGED_BY"] = "{{ .Release.Service }}"
        prefix_text, suffix = "", ""
        kind = obj["kind"]
        own_rbac = any(templated is b for b in operator_bindings) or (
            kind in ("Role", "ClusterRole") and (kind, obj["metadata"]["name"]) in operator_roles
        )
        if kind == "Namespace":
            if obj["metadata"]["name"] != namespace:
                raise SystemExit(f"gen_helm: config/default creates namespace {obj['metadata']['name']} too")
            # The label the apiserver sets to the name (kustomize's transformer does not move it).
            labels = templated["metadata"].get("labels") or {}
            if labels.get("kubernetes.io/metadata.name") == namespace:
                labels["kubernetes.io/metadata.name"] = NS_MARK
            prefix_text = "{{- if .Values.namespace.create }}\n"
            suffix = "{{- end }}\n"
        else:
            names.mark(templated)
        if kind == "Deployment":
            names.mark_deployment(templated, services)
            template_deployment(templated, markers, found)
            prefix_text = '{{- include "pko.validate" . }}\n'
        elif obj is metrics:
            prefix_text = "{{- if .Values.metrics.service.enabled }}\n"
            suffix = "{{- end }}\n"
        elif kind == "ServiceAccount" and obj["metadata"]["name"] == sa_name:
            if "annotations" in obj["metadata"]:
                raise SystemExit(
                    "gen_helm: config/ annotates the ServiceAccount: make it the value's default"
                )
            templated["metadata"]["annotations"] = markers.new_block(
                "SA_ANNOTATIONS", with_key(".Values.serviceAccount.annotations")
            )
            prefix_text = "{{- if .Values.serviceAccount.create }}\n"
            suffix = "{{- end }}\n"
        elif own_rbac:
            if obj is manager_role:
                templated["rules"] = helm_namespaced.mark_manager_rules(
                    templated["rules"], markers, stack_secrets["rules"][0]
                )
                templated["rules"].append(
                    markers.new_block("EXTRA_RULES", with_items(".Values.rbac.extraRules"))
                )
            prefix_text = "{{- if .Values.rbac.create }}\n"
            suffix = "{{- end }}\n"
        body = apply_markers(dump(templated), markers)
        name = f"templates/{file_name(obj)}"
        if name in files:
            raise SystemExit(f"gen_helm: two objects would both be {name}")
        files[name] = header + prefix_text + body + suffix

    if not any(o["kind"] == "Namespace" for o in objs):
        raise SystemExit("gen_helm: config/default creates no Namespace")
    nodes = helm_values.describe(found)
    files["templates/servicemonitor.yaml"] = header + helm_templates.service_monitor(
        metrics, MANAGED_BY, METRICS_PORT
    )
    files["templates/podmonitor.yaml"] = header + helm_podmonitor.pod_monitor(
        {k: v for k, v in (metrics["metadata"].get("labels") or {}).items() if k != "control-plane"},
        MANAGED_BY,
        reader_role,
    )
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    files["templates/prometheusrule.yaml"] = header + helm_templates.prometheus_rule(
        {k: v for k, v in rule["metadata"]["labels"].items() if k != MANAGED_BY}, MANAGED_BY
    )
    files[helm_templates.PROMETHEUS_RULE_SPEC] = (
        f"# Generated by hack/gen_helm.py from {PROMETHEUS_RULE.relative_to(REPO_ROOT)}'s spec."
        " DO NOT EDIT.\n" + yaml.safe_dump(rule["spec"], sort_keys=False)
    )
    files["templates/role-watched.yaml"] = header + helm_namespaced.watched_roles(
        manager_role["rules"],
        helm_templates.labels_block(manager_role["metadata"].get("labels") or {}, MANAGED_BY, 4),
        helm_templates.name_expr(f"{prefix}-watched"),
    )
    stack_secrets_name = stack_secrets["metadata"]["name"]
    files[f"templates/clusterrole-{stack_secrets_name}.yaml"] = header + helm_namespaced.stack_secrets_role(
        stack_secrets,
        helm_templates.labels_block(manager_role["metadata"].get("labels") or {}, MANAGED_BY, 4),
        helm_templates.name_expr(stack_secrets_name),
    )
    files["templates/poddisruptionbudget.yaml"] = header + helm_templates.pod_disruption_budget(
        deploy, MANAGED_BY
    )
    files["templates/NOTES.txt"] = helm_templates.notes(deploy["metadata"]["name"])
    files["templates/_helpers.tpl"] = (
        "{{/* " + header.strip("# \n") + " */}}\n" + helm_templates.helpers(prefix, sa_name)
    )
    files["values.yaml"] = header + helm_values.values_yaml(nodes)
    files["values.schema.json"] = helm_values.values_schema(nodes)
    files["Chart.yaml"] = header + chart_yaml(version)
    files[".helmignore"] = header + "*.orig\n*.swp\n*~\n.DS_Store\n"
    return files, nodes


def chart_yaml(version: str) -> str:
    chart = {
        "apiVersion": "v2",
        "name": "pko",
        "description": "pko, a Python re-implementation of the Pulumi Kubernetes Operator v2: Stacks, "
        "Programs, Workspaces and Updates reconciled into Pulumi deployments",
        "type": "application",
        "version": version,
        "appVersion": version,
        "keywords": ["pulumi", "kubernetes", "operator", "infrastructure-as-code"],
    }
    return (
        dump(chart)
        + "# The oldest Kubernetes with everything the chart installs: the plan approval policy is a\n"
        "# ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA and served from 1.30); the CRDs'\n"
        "# CEL rules need less. pko is tested on 1.37. `-0` admits providers' versions such as\n"
        "# v1.30.4-eks-a1b2c3, which semver ranks below 1.30.0 otherwise.\n"
        'kubeVersion: ">=1.30.0-0"\n'
    )


def docs_with_table(nodes: tuple[helm_values.Node, ...]) -> str:
    """docs/helm.md with its values table rewritten from the description."""
    text = DOCS.read_text()
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"gen_helm: {DOCS} lacks the lines {TABLE_BEGIN!r} ... {TABLE_END!r}")
    table = helm_values.values_table(nodes)
    return text[: begin + len(TABLE_BEGIN)] + "\n\n" + table + "\n" + text[end:]


def expected_files(kubectl: str) -> dict[Path, str]:
    objs, moved = render_config(kubectl)
    files, nodes = build(objs, moved, VERSION)
    expected = {CHART / rel: text for rel, text in files.items()}
    expected[DOCS] = docs_with_table(nodes)
    return expected


def stale_files(expected: dict[Path, str]) -> list[Path]:
    """Files that are missing or differ, and files in the chart this script would not write."""
    stale = [path for path, text in sorted(expected.items()) if not path.exists() or path.read_text() != text]
    if CHART.is_dir():
        present = {p for p in CHART.rglob("*") if p.is_file()}
        stale += sorted(present - set(expected) - HAND_WRITTEN)
    return stale


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if charts/pko is out of date")
    parser.add_argument("--kubectl", default="kubectl", help="the kubectl to run kustomize with")
    args = parser.parse_args(argv)

    expected = expected_files(args.kubectl)
    stale = stale_files(expected)
    if args.check:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO_ROOT)} (run hack/gen_helm.py)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        if path in expected:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(expected[path])
            out(f"wrote {path.relative_to(REPO_ROOT)}")
        else:
            path.unlink()
            out(f"removed {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

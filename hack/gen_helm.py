#!/usr/bin/env python3
"""Write charts/pko, the Helm chart, from what `kubectl kustomize config/default` renders.

Usage:
    hack/gen_helm.py                      # (re)write charts/pko
    hack/gen_helm.py --check              # exit 1 and list the files that differ from what config/ gives
    hack/gen_helm.py --kubectl PATH ...   # the kubectl whose kustomize to run (default: `kubectl` on
                                          # PATH; hack/test.sh puts the control plane's first)

Kustomize stays the primary install path, and the chart cannot drift from it: every object of the chart
is an object of config/default, with values substituted at fixed places, and rendered with the default
values it is that object again (test/test_helm_chart.py renders it with the real helm and compares).
Where the values go, and nothing else:

- the namespace: wherever kustomize's namespace transformer puts it (found by rendering config/default
  a second time under a sentinel namespace and taking the fields that change), and in the
  ``system:serviceaccount:<ns>:`` user names of strings such as CEL expressions, becomes
  ``{{ .Release.Namespace }}``; the Namespace object itself is rendered only with
  ``namespace.create=true`` (Helm's release namespace exists before the chart's objects do);
- ``app.kubernetes.io/managed-by: kustomize`` says ``{{ .Release.Service }}`` (Helm);
- the manager Deployment: replicas, image and pull policy, the agent image, resources, both security
  contexts, the grace period, ``--leader-elect`` and the log flags, optional environment (leader
  election timings, WATCH_NAMESPACE, KUBE_API_TIMEOUT, FLUX_MAX_UNTAR_SIZE_BYTES, extraEnv), pod
  annotations and labels, scheduling (nodeSelector, affinity, tolerations), imagePullSecrets;
- the metrics Service (the Service whose only port is named ``http-metrics``) exists only while
  ``metrics.service.enabled``; a ServiceMonitor for it is added with ``serviceMonitor.enabled``.

The values' defaults are read from the same render, so values.yaml says what config/ says. Anything
config/ changes that the generator relies on (one Deployment, its ``manager`` container, the
``--leader-elect`` and ``--log-*`` flags, the metrics port) fails the generator with the reason rather
than producing a chart that quietly differs. The CRDs go to charts/pko/crds/ unchanged (Helm installs
them before the templates and never upgrades or deletes them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pko import defaults

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DEFAULT = REPO_ROOT / "config" / "default"
CHART = REPO_ROOT / "charts" / "pko"
# Written by hand, not by this script (the --check leaves it alone).
HAND_WRITTEN = frozenset({CHART / "README.md"})

# Every marker is a plain YAML scalar made of letters and underscores, which PyYAML writes unquoted and
# never folds, and which no config/ object contains (checked).
MARK = "PKOHELM_"
NS_MARK = MARK + "NAMESPACE"
SENTINEL_NAMESPACE = "pko-helm-sentinel-namespace"
MANAGED_BY = "app.kubernetes.io/managed-by"
METRICS_PORT = "http-metrics"

Obj = dict[str, Any]


# ------------------------------------------------------------------------------------ rendering config/


def kustomize(kubectl: str, path: Path) -> list[Obj]:
    proc = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"gen_helm: {kubectl} kustomize {path} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


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
    return namespaces.pop()


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


# ------------------------------------------------------------------------------ markers and their text


@dataclass
class Markers:
    """What each marker in the dumped YAML becomes. ``inline``: the marker token is replaced by an
    expression. ``block``: the line holding the marker (``key: MARKER``, ``- MARKER`` or, for entries
    added to a map, ``MARKER: null``) is replaced by lines, each prefixed by that line's indentation,
    with ``<key>``, ``<n>`` (the indentation's width) and ``<n2>`` (two more) filled in."""

    inline: dict[str, str] = field(default_factory=dict)
    block: dict[str, str] = field(default_factory=dict)

    def new_inline(self, name: str, expr: str) -> str:
        marker = MARK + name
        self.inline[marker] = expr
        return marker

    def new_block(self, name: str, text: str) -> str:
        marker = MARK + name
        self.block[marker] = text
        return marker


_BLOCK_LINE = re.compile(r"^(?P<indent> *)(?:- (?P<item>\w+)|(?P<key>[^\s:]+): (?P<value>\S+))$")


def apply_markers(text: str, markers: Markers) -> str:
    text = text.replace("{{", '{{ "{{" }}')  # a literal `{{` of config/ stays literal under Helm
    out: list[str] = []
    for line in text.splitlines():
        m = _BLOCK_LINE.match(line)
        marker = None
        if m:
            marker = next((t for t in (m["item"], m["value"], m["key"]) if t in markers.block), None)
        if m and marker:
            indent = m["indent"]
            key = "" if marker == m["key"] else m["key"] or ""
            body = markers.block[marker].replace("<key>", key)
            body = body.replace("<n2>", str(len(indent) + 2)).replace("<n>", str(len(indent)))
            out.extend(indent + b for b in body.splitlines())
            continue
        out.append(line)
    text = "\n".join(out) + "\n"
    for marker, expr in markers.inline.items():
        text = text.replace(marker, expr)
    text = text.replace(NS_MARK, "{{ .Release.Namespace }}")
    leftover = re.search(MARK + r"\w*", text)
    if leftover:
        raise SystemExit(f"gen_helm: marker {leftover[0]} was not replaced (did PyYAML move or quote it?)")
    return text


def dump(obj: Obj) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100)


# Block texts. `with` renders nothing for an empty value; toYaml keeps the value's shape.
def with_key(value: str) -> str:
    """``key:`` and the value below it, only when the value is not empty."""
    return "{{- with " + value + " }}\n<key>:\n  {{- toYaml . | nindent <n2> }}\n{{- end }}"


def with_items(value: str) -> str:
    """The value's list items (or map entries) at the marker's own indentation, when not empty."""
    return "{{- with " + value + " }}\n{{- toYaml . | nindent <n> }}\n{{- end }}"


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
    """What the chart's ``pko.image`` helper renders (the Python twin, to check parse_image)."""
    ref = (image["registry"] + "/" if image["registry"] else "") + image["repository"]
    if image["digest"]:
        return ref + "@" + image["digest"]
    return ref + (":" + image["tag"] if image["tag"] else "")


def helm_labels(obj: Obj) -> None:
    labels = obj["metadata"].get("labels") or {}
    if labels.get(MANAGED_BY) == "kustomize":
        labels[MANAGED_BY] = MARK + "MANAGED_BY"


def one(items: list[Obj], what: str) -> Obj:
    if len(items) != 1:
        raise SystemExit(f"gen_helm: expected one {what} in config/default, found {len(items)}")
    return items[0]


def template_deployment(deploy: Obj, markers: Markers, values: dict[str, Any]) -> None:
    """Put the values' markers into the manager Deployment, and record config's settings as defaults."""
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    meta = spec["template"].setdefault("metadata", {})
    container_name = meta.get("annotations", {}).get("kubectl.kubernetes.io/default-container", "manager")
    container = one(
        [c for c in pod["containers"] if c["name"] == container_name], f"container {container_name}"
    )

    values["replicaCount"] = spec.get("replicas", 1)
    spec["replicas"] = markers.new_inline("REPLICAS", "{{ .Values.replicaCount | int64 }}")

    if "annotations" in deploy["metadata"]:
        raise SystemExit(
            "gen_helm: config/ annotates the Deployment: make it deploymentAnnotations' default first"
        )
    deploy["metadata"]["annotations"] = markers.new_block(
        "DEPLOYMENT_ANNOTATIONS", with_key(".Values.deploymentAnnotations")
    )
    values["deploymentAnnotations"] = {}
    # Added to the pod template's own annotations and labels (the selector's labels stay as they are).
    meta.setdefault("annotations", {})[
        markers.new_block("POD_ANNOTATIONS", with_items(".Values.podAnnotations"))
    ] = None
    meta.setdefault("labels", {})[markers.new_block("POD_LABELS", with_items(".Values.podLabels"))] = None
    values["podAnnotations"] = {}
    values["podLabels"] = {}

    image = parse_image(container["image"])
    values["image"] = {**image, "pullPolicy": container.get("imagePullPolicy", "IfNotPresent")}
    env = container.setdefault("env", [])
    agent_image = one([e for e in env if e["name"] == "AGENT_IMAGE"], "AGENT_IMAGE variable")
    agent_policy = one([e for e in env if e["name"] == "AGENT_IMAGE_PULL_POLICY"], "AGENT_IMAGE_PULL_POLICY")
    values["agent"] = {"image": {**parse_image(agent_image["value"]), "pullPolicy": agent_policy["value"]}}
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
    values["leaderElection"] = {"enabled": True, "leaseDuration": "", "renewDeadline": "", "retryPeriod": ""}
    values["controller"] = {}
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
            values["controller"][key] = value
            new_args.append(
                markers.new_inline(
                    key.upper(),
                    f'{{{{ printf "{flag}=%s" (include "pko.string" .Values.controller.{key}) | quote }}}}',
                )
            )
        else:
            new_args.append(arg)
    if set(values["controller"]) != {"logLevel", "logFormat"}:
        raise SystemExit("gen_helm: the manager's args lack --log-level=... or --log-format=...")
    container["args"] = new_args

    optional = (
        ("LEADER_ELECTION_LEASE_DURATION", ".Values.leaderElection.leaseDuration"),
        ("LEADER_ELECTION_RENEW_DEADLINE", ".Values.leaderElection.renewDeadline"),
        ("LEADER_ELECTION_RETRY_PERIOD", ".Values.leaderElection.retryPeriod"),
        ("WATCH_NAMESPACE", ".Values.watchNamespace"),
        ("KUBE_API_TIMEOUT", ".Values.kubeAPI.timeout"),
        ("FLUX_MAX_UNTAR_SIZE_BYTES", ".Values.flux.maxUntarSizeBytes"),
    )
    taken = sorted({name for name, _ in optional} & {e["name"] for e in env})
    if taken:
        raise SystemExit(f"gen_helm: config/ sets {taken} itself: the chart's values would duplicate them")
    optional_env = "\n".join(
        f"{{{{- with {value} }}}}\n- name: {name}\n"
        '  value: {{ include "pko.string" . | quote }}\n{{- end }}'
        for name, value in optional
    )
    env.append(markers.new_block("OPTIONAL_ENV", optional_env))
    env.append(markers.new_block("EXTRA_ENV", with_items(".Values.extraEnv")))
    values["watchNamespace"] = ""
    values["kubeAPI"] = {"timeout": ""}
    values["flux"] = {"maxUntarSizeBytes": ""}
    values["extraEnv"] = []

    if "terminationGracePeriodSeconds" not in pod or not {"resources", "securityContext"} <= container.keys():
        raise SystemExit(
            "gen_helm: the manager pod lacks terminationGracePeriodSeconds, resources or securityContext"
        )
    values["resources"] = container["resources"]
    values["securityContext"] = container["securityContext"]
    values["podSecurityContext"] = pod.get("securityContext", {})
    values["terminationGracePeriodSeconds"] = pod["terminationGracePeriodSeconds"]
    pod["terminationGracePeriodSeconds"] = markers.new_inline(
        "GRACE", "{{ .Values.terminationGracePeriodSeconds | int64 }}"
    )
    pod["securityContext"] = markers.new_block("POD_SECURITY", with_key(".Values.podSecurityContext"))
    for key, marker, value in (
        ("imagePullSecrets", "PULL_SECRETS", ".Values.imagePullSecrets"),
        ("nodeSelector", "NODE_SELECTOR", ".Values.nodeSelector"),
        ("affinity", "AFFINITY", ".Values.affinity"),
        ("tolerations", "TOLERATIONS", ".Values.tolerations"),
    ):
        if key in pod:
            raise SystemExit(f"gen_helm: config/ sets the pod's {key}: make it the value's default first")
        pod[key] = markers.new_block(marker, with_key(value))
        values[key] = [] if key in ("imagePullSecrets", "tolerations") else {}

    # The container's name first: a block marker must not sit on a list item's `- ` line.
    rest = {k: v for k, v in container.items() if k != "name"}
    rest["image"] = markers.new_inline(
        "IMAGE", '{{ include "pko.image" (dict "image" .Values.image "chart" .Chart) | quote }}'
    )
    rest["imagePullPolicy"] = markers.new_inline("PULL_POLICY", "{{ .Values.image.pullPolicy }}")
    rest["resources"] = markers.new_block("RESOURCES", with_key(".Values.resources"))
    rest["securityContext"] = markers.new_block("SECURITY", with_key(".Values.securityContext"))
    container.clear()
    container.update({"name": container_name, **rest})


def service_monitor(metrics: Obj) -> str:
    """The optional ServiceMonitor: scrapes the metrics Service's port by name (plain HTTP: pko serves
    /metrics without authentication, restricted by NetworkPolicy)."""
    labels = dict(metrics["metadata"].get("labels") or {})
    selector = {k: v for k, v in labels.items() if k != MANAGED_BY}
    if MANAGED_BY in labels:
        labels[MANAGED_BY] = MARK + "MANAGED_BY"
    indent4 = textwrap.indent(yaml.safe_dump(labels, sort_keys=False).rstrip(), "    ")
    indent4 = indent4.replace(MARK + "MANAGED_BY", "{{ .Release.Service }}")
    indent6 = textwrap.indent(yaml.safe_dump(selector, sort_keys=False).rstrip(), "      ")
    name = metrics["metadata"]["name"]
    return f"""\
{{{{- if .Values.serviceMonitor.enabled }}}}
{{{{- if not .Values.metrics.service.enabled }}}}
{{{{- fail "serviceMonitor.enabled needs metrics.service.enabled: it scrapes the metrics Service" }}}}
{{{{- end }}}}
# Prometheus Operator's ServiceMonitor for the metrics Service (its CRD must be installed).
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {name}
  namespace: {{{{ .Values.serviceMonitor.namespace | default .Release.Namespace }}}}
  labels:
{indent4}
    {{{{- with .Values.serviceMonitor.labels }}}}
    {{{{- toYaml . | nindent 4 }}}}
    {{{{- end }}}}
spec:
  namespaceSelector:
    matchNames:
    - {{{{ .Release.Namespace }}}}
  selector:
    matchLabels:
{indent6}
  endpoints:
  - port: {METRICS_PORT}
    scheme: http
    path: {{{{ .Values.serviceMonitor.telemetryPath | default "/metrics" }}}}
    {{{{- with .Values.serviceMonitor.interval }}}}
    interval: {{{{ . }}}}
    {{{{- end }}}}
    {{{{- with .Values.serviceMonitor.timeout }}}}
    scrapeTimeout: {{{{ . }}}}
    {{{{- end }}}}
    {{{{- with .Values.serviceMonitor.metricRelabelings }}}}
    metricRelabelings:
    {{{{- toYaml . | nindent 4 }}}}
    {{{{- end }}}}
  {{{{- with .Values.serviceMonitor.targetLabels }}}}
  targetLabels:
  {{{{- toYaml . | nindent 2 }}}}
  {{{{- end }}}}
{{{{- end }}}}
"""


HELPERS = """\
{{/*
pko.image: [registry/]repository, then @digest, else :tag (default: the chart's appVersion).
Called with (dict "image" .Values.image "chart" .Chart).
*/}}
{{- define "pko.image" -}}
{{- $ref := .image.repository -}}
{{- with .image.registry }}{{ $ref = printf "%s/%s" . $ref }}{{ end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $ref .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (include "pko.string" (.image.tag | default .chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{/*
pko.string: a value as the text a user wrote: YAML numbers reach templates as float64, which toString
would print as 5.24288e+08.
*/}}
{{- define "pko.string" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/*
pko.validate: refuse values the operator would misread, with the reason.
*/}}
{{- define "pko.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicaCount > 1 needs leaderElection.enabled: replicas without a Lease all reconcile" -}}
{{- end -}}
{{- if not (kindIs "string" .Values.watchNamespace) -}}
{{- fail "watchNamespace is one namespace name, or empty for all: pko watches one namespace or every one" -}}
{{- end -}}
{{- end -}}
"""


def file_name(obj: Obj) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def build_chart(objs: list[Obj], moved: list[Obj], version: str) -> dict[str, str]:
    """The chart's files (path in the chart -> text) from config/default's objects (``moved``: the same
    under the sentinel namespace)."""
    namespace = config_namespace(objs)
    text = json.dumps(objs)
    if MARK in text or SENTINEL_NAMESPACE in text:
        raise SystemExit(f"gen_helm: config/default contains {MARK} or {SENTINEL_NAMESPACE}")
    files: dict[str, str] = {}
    values: dict[str, Any] = {}
    header = "# Generated by hack/gen_helm.py from `kubectl kustomize config/default`. DO NOT EDIT.\n"

    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        files[f"crds/{crd['metadata']['name']}.yaml"] = header + dump(crd)

    one([o for o in objs if o["kind"] == "Deployment"], "Deployment")
    metrics_services = [
        o
        for o in objs
        if o["kind"] == "Service" and any(p.get("name") == METRICS_PORT for p in o["spec"].get("ports", []))
    ]
    metrics = one(metrics_services, f"Service with a port named {METRICS_PORT}")
    if any(p.get("name") != METRICS_PORT for p in metrics["spec"]["ports"]):
        raise SystemExit(f"gen_helm: Service {metrics['metadata']['name']} serves more than {METRICS_PORT}")

    for obj, other in zip(objs, moved, strict=True):
        if obj["kind"] == "CustomResourceDefinition":
            continue
        if "namespace" not in obj["metadata"]:
            # Cluster-scoped in config's render; an overlay's `namespace:` may still set it on kinds
            # kustomize's schema does not know (config/default takes it off ValidatingAdmissionPolicies).
            other["metadata"].pop("namespace", None)
        markers = Markers()
        templated: Obj = mark_namespace(obj, other, namespace)
        helm_labels(templated)
        markers.inline[MARK + "MANAGED_BY"] = "{{ .Release.Service }}"
        prefix, suffix = "", ""
        if obj["kind"] == "Namespace":
            if obj["metadata"]["name"] != namespace:
                raise SystemExit(f"gen_helm: config/default creates namespace {obj['metadata']['name']} too")
            # The label the apiserver sets to the name (kustomize's transformer does not move it).
            labels = templated["metadata"].get("labels") or {}
            if labels.get("kubernetes.io/metadata.name") == namespace:
                labels["kubernetes.io/metadata.name"] = NS_MARK
            values["namespace"] = {"create": False}
            prefix = "{{- if .Values.namespace.create }}\n"
            suffix = "{{- end }}\n"
        elif obj["kind"] == "Deployment":
            template_deployment(templated, markers, values)
            prefix = '{{- include "pko.validate" . }}\n'
        elif obj is metrics:
            values["metrics"] = {"service": {"enabled": True}}
            prefix = "{{- if .Values.metrics.service.enabled }}\n"
            suffix = "{{- end }}\n"
        body = apply_markers(dump(templated), markers)
        name = f"templates/{file_name(obj)}"
        if name in files:
            raise SystemExit(f"gen_helm: two objects would both be {name}")
        files[name] = header + prefix + body + suffix

    if "namespace" not in values:
        raise SystemExit("gen_helm: config/default creates no Namespace")
    values["serviceMonitor"] = {
        "enabled": False,
        "namespace": "",
        "labels": {},
        "interval": "",
        "timeout": "",
        "telemetryPath": "/metrics",
        "metricRelabelings": [],
        "targetLabels": [],
    }
    files["templates/servicemonitor.yaml"] = header + service_monitor(metrics)
    files["templates/_helpers.tpl"] = "{{/* " + header.strip("# \n") + " */}}\n" + HELPERS
    files["values.yaml"] = header + values_yaml(values)
    files["Chart.yaml"] = header + chart_yaml(version)
    files[".helmignore"] = header + "*.orig\n*.swp\n*~\n.DS_Store\n"
    return files


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
    return dump(chart)


def values_yaml(v: dict[str, Any]) -> str:
    """values.yaml with a comment per value; the defaults are config/default's."""

    def y(value: Any) -> str:
        """The value after ``key:`` at the top level: inline, or a block below the key."""
        text = yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip()
        if isinstance(value, dict | list) and value:
            return "\n" + textwrap.indent(text, "  ")
        return " " + text.removesuffix("\n...").strip()

    lease, renew, retry, api_timeout = (
        defaults.go_duration_text(s)
        for s in (
            defaults.LEASE_DURATION,
            defaults.RENEW_DEADLINE,
            defaults.RETRY_PERIOD,
            defaults.KUBE_API_TIMEOUT,
        )
    )

    img, agent = v["image"], v["agent"]["image"]
    le, sm = v["leaderElection"], v["serviceMonitor"]
    return f"""\
# Values of the pko chart. Every default is what `kubectl apply --server-side -k config/default`
# installs; the names follow the Go operator's chart (deploy/helm/pulumi-operator) where pko has the
# same setting, so its values files carry over (charts/pko/README.md lists the differences).

# -- Manager replicas. More than one needs leaderElection.enabled: the others stand by.
replicaCount:{y(v["replicaCount"])}

image:
  # -- Registry of the manager image (empty: none, as in the repository name)
  registry:{y(img["registry"])}
  # -- Repository of the manager image
  repository:{y(img["repository"])}
  # -- Tag of the manager image (empty: the chart's appVersion)
  tag:{y(img["tag"])}
  # -- Digest (sha256:...); when set it is used instead of the tag
  digest:{y(img["digest"])}
  # -- Pull policy of the manager image
  pullPolicy:{y(img["pullPolicy"])}

# The agent image: every workspace pod's bootstrap and fetch containers run it (pko ships the agent in an
# image of its own, not in the manager's as the Go operator does).
agent:
  image:
    registry:{y(agent["registry"])}
    repository:{y(agent["repository"])}
    # -- Tag of the agent image (empty: the chart's appVersion)
    tag:{y(agent["tag"])}
    digest:{y(agent["digest"])}
    pullPolicy:{y(agent["pullPolicy"])}

# -- Secrets to pull the manager image with
imagePullSecrets:{y(v["imagePullSecrets"])}

controller:
  # -- --log-level: debug, info, warn, error or critical
  logLevel:{y(v["controller"]["logLevel"])}
  # -- --log-format: json or console
  logFormat:{y(v["controller"]["logFormat"])}

leaderElection:
  # -- --leader-elect: run the controllers only while holding the Lease
  enabled:{y(le["enabled"])}
  # -- How long a standby waits before taking over an unrenewed Lease (Go duration; empty: {lease})
  leaseDuration:{y(le["leaseDuration"])}
  # -- How long the leader tries to renew before it stops leading (empty: {renew})
  renewDeadline:{y(le["renewDeadline"])}
  # -- Time between Lease attempts (empty: {retry})
  retryPeriod:{y(le["retryPeriod"])}

# -- The one namespace to watch and reconcile (WATCH_NAMESPACE); empty: every namespace. The RBAC stays
# cluster-wide either way.
watchNamespace:{y(v["watchNamespace"])}

kubeAPI:
  # -- Timeout of Kubernetes API requests (KUBE_API_TIMEOUT, Go duration; empty: {api_timeout})
  timeout:{y(v["kubeAPI"]["timeout"])}

flux:
  # -- Largest Flux artifact a workspace unpacks, in bytes (a positive number; empty: the agent's default)
  maxUntarSizeBytes:{y(v["flux"]["maxUntarSizeBytes"])}

# -- Extra environment variables of the manager container (name/value or name/valueFrom), after the
# chart's own: a variable named here again overrides the chart's (the last one wins)
extraEnv:{y(v["extraEnv"])}

# -- Resource requests and limits of the manager container
resources:{y(v["resources"])}

# -- Security context of the manager container
securityContext:{y(v["securityContext"])}

# -- Security context of the manager pod (the defaults satisfy the `restricted` Pod Security Standard)
podSecurityContext:{y(v["podSecurityContext"])}

# -- Seconds the manager gets to finish its reconciles and release the Lease when stopped
terminationGracePeriodSeconds:{y(v["terminationGracePeriodSeconds"])}

# -- Annotations of the Deployment
deploymentAnnotations:{y(v["deploymentAnnotations"])}
# -- Annotations added to the manager pod
podAnnotations:{y(v["podAnnotations"])}
# -- Labels added to the manager pod
podLabels:{y(v["podLabels"])}
# -- Node selector of the manager pod
nodeSelector:{y(v["nodeSelector"])}
# -- Affinity of the manager pod
affinity:{y(v["affinity"])}
# -- Tolerations of the manager pod
tolerations:{y(v["tolerations"])}

namespace:
  # -- Render the Namespace object too (with its `restricted` Pod Security label), named after the
  # release namespace. Off for `helm install`, which needs the namespace before it installs (use
  # --create-namespace, or create it yourself); on for `helm template | kubectl apply`.
  create:{y(v["namespace"]["create"])}

metrics:
  service:
    # -- The metrics Service (port {METRICS_PORT}, plain HTTP /metrics)
    enabled:{y(v["metrics"]["service"]["enabled"])}

serviceMonitor:
  # -- A Prometheus Operator ServiceMonitor for the metrics Service (needs its CRD, monitoring.coreos.com/v1)
  enabled:{y(sm["enabled"])}
  # -- Namespace of the ServiceMonitor (empty: the release namespace)
  namespace:{y(sm["namespace"])}
  # -- Labels of the ServiceMonitor, e.g. the one your Prometheus selects ServiceMonitors by
  labels:{y(sm["labels"])}
  # -- Scrape interval (empty: Prometheus's)
  interval:{y(sm["interval"])}
  # -- Scrape timeout (empty: Prometheus's)
  timeout:{y(sm["timeout"])}
  # -- Path of the metrics
  telemetryPath:{y(sm["telemetryPath"])}
  # -- metricRelabelings of the endpoint
  metricRelabelings:{y(sm["metricRelabelings"])}
  # -- Service labels copied onto the scraped series
  targetLabels:{y(sm["targetLabels"])}
"""


def project_version() -> str:
    return str(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])


def expected_files(kubectl: str) -> dict[Path, str]:
    objs, moved = render_config(kubectl)
    files = build_chart(objs, moved, project_version())
    return {CHART / rel: text for rel, text in files.items()}


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

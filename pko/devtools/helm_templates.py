"""The texts of the pko chart that config/default has no object for: the helpers, the optional
ServiceMonitor, PrometheusRule and PodDisruptionBudget, and NOTES.txt. hack/gen_helm.py fills in
what they take from config/ (the name prefix, the metrics Service, the Deployment's selector) and
writes them.
"""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

Obj = dict[str, Any]
# Where the chart keeps config/prometheus/prometheusrule.yaml's spec (the PrometheusRule reads it).
PROMETHEUS_RULE_SPEC = "files/prometheusrule-spec.yaml"


def name_expr(config_name: str) -> str:
    """The template expression for one of config/default's object names (see ``pko.objname``)."""
    return f'{{{{ include "pko.objname" (list $ "{config_name}") }}}}'


def helpers(prefix: str, service_account: str) -> str:
    """_helpers.tpl. ``prefix``: the name config/ starts its objects' names with (the app's name);
    ``service_account``: config's name of the manager's ServiceAccount."""
    return (
        (
            """\
{{/*
pko.image: REGISTRY/REPOSITORY:TAG@DIGEST, each part only when set; the tag defaults to the chart's
appVersion, so a release can pin both NAME:VERSION and its digest. Called with
(dict "image" .Values.image "chart" .Chart).
*/}}
{{- define "pko.image" -}}
{{- $ref := .image.repository -}}
{{- with .image.registry }}{{ $ref = printf "%s/%s" . $ref }}{{ end -}}
{{- $ref = printf "%s:%s" $ref (include "pko.string" (.image.tag | default .chart.AppVersion)) -}}
{{- with .image.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
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
pko.fullname: fullnameOverride; else, with nameOverride, <release>-<nameOverride> (the release name
alone when it holds nameOverride), as the Go operator's chart names it; else config/'s prefix.
*/}}
{{- define "pko.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if .Values.nameOverride -}}
{{- if contains .Values.nameOverride .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- else -}}
PREFIX
{{- end -}}
{{- end -}}

{{/*
pko.objname: the name of one of config/default's objects, called with (list $ "<config's name>").
Without a name override it is config's name. With one, the prefix PREFIX of config's name becomes
pko.fullname, and a name without that prefix gets pko.fullname- in front, so a second release (in
another namespace) shares no cluster-wide name with the first. Every reference follows: role bindings,
the ServiceAccount's token request Role, the admission policy binding, --program-fs-adv-addr.
*/}}
{{- define "pko.objname" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- if or $root.Values.fullnameOverride $root.Values.nameOverride -}}
{{- $full := include "pko.fullname" $root -}}
{{- if eq $name "PREFIX" -}}
{{- $full -}}
{{- else if hasPrefix "PREFIX-" $name -}}
{{- printf "%s%s" $full (trimPrefix "PREFIX" $name) -}}
{{- else -}}
{{- printf "%s-%s" $full $name -}}
{{- end -}}
{{- else -}}
{{- $name -}}
{{- end -}}
{{- end -}}

{{/*
pko.serviceAccountName: the manager's ServiceAccount: serviceAccount.name, else (created by the chart)
config's name after the overrides.
*/}}
{{- define "pko.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else if .Values.serviceAccount.create -}}
{{- include "pko.objname" (list . "SERVICE_ACCOUNT") -}}
{{- else -}}
{{- fail "serviceAccount.create=false needs serviceAccount.name: the ServiceAccount the manager runs as" -}}
{{- end -}}
{{- end -}}

{{/*
pko.validate: refuse values the operator would misread, with the reason (the schema checks types).
*/}}
{{- define "pko.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicaCount > 1 needs leaderElection.enabled: replicas without a Lease all reconcile" -}}
{{- end -}}
{{- end -}}
"""
        )
        .replace("SERVICE_ACCOUNT", service_account)
        .replace("PREFIX", prefix)
    )


def labels_block(labels: dict[str, str], managed_by: str, indent: int) -> str:
    out = dict(labels)
    if managed_by in out:
        out[managed_by] = "MANAGED_BY_HELM"
    text = textwrap.indent(yaml.safe_dump(out, sort_keys=False).rstrip(), " " * indent)
    return text.replace("MANAGED_BY_HELM", "{{ .Release.Service }}")


def prometheus_rule(labels: dict[str, str], managed_by: str) -> str:
    """The optional PrometheusRule: config/prometheus's rules, read from the chart's files/ as they are
    (Helm does not template a file it reads, so the alerts' own ``{{ $labels }}`` pass through)."""
    indent4 = textwrap.indent(yaml.safe_dump(labels, sort_keys=False).rstrip(), "    ")
    return f"""\
{{{{- if .Values.prometheusRule.enabled }}}}
# The operator's alerts (config/prometheus/prometheusrule.yaml; docs: Metrics and alerts).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{{{ include "pko.objname" (list $ "pulumi-kubernetes-operator") }}}}
  namespace: {{{{ .Values.prometheusRule.namespace | default .Release.Namespace }}}}
  labels:
    {managed_by}: {{{{ .Release.Service }}}}
{indent4}
    {{{{- with .Values.prometheusRule.labels }}}}
    {{{{- toYaml . | nindent 4 }}}}
    {{{{- end }}}}
spec:
  {{{{- .Files.Get "{PROMETHEUS_RULE_SPEC}" | nindent 2 }}}}
{{{{- end }}}}
"""


def service_monitor(metrics: Obj, managed_by: str, port: str) -> str:
    """The optional ServiceMonitor: scrapes the metrics Service's port by name over HTTPS with the
    Prometheus pod's ServiceAccount token, which the operator reviews (TokenReview, then a
    SubjectAccessReview for `get` on /metrics: bind that account to the metrics-reader ClusterRole);
    the operator's certificate is self-signed unless a cert dir is mounted, hence insecureSkipVerify
    until ``serviceMonitor.tlsConfig`` names a CA."""
    labels = dict(metrics["metadata"].get("labels") or {})
    selector = {k: v for k, v in labels.items() if k != managed_by}
    indent6 = textwrap.indent(yaml.safe_dump(selector, sort_keys=False).rstrip(), "      ")
    return f"""\
{{{{- if .Values.serviceMonitor.enabled }}}}
{{{{- if not .Values.metrics.service.enabled }}}}
{{{{- fail "serviceMonitor.enabled needs metrics.service.enabled: it scrapes the metrics Service" }}}}
{{{{- end }}}}
# Prometheus Operator's ServiceMonitor for the metrics Service (its CRD must be installed).
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {name_expr(metrics["metadata"]["name"])}
  namespace: {{{{ .Values.serviceMonitor.namespace | default .Release.Namespace }}}}
  labels:
{labels_block(labels, managed_by, 4)}
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
  - port: {port}
    scheme: {{{{ .Values.serviceMonitor.scheme }}}}
    path: {{{{ .Values.serviceMonitor.telemetryPath | default "/metrics" }}}}
    {{{{- if eq .Values.serviceMonitor.scheme "https" }}}}
    {{{{- with .Values.serviceMonitor.bearerTokenFile }}}}
    bearerTokenFile: {{{{ . }}}}
    {{{{- end }}}}
    {{{{- with .Values.serviceMonitor.tlsConfig }}}}
    tlsConfig:
    {{{{- toYaml . | nindent 6 }}}}
    {{{{- end }}}}
    {{{{- end }}}}
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


def pod_disruption_budget(deploy: Obj, managed_by: str) -> str:
    """The optional PodDisruptionBudget of the manager pods: named and selecting as the Deployment.
    Neither bound set means maxUnavailable 1 (a drain moves one replica at a time; with one replica
    minAvailable 1 would block every drain)."""
    labels = dict(deploy["metadata"].get("labels") or {})
    selector = textwrap.indent(yaml.safe_dump(deploy["spec"]["selector"], sort_keys=False).rstrip(), "    ")
    return f"""\
{{{{- with .Values.podDisruptionBudget }}}}
{{{{- if .enabled }}}}
{{{{- if and (ne (toString .minAvailable) "") (ne (toString .maxUnavailable) "") }}}}
{{{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" }}}}
{{{{- end }}}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {name_expr(deploy["metadata"]["name"])}
  namespace: {{{{ $.Release.Namespace }}}}
  labels:
{labels_block(labels, managed_by, 4).replace(".Release", "$.Release")}
spec:
  {{{{- if ne (toString .minAvailable) "" }}}}
  minAvailable: {{{{ .minAvailable }}}}
  {{{{- else if ne (toString .maxUnavailable) "" }}}}
  maxUnavailable: {{{{ .maxUnavailable }}}}
  {{{{- else }}}}
  maxUnavailable: 1
  {{{{- end }}}}
  selector:
{selector}
{{{{- end }}}}
{{{{- end }}}}
"""


def notes(deployment: str) -> str:
    """NOTES.txt: what to do after the install."""
    return f"""\
pko {{{{ .Chart.AppVersion }}}} is installed in namespace {{{{ .Release.Namespace }}}}
(release {{{{ .Release.Name }}}}).
Wait for the manager:

  kubectl -n {{{{ .Release.Namespace }}}} rollout status deployment/{name_expr(deployment)}
{{{{- if not .Values.rbac.create }}}}

rbac.create is false: bind the ServiceAccount {{{{ include "pko.serviceAccountName" . }}}} to the permissions
of charts/pko/templates/clusterrole-*-controller-manager.yaml (and the leader election and token request
Roles) yourself, or the manager cannot work.
{{{{- end }}}}

Next steps

1. A workspace identity. Every Stack's workspace pod runs as the Stack's spec.serviceAccountName, and its
   agent checks each call with TokenReview and SubjectAccessReview, so that ServiceAccount needs
   system:auth-delegator (config/quickstart in pko's repository does the same):

     kubectl create serviceaccount pulumi -n default
     kubectl create clusterrolebinding default:pulumi:system:auth-delegator \\
       --clusterrole=system:auth-delegator --serviceaccount=default:pulumi

2. A first Stack: a Program held in the cluster and a Stack that deploys it (its state in a file backend
   inside the workspace pod; config/samples keeps it on a PersistentVolumeClaim instead):

     kubectl apply -n default -f - <<'EOF'
     apiVersion: pulumi.com/v1
     kind: Program
     metadata:
       name: hello
     program:
       outputs:
         greeting: Hello from pko
     ---
     apiVersion: pulumi.com/v1
     kind: Stack
     metadata:
       name: hello
     spec:
       serviceAccountName: pulumi
       stack: dev
       programRef:
         name: hello
       backend: file:///tmp
       envRefs:
         PULUMI_CONFIG_PASSPHRASE:
           type: Literal
           literal:
             value: change-me
     EOF
     kubectl -n default get stack hello -w

3. The chart's values and what they change: docs/helm.md; Stacks, Programs and approvals: docs/stacks.md
   and docs/ in pko's repository.
"""

"""The chart's optional PodMonitor of the workspace agents' own ``/metrics`` (issue 46): its values and
its template, which hack/gen_helm.py writes to ``templates/podmonitor.yaml``.

Workspace pods serve the agent's metrics on container port ``https-metrics`` (``--workspace-metrics``,
pko.controllers.workspace.podspec), and each agent reviews every scraper's bearer token (TokenReview,
then a SubjectAccessReview for ``get`` on ``/metrics``), as the operator does. A ServiceMonitor can
send Prometheus's own mounted token (``bearerTokenFile``); a PodMonitor cannot: Prometheus Operator
gives it no file access on purpose (anyone who may create a PodMonitor could otherwise send the
Prometheus pod's files to a target of theirs), so the token comes from a Secret in the PodMonitor's
namespace. Unless ``podMonitor.tokenSecret`` names one (key ``token``), the chart makes a
ServiceAccount for the scrapes there, binds it to the metrics-reader ClusterRole and asks the
apiserver for its long-lived token Secret (``kubernetes.io/service-account-token``): a token that may
read metrics and nothing else. The agents' certificates are self-signed, hence ``insecureSkipVerify``
until ``podMonitor.tlsConfig`` says otherwise. With ``workspace.metrics=http`` it scrapes port
``http-metrics`` in the clear, with no token; with ``off`` it is refused (there is nothing to scrape).
"""

from __future__ import annotations

from typing import Final

from pko.controllers.resources import WORKSPACE_COMPONENT, WORKSPACE_COMPONENT_LABEL
from pko.devtools.helm_templates import labels_block, name_expr
from pko.devtools.helm_values import BOOL, OBJECT, STRING, STRING_MAP, Group, Leaf

__all__ = ["SCRAPER", "VALUES", "pod_monitor"]

# config/'s name for the scraping ServiceAccount, its Secret and binding (pko.objname renames them).
SCRAPER: Final = "pulumi-kubernetes-operator-workspace-metrics"

VALUES: Final = Group(
    "podMonitor",
    "",
    (
        Leaf(
            "enabled",
            False,
            BOOL,
            "A Prometheus Operator PodMonitor scraping every workspace pod's agent (port "
            "`https-metrics`, any namespace; needs its CRD)",
        ),
        Leaf(
            "namespace",
            "",
            STRING,
            "Its namespace, and that of the token Secret it reads (empty: the release namespace)",
        ),
        Leaf("labels", {}, STRING_MAP, "Its labels, e.g. the one your Prometheus selects PodMonitors by"),
        Leaf("interval", "", STRING, "Scrape interval (empty: Prometheus's)"),
        Leaf(
            "tokenSecret",
            "",
            STRING,
            "A Secret (key `token`) in its namespace with a token allowed to get /metrics; empty: the "
            "chart makes ServiceAccount `pulumi-kubernetes-operator-workspace-metrics`, bound to the "
            "metrics-reader ClusterRole, and its token Secret",
        ),
        Leaf(
            "tlsConfig",
            {"insecureSkipVerify": True},
            OBJECT,
            "`tlsConfig` of the endpoint: each agent's certificate is self-signed unless its pod "
            "is given one (docs/metrics.md)",
        ),
    ),
)


def pod_monitor(labels: dict[str, str], managed_by: str, reader_role: str) -> str:
    """``templates/podmonitor.yaml``; ``labels``: config's common labels; ``reader_role``: config's name
    of the metrics-reader ClusterRole the scraper is bound to."""
    meta_labels = labels_block(labels, managed_by, 4).replace(".Release", "$.Release")
    scraper = name_expr(SCRAPER)
    token = f'(printf "%s-token" (include "pko.objname" (list $ "{SCRAPER}")))'
    return f"""\
{{{{- with .Values.podMonitor }}}}
{{{{- if .enabled }}}}
{{{{- $metrics := $.Values.workspace.metrics | default "https" }}}}
{{{{- if eq $metrics "off" }}}}
{{{{- fail "podMonitor.enabled needs workspace pods that serve metrics: workspace.metrics is off" }}}}
{{{{- end }}}}
{{{{- $ns := .namespace | default $.Release.Namespace }}}}
{{{{- $makeToken := and (eq $metrics "https") (not .tokenSecret) }}}}
{{{{- if $makeToken }}}}
# The identity the PodMonitor scrapes with: it may get /metrics and nothing else.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {scraper}
  namespace: {{{{ $ns }}}}
  labels:
{meta_labels}
---
# Its long-lived token, filled in by the apiserver (a PodMonitor reads tokens from Secrets only).
apiVersion: v1
kind: Secret
type: kubernetes.io/service-account-token
metadata:
  name: {scraper}-token
  namespace: {{{{ $ns }}}}
  labels:
{meta_labels}
  annotations:
    kubernetes.io/service-account.name: {scraper}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {scraper}
  labels:
{meta_labels}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {name_expr(reader_role)}
subjects:
- kind: ServiceAccount
  name: {scraper}
  namespace: {{{{ $ns }}}}
---
{{{{- end }}}}
# Prometheus Operator's PodMonitor for the workspace agents (its CRD must be installed).
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {scraper}
  namespace: {{{{ $ns }}}}
  labels:
{meta_labels}
    {{{{- with .labels }}}}
    {{{{- toYaml . | nindent 4 }}}}
    {{{{- end }}}}
spec:
  namespaceSelector:
    any: true
  selector:
    matchLabels:
      {WORKSPACE_COMPONENT_LABEL}: {WORKSPACE_COMPONENT}
  podMetricsEndpoints:
  - port: {{{{ $metrics }}}}-metrics
    scheme: {{{{ $metrics }}}}
    path: /metrics
    {{{{- if eq $metrics "https" }}}}
    authorization:
      type: Bearer
      credentials:
        name: {{{{ .tokenSecret | default {token} }}}}
        key: token
    {{{{- with .tlsConfig }}}}
    tlsConfig:
    {{{{- toYaml . | nindent 6 }}}}
    {{{{- end }}}}
    {{{{- end }}}}
    {{{{- with .interval }}}}
    interval: {{{{ . }}}}
    {{{{- end }}}}
{{{{- end }}}}
{{{{- end }}}}
"""

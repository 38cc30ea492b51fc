"""The chart's namespaced install (``rbac.namespaced``), as config/namespaced does it with kustomize.

With ``rbac.namespaced=true`` the manager's ClusterRole keeps only its rules on cluster-scoped
resources (TokenReview and SubjectAccessReview for the secure /metrics endpoint; Node `get` is
dropped as config/namespaced drops it), and the rest of its rules become a Role and RoleBinding in
each namespace of ``watchNamespaces`` (the release namespace when that is empty), which the
operator then watches (``WATCH_NAMESPACES``). With the default (false) the chart renders
config/default's objects unchanged: the conditionals below render nothing.

With ``rbac.secretsPerNamespace`` (cluster-wide installs) the chart renders the secrets-per-namespace
ClusterRole under ``pko.objname`` and tells the operator that name (``STACK_SECRETS_ROLE``), which a
refused Secret's message names (pko.controllers.secretaccess): with nameOverride or fullnameOverride
it is not config's ``pko-stack-secrets``.
"""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from pko import defaults
from pko.devtools.helm_markers import Markers

Obj = dict[str, Any]

# Cluster-scoped resources the manager's rules name; a Role cannot grant them.
CLUSTER_SCOPED = frozenset({"nodes", "tokenreviews", "subjectaccessreviews"})
# What the namespaced install keeps of them (config/namespaced/kustomization.yaml).
KEPT_CLUSTER_SCOPED = frozenset({"tokenreviews", "subjectaccessreviews"})
# The ClusterRole of the secrets-per-namespace component (config/components/secrets-per-namespace).
STACK_SECRETS_ROLE_FILE = "config/components/secrets-per-namespace/stack_secrets_role.yaml"
# The manager's variables this module sets (config/ must not set them itself).
OWN_ENV = frozenset({"WATCH_NAMESPACES", "WATCH_LABEL_SELECTOR", "STACK_SECRETS_ROLE"})
# Where the chart renders the secrets-per-namespace ClusterRole.
SECRETS_PER_NAMESPACE = (
    "and .Values.rbac.create .Values.rbac.secretsPerNamespace (not .Values.rbac.namespaced)"
)
# The namespaces watched: watchNamespaces, else (namespaced RBAC) the release namespace.
WATCHED = (
    "(.Values.watchNamespaces | default (ternary (list .Release.Namespace) (list) .Values.rbac.namespaced))"
)


def namespaced_rules(rules: list[Obj]) -> list[Obj]:
    return [r for r in rules if not set(r["resources"]) & CLUSTER_SCOPED]


def mark_manager_rules(rules: list[Obj], markers: Markers, per_namespace: Obj | None = None) -> list[Any]:
    """The manager ClusterRole's rules with every rule a namespaced install moves to the Roles (or
    drops) inside ``{{- if not .Values.rbac.namespaced }}``, in config's order; ``per_namespace``
    (the rule of the secrets-per-namespace ClusterRole, which config's must equal) also inside
    ``{{- if not .Values.rbac.secretsPerNamespace }}``."""
    out: list[Any] = []
    inside = False
    found = False
    for n, rule in enumerate(rules):
        moved = not set(rule["resources"]) <= KEPT_CLUSTER_SCOPED
        if moved != inside:
            text = "{{- if not .Values.rbac.namespaced }}" if moved else "{{- end }}"
            out.append(markers.new_block(f"NOT_NAMESPACED_{n}", text))
            inside = moved
        if rule == per_namespace:
            found = True
            out.append(
                markers.new_block(f"PER_NAMESPACE_{n}", "{{- if not .Values.rbac.secretsPerNamespace }}")
            )
            out.append(rule)
            out.append(markers.new_block(f"PER_NAMESPACE_END_{n}", "{{- end }}"))
            continue
        out.append(rule)
    if inside:
        out.append(markers.new_block("NOT_NAMESPACED_END", "{{- end }}"))
    if per_namespace is not None and not found:
        raise SystemExit(
            "gen_helm: the manager's ClusterRole has no rule equal to the secrets-per-namespace "
            f"ClusterRole's ({per_namespace}): keep {STACK_SECRETS_ROLE_FILE} and config/rbac/role.yaml "
            "in step"
        )
    return out


def stack_secrets_role(role: Obj, labels: str, role_name: str) -> str:
    """templates/clusterrole-pko-stack-secrets.yaml: the secrets-per-namespace ClusterRole
    (``rbac.secretsPerNamespace``, cluster-wide installs only), which admins bind per namespace."""
    if role["metadata"]["name"] != defaults.STACK_SECRETS_ROLE:
        raise SystemExit(
            f"gen_helm: {STACK_SECRETS_ROLE_FILE} names its ClusterRole {role['metadata']['name']}, the "
            f"operator's default (--stack-secrets-role) is {defaults.STACK_SECRETS_ROLE}: keep them one"
        )
    body = yaml.safe_dump(role["rules"], sort_keys=False).rstrip()
    return f"""\
{{{{- if {SECRETS_PER_NAMESPACE} }}}}
# The operator's Secret and ConfigMap rights, granted where a RoleBinding to its ServiceAccount
# grants them (rbac.secretsPerNamespace; config/components/secrets-per-namespace).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {role_name}
  labels:
{labels}
rules:
{body}
{{{{- end }}}}
"""


def manager_env() -> str:
    """The manager's WATCH_NAMESPACES (and WATCH_LABEL_SELECTOR) entries, when set, and the name
    the chart gives the secrets-per-namespace ClusterRole (STACK_SECRETS_ROLE), when it renders it."""
    return (
        "{{- if " + SECRETS_PER_NAMESPACE + " }}\n"
        "- name: STACK_SECRETS_ROLE\n"
        f'  value: {{{{ include "pko.objname" (list $ "{defaults.STACK_SECRETS_ROLE}") | quote }}}}\n'
        "{{- end }}\n"
        "{{- with " + WATCHED + " }}\n"
        "- name: WATCH_NAMESPACES\n"
        '  value: {{ join "," . | quote }}\n'
        "{{- end }}\n"
        "{{- with .Values.watchLabelSelector }}\n"
        "- name: WATCH_LABEL_SELECTOR\n"
        "  value: {{ . | quote }}\n"
        "{{- end }}"
    )


def watched_roles(rules: list[Obj], labels: str, role_name: str) -> str:
    """templates/role-watched.yaml: a Role and its RoleBinding per watched namespace. ``labels``: the
    labels block (4 spaces in); ``role_name``: its ``pko.objname`` expression (dot is the root)."""
    body = textwrap.indent(yaml.safe_dump(namespaced_rules(rules), sort_keys=False).rstrip(), "  ")
    return f"""\
{{{{- if and .Values.rbac.create .Values.rbac.namespaced }}}}
{{{{- range $ns := {WATCHED} }}}}
{{{{- with $ }}}}
---
# The operator's rights in a watched namespace (rbac.namespaced; config/namespaced/watched).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {role_name}
  namespace: {{{{ $ns }}}}
  labels:
{labels}
rules:
{body}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {role_name}
  namespace: {{{{ $ns }}}}
  labels:
{labels}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {role_name}
subjects:
- kind: ServiceAccount
  name: {{{{ include "pko.serviceAccountName" . }}}}
  namespace: {{{{ .Release.Namespace }}}}
{{{{- end }}}}
{{{{- end }}}}
{{{{- end }}}}
"""

"""The one description of the pko chart's values, and the three files written from it.

hack/gen_helm.py reads config/default's settings (images, replicas, resources, probes, ...) and hands
them to :func:`describe`; from the tree it returns come values.yaml (each value with its comment),
values.schema.json (Helm refuses a mistyped key or a wrong type before it renders anything: every map
the chart defines is ``additionalProperties: false``; maps that are Kubernetes objects, such as
``resources``, stay open) and the values table of docs/helm.md. So a value cannot be documented,
defaulted and checked three different ways.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import Any

import yaml

from pko import defaults

Schema = dict[str, Any]


@dataclass(frozen=True)
class Leaf:
    """One value: its default, its JSON schema and what it does (one sentence, Markdown allowed)."""

    name: str
    default: Any
    schema: Schema
    doc: str


@dataclass(frozen=True)
class Group:
    """A map of values the chart defines (closed: an unknown key in it is an error)."""

    name: str
    doc: str
    children: tuple[Leaf | Group, ...]


Node = Leaf | Group

# Schema pieces. Numbers a user may write either way (a tag 20261127) take both types.
STRING: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}
OBJECTS: Schema = {"type": "array", "items": {"type": "object"}}
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
COUNT: Schema = {"type": "integer", "minimum": 0}
PULL_POLICY: Schema = {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]}
TAG: Schema = {"type": ["string", "number"]}
DIGEST: Schema = {"type": "string", "pattern": r"^([A-Za-z0-9_+.-]+:[A-Fa-f0-9]{32,})?$"}
# A Go duration (what pko's LEADER_ELECTION_*/KUBE_API_TIMEOUT parse), or empty for pko's default.
DURATION: Schema = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))*$"}
# A DNS label (the name overrides prefix object names), or empty.
DNS_LABEL: Schema = {"type": "string", "maxLength": 63, "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$"}
# A PodDisruptionBudget's count or percentage, or empty.
INT_OR_PERCENT: Schema = {
    "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": r"^([0-9]+%?)?$"}]
}


def image(what: str, found: dict[str, str], pull_policy: str | None) -> tuple[Leaf, ...]:
    """The keys of an image, as hack/release.py writes them: ``REGISTRY/REPOSITORY:TAG@DIGEST``."""
    leaves = (
        Leaf("registry", found["registry"], STRING, f"Registry of the {what} image (empty: none)"),
        Leaf("repository", found["repository"], STRING, f"Repository of the {what} image"),
        Leaf("tag", "", TAG, "Tag (empty: the chart's `appVersion`)"),
        Leaf("digest", found["digest"], DIGEST, "Digest `sha256:...`, appended to the tag when set"),
    )
    if pull_policy is None:
        return leaves
    return (*leaves, Leaf("pullPolicy", pull_policy, PULL_POLICY, f"Pull policy of the {what} image"))


def describe(found: dict[str, Any]) -> tuple[Node, ...]:
    """The chart's values. ``found``: config/default's settings, which are the defaults (see
    gen_helm.template_deployment for the keys)."""
    # Imported here: that module describes its values with this one's Leaf and Group.
    from pko.devtools.helm_podmonitor import VALUES as POD_MONITOR

    lease, renew, retry, api_timeout = (
        defaults.go_duration_text(s)
        for s in (
            defaults.LEASE_DURATION,
            defaults.RENEW_DEADLINE,
            defaults.RETRY_PERIOD,
            defaults.KUBE_API_TIMEOUT,
        )
    )
    prefix = found["name_prefix"]
    return (
        Leaf(
            "nameOverride",
            "",
            DNS_LABEL,
            f"Names the objects `<release>-<nameOverride>-...` instead of config/'s (`{prefix}-...`, "
            "`controller-manager`, ...); the labels stay",
        ),
        Leaf(
            "fullnameOverride",
            "",
            DNS_LABEL,
            "Names the objects `<fullnameOverride>-...` (the file server Service `<fullnameOverride>`); "
            "wins over `nameOverride`",
        ),
        Leaf(
            "replicaCount",
            found["replicas"],
            COUNT,
            "Manager replicas; more than one needs `leaderElection.enabled` (the others stand by)",
        ),
        Group("image", "The manager image", image("manager", found["image"], found["image_pull_policy"])),
        Group(
            "agent",
            "",
            (
                Group(
                    "image",
                    "The agent image, which every workspace pod's bootstrap and fetch containers run "
                    "(`AGENT_IMAGE`, `AGENT_IMAGE_PULL_POLICY`)",
                    image("agent", found["agent_image"], found["agent_pull_policy"]),
                ),
            ),
        ),
        Group(
            "workspace",
            "",
            (
                Group(
                    "image",
                    "The Pulumi image of Workspaces that name none (`WORKSPACE_IMAGE`; empty repository: "
                    "not set, so `pulumi/pulumi:latest-nonroot`, or `:latest` for the `baseline` security "
                    "profile). The operator has no pull policy for it: a Stack's `workspaceTemplate` "
                    "sets one",
                    image("workspace", {"registry": "", "repository": "", "digest": ""}, None),
                ),
                Leaf(
                    "defaultTemplate",
                    "",
                    STRING,
                    "`--default-workspace-template`: the WorkspaceTemplate (`namespace/name`, or a name in "
                    "the release namespace) merged into every Stack's Workspace, under the Stack's own "
                    "(empty: none; docs/workspaces.md)",
                ),
                Leaf(
                    "metrics",
                    "",
                    {"type": "string", "enum": ["", "https", "http", "off"]},
                    "`--workspace-metrics`: how workspace pods serve their agent's /metrics (empty: the "
                    "operator's `https`, each scraper's token reviewed; `http` in the clear; `off`)",
                ),
            ),
        ),
        Leaf(
            "imagePullSecrets",
            [],
            {"anyOf": [OBJECTS, {"type": "string", "maxLength": 0}]},
            "Pull secrets of the manager pod",
        ),
        Group(
            "serviceAccount",
            "The manager's ServiceAccount",
            (
                Leaf("create", True, BOOL, "Create it (false: use `serviceAccount.name`, which must exist)"),
                Leaf(
                    "name",
                    "",
                    STRING,
                    "Its name (empty: config/'s `controller-manager`, after the name overrides); "
                    "the bindings "
                    "and the token request Role follow it",
                ),
                Leaf(
                    "annotations",
                    {},
                    STRING_MAP,
                    "Its annotations, e.g. a cloud's workload identity (`eks.amazonaws.com/role-arn`)",
                ),
            ),
        ),
        Group(
            "rbac",
            "",
            (
                Leaf(
                    "create",
                    True,
                    BOOL,
                    "Create the operator's own ClusterRole, Roles and bindings (the user-facing "
                    "edit/view/approve roles are always created)",
                ),
                Leaf("extraRules", [], OBJECTS, "Rules appended to the manager's ClusterRole"),
                Leaf(
                    "namespaced",
                    False,
                    BOOL,
                    "The namespaced install (config/namespaced): the manager's rules on namespaced "
                    "resources as a Role and RoleBinding in each of `watchNamespaces` (empty: the "
                    "release namespace, which is then watched); its ClusterRole keeps only "
                    "TokenReview and SubjectAccessReview `create` (docs/install.md)",
                ),
                Leaf(
                    "secretsPerNamespace",
                    False,
                    BOOL,
                    "Secrets per namespace (config/components/secrets-per-namespace; cluster-wide "
                    "installs): the manager's ClusterRole without Secret and ConfigMap rights, which "
                    "the ClusterRole `pko-stack-secrets` grants where the platform team binds it to "
                    "the operator's ServiceAccount with a RoleBinding, in each namespace with Stacks "
                    "(docs/install.md)",
                ),
            ),
        ),
        Group(
            "controller",
            "",
            (
                Leaf(
                    "logLevel",
                    found["log_level"],
                    {"type": "string", "enum": ["debug", "info", "warn", "error", "critical"]},
                    "`--log-level`: `debug`, `info`, `warn`, `error` or `critical`",
                ),
                Leaf(
                    "logFormat",
                    found["log_format"],
                    {"type": "string", "enum": ["json", "console"]},
                    "`--log-format`: `json` or `console`",
                ),
            ),
        ),
        Group(
            "leaderElection",
            "",
            (
                Leaf(
                    "enabled",
                    True,
                    BOOL,
                    "`--leader-elect`: run the controllers only while holding the Lease",
                ),
                Leaf(
                    "id",
                    "",
                    STRING,
                    "The Lease's name (`LEADER_ELECTION_ID`; empty: pko's); with `watchLabelSelector` a "
                    "digest of the selector is appended, so each shard holds its own (docs/sharding.md)",
                ),
                Leaf(
                    "leaseDuration",
                    "",
                    DURATION,
                    "How long a standby waits before taking over an unrenewed Lease "
                    f"(Go duration; empty: {lease})",
                ),
                Leaf(
                    "renewDeadline",
                    "",
                    DURATION,
                    f"How long the leader tries to renew before it stops leading (empty: {renew})",
                ),
                Leaf("retryPeriod", "", DURATION, f"Time between Lease attempts (empty: {retry})"),
            ),
        ),
        Leaf(
            "watchNamespace",
            "",
            STRING,
            "The one namespace to watch (`WATCH_NAMESPACE`); empty: every namespace. The RBAC stays "
            "cluster-wide either way",
        ),
        Leaf(
            "watchNamespaces",
            [],
            {"type": "array", "items": DNS_LABEL},
            "The namespaces to watch (`WATCH_NAMESPACES`), each listed and watched apart; with "
            "`rbac.namespaced` the operator's Roles go there; empty: every namespace (or, with "
            "`rbac.namespaced`, the release namespace)",
        ),
        Leaf(
            "watchLabelSelector",
            "",
            STRING,
            "Reconcile only the Stacks this label selector matches (`WATCH_LABEL_SELECTOR`); a shard: "
            "`pko.pulumi.com/shard=a`, the default shard `!pko.pulumi.com/shard`, one release each "
            "(docs/sharding.md); empty: every Stack",
        ),
        Group(
            "kubeAPI",
            "",
            (
                Leaf(
                    "timeout",
                    "",
                    DURATION,
                    f"Timeout of Kubernetes API requests (`KUBE_API_TIMEOUT`; empty: {api_timeout})",
                ),
            ),
        ),
        Group(
            "flux",
            "",
            (
                Leaf(
                    "maxUntarSizeBytes",
                    "",
                    {
                        "anyOf": [
                            {"type": "integer", "minimum": 1},
                            {"type": "string", "pattern": "^([1-9][0-9]*)?$"},
                        ]
                    },
                    "Largest Flux artifact a workspace unpacks, in bytes "
                    "(`FLUX_MAX_UNTAR_SIZE_BYTES`; empty: "
                    "the agent's default)",
                ),
                Leaf(
                    "eventsAddress",
                    "",
                    STRING,
                    "Where Stack Events are also POSTed as Flux events (`EVENTS_ADDRESS`), e.g. "
                    "`http://notification-controller.flux-system.svc.cluster.local./`; empty: nowhere",
                ),
            ),
        ),
        Group(
            "git",
            "",
            (
                Leaf(
                    "allowInsecureCredentials",
                    False,
                    BOOL,
                    "Run Stacks whose `projectRepo` is plain `http://` with credentials, sent unencrypted "
                    "(`ALLOW_INSECURE_GIT_CREDENTIALS`); false: such a Stack is Stalled "
                    "`CredentialsOverPlainHTTPRefused` and nothing is sent",
                ),
            ),
        ),
        Leaf(
            "extraEnv",
            [],
            OBJECTS,
            "More variables of the manager container, after the chart's own (a name given again wins)",
        ),
        Leaf(
            "extraVolumes",
            [],
            OBJECTS,
            "More volumes of the manager pod, e.g. a private CA or `known_hosts` for git",
        ),
        Leaf("extraVolumeMounts", [], OBJECTS, "More volume mounts of the manager container"),
        Leaf(
            "resources", found["resources"], OBJECT, "Resource requests and limits of the manager container"
        ),
        Leaf(
            "securityContext", found["security_context"], OBJECT, "Security context of the manager container"
        ),
        Leaf(
            "podSecurityContext",
            found["pod_security_context"],
            OBJECT,
            "Security context of the manager pod "
            "(the defaults satisfy the `restricted` Pod Security Standard)",
        ),
        Leaf(
            "livenessProbe",
            found["liveness_probe"],
            OBJECT,
            "The manager container's liveness probe: what you set merges into config/'s (a key set to "
            "`null` drops it; `livenessProbe: null`: no probe)",
        ),
        Leaf(
            "readinessProbe",
            found["readiness_probe"],
            OBJECT,
            "The manager container's readiness probe, merged likewise (`readinessProbe: null`: no probe)",
        ),
        Leaf(
            "terminationGracePeriodSeconds",
            found["grace"],
            COUNT,
            "Seconds the manager gets to finish its reconciles and release the Lease when stopped",
        ),
        Leaf("priorityClassName", "", STRING, "PriorityClass of the manager pod"),
        Leaf("deploymentAnnotations", {}, STRING_MAP, "Annotations of the Deployment"),
        Leaf("podAnnotations", {}, STRING_MAP, "Annotations added to the manager pod"),
        Leaf("podLabels", {}, STRING_MAP, "Labels added to the manager pod (the selector stays config/'s)"),
        Leaf("nodeSelector", {}, STRING_MAP, "Node selector of the manager pod"),
        Leaf("affinity", {}, OBJECT, "Affinity of the manager pod"),
        Leaf("tolerations", [], OBJECTS, "Tolerations of the manager pod"),
        Group(
            "podDisruptionBudget",
            "",
            (
                Leaf("enabled", False, BOOL, "A PodDisruptionBudget for the manager pods"),
                Leaf("minAvailable", "", INT_OR_PERCENT, "Its `minAvailable` (a count or a percentage)"),
                Leaf(
                    "maxUnavailable",
                    "",
                    INT_OR_PERCENT,
                    "Its `maxUnavailable` (empty with `minAvailable` empty too: 1); set one of the two",
                ),
            ),
        ),
        Group(
            "namespace",
            "",
            (
                Leaf(
                    "create",
                    False,
                    BOOL,
                    "Render the Namespace (named after the release namespace, with its `restricted` Pod "
                    "Security label): for `helm template | kubectl apply`; `helm install` needs it first",
                ),
            ),
        ),
        Group(
            "metrics",
            "",
            (
                Group(
                    "service",
                    "",
                    (
                        Leaf(
                            "enabled",
                            True,
                            BOOL,
                            f"The metrics Service (`{found['metrics_service']}`, "
                            "port `http-metrics`: HTTPS, a bearer token allowed to get /metrics)",
                        ),
                    ),
                ),
            ),
        ),
        Group(
            "serviceMonitor",
            "",
            (
                Leaf(
                    "enabled",
                    False,
                    BOOL,
                    "A Prometheus Operator ServiceMonitor for the metrics Service (needs its CRD)",
                ),
                Leaf("namespace", "", STRING, "Its namespace (empty: the release namespace)"),
                Leaf("labels", {}, STRING_MAP, "Its labels, e.g. the one your Prometheus selects by"),
                Leaf("interval", "", STRING, "Scrape interval (empty: Prometheus's)"),
                Leaf("timeout", "", STRING, "Scrape timeout (empty: Prometheus's)"),
                Leaf("telemetryPath", "/metrics", STRING, "Path of the metrics"),
                Leaf(
                    "scheme",
                    "https",
                    {"type": "string", "enum": ["https", "http"]},
                    "`http` only for an operator run with `METRICS_SECURE=false` (in `extraEnv`)",
                ),
                Leaf(
                    "bearerTokenFile",
                    "/var/run/secrets/kubernetes.io/serviceaccount/token",
                    STRING,
                    "The token Prometheus scrapes with (its pod's ServiceAccount token): bind that "
                    "account to the metrics-reader ClusterRole (docs/metrics.md)",
                ),
                Leaf(
                    "tlsConfig",
                    {"insecureSkipVerify": True},
                    OBJECT,
                    "`tlsConfig` of the endpoint: the operator's certificate is self-signed unless "
                    "`METRICS_CERT_DIR` names a mounted one; then give its `ca`, `serverName` and "
                    "`insecureSkipVerify: false`",
                ),
                Leaf("metricRelabelings", [], OBJECTS, "`metricRelabelings` of the endpoint"),
                Leaf(
                    "targetLabels",
                    [],
                    {"type": "array", "items": STRING},
                    "Service labels copied onto the scraped series",
                ),
            ),
        ),
        POD_MONITOR,
        Group(
            "prometheusRule",
            "",
            (
                Leaf(
                    "enabled",
                    False,
                    BOOL,
                    "The alerts of config/prometheus as a Prometheus Operator PrometheusRule (needs its CRD)",
                ),
                Leaf("namespace", "", STRING, "Its namespace (empty: the release namespace)"),
                Leaf("labels", {}, STRING_MAP, "Its labels, e.g. the one your ruleSelector reads"),
            ),
        ),
    )


# ------------------------------------------------------------------------------------------ the files


def defaults_of(nodes: tuple[Node, ...]) -> dict[str, Any]:
    return {n.name: defaults_of(n.children) if isinstance(n, Group) else n.default for n in nodes}


def values_yaml(nodes: tuple[Node, ...]) -> str:
    """values.yaml: every value with its comment (``# --``, the helm-docs convention)."""

    def lines(nodes: tuple[Node, ...], indent: str) -> list[str]:
        out: list[str] = []
        for node in nodes:
            if not indent:
                out.append("")
            if node.doc:
                width = 100 - len(indent) - 5
                wrapped = textwrap.wrap(node.doc, width, break_long_words=False, break_on_hyphens=False)
                out.append(f"{indent}# -- {wrapped[0]}")
                out.extend(f"{indent}#    {w}" for w in wrapped[1:])
            if isinstance(node, Group):
                out.append(f"{indent}{node.name}:")
                out.extend(lines(node.children, indent + "  "))
                continue
            text = yaml.safe_dump({node.name: node.default}, sort_keys=False, default_flow_style=False)
            out.extend(textwrap.indent(text.rstrip(), indent).splitlines())
        return out

    head = (
        "# Values of the pko chart. Every default is what `kubectl apply --server-side -k config/default`\n"
        "# installs (the image tags: the chart's appVersion); the names follow the Go operator's chart\n"
        "# (deploy/helm/pulumi-operator) where pko has the same setting. values.schema.json refuses\n"
        "# unknown keys and wrong types. docs/helm.md describes every value.\n"
    )
    return head + "\n".join(lines(nodes, "")) + "\n"


def schema_of(node: Node) -> Schema:
    if isinstance(node, Leaf):
        return {"description": node.doc, **node.schema} if node.doc else dict(node.schema)
    out: Schema = {"type": "object"}
    if node.doc:
        out["description"] = node.doc
    out["additionalProperties"] = False
    out["properties"] = {c.name: schema_of(c) for c in node.children}
    return out


def values_schema(nodes: tuple[Node, ...]) -> str:
    root = schema_of(Group("", "", nodes))
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Values of the pko chart (generated by hack/gen_helm.py)",
        **root,
    }
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def default_text(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`" if len(text) <= 40 else "config/'s (see values.yaml)"


def values_table(nodes: tuple[Node, ...]) -> str:
    """The Markdown table of every value, for docs/helm.md."""
    rows = ["| Key | Default | Description |", "|-----|---------|-------------|"]

    def walk(nodes: tuple[Node, ...], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, Group):
                walk(node.children, f"{prefix}{node.name}.")
            else:
                doc = node.doc.replace("|", "\\|")
                rows.append(f"| `{prefix}{node.name}` | {default_text(node.default)} | {doc} |")

    walk(nodes, "")
    return "\n".join(rows) + "\n"

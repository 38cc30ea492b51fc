"""What the e2e modules build and wait for: the suite's Program and Stack manifests (the Stack is
pko.devtools.stacks.claimed_stack: state on a claim of the Stack's own, the passphrase as a literal), a
broken and a slow Program, Ready and gone, the operator's metrics as a metrics-reader scrapes them, the
gitops project's bare repository, and a Flux source Ready with an artifact the test serves."""

from __future__ import annotations

import json
import ssl
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from dulwich.repo import Repo

from pko.devtools.fluxsource import GITREPOSITORY_CRD, artifact_status
from pko.devtools.gitserver import git_commit
from pko.devtools.stacks import claimed_stack

from .conftest import OPERATOR, OPERATOR_NS, Kube

PROGRAM = """\
apiVersion: pulumi.com/v1
kind: Program
metadata:
  name: {name}
program:
  resources:
    settings:
      type: kubernetes:core/v1:ConfigMap
      properties:
        metadata:
          name: {name}-settings
        data:
          greeting: hello
{extra}  outputs:
    greeting: ${{settings.data.greeting}}
    uid:
      fn::secret: ${{settings.metadata.uid}}
"""

# A resource whose creation takes `seconds`: pulumi-kubernetes awaits a Deployment until its pod is
# ready, and this pod's readiness probe passes only after that long.
HANG = """\
    wait:
      type: kubernetes:apps/v1:Deployment
      properties:
        metadata:
          name: {name}-wait
        spec:
          selector:
            matchLabels: {{app: {name}-wait}}
          template:
            metadata:
              labels: {{app: {name}-wait}}
            spec:
              securityContext:
                runAsNonRoot: true
                runAsUser: 1000
                seccompProfile: {{type: RuntimeDefault}}
              terminationGracePeriodSeconds: 1
              containers:
                - name: wait
                  image: localhost/pko-base-python:bookworm
                  imagePullPolicy: Never
                  command: [sh, -c, "sleep {seconds}; touch /tmp/ready; exec sleep 100000"]
                  readinessProbe:
                    exec: {{command: [test, -f, /tmp/ready]}}
                    periodSeconds: 1
                  securityContext:
                    allowPrivilegeEscalation: false
                    capabilities: {{drop: [ALL]}}
"""


# A Program whose output names nothing: the engine refuses it on every up.
BROKEN_PROGRAM = """\
apiVersion: pulumi.com/v1
kind: Program
metadata:
  name: {name}
program:
  outputs:
    broken: ${{nothing.here}}
"""


def program(name: str, hang: int | None = None) -> str:
    return PROGRAM.format(name=name, extra=HANG.format(name=name, seconds=hang) if hang else "")


def stack(name: str, source: str, env: dict[str, str] | None = None) -> str:
    """The Stack (with its state claim) for ``source``; ``env``: more variables for its workspace pod."""
    return claimed_stack(name, source, env=env)


def ready(k: Kube, name: str, within: float = 600) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        s = k.get("stack", name)
        c = k.condition(s, "Ready")
        return s if c.get("status") == "True" and c.get("reason") == "ProcessingCompleted" else None

    result: dict[str, Any] = k.until(f"stack {name} Ready", probe, within)
    return result


def gone(k: Kube, kind: str, name: str, within: float = 300) -> None:
    k.until(f"{kind} {name} deleted", lambda: k.get(kind, name) is None, within)


# Who scrapes pko's /metrics: a ServiceAccount bound to the shipped metrics-reader ClusterRole, as a
# Prometheus would be (pko serves /metrics over HTTPS to a token allowed to get it: docs/metrics.md).
METRICS_SCRAPER = f"""\
apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-metrics-scraper
  namespace: {OPERATOR_NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-metrics-scraper
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: pulumi-kubernetes-operator-metrics-reader
subjects:
  - kind: ServiceAccount
    name: e2e-metrics-scraper
    namespace: {OPERATOR_NS}
"""


def metrics(k: Kube) -> str:
    pod = k.json("-n", OPERATOR_NS, "get", "pods", "-l", "control-plane=controller-manager")["items"][0]
    if OPERATOR == "go":  # the Go operator serves plain HTTP to anyone
        request = urllib.request.Request(f"http://{pod['status']['podIP']}:8383/metrics")
        context = None
    else:
        k.apply(METRICS_SCRAPER, OPERATOR_NS)
        token = k.run("-n", OPERATOR_NS, "create", "token", "e2e-metrics-scraper").strip()
        request = urllib.request.Request(
            f"https://{pod['status']['podIP']}:8383/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # its self-signed certificate
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        text: str = r.read().decode()
        return text


def gitops_commit(repo: Repo, greeting: str) -> str:
    project = f"name: gitops\nruntime: yaml\noutputs:\n  greeting: {greeting}\n".encode()
    return git_commit(repo, {"app/Pulumi.yaml": project}, greeting.encode())


def bare_repository(root: Path) -> Repo:
    """A bare repository whose ``main`` holds one commit ("one") of the gitops project."""
    repo = Repo.init_bare(str(root / "repo.git"), mkdir=True)
    gitops_commit(repo, "one")
    repo.refs.set_symbolic_ref(b"HEAD", b"refs/heads/main")
    return repo


def flux_source_ready(k: Kube, manifest: str, name: str, url: str, digest: str, revision: str) -> None:
    """A stand-in for Flux's source-controller (pko.devtools.fluxsource): the GitRepository kind (its CRD
    alone, no controller) applied and Established, then ``manifest`` (which holds GitRepository
    ``name``), then the status source-controller writes on ``name`` once it has stored the artifact at
    ``url`` (``digest``, ``revision``), which the caller serves. The caller deletes the CRD."""
    k.apply(yaml.safe_dump(GITREPOSITORY_CRD))
    k.established(GITREPOSITORY_CRD["metadata"]["name"])
    k.apply(manifest)
    generation = int((k.get("gitrepository", name) or {})["metadata"]["generation"])
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = json.dumps({"status": artifact_status(url, digest, revision, generation, now)})
    k.run("patch", "gitrepository", name, "--subresource=status", "--type=merge", "-p", patch)

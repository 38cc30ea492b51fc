"""What a platform team sets up around pko, on the real node (issues 42 and 46), judged from outside:

1. a WorkspaceTemplate shared by two Program Stacks (``workspaceTemplateRef``): both workspace pods carry
   its label; the template changed once rolls each pod exactly once, onto the new label, with no Update;
2. ``spec.outputs``: the Stack's outputs Secret, with its stable name, mounted by a plain pod that prints
   the output it reads;
3. two shards (docs/sharding.md): the suite's operator given ``!pko.pulumi.com/shard`` and a second
   Deployment ``pko.pulumi.com/shard=b``, each with its own Lease; ``pf-b`` is labelled shard ``b``, the
   others are the default shard's. With shard ``b``'s operator gone (scaled to 0), a change of ``pf-a``
   is deployed and one of ``pf-b`` waits, with no Update; shard ``b`` back, it is deployed;
4. a probe of the operator and an agent from a pod in another namespace (issue 46): its scrape of
   ``/metrics`` without a token is refused (401) and with its own token (no metrics-reader role) 403, as
   is (401) its tokenless scrape of ``pf-a``'s agent's own ``/metrics``; its
   calls to ``pf-a``'s agent without a token are ``UNAUTHENTICATED`` and with a token of the agent's own
   audience ``PERMISSION_DENIED``; and the operator's ServiceAccount may not list or watch Secrets;
5. a real Prometheus (hack/build-prometheus.sh) on this machine's loopback scraping the operator's pod on
   the node over HTTPS with a metrics-reader ServiceAccount's token, evaluating the shipped rules
   (``for`` shortened): it fires ``PulumiStackFailing`` for a Stack whose program is broken, and no other
   Stack; a token without the metrics-reader binding is refused (403), and no token at all (401);
6. the same Prometheus and token scraping two workspace pods' agents (``pf-a``'s and the broken Stack's)
   on their ``https-metrics`` port: both up, and the broken Stack's failed ups counted by its agent.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from pko.controllers.sharding import lease_name
from pko.defaults import LEADER_ELECTION_ID
from pko.devtools.prometheus import rules_without_waiting, running_prometheus, scrape_pko
from pko.devtools.waiting import NotReached

from .conftest import OPERATOR_NS, Kube
from .stacks import BROKEN_PROGRAM, METRICS_SCRAPER, gone, program, ready, stack

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.pko_only("WorkspaceTemplate, spec.outputs, secure metrics"),
]

SHARED = ("pf-a", "pf-b")  # the two Stacks of the shared template
BROKEN = "pf-broken"  # a Stack whose program the engine refuses
TEMPLATE = "pf-shared"
LABEL = "e2e.pko.dev/template"
OUTPUTS = "pf-a-outputs"  # pf-a's outputs Secret
READER = "pf-outputs-reader"  # the pod that mounts it


def _template(version: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "auto.pulumi.com/v1alpha1",
            "kind": "WorkspaceTemplate",
            "metadata": {"name": TEMPLATE},
            "spec": {"spec": {"podTemplate": {"metadata": {"labels": {LABEL: version}}}}},
        }
    )


def _stack(name: str, **spec: Any) -> str:
    """The suite's Program Stack (state on its claim), with more ``spec`` fields."""
    docs = [d for d in yaml.safe_load_all(stack(name, f"programRef:\n    name: {name}")) if d]
    for doc in docs:
        if doc["kind"] == "Stack":
            doc["spec"].update(spec)
    return yaml.safe_dump_all(docs)


def _pod(k: Kube, name: str) -> dict[str, Any] | None:
    return k.get("pod", f"{name}-workspace-0")


def _ups(k: Kube, name: str) -> set[str]:
    return {
        u["metadata"]["name"]
        for u in k.json("get", "updates", "-l", f"pulumi.com/stack-name={name}")["items"]
    }


SHARD_LABEL = "pko.pulumi.com/shard"
SHARD_B = "controller-manager-shard-b"  # shard b's operator: a copy of the suite's Deployment
SHARD_POD_LABEL = "e2e.pko.dev/shard"  # tells its pods from the suite's operator's


def _operator(k: Kube) -> dict[str, Any]:
    """The suite's operator pod (not shard b's)."""
    pods = k.json(
        "-n", OPERATOR_NS, "get", "pods", "-l", f"control-plane=controller-manager,!{SHARD_POD_LABEL}"
    )
    running = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in running]
    return dict(running[0])


def _set_selector(k: Kube, deployment: str, selector: str | None) -> None:
    env = f"WATCH_LABEL_SELECTOR={selector}" if selector else "WATCH_LABEL_SELECTOR-"
    k.run("-n", OPERATOR_NS, "set", "env", f"deployment/{deployment}", "-c", "manager", env)
    k.run("-n", OPERATOR_NS, "rollout", "status", f"deployment/{deployment}", "--timeout=300s", timeout=320)


def _start_shard_b(k: Kube) -> None:
    """Shard b's operator: the suite's Deployment copied, its pods told apart by one more label, its
    selector ``pko.pulumi.com/shard=b``; the suite's operator takes the unlabelled Stacks."""
    deployment = k.json("-n", OPERATOR_NS, "get", "deployment", "controller-manager")
    meta = deployment["metadata"]
    deployment["metadata"] = {"name": SHARD_B, "namespace": OPERATOR_NS, "labels": meta.get("labels", {})}
    deployment.pop("status", None)
    spec = deployment["spec"]
    spec["selector"]["matchLabels"][SHARD_POD_LABEL] = "b"
    spec["template"]["metadata"]["labels"][SHARD_POD_LABEL] = "b"
    (manager,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "manager"]
    manager["env"] = [e for e in manager.get("env", []) if e["name"] != "WATCH_LABEL_SELECTOR"]
    manager["env"].append({"name": "WATCH_LABEL_SELECTOR", "value": f"{SHARD_LABEL}=b"})
    k.apply(json.dumps(deployment), OPERATOR_NS)
    _set_selector(k, "controller-manager", f"!{SHARD_LABEL}")
    k.run("-n", OPERATOR_NS, "rollout", "status", f"deployment/{SHARD_B}", "--timeout=300s", timeout=320)


def _stop_shards(k: Kube) -> None:
    k.run("-n", OPERATOR_NS, "delete", "deployment", SHARD_B, "--ignore-not-found", check=False)
    _set_selector(k, "controller-manager", None)


def _scale_shard_b(k: Kube, replicas: int) -> None:
    k.run("-n", OPERATOR_NS, "scale", f"deployment/{SHARD_B}", f"--replicas={replicas}")
    k.until(
        f"shard b's operator at {replicas} pods",
        lambda: (
            len(
                [
                    p
                    for p in k.json("-n", OPERATOR_NS, "get", "pods", "-l", f"{SHARD_POD_LABEL}=b")["items"]
                    if replicas == 0 or k.condition(p, "Ready").get("status") == "True"
                ]
            )
            == replicas
        ),
        180,
    )


@pytest.fixture(scope="module")
def stacks(kube: Kube) -> Any:
    """Two shards; the shared template, its two Stacks (pf-a keeping its outputs in a Secret, pf-b of
    shard b) and the broken one."""
    k = kube
    _start_shard_b(k)
    k.apply(_template("v1"))
    k.apply(
        program(SHARED[0])
        + "---\n"
        + _stack(
            SHARED[0], workspaceTemplateRef={"name": TEMPLATE}, outputs={"name": OUTPUTS, "kind": "Secret"}
        )
    )
    k.apply(program(SHARED[1]) + "---\n" + _stack(SHARED[1], workspaceTemplateRef={"name": TEMPLATE}))
    k.run("label", "stack", SHARED[1], f"{SHARD_LABEL}=b")
    k.apply(BROKEN_PROGRAM.format(name=BROKEN) + "---\n" + _stack(BROKEN, destroyOnFinalize=False))
    for name in SHARED:
        ready(k, name)
    yield k
    k.run("delete", "pod", READER, "--ignore-not-found", "--wait=false", check=False)
    for name in (*SHARED, BROKEN):
        k.run("delete", "stack", name, "--ignore-not-found", "--wait=false", check=False)
    for name in (*SHARED, BROKEN):
        gone(k, "stack", name, 600)
        k.run("delete", "program", name, f"pvc/{name}-state", "--ignore-not-found", check=False)
    k.run("delete", "workspacetemplate", TEMPLATE, "--ignore-not-found", check=False)
    _stop_shards(k)


def test_a_shared_template_changed_once_rolls_each_pod_once_without_an_update(stacks: Kube) -> None:
    k = stacks
    before = {}
    for name in SHARED:
        pod = _pod(k, name)
        assert pod is not None and pod["metadata"]["labels"].get(LABEL) == "v1", pod and pod["metadata"]
        before[name] = (pod["metadata"]["uid"], _ups(k, name))
    k.apply(_template("v2"))
    seen: dict[str, set[str]] = {name: set() for name in SHARED}

    def rolled() -> bool:
        done = True
        for name in SHARED:
            pod = _pod(k, name)
            if pod is None:
                done = False
                continue
            seen[name].add(pod["metadata"]["uid"])
            ready_pod = k.condition(pod, "Ready").get("status") == "True"
            done = done and pod["metadata"]["labels"].get(LABEL) == "v2" and ready_pod
        return done

    k.until("both workspace pods on the changed template", rolled, 300, 0.5)
    for name in SHARED:
        uid, ups = before[name]
        assert seen[name] - {uid} and len(seen[name] - {uid}) == 1, (
            f"{name}'s pod rolled more than once: {seen}"
        )
        ready(k, name)
        assert _ups(k, name) == ups, f"the template's change ran an Update for {name}"
        tmpl = k.json("get", "stack", name)["spec"]["workspaceTemplateRef"]
        assert tmpl == {"name": TEMPLATE}


def test_the_outputs_secret_is_mounted_by_a_pod(stacks: Kube) -> None:
    k = stacks
    secret = k.until("pf-a's outputs Secret", lambda: k.get("secret", OUTPUTS), 120)
    assert secret["metadata"]["labels"]["pulumi.com/stack-name"] == SHARED[0]
    assert [o["kind"] for o in secret["metadata"]["ownerReferences"]] == ["Stack"]
    assert set(secret["data"]) == {"greeting", "uid"}
    reader = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": READER},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "reader",
                    "image": "localhost/pko-base-python:bookworm",
                    "imagePullPolicy": "Never",
                    "command": ["cat", "/outputs/greeting"],
                    "volumeMounts": [{"name": "outputs", "mountPath": "/outputs", "readOnly": True}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            "volumes": [{"name": "outputs", "secret": {"secretName": OUTPUTS}}],
        },
    }
    k.apply(json.dumps(reader))
    k.until(
        "the reader pod done",
        lambda: ((k.get("pod", READER) or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        120,
    )
    assert k.run("logs", READER) == k.json("get", "stack", SHARED[0])["status"]["outputs"]["greeting"]


def test_two_shards_split_the_stacks_and_one_shards_loss_leaves_the_other(stacks: Kube) -> None:
    k = stacks
    a, b = SHARED
    # Each shard holds its own Lease (the selector's digest after the Lease name), by its own pods.
    leases = {x["metadata"]["name"]: x["spec"] for x in k.json("-n", OPERATOR_NS, "get", "leases")["items"]}
    holders = {
        shard: str(leases[lease_name(LEADER_ELECTION_ID, selector)].get("holderIdentity"))
        for shard, selector in (("default", f"!{SHARD_LABEL}"), ("b", f"{SHARD_LABEL}=b"))
    }
    assert holders["b"].startswith(SHARD_B) and holders["default"].startswith("controller-manager-"), holders
    assert not holders["default"].startswith(SHARD_B), holders
    # The Stack's shard label reaches its Workspace and Updates, and only those of shard b carry it.
    assert [
        w["metadata"]["name"] for w in k.json("get", "workspaces", "-l", f"{SHARD_LABEL}=b")["items"]
    ] == [b]
    shard_b_updates = k.json("get", "updates", "-l", f"{SHARD_LABEL}=b")["items"]
    assert {u["metadata"]["labels"]["pulumi.com/stack-name"] for u in shard_b_updates} == {b}
    _scale_shard_b(k, 0)
    before_b = _ups(k, b)
    for name in (a, b):
        k.apply(program(name).replace("greeting: hello", "greeting: hello-sharded"))
    k.until(
        f"{a} deployed by the default shard",
        lambda: (ready(k, a, 300)["status"].get("outputs") or {}).get("greeting") == "hello-sharded",
        300,
    )
    assert _ups(k, b) == before_b, f"{b}'s shard is down, yet an Update ran for it"
    _scale_shard_b(k, 1)
    k.until(
        f"{b} deployed once shard b is back",
        lambda: (ready(k, b, 300)["status"].get("outputs") or {}).get("greeting") == "hello-sharded",
        300,
    )
    assert len(_ups(k, b) - before_b) == 1, "shard b ran more than one Update for one change"


OUTSIDER = "pf-outsider"  # the namespace of the probing pod
# Run in pko's own image (it has grpclib and the agent's client stubs): every answer, as JSON.
PROBE = """
import asyncio, json, ssl, sys, urllib.error, urllib.request
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from pko.api.generated.pko.agent import v1 as pb

metrics, agent, agent_metrics = sys.argv[1], sys.argv[2], sys.argv[3]
own = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read().strip()
aimed = open("/var/run/probe/token").read().strip()
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

def scrape(token, url=metrics):
    headers = {"Authorization": "Bearer " + token} if token else {}
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

async def call(token):
    host, port = agent.rsplit(":", 1)
    channel = Channel(host, int(port))
    try:
        meta = {"authorization": "Bearer " + token} if token else None
        await pb.AutomationServiceStub(channel).pulumi_version(metadata=meta, timeout=10)
        return "OK"
    except GRPCError as e:
        return e.status.name
    finally:
        channel.close()

answers = {"metrics_none": scrape(None), "metrics_own": scrape(own)}
answers["agent_metrics_none"] = scrape(None, agent_metrics)
answers["agent_none"] = asyncio.run(call(None))
answers["agent_aimed"] = asyncio.run(call(aimed))
print(json.dumps(answers))
"""


def test_a_pod_in_another_namespace_is_refused_by_the_operator_and_the_agent(stacks: Kube) -> None:
    k = stacks
    operator = _operator(k)
    image = next(c["image"] for c in operator["spec"]["containers"] if c["name"] == "manager")
    metrics_url = f"https://{operator['status']['podIP']}:8383/metrics"
    agent = f"{SHARED[0]}-workspace.default.svc.cluster.local:50051"
    agent_metrics = f"https://{_agent_target(k, SHARED[0])}/metrics"
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": OUTSIDER},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", PROBE, metrics_url, agent, agent_metrics],
                    "volumeMounts": [{"name": "aimed", "mountPath": "/var/run/probe", "readOnly": True}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            # A token for the agent's own audience: it passes the TokenReview, so the SubjectAccessReview
            # is what refuses it.
            "volumes": [
                {
                    "name": "aimed",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "audience": f"{SHARED[0]}.default"}}
                        ]
                    },
                }
            ],
        },
    }
    k.run("create", "namespace", OUTSIDER)
    try:
        k.apply(json.dumps(probe), OUTSIDER)
        k.until(
            "the probe done",
            lambda: (
                ((k.get("pod", "probe", OUTSIDER) or {}).get("status") or {}).get("phase")
                in ("Succeeded", "Failed")
            ),
            180,
        )
        logs = k.run("-n", OUTSIDER, "logs", "probe")
        answers = json.loads(logs.strip().splitlines()[-1])
        assert answers == {
            "metrics_none": 401,
            "metrics_own": 403,
            "agent_metrics_none": 401,
            "agent_none": "UNAUTHENTICATED",
            "agent_aimed": "PERMISSION_DENIED",
        }, logs
    finally:
        k.run("delete", "namespace", OUTSIDER, "--wait=false", check=False)
    # The operator reads each Secret it needs by name; it can neither list nor watch them.
    operator_sa = f"system:serviceaccount:{OPERATOR_NS}:controller-manager"
    for verb in ("list", "watch"):
        can = k.run("auth", "can-i", verb, "secrets", "--all-namespaces", f"--as={operator_sa}", check=False)
        assert can.strip() == "no", (verb, can)


def _agent_target(k: Kube, name: str) -> str:
    """Where Stack ``name``'s workspace agent serves /metrics: its pod's https-metrics port (issue 46)."""
    pod = _pod(k, name)
    assert pod is not None, f"{name} has no workspace pod"
    (port,) = [
        p for c in pod["spec"]["containers"] for p in c.get("ports") or [] if p["name"] == "https-metrics"
    ]
    return f"{pod['status']['podIP']}:{port['containerPort']}"


def _metrics_status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = (
        False,
        ssl.CERT_NONE,
    )  # the operator's self-signed certificate
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10, context=context
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_real_prometheus_scrapes_the_operator_on_the_node_and_fires_for_the_broken_stack(
    stacks: Kube, tmp_path: Path
) -> None:
    k = stacks
    pod = _operator(k)
    target = f"{pod['status']['podIP']}:8383"
    url = f"https://{target}/metrics"
    k.apply(METRICS_SCRAPER, OPERATOR_NS)
    token = tmp_path / "token"
    token.write_text(k.run("-n", OPERATOR_NS, "create", "token", "e2e-metrics-scraper").strip())
    # Issue 46: only a token the apiserver accepts and whose user may get /metrics is served.
    k.run("-n", OPERATOR_NS, "create", "serviceaccount", "pf-nobody", check=False)
    nobody = k.run("-n", OPERATOR_NS, "create", "token", "pf-nobody").strip()
    try:
        assert _metrics_status(url, nobody) == 403
        assert _metrics_status(url, None) == 401
        assert _metrics_status(url, token.read_text()) == 200
    finally:
        k.run("-n", OPERATOR_NS, "delete", "serviceaccount", "pf-nobody", "--ignore-not-found", check=False)
    config = scrape_pko(target, token, "2s")
    with running_prometheus(tmp_path / "prometheus", config, rules_without_waiting()) as prom:
        k.until("Prometheus ready", prom.ready, 60, 1)

        def failing() -> list[dict[str, Any]]:
            alerts = [a for a in prom.alerts() if a["labels"]["alertname"] == "PulumiStackFailing"]
            return alerts if any(a["labels"].get("name") == BROKEN for a in alerts) else []

        try:
            alerts = k.until("PulumiStackFailing firing for the broken Stack", failing, 300, 2)
        except NotReached as exc:
            raise AssertionError(f"{exc}\nPrometheus log:\n{prom.logs()}") from None
        names = {(a["labels"]["namespace"], a["labels"]["name"]) for a in alerts}
        assert names == {("default", BROKEN)}, names
        assert prom.query('up{job="pko"} == 1'), "the operator's target is not up"
        scraped = prom.query('pko_updates_total{type="up",result="succeeded"} > 0')
        assert scraped, "no succeeded up was counted"


def test_a_real_prometheus_scrapes_the_workspace_agents_with_a_metrics_reader_token(
    stacks: Kube, tmp_path: Path
) -> None:
    """Issue 46: workspace pods serve their agent's /metrics by default, as the operator serves its own.
    The same metrics-reader token the operator accepts is accepted by pf-a's and the broken Stack's
    agents (each reviews it itself); the broken Stack's failed ups are counted by its agent."""
    k = stacks
    targets = [_agent_target(k, name) for name in (SHARED[0], BROKEN)]
    k.apply(METRICS_SCRAPER, OPERATOR_NS)
    token = tmp_path / "token"
    token.write_text(k.run("-n", OPERATOR_NS, "create", "token", "e2e-metrics-scraper").strip())
    assert [_metrics_status(f"https://{t}/metrics", token.read_text()) for t in targets] == [200, 200]
    config = scrape_pko(targets[0], token, "2s")
    (job,) = config["scrape_configs"]
    job["job_name"] = "pko-agents"
    job["static_configs"] = [{"targets": targets}]
    with running_prometheus(tmp_path / "prometheus", config) as prom:
        k.until("Prometheus ready", prom.ready, 60, 1)
        try:
            k.until("both agents scraped", lambda: len(prom.query('up{job="pko-agents"} == 1')) == 2, 120, 2)
            k.until(
                "the broken Stack's failed ups, as its agent counts them",
                lambda: prom.query('agent_operations_total{type="up",state="failed"} > 0'),
                300,
                2,
            )
        except NotReached as exc:
            raise AssertionError(f"{exc}\nPrometheus log:\n{prom.logs()}") from None
        assert prom.query('agent_operation_duration_seconds_count{type="up",state="failed"} > 0')

"""hack/bench/procstats.py's parsers and cgroup readers, and peerscale*.py's pure steps, on sample text
and files (no cluster): what the scale benchmark counts must be right before its figures mean anything."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import peerscale_busy
import peerscale_idle
import peerscale_operator
import peerscale_watch
import procstats
import pytest
from procstats import Requests

Obj = dict[str, Any]


def series(verb: str, group: str, count: int, *, code: str = "200", dry_run: str = "", sub: str = "") -> str:
    """One ``apiserver_request_total`` line as kube-apiserver 1.37 writes it."""
    labels = (
        f'code="{code}",component="apiserver",dry_run="{dry_run}",group="{group}",resource="r",'
        f'scope="resource",subresource="{sub}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {count}"


METRICS = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb...",
        "# TYPE apiserver_request_total counter",
        series("APPLY", "pulumi.com", 32, sub="status"),
        series("PUT", "pulumi.com", 3, code="409"),
        series("LIST", "pulumi.com", 4),
        series("WATCH", "pulumi.com", 10),
        series("GET", "", 236),
        series("POST", "", 1, code="201", dry_run="All"),
        series("CONNECT", "", 2, code="0", sub="exec"),
        series("GET", "", 222, code="304", sub="apis"),
        series("POST", "coordination.k8s.io", 4, code="201"),
        'apiserver_request_terminations_total{code="429",component="apiserver",group="",verb="GET"} 7',
        'apiserver_request_duration_seconds_count{component="apiserver",group="",verb="GET"} 9',
    ]
)


def test_the_apiserver_counters_are_tallied_by_group_as_reads_writes_and_dry_runs() -> None:
    tally = procstats.parse_request_totals(METRICS)
    # APPLY and PUT are writes whatever their code; LIST is a read; the WATCH is left out.
    assert tally["pulumi.com"] == Requests(reads=4, writes=35)
    # GET of a pod and of discovery (group ""), a dry-run POST apart, CONNECT left out.
    assert tally[""] == Requests(reads=458, dry_runs=1)
    assert tally["coordination.k8s.io"] == Requests(writes=4)
    assert set(tally) == {"pulumi.com", "", "coordination.k8s.io"}  # other metrics are not requests


def test_tallies_add_subtract_scale_and_total_by_group() -> None:
    before = {"pulumi.com": Requests(reads=4, writes=10), "": Requests(reads=100)}
    after = {"pulumi.com": Requests(reads=6, writes=30), "": Requests(reads=160), "apps": Requests(writes=2)}
    delta = procstats.sub(after, before)
    assert delta == {
        "pulumi.com": Requests(reads=2, writes=20),
        "": Requests(reads=60),
        "apps": Requests(writes=2),
    }
    assert procstats.add(before, delta) == after
    assert procstats.total(delta) == Requests(reads=62, writes=22)
    assert procstats.total(delta, procstats.PULUMI_GROUPS) == Requests(reads=2, writes=20)
    assert procstats.total(procstats.scaled(delta, 0.5)).total == 42
    assert Requests(reads=1, writes=2, dry_runs=3).total == 6


def response(verb: str, path: str, status: str = "200 OK") -> str:
    """One response line of ``kubectl -v=6`` (client-go 1.37's structured form)."""
    url = f"https://10.87.0.1:6443{path}"
    prefix = "I1127 14:01:40.594581   12181 round_trippers.go:632]"
    return f'{prefix} "Response" verb="{verb}" url="{url}" status="{status}" milliseconds=7'


KUBECTL_LOG = "\n".join(
    [
        "I1127 14:01:40.581777   12181 loader.go:408] Config loaded from file:  .node/kubeconfig",
        response("GET", "/api?timeout=32s"),
        response("GET", "/apis/pulumi.com/v1/namespaces/bench-peer/stacks?limit=500"),
        response("PATCH", "/apis/pulumi.com/v1/namespaces/bench-peer/stacks/a?fieldManager=kubectl", "201"),
        response("POST", "/api/v1/namespaces/bench-peer/pods?dryRun=All", "201 Created"),
        response("GET", "/apis/pulumi.com/v1/namespaces/bench-peer/stacks?watch=true"),
        response("GET", "/metrics"),
        # client-go before 1.30: plain text
        "I0101 00:00:00.000000    1 round_trippers.go:553] DELETE https://h:6443/apis/apps/v1/namespaces/x/"
        "statefulsets/y 200 OK in 5 milliseconds",
        'Error from server (NotFound): stacks.pulumi.com "b" not found',
    ]
)


def test_what_kubectl_sent_is_read_from_its_v6_log_as_the_apiserver_counts_it() -> None:
    tally = procstats.kubectl_tally(KUBECTL_LOG)
    assert tally[""] == Requests(reads=1, dry_runs=1)  # discovery; the dry run apart; /metrics uncounted
    assert tally["pulumi.com"] == Requests(reads=1, writes=1)  # the watch is left out
    assert tally["apps"] == Requests(writes=1)  # the older plain format


@pytest.mark.parametrize(
    ("url", "group"),
    [
        ("https://h/api/v1/namespaces/x/pods", ""),
        ("https://h/apis/pulumi.com/v1/namespaces/x/stacks/a/status", "pulumi.com"),
        ("https://h/apis/auto.pulumi.com/v1alpha1/workspaces", "auto.pulumi.com"),
        ("https://h/apis/pulumi.com/v1", ""),  # group discovery: a non-resource request
        ("https://h/apis", ""),
        ("https://h/openapi/v3", ""),
    ],
)
def test_a_url_names_its_group_as_the_apiserver_labels_it(url: str, group: str) -> None:
    assert procstats.url_group(url) == group


def test_a_pods_cgroup_is_found_by_its_qos_class(tmp_path: Path) -> None:
    uid = "551d84ec-8daf-4111-a75e-4612b5ee16f5"
    guaranteed = tmp_path / "cpuacct" / "kubepods" / f"pod{uid}"
    burstable = tmp_path / "memory" / "kubepods" / "burstable" / f"pod{uid}"
    systemd = tmp_path / "cpu" / "kubepods.slice" / "kubepods-besteffort.slice"
    systemd = systemd / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    for d in (guaranteed, burstable, systemd):
        d.mkdir(parents=True)
    assert procstats.pod_cgroup("cpuacct", uid, tmp_path) == guaranteed
    assert procstats.pod_cgroup("memory", uid, tmp_path) == burstable
    assert procstats.pod_cgroup("cpu", uid, tmp_path) == systemd
    assert procstats.pod_cgroup("pids", uid, tmp_path) is None
    assert procstats.pod_cgroup("memory", "another-uid", tmp_path) is None


def test_a_pods_cpu_throttling_and_processes_are_read_from_its_cgroup(tmp_path: Path) -> None:
    pod = tmp_path / "podx"
    for container, pids in (("sandbox", "11\n"), ("manager", "23\n24\n")):
        (pod / container).mkdir(parents=True)
        (pod / container / "cgroup.procs").write_text(pids)
    (pod / "cgroup.procs").write_text("")
    (pod / "cpuacct.usage").write_text("626227058\n")
    (pod / "cpu.stat").write_text("nr_periods 376\nnr_throttled 6\nthrottled_time 399490885\n")
    assert procstats.cpuacct_seconds(pod) == pytest.approx(0.626227058)
    assert procstats.throttled_seconds(pod) == pytest.approx(0.399490885)
    assert sorted(procstats.cgroup_pids(pod)) == [11, 23, 24]
    assert procstats.parse_flat_keyed("total_rss 21532672\nbad line here\ncache 0\n") == {
        "total_rss": 21532672,
        "cache": 0,
    }


def test_a_status_field_is_read_in_kb_and_is_zero_when_absent() -> None:
    status = "Name:\tmanager\nVmHWM:\t   70360 kB\nVmRSS:\t   70212 kB\nThreads:\t12\n"
    assert procstats.status_kb(status, "VmRSS") == 70212
    assert procstats.status_kb(status, "VmHWM") == 70360
    assert procstats.status_kb("Name:\tkthreadd\n", "VmRSS") == 0


def test_this_process_rss_is_read_and_the_sandbox_left_out() -> None:
    me = os.getpid()
    mine = procstats.process_kb([me, 2**22 + 1], "VmRSS")  # a pid that does not exist is skipped
    assert set(mine) == {me} and mine[me] > 0
    comm = Path(f"/proc/{me}/comm").read_text().strip()
    assert procstats.process_kb([me], "VmRSS", skip=frozenset({comm})) == {}


def test_the_sampler_keeps_the_highest_value_and_skips_failed_reads() -> None:
    values = iter([5, 9, 7])
    sampled = threading.Event()

    def read() -> int:
        value = next(values, None)
        if value is None:
            sampled.set()
            raise RuntimeError("the pod is gone")
        return value

    with procstats.PeakSampler(read, every=0.01) as sampler:
        assert sampled.wait(5)
    assert sampler.peak == 9 and sampler.samples == 3


def pod(name: str, *, running: bool = True, deleting: bool = False, restarts: int = 0) -> Obj:
    state = {"running": {}} if running else {"waiting": {"reason": "ContainerCreating"}}
    meta: Obj = {"name": name, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T14:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [{"state": state, "restartCount": restarts}]}}


def test_the_operator_pod_is_the_one_running_and_not_being_deleted() -> None:
    assert peerscale_operator.running([pod("old", deleting=True), pod("new")])["metadata"]["name"] == "new"
    assert peerscale_operator.running([pod("new", running=False)]) is None
    assert peerscale_operator.running([pod("a"), pod("b")]) is None  # a rollout in progress: not yet
    assert peerscale_operator.running([]) is None
    assert peerscale_operator.restarts(pod("a", restarts=2)) == 2


def stack(name: str, generation: int = 1, **status: Any) -> Obj:
    return {"metadata": {"name": name, "generation": generation}, "status": status}


def test_a_stack_is_ready_for_its_generation_and_has_a_status_once_it_has_conditions() -> None:
    ready = [{"type": "Ready", "status": "True", "reason": "ProcessingCompleted"}]
    assert peerscale_watch.ready_now(stack("a", 2, conditions=ready, lastUpdate={"generation": 2}))
    assert not peerscale_watch.ready_now(stack("a", 2, conditions=ready, lastUpdate={"generation": 1}))
    stalled = [{"type": "Stalled", "status": "True", "reason": "SourceUnavailable"}]
    assert peerscale_watch.has_status(stack("a", conditions=stalled))
    assert not peerscale_watch.has_status(stack("a", observedGeneration=1))
    assert not peerscale_watch.has_status({"metadata": {"name": "a"}})


def test_the_stack_watch_notes_the_first_moment_every_stack_is_done() -> None:
    watch = peerscale_watch.StackWatch(None, ["a", "b"], peerscale_watch.has_status, None)  # type: ignore[arg-type]
    done = [{"type": "Stalled", "status": "True", "reason": "SourceUnavailable"}]
    watch._see("ADDED", stack("a"), 1.0)
    watch._see("ADDED", stack("other", conditions=done), 1.5)  # not one of ours
    watch._see("MODIFIED", stack("a", conditions=done), 2.0)
    watch._see("MODIFIED", stack("a", conditions=done), 2.5)  # counted once
    assert watch.done_at is None and watch.satisfied == 1
    watch._see("ADDED", stack("b", conditions=done), 3.0)
    assert watch.done_at == 3.0
    watch._see("DELETED", stack("b", conditions=done), 4.0)
    assert watch.satisfied == 1 and watch.done_at == 3.0  # the first moment stays


def test_both_idle_shapes_name_something_that_never_exists_and_destroy_nothing() -> None:
    missing = peerscale_idle.idle_stack("idle-00000", "missing-program")["spec"]
    assert missing == {"stack": "dev", "programRef": {"name": peerscale_idle.ABSENT}}
    waiting = peerscale_idle.idle_stack("idle-00001", "prerequisite")["spec"]
    assert waiting["programRef"] == {"name": peerscale_idle.IDLE_PROGRAM}
    assert waiting["prerequisites"] == [{"name": peerscale_idle.ABSENT}]
    assert "destroyOnFinalize" not in missing and "destroyOnFinalize" not in waiting


def test_row_3s_stacks_are_peer_pys_on_one_shared_claim_with_small_cpu_requests() -> None:
    program, stack_obj = peerscale_busy.row3_objects("scale-007")
    assert program["kind"] == "Program" and program["metadata"]["name"] == "scale-007"
    spec = stack_obj["spec"]
    assert spec["programRef"] == {"name": "scale-007"} and spec["destroyOnFinalize"] is True
    workspace = spec["workspaceTemplate"]["spec"]
    claim = workspace["podTemplate"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == peerscale_busy.SHARED_CLAIM == peerscale_busy.shared_claim()["metadata"]["name"]
    assert workspace["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}}

"""Lease leader election against a real kube-apiserver: one leader at a time, clean handover,
takeover after a killed leader's lease expires, and a leader cut off from the apiserver stops."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pko.devtools.waiting import wait_until
from pko.machinery.leaderelection import (
    LeaderElectionConfig,
    LeaderElectionRecord,
    LeaderElector,
    micro_time,
    next_try_in,
)
from pko.machinery.resource import LEASES, ResourceClient

CANDIDATE_SCRIPT = Path(__file__).with_name("lease_candidate.py")
REPO = Path(__file__).resolve().parents[2]


# ----- pure --------------------------------------------------------------------------------------


def test_config_defaults_are_the_go_operators_and_bad_durations_are_refused() -> None:
    cfg = LeaderElectionConfig("l", "ns", "me")
    assert (cfg.lease_duration, cfg.renew_deadline, cfg.retry_period) == (60.0, 45.0, 10.0)
    assert cfg.lease_duration_seconds == 60
    assert LeaderElectionConfig("l", "ns", "me", 2.5, 2.0, 1.0).lease_duration_seconds == 3  # rounded up
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "me", lease_duration=10, renew_deadline=10, retry_period=1)
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "me", lease_duration=10, renew_deadline=5, retry_period=5)
    with pytest.raises(ValueError):
        LeaderElectionConfig("l", "ns", "")


def test_record_round_trips_through_a_lease_spec() -> None:
    record = LeaderElectionRecord("me", 15, "2026-01-02T03:04:05.000006Z", "2026-01-02T03:04:06.000000Z", 3)
    assert LeaderElectionRecord.from_lease({"spec": record.to_spec()}) == record
    assert LeaderElectionRecord.from_lease({"spec": {}}) == LeaderElectionRecord("", 0, None, None, 0)
    when = datetime.fromisoformat("2026-01-02T03:04:05.000006+00:00")
    assert micro_time(when) == "2026-01-02T03:04:05.000006Z"


def test_a_candidate_tries_when_the_holders_lease_expires_if_that_is_before_its_next_try() -> None:
    assert next_try_in(12.0, None, 0.3) == 12.0  # nobody else holds it
    assert next_try_in(12.0, 50.0, 0.3) == 12.0  # a live holder: the usual retry
    assert next_try_in(12.0, 4.0, 0.3) == 4.3  # expires before the retry: try just after it
    assert next_try_in(12.0, 11.9, 0.3) == 12.0  # the retry comes as soon
    assert next_try_in(12.0, 0.0, 0.3) == 12.0  # expired and the try failed: someone else won
    assert next_try_in(12.0, -3.0, 0.3) == 12.0


# ----- against the apiserver ---------------------------------------------------------------------


class Tracker:
    """Who is leading, as seen by the work the leaders run; records any overlap."""

    def __init__(self) -> None:
        self.leading: list[str] = []
        self.overlaps: list[tuple[str, list[str]]] = []
        self.starts: list[str] = []

    def work(self, identity: str) -> Any:
        async def lead() -> None:
            if self.leading:
                self.overlaps.append((identity, list(self.leading)))
            self.leading.append(identity)
            self.starts.append(identity)
            try:
                await asyncio.Event().wait()
            finally:
                self.leading.remove(identity)  # the leader's controllers have stopped

        return lead


@dataclass
class Candidate:
    identity: str
    elector: LeaderElector
    task: asyncio.Task[None]
    seen_leaders: list[str] = field(default_factory=list)
    stopped_leading: int = 0


@pytest.fixture
async def candidates() -> AsyncIterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for c in made:
        c.elector.stop()
    for c in made:
        c.task.cancel()
        await asyncio.gather(c.task, return_exceptions=True)


def start_candidate(
    api: Any, tracker: Tracker, made: list[Candidate], cfg: LeaderElectionConfig
) -> Candidate:
    seen: list[str] = []
    holder: list[Candidate] = []

    def stopped() -> None:
        holder[0].stopped_leading += 1

    elector = LeaderElector(
        api,
        cfg,
        on_started_leading=tracker.work(cfg.identity),
        on_stopped_leading=stopped,
        on_new_leader=seen.append,
    )
    candidate = Candidate(cfg.identity, elector, asyncio.create_task(elector.run()), seen)
    holder.append(candidate)
    made.append(candidate)
    return candidate


def all_have_seen(leader: str, followers: list[Candidate]) -> bool:
    return all(leader in c.seen_leaders for c in followers)


async def read_record(api: Any, namespace: str, name: str) -> LeaderElectionRecord:
    return LeaderElectionRecord.from_lease(await ResourceClient(api, LEASES, namespace).get(name))


def parse_time(value: str | None) -> datetime:
    assert value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.mark.cluster
async def test_three_candidates_one_leader_at_a_time_and_clean_stop_hands_over_at_once(
    api_client: Any, namespace: str, candidates: list[Candidate]
) -> None:
    tracker = Tracker()
    # A long lease: a handover that waited for expiry instead of the release would take 45 s.
    lease_s, renew_s, retry_s = 45.0, 30.0, 0.5
    by_id = {
        ident: start_candidate(
            api_client,
            tracker,
            candidates,
            LeaderElectionConfig("le-three", namespace, ident, lease_s, renew_s, retry_s),
        )
        for ident in ("a", "b", "c")
    }
    loop = asyncio.get_running_loop()

    await wait_until("a first leader", lambda: len(tracker.leading) == 1)
    expected_transitions = 0
    for round_ in range(3):
        leader = tracker.leading[0]
        record = await read_record(api_client, namespace, "le-three")
        assert record.holder_identity == leader
        assert record.lease_transitions == expected_transitions
        assert by_id[leader].elector.is_leader()
        followers = [c for ident, c in by_id.items() if ident != leader and not c.task.done()]
        assert not any(c.elector.is_leader() for c in followers)
        await wait_until("followers see the leader", functools.partial(all_have_seen, leader, followers))

        stopped_at = loop.time()
        by_id[leader].elector.stop()
        await asyncio.wait_for(by_id[leader].task, 60)  # returns once the lease is released
        assert by_id[leader].stopped_leading == 1
        assert not by_id[leader].elector.is_leader()
        if round_ == 2:
            break
        await wait_until("the next leader", lambda: len(tracker.leading) == 1)
        # Taken over without waiting out the 45 s lease: the release made it free at once.
        assert loop.time() - stopped_at < lease_s
        expected_transitions += 1

    released = await read_record(api_client, namespace, "le-three")
    assert released.holder_identity == ""
    assert released.lease_transitions == 2
    assert tracker.overlaps == []
    assert sorted(tracker.starts) == ["a", "b", "c"]


@pytest.mark.cluster
async def test_killed_leader_is_replaced_after_lease_duration(
    api_client: Any, cluster: Any, namespace: str, candidates: list[Candidate]
) -> None:
    lease_s, renew_s, retry_s = 4.0, 2.5, 0.5
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CANDIDATE_SCRIPT),
        str(cluster.kubeconfig),
        namespace,
        "le-kill",
        "doomed",
        str(lease_s),
        str(renew_s),
        str(retry_s),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    try:
        async with asyncio.timeout(120):
            assert proc.stdout is not None
            while (line := await proc.stdout.readline()) and line.strip() != b"LEADING":
                pass
        assert line.strip() == b"LEADING", "the subprocess candidate never led"

        tracker = Tracker()
        successor = start_candidate(
            api_client,
            tracker,
            candidates,
            LeaderElectionConfig("le-kill", namespace, "successor", lease_s, renew_s, retry_s),
        )
        await wait_until("the successor observing the leader", lambda: "doomed" in successor.seen_leaders)
        assert not successor.elector.is_leader()

        proc.send_signal(signal.SIGKILL)  # no release: the lease must expire
        await proc.wait()
        await asyncio.sleep(0.5)  # let a write that was in flight land
        last = await read_record(api_client, namespace, "le-kill")
        assert last.holder_identity == "doomed"

        await wait_until("the successor leading", lambda: tracker.leading == ["successor"], within=120)
        record = await read_record(api_client, namespace, "le-kill")
        assert record.holder_identity == "successor"
        assert record.lease_transitions == last.lease_transitions + 1
        waited = (parse_time(record.acquire_time) - parse_time(last.renew_time)).total_seconds()
        assert waited >= lease_s - 0.05, f"took over {waited:.2f}s after the last renewal"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.cluster
async def test_leader_that_loses_the_apiserver_stops_leading_before_another_takes_over(
    cluster: Any,
    api_client: Any,
    namespace: str,
    make_client: Any,
    make_proxy: Any,
    candidates: list[Candidate],
) -> None:
    lease_s, renew_s, retry_s = 6.0, 3.0, 0.5
    tracker = Tracker()
    proxy_a = await make_proxy(cluster.server)
    proxy_b = await make_proxy(cluster.server)
    api_a = await make_client(cluster.kubeconfig, server=proxy_a.url)
    api_b = await make_client(cluster.kubeconfig, server=proxy_b.url)

    a = start_candidate(
        api_a, tracker, candidates, LeaderElectionConfig("le-cut", namespace, "a", lease_s, renew_s, retry_s)
    )
    await wait_until("a leading", lambda: tracker.leading == ["a"])
    b = start_candidate(
        api_b, tracker, candidates, LeaderElectionConfig("le-cut", namespace, "b", lease_s, renew_s, retry_s)
    )
    await wait_until("b observing a", lambda: "a" in b.seen_leaders)

    await proxy_a.cut()
    await asyncio.wait_for(a.task, 60)  # run() returns: leadership lost, no exception
    assert a.task.exception() is None
    assert not a.elector.is_leader()
    assert a.stopped_leading == 1
    last = await read_record(api_client, namespace, "le-cut")

    await wait_until("b leading", lambda: tracker.leading == ["b"], within=120)
    assert tracker.overlaps == []  # a had stopped its work before b started
    record = await read_record(api_client, namespace, "le-cut")
    assert record.holder_identity == "b"
    if last.holder_identity == "a":  # b had not yet taken over when we looked
        waited = (parse_time(record.acquire_time) - parse_time(last.renew_time)).total_seconds()
        assert waited >= lease_s - 0.05


@pytest.mark.cluster
async def test_a_restarted_container_takes_its_predecessors_lease_at_once(
    api_client: Any, namespace: str, candidates: list[Candidate]
) -> None:
    """The operator's container killed or exited on a lost renewal: its restart (same pod, new
    identity) leads at once instead of waiting out the 45 s lease; another pod still waits."""
    lease_s, renew_s, retry_s = 45.0, 30.0, 0.5
    now = micro_time(datetime.now(UTC))
    held = LeaderElectionRecord("pod-a_first-run", int(lease_s), now, now, 4)
    await ResourceClient(api_client, LEASES, namespace).create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "le-restart", "namespace": namespace},
            "spec": held.to_spec(),
        }
    )
    tracker = Tracker()
    other = start_candidate(
        api_client,
        tracker,
        candidates,
        LeaderElectionConfig(
            "le-restart", namespace, "pod-b_x", lease_s, renew_s, retry_s, predecessors="pod-b_"
        ),
    )
    await wait_until("the other pod observing the holder", lambda: "pod-a_first-run" in other.seen_leaders)
    assert not other.elector.is_leader()

    loop = asyncio.get_running_loop()
    started = loop.time()
    start_candidate(
        api_client,
        tracker,
        candidates,
        LeaderElectionConfig(
            "le-restart", namespace, "pod-a_second-run", lease_s, renew_s, retry_s, predecessors="pod-a_"
        ),
    )
    await wait_until("the restarted container leading", lambda: tracker.leading == ["pod-a_second-run"])
    assert loop.time() - started < lease_s / 3
    record = await read_record(api_client, namespace, "le-restart")
    assert record.holder_identity == "pod-a_second-run"
    assert record.lease_transitions == 5
    assert not other.elector.is_leader()
    assert tracker.overlaps == []

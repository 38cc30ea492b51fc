"""What an operator's pod costs, read from outside it: the kube-apiserver's request counters, the pod's
cgroups (cgroup v1, the kubelet's ``cgroupfs`` driver) and its processes' ``/proc/<pid>/status``.

Pure parsers (tested in test/bench/test_procstats.py without a cluster) and a few thin readers of the
host's files; nothing here talks to the API server, so reading never adds to what is counted.

Requests are tallied by API group (``""`` for the core group and for non-resource paths such as
discovery), each as reads (GET, LIST), writes (POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION) and
dry runs (a write with ``dryRun``: it stores nothing). Watches and CONNECT (exec, attach, port-forward)
are left out: the apiserver counts a long-running request when it ends, not when it starts, so they
do not fall into the window that caused them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
LONG_RUNNING_VERBS = frozenset({"WATCH", "WATCHLIST", "CONNECT"})
PULUMI_GROUPS = ("pulumi.com", "auto.pulumi.com")  # the operators' own kinds: no other client writes them

CGROUP_ROOT = Path("/sys/fs/cgroup")
SANDBOX_COMMANDS = frozenset({"pause"})  # the pod's sandbox process, not the operator's


@dataclass(frozen=True, slots=True)
class Requests:
    reads: float = 0.0
    writes: float = 0.0
    dry_runs: float = 0.0

    @property
    def total(self) -> float:
        return self.reads + self.writes + self.dry_runs

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.reads + other.reads, self.writes + other.writes, self.dry_runs + other.dry_runs)

    def __sub__(self, other: Requests) -> Requests:
        return Requests(self.reads - other.reads, self.writes - other.writes, self.dry_runs - other.dry_runs)

    def scaled(self, factor: float) -> Requests:
        return Requests(self.reads * factor, self.writes * factor, self.dry_runs * factor)


Tally = dict[str, Requests]  # API group -> requests


def _one(verb: str, dry_run: bool, count: float) -> Requests | None:
    """``count`` requests of ``verb`` as reads, writes or dry runs; None for a long-running verb."""
    if verb in LONG_RUNNING_VERBS:
        return None
    if verb in WRITE_VERBS:
        return Requests(dry_runs=count) if dry_run else Requests(writes=count)
    return Requests(reads=count)  # GET, LIST and anything the apiserver may add that changes nothing


def add(a: Mapping[str, Requests], b: Mapping[str, Requests]) -> Tally:
    return {g: a.get(g, Requests()) + b.get(g, Requests()) for g in set(a) | set(b)}


def sub(a: Mapping[str, Requests], b: Mapping[str, Requests]) -> Tally:
    return {g: a.get(g, Requests()) - b.get(g, Requests()) for g in set(a) | set(b)}


def scaled(tally: Mapping[str, Requests], factor: float) -> Tally:
    return {g: r.scaled(factor) for g, r in tally.items()}


def total(tally: Mapping[str, Requests], groups: Iterable[str] | None = None) -> Requests:
    """All of ``tally``, or only ``groups``'."""
    wanted = set(tally) if groups is None else set(groups)
    out = Requests()
    for group, requests in tally.items():
        if group in wanted:
            out = out + requests
    return out


# --- the apiserver's own count: apiserver_request_total -------------------------------------------

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>.*)\}\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_request_totals(text: str) -> Tally:
    """The requests the apiserver has served since it started (its ``/metrics`` text), by group.

    ``apiserver_request_total`` has one series per verb, group, version, resource, subresource,
    scope, component, dry_run and response code; they are summed here into reads, writes and dry
    runs per group (long-running verbs left out, see the module docstring).
    """
    tally: Tally = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        one = _one(labels.get("verb", ""), bool(labels.get("dry_run")), float(match["value"]))
        if one is not None:
            group = labels.get("group", "")
            tally[group] = tally.get(group, Requests()) + one
    return tally


# --- what the bench itself sent: kubectl -v=6 ----------------------------------------------------

# kubectl (client-go) at -v=6 logs one line per response; 1.30+ structured, older releases plain.
_KUBECTL_RESPONSE = (
    re.compile(r'"Response" verb="(?P<verb>[A-Z]+)" url="(?P<url>[^"]+)" status="(?P<status>\d*)'),
    re.compile(r"\] (?P<verb>GET|POST|PUT|PATCH|DELETE) (?P<url>https?://\S+) (?P<status>\d{3})\b"),
)
_HTTP_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def url_group(url: str) -> str:
    """The API group a request URL names, as the apiserver labels it: ``""`` for the core group and
    for discovery and other non-resource paths (``/apis/<group>/<version>`` itself is discovery)."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    if len(parts) >= 4 and parts[0] == "apis":
        return parts[1]
    return ""


def kubectl_tally(stderr: str) -> Tally:
    """The requests a ``kubectl -v=6`` run sent, from its log (watches left out, as on the server)."""
    tally: Tally = {}
    for line in stderr.splitlines():
        match = next((m for p in _KUBECTL_RESPONSE if (m := p.search(line)) is not None), None)
        if match is None:
            continue
        url = match["url"]
        path, query = urlsplit(url).path, urlsplit(url).query
        if "watch=true" in query.split("&") or "/watch/" in path or path == "/metrics":
            continue  # watches: see above; /metrics: the apiserver does not count it
        if match["verb"] in _HTTP_WRITES:
            one = Requests(dry_runs=1) if "dryRun=" in query else Requests(writes=1)
        else:
            one = Requests(reads=1)
        group = url_group(url)
        tally[group] = tally.get(group, Requests()) + one
    return tally


# --- the pod's cgroups and processes -------------------------------------------------------------


def pod_cgroup(controller: str, uid: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The pod's directory in one cgroup v1 hierarchy (``cpuacct``, ``cpu``, ``memory``), None when
    it has none. The kubelet names it by the pod's QoS class: ``kubepods/pod<uid>`` (Guaranteed),
    ``kubepods/burstable/pod<uid>``, ``kubepods/besteffort/pod<uid>`` with the ``cgroupfs`` driver;
    ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice`` with ``systemd``."""
    base = root / controller
    under = uid.replace("-", "_")
    candidates = [
        base / "kubepods" / f"pod{uid}",
        base / "kubepods" / "burstable" / f"pod{uid}",
        base / "kubepods" / "besteffort" / f"pod{uid}",
        base / "kubepods.slice" / f"kubepods-pod{under}.slice",
        base / "kubepods.slice" / "kubepods-burstable.slice" / f"kubepods-burstable-pod{under}.slice",
        base / "kubepods.slice" / "kubepods-besteffort.slice" / f"kubepods-besteffort-pod{under}.slice",
    ]
    return next((c for c in candidates if c.is_dir()), None)


def cpuacct_seconds(pod_dir: Path) -> float:
    """CPU the pod's processes used so far (``cpuacct.usage``: nanoseconds, user and system, every
    container of the pod; charged to the pod's directory as it is used, so a container restarted
    in the pod keeps what its predecessor used)."""
    return int((pod_dir / "cpuacct.usage").read_text().strip()) / 1e9


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (``cpu.stat``, ``memory.stat``) as a mapping."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def throttled_seconds(cpu_dir: Path) -> float:
    """How long CFS kept the pod off the CPU for its CPU limit (``cpu.stat`` ``throttled_time``, ns)."""
    return parse_flat_keyed((cpu_dir / "cpu.stat").read_text()).get("throttled_time", 0) / 1e9


def cgroup_pids(directory: Path) -> list[int]:
    """Every process in ``directory`` and its sub-cgroups (the pod's: one per container)."""
    pids: list[int] = []
    for procs in sorted(directory.rglob("cgroup.procs")):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:  # a container's cgroup removed while we read
            continue
    return pids


def status_kb(text: str, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``); 0 when absent (a kernel
    thread, a zombie)."""
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def process_kb(pids: Iterable[int], field: str, skip: frozenset[str] = SANDBOX_COMMANDS) -> dict[int, int]:
    """``field`` of each live process in ``pids`` whose command is not in ``skip``."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() in skip:
                continue
            out[pid] = status_kb(Path(f"/proc/{pid}/status").read_text(), field)
        except OSError:  # gone since cgroup.procs was read
            continue
    return out


class PeakSampler:
    """Calls ``read`` every ``every`` seconds in a thread and keeps the highest value.

    A thread, not a task: the bench blocks its event loop in ``subprocess.run`` (kubectl), and a
    sample must not wait for that. A failed read (the pod going away) is skipped.
    """

    def __init__(self, read: Callable[[], int], every: float = 1.0) -> None:
        self.read, self.every = read, every
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-sampler", daemon=True)

    def _sample(self) -> None:
        try:
            value = self.read()
        except (OSError, RuntimeError):
            return
        self.peak = max(self.peak, value)
        self.samples += 1

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(self.every):
            self._sample()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # the end of the window counts too

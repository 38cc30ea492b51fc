"""The second node (``node-add``, ``node-lose``, ``node-remove``): ``pko-node2`` in a network namespace
and cgroup root of its own, joined to the same control plane (see :data:`~.node.NODE2`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from pko.devtools.localnode.components import (
    _cmdline,
    _kill_containers,
    _shims,
    _start_containerd,
    _start_kube_proxy,
    _start_kubelet,
    _wait_ready,
)
from pko.devtools.localnode.images import (
    snapshotter,
)
from pko.devtools.localnode.network import (
    _unmount_all,
)
from pko.devtools.localnode.node import (
    NODE2,
    NODE2_COMPONENTS,
    NODE2_VETH,
    NODE2_VETH_PEER,
    NODE_IP,
    STATE,
    _log,
    sh,
)
from pko.devtools.localnode.processes import (
    _alive,
    _forget,
    _kubectl,
    _pids,
    _stop,
)
from pko.devtools.pki import Cert, sign


def _node2_pid(name: str) -> int | None:
    """The pid of a node-2 component if that process still runs and is that component (its command line
    names node 2), so that a pid reused since node-lose is never signalled."""
    pid = _pids().get(name)
    if not pid or not _alive(pid):
        return None
    cmdline = _cmdline(pid)
    return pid if str(NODE2.state) in cmdline or NODE2.name in cmdline else None


def _node2_present() -> bool:
    return any(n in _pids() for n in NODE2_COMPONENTS) or Path(f"/run/netns/{NODE2.netns}").exists()


def _node2_network_up() -> None:
    """Node 2's network namespace and its link to the host (see :data:`NODE2`). The host end of the veth
    has no address: the host routes node 2's IP and pod subnet through it with NODE_IP as the source,
    and answers node 2's ARP for NODE_IP there. ip_forward is set inside the namespace (the host's is
    already on, node 1 set it). Nothing is masqueraded, and no host iptables rule is needed (the
    host's FORWARD policy accepts, kube-proxy's KUBE-FORWARD only drops INVALID)."""
    ns = str(NODE2.netns)
    if not Path(f"/run/netns/{ns}").exists():
        sh("ip", "netns", "add", ns)
    if sh("ip", "link", "show", NODE2_VETH, check=False).strip() == "":
        sh("ip", "link", "add", NODE2_VETH, "type", "veth", "peer", "name", NODE2_VETH_PEER, "netns", ns)
    inside = ("ip", "-n", ns)
    sh(*inside, "link", "set", "lo", "up")
    sh(*inside, "addr", "replace", f"{NODE2.ip}/32", "dev", NODE2_VETH_PEER)
    sh(*inside, "link", "set", NODE2_VETH_PEER, "up")
    sh("ip", "link", "set", NODE2_VETH, "up")
    sh(*inside, "route", "replace", f"{NODE_IP}/32", "dev", NODE2_VETH_PEER, "src", NODE2.ip)
    sh(*inside, "route", "replace", "default", "via", NODE_IP, "dev", NODE2_VETH_PEER, "src", NODE2.ip)
    sh("ip", "route", "replace", f"{NODE2.ip}/32", "dev", NODE2_VETH, "src", NODE_IP)
    sh("ip", "route", "replace", NODE2.pod_subnet, "via", NODE2.ip, "dev", NODE2_VETH, "src", NODE_IP)
    sh(*NODE2.enter(), "sysctl", "-qw", "net.ipv4.ip_forward=1")
    # Service traffic between two pods of node 2's bridge must pass its iptables (kube-proxy's DNAT);
    # the setting is per network namespace where br_netfilter is loaded.
    sh(*NODE2.enter(), "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", check=False)


def _node2_network_down() -> None:
    """The namespace (its veth end, bridge and iptables go with it), the host end and the host routes."""
    for route in (NODE2.pod_subnet, f"{NODE2.ip}/32"):
        subprocess.run(["ip", "route", "del", route, "dev", NODE2_VETH], capture_output=True)
    subprocess.run(["ip", "link", "delete", NODE2_VETH], capture_output=True)
    subprocess.run(["ip", "netns", "delete", str(NODE2.netns)], capture_output=True)


def _cgroup_roots(cgroup_root: str) -> list[Path]:
    """``cgroup_root`` in every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers, the
    hybrid's unified one, or the v2 root)."""
    base = Path("/sys/fs/cgroup")
    rel = cgroup_root.strip("/")
    if (base / "cgroup.controllers").exists():  # cgroup v2 alone
        return [base / rel]
    return [d / rel for d in sorted(base.iterdir()) if d.is_dir() and not d.is_symlink()]


def _node2_cgroups_up() -> None:
    """The kubelet refuses a cgroupRoot that does not exist in every hierarchy: make it. A new cpuset
    cgroup starts with no CPUs and no memory nodes, so it gets its parent's."""
    for d in _cgroup_roots(str(NODE2.cgroup_root)):
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (d / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((d.parent / f).read_text())


def _node2_cgroups_down() -> None:
    """Remove node 2's cgroups, deepest first (a cgroup goes once its last process has exited)."""
    for d in _cgroup_roots(str(NODE2.cgroup_root)):
        if not d.is_dir():
            continue
        subs = sorted((c for c in d.rglob("*") if c.is_dir()), key=lambda c: len(c.parts), reverse=True)
        for sub in [*subs, d]:
            for attempt in range(50):
                try:
                    sub.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if attempt == 49:
                        _log(f"node 2: cannot remove the cgroup {sub}: {e}")
                    time.sleep(0.1)


def _node2_processes() -> set[int]:
    """Every process of node 2: those in its network namespace (its containerd, kubelet, kube-proxy and
    the shims), its containers (in its cgroups) and any shim of its containerd. Never one of node 1's,
    which live in the host's namespace and cgroups."""
    found = set(_shims(NODE2.state))
    for d in _cgroup_roots(str(NODE2.cgroup_root)):
        if d.is_dir():
            for procs in d.rglob("cgroup.procs"):
                try:
                    found.update(int(p) for p in procs.read_text().split())
                except OSError:
                    pass
    try:
        netns = os.stat(f"/run/netns/{NODE2.netns}").st_ino
    except OSError:
        return found - {os.getpid()}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.stat(proc / "ns" / "net").st_ino == netns:
                    found.add(int(proc.name))
            except OSError:
                pass
    return found - {os.getpid()}


def _kill_node2_processes(timeout: float = 20.0) -> None:
    """SIGKILL every process of node 2 until none is left (a container may fork meanwhile)."""
    deadline = time.monotonic() + timeout
    while procs := _node2_processes():
        for pid in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            _log(f"node 2: processes still there after SIGKILL: {sorted(procs)}")
            return
        time.sleep(0.2)
        for pid in procs:  # our own children (nsenter'd components) must not stay zombies
            _alive(pid)


def node_add(imports: list[Path], timeout: float = 180.0) -> None:
    """Start the second node, ``NODE2``, joined to the running control plane, and wait until it is Ready
    (the node lifecycle controller of the controller-manager lifts its not-ready taint). A node 2 that is
    there already (running or lost) is removed first."""
    if os.geteuid() != 0:
        raise SystemExit("localnode: a node needs root (containerd, kubelet, network devices)")
    pid = _pids().get("kube-apiserver")
    if not pid or not _alive(pid):
        raise SystemExit("localnode: node-add needs the running node of `up` (its control plane)")
    if _node2_present():
        node_remove()
    for sub in ("run", "pki"):
        (NODE2.state / sub).mkdir(parents=True, exist_ok=True)
    # The kubelet's serving cert, signed by the node's CA (whose directory it leaves as it is).
    sign(
        STATE / "pki",
        Cert("kubelet", f"/CN={NODE2.name}", "serverAuth", (f"IP:{NODE2.ip}", f"DNS:{NODE2.name}")),
        NODE2.state / "pki",
    )
    _node2_network_up()
    _node2_cgroups_up()
    _start_containerd(NODE2, snapshotter(), imports)
    _start_kube_proxy(NODE2)
    _start_kubelet(NODE2)
    _wait_ready(NODE2, timeout)
    taints = ", ".join(f"{k}={v}:{e}" for k, v, e in NODE2.taints)
    _log(f"node {NODE2.name} Ready at {NODE2.ip} (taints: {taints})")


def node_lose() -> None:
    """Node 2's machine dies for good: its kubelet, kube-proxy and containerd get SIGKILL, then every
    process left of it (shims, containers); its link to the host goes down, so that its pods' addresses
    stop answering as a powered-off machine's would. Nothing else is cleaned up: the Node and its pods
    stay in the API, the node lifecycle controller marks the Node NotReady (Unknown) once its lease
    expires, and its pods stay Running (Terminating once evicted) until someone force-deletes them or
    taints the node out-of-service. ``node-remove`` cleans up afterwards."""
    for name in reversed(NODE2_COMPONENTS):  # kubelet, kube-proxy, containerd
        pid = _node2_pid(name)
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    _kill_node2_processes()
    subprocess.run(["ip", "link", "set", NODE2_VETH, "down"], capture_output=True)
    _log(f"node {NODE2.name} lost: every process of it killed, its link down; the API objects stay")


def node_remove() -> None:
    """Stop node 2 and remove everything it made: its processes (whether it runs or was lost), its
    Node object, mounts, pods' network namespaces, cgroups, network namespace, veth and host routes,
    libcni's cached results and the kubelet's /var/log/containers links, and ``.node/node2``. Its logs
    stay in ``.node/logs`` (as node 1's do after ``down``). A no-op when there is no node 2. ``down``
    calls it first."""
    if not _node2_present() and not NODE2.state.exists():
        return
    # What the shims and CNI leave outside .node/node2 (shim sockets, libcni's cached results), read
    # from the task bundles before the containers, and their bundles, go.
    tasks = NODE2.state / "run" / "containerd-state" / "io.containerd.runtime.v2.task"
    bundles = {
        b.name: (b / "address").read_text().strip() for b in tasks.glob("*/*") if (b / "address").exists()
    }
    for name in ("kubelet-2", "kube-proxy-2"):
        pid = _node2_pid(name)
        if pid:
            _stop(name, pid)
    if _node2_pid(NODE2.component("containerd")):
        _kill_containers(NODE2.socket)
    pid = _node2_pid(NODE2.component("containerd"))
    if pid:
        _stop(NODE2.component("containerd"), pid)
    _kill_node2_processes()
    _forget(*NODE2_COMPONENTS)
    apiserver = _pids().get("kube-apiserver")
    if apiserver and _alive(apiserver):
        _kubectl(
            "delete",
            "node",
            NODE2.name,
            "--ignore-not-found",
            "--wait=false",
            "--request-timeout=20s",
            check=False,
        )
    results = Path("/var/lib/cni/results")
    for task, address in bundles.items():
        Path(address.removeprefix("unix://")).unlink(missing_ok=True)
        for cached in results.glob(f"*-{task}-*"):
            cached.unlink(missing_ok=True)
    for cached in results.glob(f"{NODE2.cni_network}-*"):  # node 2's network, whatever the container
        cached.unlink(missing_ok=True)
    logs = Path("/var/log/containers")
    if logs.is_dir() and NODE2.pod_logs_dir:
        for link in logs.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(NODE2.pod_logs_dir)):
                link.unlink()
    _unmount_all(NODE2.state)
    _node2_cgroups_down()
    _node2_network_down()
    shutil.rmtree(NODE2.state, ignore_errors=True)
    _log(f"node {NODE2.name} removed")

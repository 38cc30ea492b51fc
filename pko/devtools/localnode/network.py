"""The host's side of the node's network: its veth pair and address, the sysctls it needs (restored by
``down``), /run/netns as a shared mount, and the cleanup of what kube-proxy, the kubelet and the CNI
left in iptables and the mount table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pko.devtools.localnode.node import (
    BRIDGE,
    NODE_IP,
    POD_SUBNET,
    STATE,
    VETH,
    VETH_PEER,
    sh,
)


def _sysctl(key: str, value: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    saved = STATE / "sysctl.json"
    old = json.loads(saved.read_text()) if saved.exists() else {}
    if key not in old:
        old[key] = path.read_text().strip()
        saved.write_text(json.dumps(old))
    path.write_text(value)


def _netns_mount_point() -> None:
    """Make /run/netns a shared mount point before any pod exists, as ``ip netns add`` would the first
    time it runs. Otherwise that first ``ip netns add`` (node 2's namespace) bind-mounts /run/netns over
    itself while pods run, hiding their network namespaces' mounts under it: the CNI can no longer
    remove them (``unlinkat /run/netns/cni-...: device or resource busy``) and those pods never finish
    terminating. Left in place by ``down`` (it is what ``ip netns`` leaves too)."""
    netns = Path("/run/netns")
    netns.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(netns)]).returncode != 0:
        sh("mount", "--bind", str(netns), str(netns))
    sh("mount", "--make-shared", str(netns))


def _network_up() -> None:
    _netns_mount_point()
    if sh("ip", "link", "show", VETH, check=False).strip() == "":
        sh("ip", "link", "add", VETH, "type", "veth", "peer", "name", VETH_PEER)
    sh("ip", "addr", "replace", f"{NODE_IP}/32", "dev", VETH)
    sh("ip", "link", "set", VETH, "up")
    sh("ip", "link", "set", VETH_PEER, "up")
    _sysctl("net.ipv4.ip_forward", "1")
    # Service traffic between pods on one bridge must pass iptables (kube-proxy's DNAT).
    if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        _sysctl("net.bridge.bridge-nf-call-iptables", "1")


def _network_down() -> None:
    # Pod sandboxes' namespaces (their veths on the bridge die with them).
    before = (
        set(json.loads((STATE / "netns-before.json").read_text()))
        if (STATE / "netns-before.json").exists()
        else None
    )
    netns_dir = Path("/run/netns")
    if before is not None and netns_dir.is_dir():
        for ns in netns_dir.iterdir():
            if ns.name.startswith("cni-") and ns.name not in before:
                subprocess.run(["umount", "-l", str(ns)], capture_output=True)
                ns.unlink(missing_ok=True)
    for dev in (BRIDGE, VETH):
        subprocess.run(["ip", "link", "delete", dev], capture_output=True)
    saved = STATE / "sysctl.json"
    if saved.exists():
        for key, value in json.loads(saved.read_text()).items():
            Path("/proc/sys", key.replace(".", "/")).write_text(value)
        saved.unlink()


def _iptables_clean() -> None:
    """Remove every rule and chain kube-proxy, kubelet and CNI created (KUBE-*, CNI-*); keep the rest."""
    for table in ("filter", "nat", "mangle"):
        saved = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True)
        if saved.returncode != 0:
            continue
        kept = [
            line
            for line in saved.stdout.splitlines()
            if "KUBE-" not in line and "CNI-" not in line and f"{POD_SUBNET}" not in line
        ]
        if kept != saved.stdout.splitlines():
            subprocess.run(
                ["iptables-restore", "-T", table], input="\n".join(kept) + "\n", text=True, check=False
            )


def _unmount_all(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted(
        (m for m in mounts if m.startswith(str(root) + "/") or m == str(root)), key=len, reverse=True
    ):
        subprocess.run(["umount", "-l", mount], capture_output=True)

"""The node's names and places: where its state lives, its addresses, its components, the two nodes
(:data:`NODE1`, :data:`NODE2`), its PKI, and the one way to run a command (:func:`sh`)."""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import subprocess
import sys
from pathlib import Path

from pko.devtools.localcluster import ensure_binaries
from pko.devtools.pki import Cert, apiserver_sans
from pko.devtools.versions import cache_dir

bin_dir = functools.cache(ensure_binaries)  # Kubernetes, etcd and kubectl of hack/versions.env

REPO = Path(__file__).resolve().parents[3]
HACK = REPO / "hack"
STATE = REPO / ".node"
# containerd's registry hosts directory (its CRI `config_path`), one for every node of this machine, as
# /etc/containerd/certs.d is on each node of a real cluster: `trust-registry` writes a registry's
# hosts.toml there, which containerd reads at each pull (no restart).
CERTS_D = STATE / "certs.d"
CACHE = cache_dir()  # the build scripts' rule: $PKO_CACHE_DIR, else ${XDG_CACHE_HOME:-~/.cache}/pko
IMAGES = CACHE / "images"

NODE_NAME = "pko-node"
NODE_IP = "10.87.0.1"
VETH, VETH_PEER = "pkonode0", "pkonode1"
BRIDGE = "pkobr0"
POD_SUBNET = "10.88.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
APISERVER_PORT = 6443
STORAGE_CLASS = "local"
# The e2e suite keeps every Stack's state on a claim and leaves the claims: 32 ran out before test_release;
# 64 since every example is applied too (issue 40: drift, git-ssh, flux-source on claims of their own).
STATIC_VOLUMES = 64
PACKAGES = (
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "conntrack",
    "dnsmasq-base",
    "buildah",
    "gcc",
    "libc6-dev",
    "openssl",
    "iproute2",
)
# Start order; `down` stops them in reverse.
COMPONENTS = (
    "containerd",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "dnsmasq",
    "clusterdns",
    "kube-proxy",
    "kubelet",
)


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the cluster: its name and addresses, where its containerd and kubelet keep their
    state, and what its components are called in ``pids.json`` (``kubelet``, ``kubelet-2``).

    Node 1 (``up``) runs in the host's network namespace with its state right in ``STATE`` (the paths it
    always had); node 2 (``node-add``) runs in a network namespace of its own (``netns``), and its
    kubelet gets the settings that keep two kubelets on one machine apart (``cgroup_root``,
    ``pod_logs_dir``; see :data:`NODE2`)."""

    name: str
    ip: str
    pod_subnet: str
    bridge: str  # the CNI bridge, in the node's network namespace
    cni_network: str  # the CNI network's name (libcni caches results in /var/lib/cni under it)
    state: Path
    suffix: str = ""
    netns: str | None = None
    cgroup_root: str | None = None  # the kubelet's cgroupRoot (None: its default, "/")
    pod_logs_dir: Path | None = None  # the kubelet's podLogsDir (None: its default, /var/log/pods)
    taints: tuple[tuple[str, str, str], ...] = ()  # registerWithTaints: (key, value, effect)

    def component(self, base: str) -> str:
        return base + self.suffix

    @property
    def socket(self) -> Path:
        return self.state / "run" / "containerd.sock"

    def enter(self) -> list[str]:
        """The prefix that runs a command in the node's network namespace (nothing for node 1).

        ``nsenter --net`` and not ``ip netns exec``: the latter also makes a mount namespace and mounts
        a fresh /sys in it, which hides /sys/fs/cgroup from the kubelet. nsenter execs the command in
        place, so the pid ``_spawn`` records is the component's own."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"] if self.netns else []


NODE1 = Node(NODE_NAME, NODE_IP, POD_SUBNET, BRIDGE, "pko", STATE)
# The second node (`node-add`), a machine of its own as far as the cluster can tell:
# - its own network namespace, joined to the host by the veth pair NODE2_VETH (host end, no address:
#   the host routes NODE2.ip and NODE2.pod_subnet through it with NODE_IP as source) / NODE2_VETH_PEER
#   (in the namespace, with NODE2.ip/32, a route to NODE_IP and the default route through it). Pods on
#   either node reach each other by pod IP (the host forwards, as the network between two machines
#   would), and node 2's pods reach the apiserver, dnsmasq and every Service through NODE_IP;
# - its own containerd (state, socket and CNI bridge under .node/node2), with the pods' network
#   namespaces under its state directory (``netns_mounts_under_state_dir``) so that node-remove finds
#   them and `down`'s sweep of /run/netns/cni-* never meets them;
# - its own kubelet with cgroupRoot /pko-node2 (the two kubelets would otherwise both own /kubepods and
#   remove each other's pod cgroups) and podLogsDir under .node/node2 (a kubelet garbage-collects every
#   directory of /var/log/pods whose pod it does not know, which would be node 1's);
# - the taint pko.dev/spare-node=true:NoSchedule, so only pods that tolerate it land there.
NODE2 = Node(
    "pko-node2",
    "10.87.0.2",
    "10.88.1.0/24",
    "pkobr1",
    "pko-node2",
    STATE / "node2",
    suffix="-2",
    netns="pko-node2",
    cgroup_root="/pko-node2",
    pod_logs_dir=STATE / "node2" / "pod-logs",
    taints=(("pko.dev/spare-node", "true", "NoSchedule"),),
)
NODE2_VETH, NODE2_VETH_PEER = "pkonode2h", "pkonode2n"
NODE2_COMPONENTS = tuple(NODE2.component(c) for c in ("containerd", "kube-proxy", "kubelet"))


def _log(msg: str) -> None:
    print(f"localnode: {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True, capture: bool = True) -> str:
    proc = subprocess.run(list(cmd), capture_output=capture, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout if capture else ""


# The node's PKI (pki.py, with the service-account key pair): the apiserver's serving cert, its client
# cert to kubelets, and the kubelet's serving cert.
CA_CN = "pko-node-ca"
CERTS = (
    Cert("apiserver", "/CN=kube-apiserver", "serverAuth", apiserver_sans(NODE_IP, "10.0.0.1", "127.0.0.1")),
    Cert("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "clientAuth"),
    Cert("kubelet", f"/CN={NODE_NAME}", "serverAuth", (f"IP:{NODE_IP}", f"DNS:{NODE_NAME}")),
)


def _kubeconfig(path: Path, token: str, server: str) -> None:
    ca = base64.b64encode((STATE / "pki" / "ca.crt").read_bytes()).decode()
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "pko-node", "cluster": {"server": server, "certificate-authority-data": ca}}
                ],
                "users": [{"name": "admin", "user": {"token": token}}],
                "contexts": [{"name": "pko-node", "context": {"cluster": "pko-node", "user": "admin"}}],
                "current-context": "pko-node",
            },
            indent=2,
        )
    )
    path.chmod(0o600)

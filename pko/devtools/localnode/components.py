"""The components of one node (either of the two): the containerd and kubelet configurations, how
containerd, kube-proxy and the kubelet start, when the Node is Ready, the static volumes, and what
their containers and shims leave behind."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from pko.devtools.localcluster import free_port
from pko.devtools.localnode.images import (
    _ctr,
    _pause_archive,
    import_images,
)
from pko.devtools.localnode.node import (
    CERTS_D,
    NODE1,
    NODE_IP,
    NODE_NAME,
    STATE,
    STATIC_VOLUMES,
    STORAGE_CLASS,
    Node,
    bin_dir,
)
from pko.devtools.localnode.processes import (
    _kubectl,
    _spawn,
    _wait,
)


def _containerd_config(node: Node, pause_image: str, snapshotter: str) -> Path:
    cni = node.state / "cni"
    (cni / "net.d").mkdir(parents=True, exist_ok=True)
    (cni / "net.d" / "10-pko.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "0.4.0",
                "name": node.cni_network,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": node.bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": node.pod_subnet}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(cni / "ipam"),
                        },
                    },
                    {"type": "loopback"},
                ],
            },
            indent=1,
        )
    )
    # A node in a network namespace of its own keeps its pods' network namespaces under its state
    # directory rather than in /run/netns, where node 1's live.
    netns_mounts = "  netns_mounts_under_state_dir = true\n" if node.netns else ""
    CERTS_D.mkdir(parents=True, exist_ok=True)  # each registry's hosts.toml, from trust-registry
    config = node.state / "containerd.toml"
    config.write_text(
        f"""version = 2
root = "{node.state / "containerd"}"
state = "{node.state / "run" / "containerd-state"}"
[grpc]
  address = "{node.socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
{netns_mounts}  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni / "net.d"}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{CERTS_D}"
"""
    )
    return config


def _kubelet_config(node: Node) -> Path:
    """The kubelet's configuration for ``node``: the same on every node but for its address, runtime
    socket and serving cert, and node 2's own cgroupRoot, podLogsDir and taints (see :class:`Node`).
    Pods of every node use the one cluster DNS on NODE_IP."""
    pki = STATE / "pki"
    (node.state / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
    config = node.state / "kubelet.json"
    own: dict[str, object] = {}
    if node.cgroup_root:
        own["cgroupRoot"] = node.cgroup_root
    if node.pod_logs_dir:
        own["podLogsDir"] = str(node.pod_logs_dir)
    if node.taints:
        own["registerWithTaints"] = [{"key": k, "value": v, "effect": e} for k, v, e in node.taints]
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": node.ip,
                "port": 10250,
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": free_port(),
                # containerd 1.6 has no CRI RuntimeConfig: the kubelet uses this driver
                "cgroupDriver": "cgroupfs",
                "failCgroupV1": False,  # this host is cgroup v1 (the kubelet refuses it otherwise)
                "containerRuntimeEndpoint": f"unix://{node.socket}",
                "clusterDNS": [NODE_IP],
                "clusterDomain": "cluster.local",
                "resolvConf": str(node.state / "resolv.conf"),
                "failSwapOn": False,
                "tlsCertFile": str(node.state / "pki" / "kubelet.crt"),
                "tlsPrivateKeyFile": str(node.state / "pki" / "kubelet.key"),
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": False},
                    "x509": {"clientCAFile": str(pki / "ca.crt")},
                },
                "authorization": {"mode": "AlwaysAllow"},
                "evictionHard": {
                    "memory.available": "100Mi",
                    "nodefs.available": "1%",
                    "imagefs.available": "1%",
                },
                "imageGCHighThresholdPercent": 100,
                "serializeImagePulls": False,
                "maxPods": 110,
                **own,
            },
            indent=1,
        )
    )
    return config


def _start_containerd(node: Node, snapshotter: str, imports: list[Path]) -> None:
    """``node``'s containerd, then the images: the pause image first, then ``imports``."""
    pause_archive, pause_image = _pause_archive()
    config = _containerd_config(node, pause_image, snapshotter)
    name = node.component("containerd")
    _spawn(name, [*node.enter(), "containerd", "--config", str(config)])
    _wait(name, lambda: _ctr("version", address=node.socket) != "", 30, f"{name}.log")
    import_images([pause_archive, *imports], [node.socket])


def _start_kube_proxy(node: Node) -> None:
    _spawn(
        node.component("kube-proxy"),
        [
            *node.enter(),
            f"{bin_dir()}/kube-proxy",
            f"--kubeconfig={STATE / 'kubeconfig'}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={node.pod_subnet}",
            f"--hostname-override={node.name}",
            "--conntrack-max-per-core=0",
            "--nodeport-addresses=primary",  # NodePorts on the node address only, never on eth0
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--healthz-bind-address=127.0.0.1:{free_port()}",
            "--v=1",
        ],
    )


def _start_kubelet(node: Node) -> None:
    _spawn(
        node.component("kubelet"),
        [
            *node.enter(),
            f"{bin_dir()}/kubelet",
            f"--config={_kubelet_config(node)}",
            f"--kubeconfig={STATE / 'kubeconfig'}",
            f"--node-ip={node.ip}",
            f"--hostname-override={node.name}",
            f"--root-dir={node.state / 'kubelet'}",
            f"--cert-dir={node.state / 'kubelet-pki'}",
            "--v=1",
        ],
    )


def _wait_ready(node: Node, timeout: float) -> None:
    """Until the Node is Ready and the node lifecycle controller has lifted its not-ready taint."""

    def node_ready() -> bool:
        obj = json.loads(_kubectl("get", "node", node.name, "-o", "json"))
        ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
        taints = [
            t for t in obj["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/not-ready")
        ]
        return bool(ready and ready[0]["status"] == "True" and not taints)

    _wait(f"the node {node.name}", node_ready, timeout, f"{node.component('kubelet')}.log")


def _storage() -> None:
    """The node's local storage: a default StorageClass and static hostPath PersistentVolumes.

    A PersistentVolumeClaim that names no class (the sample Stack's Pulumi state) binds to one of them,
    as it would to a cloud disk on a real cluster, and its data outlives every pod that mounts it. The
    directories are world-writable because a hostPath volume ignores fsGroup and workspace pods run as
    uid 1000; they live under .node/ and go with `down`.
    """
    docs: list[dict[str, object]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "kubernetes.io/no-provisioner",
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        }
    ]
    shutil.rmtree(STATE / "volumes", ignore_errors=True)  # etcd starts empty: so do the volumes
    for i in range(STATIC_VOLUMES):
        path = STATE / "volumes" / f"pv{i}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o1777)
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"{NODE_NAME}-pv{i}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": STORAGE_CLASS,
                    "hostPath": {"path": str(path), "type": "Directory"},
                },
            }
        )
    manifest = STATE / "storage.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    _kubectl("apply", "--server-side", "-f", str(manifest))


def _kill_containers(sock: Path | None = None) -> None:
    """Kill and remove every container of the containerd at ``sock`` (node 1's by default)."""
    sock = sock or NODE1.socket
    if not sock.exists():
        return
    tasks = _ctr("tasks", "ls", "-q", check=False, address=sock).split()
    for task in tasks:
        _ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, address=sock)
    time.sleep(1 if tasks else 0)
    for task in tasks:
        _ctr("tasks", "rm", "-f", task, check=False, address=sock)
    for container in _ctr("containers", "ls", "-q", check=False, address=sock).split():
        _ctr("containers", "rm", container, check=False, address=sock)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
    except OSError:
        return ""


def _shims(state: Path) -> list[int]:
    """The containerd shims of the containerd whose socket is under ``state``."""
    return [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and "containerd-shim" in (c := _cmdline(int(proc.name))) and str(state) in c
    ]

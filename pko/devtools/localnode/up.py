"""``up`` and ``down``: the whole node, its control plane, cluster DNS and node 1's components started in
order, the cluster's objects it needs (RBAC, the storage class and static volumes), and everything
torn down again with nothing left."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from pathlib import Path

from pko.devtools.localcluster import _apt_install, free_port
from pko.devtools.localnode.components import (
    _kill_containers,
    _shims,
    _start_containerd,
    _start_kube_proxy,
    _start_kubelet,
    _storage,
    _wait_ready,
)
from pko.devtools.localnode.images import (
    _choose_snapshotter,
)
from pko.devtools.localnode.network import (
    _iptables_clean,
    _network_down,
    _network_up,
    _unmount_all,
)
from pko.devtools.localnode.node import (
    APISERVER_PORT,
    CA_CN,
    CERTS,
    COMPONENTS,
    HACK,
    NODE1,
    NODE_IP,
    NODE_NAME,
    PACKAGES,
    SERVICE_CIDR,
    STATE,
    _kubeconfig,
    _log,
    bin_dir,
)
from pko.devtools.localnode.node2 import (
    node_remove,
)
from pko.devtools.localnode.processes import (
    _https_ok,
    _pids,
    _spawn,
    _stop,
    _wait,
)
from pko.devtools.pki import ensure_pki


def up(imports: list[Path], timeout: float = 180.0) -> Path:
    if os.geteuid() != 0:
        raise SystemExit("localnode: a node needs root (containerd, kubelet, network devices)")
    if not Path("/sys/fs/cgroup/memory").exists() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        raise SystemExit("localnode: no cgroup hierarchy: a kubelet cannot run on this machine")
    if _pids():
        down()
    _apt_install(*PACKAGES)
    bins = bin_dir()
    for sub in ("logs", "run"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    ensure_pki(STATE / "pki", CA_CN, CERTS)
    pki = STATE / "pki"
    netns = sorted(p.name for p in Path("/run/netns").iterdir()) if Path("/run/netns").is_dir() else []
    (STATE / "netns-before.json").write_text(json.dumps(netns))
    _network_up()
    admin = secrets.token_hex(24)
    (STATE / "tokens.csv").write_text(f'{admin},admin,admin,"system:masters"\n')
    server = f"https://{NODE_IP}:{APISERVER_PORT}"
    _kubeconfig(STATE / "kubeconfig", admin, server)

    # containerd, then the images (pause first)
    _start_containerd(NODE1, _choose_snapshotter(), imports)

    etcd_port, etcd_peer = free_port(), free_port()
    shutil.rmtree(STATE / "etcd", ignore_errors=True)
    _spawn(
        "etcd",
        [
            f"{bins}/etcd",
            "--name=pko-node",
            f"--data-dir={STATE / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=pko-node=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )
    _spawn(
        "kube-apiserver",
        [
            f"{bins}/kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            f"--secure-port={APISERVER_PORT}",
            f"--bind-address={NODE_IP}",
            f"--advertise-address={NODE_IP}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={STATE / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            "--api-audiences=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ],
    )
    _wait("kube-apiserver", lambda: _https_ok("/readyz", admin), timeout, "kube-apiserver.log")
    kubeconfig = str(STATE / "kubeconfig")
    _spawn(
        "kube-controller-manager",
        [
            f"{bins}/kube-controller-manager",
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--controllers=*,-nodeipam,-ttl,-csrsigning,-bootstrapsigner,-tokencleaner",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            f"--secure-port={free_port()}",
            "--bind-address=127.0.0.1",
            "--v=1",
        ],
    )
    _spawn(
        "kube-scheduler",
        [
            f"{bins}/kube-scheduler",
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--secure-port={free_port()}",
            "--bind-address=127.0.0.1",
            "--v=1",
        ],
    )
    (STATE / "dns").mkdir(exist_ok=True)
    _spawn(
        "clusterdns",
        [
            sys.executable,
            str(HACK / "clusterdns.py"),
            f"--kubeconfig={kubeconfig}",
            f"--hosts-dir={STATE / 'dns'}",
        ],
    )
    _spawn(
        "dnsmasq",
        [
            "dnsmasq",
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--no-poll",
            f"--listen-address={NODE_IP}",
            "--bind-interfaces",
            "--port=53",
            f"--hostsdir={STATE / 'dns'}",
            "--local=/cluster.local/",
            "--domain-needed",
            f"--pid-file={STATE / 'run' / 'dnsmasq.pid'}",
            "--log-facility=-",
        ],
    )
    _start_kube_proxy(NODE1)
    _start_kubelet(NODE1)
    _wait_ready(NODE1, timeout)
    _storage()
    _log(f"node {NODE_NAME} Ready at {NODE_IP}; KUBECONFIG={kubeconfig}")
    return STATE / "kubeconfig"


def down() -> None:
    node_remove()  # the second node first, while the apiserver still answers
    pids = _pids()
    for name in ("kubelet", "kube-proxy"):
        if name in pids:
            _stop(name, pids.pop(name))
    _kill_containers()
    for name in reversed(COMPONENTS):
        if name in pids:
            _stop(name, pids.pop(name))
    for shim in _shims(STATE):  # containerd shims of our socket that outlived containerd
        _stop("shim", shim, timeout=3)
    (STATE / "pids.json").unlink(missing_ok=True)
    _unmount_all(STATE)
    _iptables_clean()
    _network_down()
    for sub in ("kubelet", "run", "containerd", "cni", "etcd", "dns", "kubelet-pki", "volumes", "certs.d"):
        shutil.rmtree(STATE / sub, ignore_errors=True)
    _log("node down")

#!/usr/bin/env python3
"""A whole single-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, containerd + runc, a CNI bridge, kube-proxy and cluster DNS.

    python3 hack/localnode.py up [--import FILE.oci.tar ...]   # prints the kubeconfig path
    python3 hack/localnode.py down                             # everything goes, nothing is left
    python3 hack/localnode.py status
    python3 hack/localnode.py restart kubelet [--signal KILL] [--down-for S]   # one component
    python3 hack/localnode.py node-add [--import FILE.oci.tar ...]   # a second node, pko-node2
    python3 hack/localnode.py node-lose     # pko-node2's machine dies (SIGKILL, no cleanup)
    python3 hack/localnode.py node-remove   # pko-node2 goes, and all it made (`down` does it too)
    python3 hack/localnode.py trust-registry HOST:PORT CA_FILE   # containerd trusts a registry's CA
    python3 hack/localnode.py untrust-registry HOST:PORT
    python3 hack/localnode.py remove-images PATTERN...           # e.g. 'docker.io/library/pko*:dev'
    python3 hack/localnode.py import-images [--import FILE.oci.tar ...]   # back in (default: all of up's)

Standard library only (it runs before the project's virtualenv exists). Needs root, cgroups and
the Kubernetes and etcd binaries `hack/build-kubernetes.sh` builds from the Go module proxy (the
versions in `hack/versions.env`, cached in ~/.cache/pko); kubectl is the one built with them. Every
trap of these machines is handled here: Debian's containerd 1.6 with ``restrict_oom_score_adj`` and the
``overlayfs`` snapshotter where an overlay mount works (else ``native``, a whole copy of the image for
each container); runc on cgroup v1 with the ``cgroupfs`` driver (containerd 1.6 lacks the CRI
RuntimeConfig call, so the kubelet uses its configured ``cgroupDriver``, and on cgroup v1 it needs
``failCgroupV1: false``); a pause image compiled from ``build/pause/linux/pause.c`` of the
k8s.io/kubernetes module of the same release; a node IP on a veth pair of our own (no ``dummy``
module); ``--kubelet-preferred-address-types`` so the apiserver never resolves the node name through
an outside DNS server.

Pod Security: the PodSecurity admission (built in since 1.25) enforces the level a namespace's
``pod-security.kubernetes.io/enforce`` label names; the node sets no cluster-wide default, so the
namespaces where workspaces run are labelled ``restricted`` by what creates them (config/manager,
config/samples, e2e/).

Network: the node IP ``10.87.0.1`` (veth ``pkonode0``), pods on the bridge ``pkobr0``
(``10.88.0.0/24``), Services in ``10.0.0.0/24``. Nothing is masqueraded and DNS never forwards:
traffic stays on loopback and on the devices created here. Cluster DNS is dnsmasq (Debian) fed by
``hack/clusterdns.py`` from the API's Services and Endpoints, so ``<svc>.<ns>.svc.cluster.local``
resolves in pods as in a real cluster.

A second node (``node-add``, issue 28): ``pko-node2`` at ``10.87.0.2`` in a network namespace of its
own, pods in ``10.88.1.0/24`` on its bridge ``pkobr1``, its own containerd, kubelet and kube-proxy
(``containerd-2``, ``kubelet-2``, ``kube-proxy-2``, which ``restart`` knows too) joined to the same
control plane, and the taint ``pko.dev/spare-node=true:NoSchedule``, so that only pods that tolerate it
(the fault matrix's) land there; see :data:`NODE2` for how the two kubelets share one machine.

State lives in ``.node/`` (gitignored; node 2's in ``.node/node2``); images are imported from
``~/.cache/pko/images/*.oci.tar`` (``hack/build-images.sh``; the cache is ``$PKO_CACHE_DIR`` when set,
as for the builds) on every ``up`` and ``node-add``.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import fnmatch
import functools
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pko.devtools.localcluster import _apt_install, ensure_binaries, free_port
from pko.devtools.pki import Cert, apiserver_sans, ensure_pki, sign
from pko.devtools.versions import cache_dir, versions

bin_dir = functools.cache(ensure_binaries)  # Kubernetes, etcd and kubectl of hack/versions.env

REPO = Path(__file__).resolve().parents[2]
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
# The e2e suite keeps every Stack's state on a claim and leaves the claims: 32 ran out before test_release.
STATIC_VOLUMES = 48
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


# --- PKI, tokens, kubeconfigs -------------------------------------------------------------------------


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


# --- processes ----------------------------------------------------------------------------------------


def _pids() -> dict[str, int]:
    try:
        return dict(json.loads((STATE / "pids.json").read_text()))
    except (OSError, ValueError):
        return {}


def _save_pid(name: str, pid: int) -> None:
    pids = _pids()
    pids[name] = pid
    (STATE / "pids.json").write_text(json.dumps(pids, indent=1))


def _spawn(name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(STATE / "logs" / f"{name}.log", "ab")
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    log.close()
    _save_pid(name, proc.pid)
    commands = _commands()
    commands[name] = {"args": args, "env": env or {}}
    (STATE / "run" / "commands.json").write_text(json.dumps(commands, indent=1))
    return proc


def _commands() -> dict[str, dict[str, object]]:
    """How each component was started (``restart`` starts it again the same way)."""
    try:
        return dict(json.loads((STATE / "run" / "commands.json").read_text()))
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    try:  # and so does anyone else's zombie (a killed node-2 component its reaper has not reaped yet)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _stop(name: str, pid: int, timeout: float = 20.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)
    _log(f"{name} (pid {pid}) did not exit")


def _wait(what: str, probe: object, timeout: float, log: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if probe():  # type: ignore[operator]
                return
        except Exception:
            pass
        time.sleep(0.5)
    hint = f"; see {STATE / 'logs' / log}" if log else ""
    raise TimeoutError(f"{what} not ready within {timeout:.0f}s{hint}")


def _https_ok(path: str, token: str) -> bool:
    ctx = ssl.create_default_context(cafile=str(STATE / "pki" / "ca.crt"))
    req = urllib.request.Request(
        f"https://{NODE_IP}:{APISERVER_PORT}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=3, context=ctx) as r:
        return bool(r.status == 200)


def _kubectl(*args: str, check: bool = True) -> str:
    """kubectl of the node's own release (the machine's may be outside the version skew)."""
    return sh(str(bin_dir() / "kubectl"), f"--kubeconfig={STATE / 'kubeconfig'}", *args, check=check)


# --- host network -------------------------------------------------------------------------------------


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


# --- images -------------------------------------------------------------------------------------------


def _kubernetes_module() -> Path:
    """The k8s.io/kubernetes module of the node's release, from the Go module cache (downloaded once
    through the Go module proxy; hack/build-kubernetes.sh already did)."""
    version = versions()["KUBERNETES_VERSION"]
    out = sh("bash", str(HACK / "gomod.sh"), "download", "k8s.io/kubernetes", f"v{version}")
    return Path(json.loads(out)["Dir"])


def _pause_version(module: Path) -> str:
    """The pause image's version the release ships: ``TAG ?=`` in build/pause/Makefile."""
    for line in (module / "build" / "pause" / "Makefile").read_text().splitlines():
        if line.replace(" ", "").startswith("TAG?="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError(f"no TAG in {module}/build/pause/Makefile")


PAUSE_REPOSITORY = "docker.io/library/pko-pause"


def _pause_archive() -> tuple[Path, str]:
    """The pause image (its archive and its name), compiled from the release's own
    ``build/pause/linux/pause.c`` as upstream's Makefile does (no image can be pulled here). The archive
    is named by the pause version, so an archive of another version is never reused."""
    module = _kubernetes_module()
    tag = _pause_version(module)
    image = f"{PAUSE_REPOSITORY}:{tag}"
    archive = IMAGES / f"pko-pause-{tag}.oci.tar"
    if archive.exists():
        return archive, image
    IMAGES.mkdir(parents=True, exist_ok=True)
    work = STATE / "pause-build"
    shutil.rmtree(work, ignore_errors=True)
    (work / "rootfs").mkdir(parents=True)
    k8s = versions()["KUBERNETES_VERSION"]
    sh(
        "gcc",
        "-Os",
        "-Wall",
        "-Werror",
        "-static",
        f"-DVERSION=v{tag}-k8s-v{k8s}",
        "-o",
        str(work / "rootfs" / "pause"),
        str(module / "build" / "pause" / "linux" / "pause.c"),
    )
    store = ["--storage-driver", "vfs", "--root", str(work / "store"), "--runroot", str(work / "run")]
    ctr = sh("buildah", *store, "from", "--quiet", "scratch").strip()
    sh("buildah", *store, "copy", "--quiet", ctr, str(work / "rootfs" / "pause"), "/pause")
    sh("buildah", *store, "config", "--entrypoint", '["/pause"]', "--user", "65535:65535", ctr)
    sh("buildah", *store, "commit", "--quiet", ctr, image)
    sh("buildah", *store, "push", "--quiet", image, f"oci-archive:{archive}.partial:{image}")
    os.replace(f"{archive}.partial", archive)
    shutil.rmtree(work, ignore_errors=True)
    for stale in IMAGES.glob("pko-pause*.oci.tar"):  # another release's pause
        if stale != archive:
            stale.unlink()
    return archive, image


def _ctr(*args: str, check: bool = True, address: Path | None = None) -> str:
    """ctr against a node's containerd (``address``: its socket; node 1's by default)."""
    return sh(
        "ctr",
        "--address",
        str(address or NODE1.socket),
        "--namespace",
        "k8s.io",
        *args,
        check=check,
    )


def _overlay_works() -> bool:
    """Whether an overlay mount works under ``STATE`` (not in every VM or container, and not on every
    filesystem)."""
    probe = STATE / "overlay-probe"
    shutil.rmtree(probe, ignore_errors=True)
    lower, upper, work, merged = (probe / name for name in ("lower", "upper", "work", "merged"))
    for folder in (lower, upper, work, merged):
        folder.mkdir(parents=True)
    (lower / "probe").write_text("overlay")
    options = f"lowerdir={lower},upperdir={upper},workdir={work}"
    mounted = (
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        return mounted and (merged / "probe").read_text() == "overlay"
    finally:
        if mounted:
            subprocess.run(["umount", str(merged)], capture_output=True, check=False)
        shutil.rmtree(probe, ignore_errors=True)


def _choose_snapshotter() -> str:
    """containerd's snapshotter for this node, kept in ``STATE/snapshotter`` for later imports:
    ``overlayfs`` (a real node's default: a container's root is its image's layers plus a layer of its
    own, ready at once) where an overlay mount works, else ``native``, which gives every container a
    whole copy of its image (seconds, and the image's size on disk, for each new pod).
    ``PKO_NODE_SNAPSHOTTER`` chooses one outright."""
    chosen = os.environ.get("PKO_NODE_SNAPSHOTTER") or ("overlayfs" if _overlay_works() else "native")
    if chosen not in ("overlayfs", "native"):
        raise SystemExit(f"localnode: PKO_NODE_SNAPSHOTTER must be overlayfs or native, not {chosen!r}")
    (STATE / "snapshotter").write_text(chosen)
    _log(f"containerd snapshotter: {chosen}")
    return chosen


def snapshotter() -> str:
    """The snapshotter this node's containerd runs with (chosen at ``up``)."""
    chosen = STATE / "snapshotter"
    return chosen.read_text().strip() if chosen.exists() else "native"


def _node_sockets() -> list[Path]:
    """The containerd sockets of the nodes: node 1's, and node 2's while its containerd runs."""
    pid = _pids().get(NODE2.component("containerd"), 0)
    return [NODE1.socket, *([NODE2.socket] if pid > 0 and _alive(pid) else [])]


def import_images(paths: list[Path], addresses: list[Path] | None = None) -> None:
    """Import OCI archives into the containerd of each socket in ``addresses`` (default: node 1's, and
    node 2's while it runs, so that an image imported after node-add reaches both nodes)."""
    for address in _node_sockets() if addresses is None else addresses:
        for path in paths:
            _log(f"importing {path.name}" + ("" if address == NODE1.socket else f" into {address}"))
            _ctr(
                "images",
                "import",
                "--snapshotter",
                snapshotter(),
                "--no-unpack=false",
                str(path),
                address=address,
            )


def dev_archives() -> list[Path]:
    """The image archives ``up`` imports by default: every ``IMAGES/*.oci.tar`` but the pause image's
    (``up`` imports the current one first, always)."""
    return sorted(p for p in IMAGES.glob("*.oci.tar") if not p.name.startswith("pko-pause"))


def _images(address: Path) -> dict[str, str]:
    """Every image of a containerd's ``k8s.io`` namespace: its name and the digest of its target."""
    rows = _ctr("images", "ls", address=address).splitlines()[1:]  # REF TYPE DIGEST SIZE PLATFORMS LABELS
    return {row.split()[0]: row.split()[2] for row in rows if row.strip()}


def images_to_remove(images: dict[str, str], patterns: list[str]) -> set[str]:
    """Of ``images`` (name: target digest), the names matching one of ``patterns`` (shell-style), but
    never the pause image's, with the digest names (``REPO@sha256:...``, ``sha256:...``) the CRI gave the
    same targets when no name left keeps them: the whole of each image, so that its content can go."""
    chosen = {
        name
        for name in images
        if any(fnmatch.fnmatchcase(name, p) for p in patterns) and not name.startswith(PAUSE_REPOSITORY)
    }
    targets = {images[name] for name in chosen}
    kept = {d for n, d in images.items() if n not in chosen and "sha256:" not in n}
    return chosen | {n for n, d in images.items() if "sha256:" in n and d in targets and d not in kept}


def remove_images(patterns: list[str], addresses: list[Path] | None = None) -> list[str]:
    """Delete from each node's containerd (default: every node's) the images :func:`images_to_remove`
    picks for ``patterns`` (e.g. ``docker.io/library/pko*:dev``), and wait for containerd's garbage
    collector to drop their content (``--sync``): what the node runs next it must pull. A running
    container's own filesystem (its snapshots) stays until the container goes. Returns the names removed."""
    removed: list[str] = []
    for address in _node_sockets() if addresses is None else addresses:
        chosen = images_to_remove(_images(address), patterns)
        if chosen:
            _log(f"removing {len(chosen)} image names from {address}: {' '.join(sorted(chosen))}")
            _ctr("images", "rm", "--sync", *sorted(chosen), address=address)
        removed += sorted(chosen)
    return removed


def trust_registry(address: str, ca_file: Path, certs_d: Path = CERTS_D) -> Path:
    """Make every node's containerd trust the registry at ``address`` (``HOST:PORT``), whose serving cert
    ``ca_file`` signed: its CA copied to ``certs_d/HOST:PORT/ca.crt`` and a ``hosts.toml`` naming it, the
    registry config containerd 1.6's CRI reads at each pull from its ``config_path`` (set at ``up``; ``ctr
    images pull --hosts-dir`` reads the same files). No credentials: pods pull with an imagePullSecret, as
    users' do. Returns the hosts.toml."""
    config = NODE1.state / "containerd.toml"
    if certs_d == CERTS_D and config.exists() and f'config_path = "{CERTS_D}"' not in config.read_text():
        raise SystemExit(
            "localnode: this node's containerd reads no registry hosts directory: `down`, then `up`"
        )
    host_dir = certs_d / address
    host_dir.mkdir(parents=True, exist_ok=True)
    ca = host_dir / "ca.crt"
    shutil.copyfile(ca_file, ca)
    hosts = host_dir / "hosts.toml"
    hosts.write_text(
        f'server = "https://{address}"\n\n'
        f'[host."https://{address}"]\n  capabilities = ["pull", "resolve"]\n  ca = "{ca}"\n'
    )
    _log(f"containerd trusts https://{address} ({hosts})")
    return hosts


def untrust_registry(address: str, certs_d: Path = CERTS_D) -> None:
    """Undo :func:`trust_registry` for ``address``: containerd's next pull from it sees no CA of its own."""
    shutil.rmtree(certs_d / address, ignore_errors=True)


# --- up / down ----------------------------------------------------------------------------------------


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


# --- the second node -----------------------------------------------------------------------------------


def _forget(*names: str) -> None:
    """Drop components from pids.json and commands.json (read-modify-write, as ``_save_pid``)."""
    pids = _pids()
    if any(n in pids for n in names):
        (STATE / "pids.json").write_text(
            json.dumps({k: v for k, v in pids.items() if k not in names}, indent=1)
        )
    commands = _commands()
    if any(n in commands for n in names):
        (STATE / "run" / "commands.json").write_text(
            json.dumps({k: v for k, v in commands.items() if k not in names}, indent=1)
        )


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


def restart(name: str, sig: signal.Signals = signal.SIGTERM, down_for: float = 0.0) -> int:
    """Stop one component of a running node (``sig`` to its process only: containerd's shims, and so
    the containers, live on) and start it again as ``up`` did, after ``down_for`` seconds: the fault
    matrix's kubelet, containerd, kube-apiserver and etcd restarts. Returns the new pid."""
    pid, command = _pids().get(name), _commands().get(name)
    if pid is None or command is None:
        raise SystemExit(f"localnode: {name} is not running on this node (components: {', '.join(_pids())})")
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    time.sleep(down_for)
    args, env = command["args"], command["env"]
    assert isinstance(args, list) and isinstance(env, dict)
    new = _spawn(name, [str(a) for a in args], {str(k): str(v) for k, v in env.items()}).pid
    _log(f"{name} restarted (pid {pid} -> {new}, {sig.name}, down {down_for:.0f}s)")
    return new


def status() -> int:
    pids = _pids()
    if not pids:
        print("down")
        return 1
    node2 = NODE2_COMPONENTS if any(n in pids for n in NODE2_COMPONENTS) else ()
    for name in (*COMPONENTS, *node2):
        pid = pids.get(name)
        print(f"{name:25} {'running' if pid and _alive(pid) else 'STOPPED'} {pid or ''}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "command",
        choices=(
            "up",
            "down",
            "status",
            "restart",
            "node-add",
            "node-remove",
            "node-lose",
            "trust-registry",
            "untrust-registry",
            "remove-images",
            "import-images",
        ),
    )
    p.add_argument(
        "operands",
        nargs="*",
        help="restart: the component; (un)trust-registry: HOST:PORT [CA_FILE]; remove-images: PATTERN...",
    )
    p.add_argument("--signal", default="TERM", choices=("TERM", "KILL"), help="restart: how it stops")
    p.add_argument("--down-for", type=float, default=0.0, help="restart: seconds between stop and start")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        type=Path,
        default=[],
        help=f"an OCI archive to import (default: every {IMAGES}/*.oci.tar)",
    )
    args = p.parse_args(argv)
    imports = args.imports or dev_archives()
    if args.command == "trust-registry":
        if len(args.operands) != 2:
            p.error("trust-registry needs HOST:PORT CA_FILE")
        print(trust_registry(args.operands[0], Path(args.operands[1])))
        return 0
    if args.command == "untrust-registry":
        if len(args.operands) != 1:
            p.error("untrust-registry needs HOST:PORT")
        untrust_registry(args.operands[0])
        return 0
    if args.command == "remove-images":
        if not args.operands:
            p.error("remove-images needs at least one PATTERN")
        print("\n".join(remove_images(args.operands)))
        return 0
    if args.command == "import-images":
        import_images(imports)
        return 0
    if args.command == "node-add":
        try:
            node_add(imports)
        except BaseException:
            _log(f"node-add failed; removing {NODE2.name} (logs in .node/logs/*-2.log)")
            node_remove()
            raise
        return 0
    if args.command == "node-remove":
        node_remove()
        return 0
    if args.command == "node-lose":
        node_lose()
        return 0
    if args.command == "up":
        try:
            print(up(imports))
        except BaseException:
            _log("up failed; tearing down (logs in .node/logs)")
            down()
            raise
        return 0
    if args.command == "down":
        down()
        return 0
    if args.command == "restart":
        if len(args.operands) != 1 or args.operands[0] not in (*COMPONENTS, *NODE2_COMPONENTS):
            p.error(f"restart needs one component of {', '.join((*COMPONENTS, *NODE2_COMPONENTS))}")
        print(restart(args.operands[0], signal.Signals[f"SIG{args.signal}"], args.down_for))
        return 0
    return status()


if __name__ == "__main__":
    sys.exit(main())

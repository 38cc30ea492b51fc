#!/usr/bin/env python3
"""A whole single-node Kubernetes on this machine: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubelet, containerd + runc, a CNI bridge, kube-proxy and cluster DNS.

    python3 hack/localnode.py up [--import FILE.oci.tar ...]   # prints the kubeconfig path
    python3 hack/localnode.py down                             # everything goes, nothing is left
    python3 hack/localnode.py status
    python3 hack/localnode.py restart kubelet [--signal KILL] [--down-for S]   # one component

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

State lives in ``.node/`` (gitignored); images are imported from ``~/.cache/pko/images/*.oci.tar``
(``hack/build-images.sh``; the cache is ``$PKO_CACHE_DIR`` when set, as for the builds) on every ``up``.
"""

from __future__ import annotations

import argparse
import base64
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localcluster import _apt_install, ensure_binaries, free_port
from pki import Cert, apiserver_sans, ensure_pki
from versions import cache_dir, versions

bin_dir = functools.cache(ensure_binaries)  # Kubernetes, etcd and kubectl of hack/versions.env

HACK = Path(__file__).resolve().parent
REPO = HACK.parent
STATE = REPO / ".node"
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
STATIC_VOLUMES = 32  # enough for the e2e suite, whose every Stack keeps its state on a claim
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


def _log(msg: str) -> None:
    print(f"localnode: {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True, capture: bool = True) -> str:
    proc = subprocess.run(list(cmd), capture_output=capture, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout if capture else ""


# --- PKI, tokens, kubeconfigs -------------------------------------------------------------------------


# The node's PKI (hack/pki.py, with the service-account key pair): the apiserver's serving cert, its client
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


def _network_up() -> None:
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


def _pause_archive() -> tuple[Path, str]:
    """The pause image (its archive and its name), compiled from the release's own
    ``build/pause/linux/pause.c`` as upstream's Makefile does (no image can be pulled here). The archive
    is named by the pause version, so an archive of another version is never reused."""
    module = _kubernetes_module()
    tag = _pause_version(module)
    image = f"docker.io/library/pko-pause:{tag}"
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


def _ctr(*args: str, check: bool = True) -> str:
    return sh(
        "ctr",
        "--address",
        str(STATE / "run" / "containerd.sock"),
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


def import_images(paths: list[Path]) -> None:
    for path in paths:
        _log(f"importing {path.name}")
        _ctr("images", "import", "--snapshotter", snapshotter(), "--no-unpack=false", str(path))


# --- up / down ----------------------------------------------------------------------------------------


def _containerd_config(pause_image: str, snapshotter: str) -> Path:
    cni = STATE / "cni"
    (cni / "net.d").mkdir(parents=True, exist_ok=True)
    (cni / "net.d" / "10-pko.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "0.4.0",
                "name": "pko",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_SUBNET}]],
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
    config = STATE / "containerd.toml"
    config.write_text(
        f"""version = 2
root = "{STATE / "containerd"}"
state = "{STATE / "run" / "containerd-state"}"
[grpc]
  address = "{STATE / "run" / "containerd.sock"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
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
"""
    )
    return config


def _kubelet_config() -> Path:
    pki = STATE / "pki"
    (STATE / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
    config = STATE / "kubelet.json"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": NODE_IP,
                "port": 10250,
                "readOnlyPort": 0,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": free_port(),
                # containerd 1.6 has no CRI RuntimeConfig: the kubelet uses this driver
                "cgroupDriver": "cgroupfs",
                "failCgroupV1": False,  # this host is cgroup v1 (the kubelet refuses it otherwise)
                "containerRuntimeEndpoint": f"unix://{STATE / 'run' / 'containerd.sock'}",
                "clusterDNS": [NODE_IP],
                "clusterDomain": "cluster.local",
                "resolvConf": str(STATE / "resolv.conf"),
                "failSwapOn": False,
                "tlsCertFile": str(pki / "kubelet.crt"),
                "tlsPrivateKeyFile": str(pki / "kubelet.key"),
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
            },
            indent=1,
        )
    )
    return config


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
    pause_archive, pause_image = _pause_archive()
    config = _containerd_config(pause_image, _choose_snapshotter())
    _spawn("containerd", ["containerd", "--config", str(config)])
    _wait("containerd", lambda: _ctr("version") != "", 30, "containerd.log")
    import_images([pause_archive, *imports])

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
    _spawn(
        "kube-proxy",
        [
            f"{bins}/kube-proxy",
            f"--kubeconfig={kubeconfig}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={POD_SUBNET}",
            f"--hostname-override={NODE_NAME}",
            "--conntrack-max-per-core=0",
            "--nodeport-addresses=primary",  # NodePorts on the node address only, never on eth0
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--healthz-bind-address=127.0.0.1:{free_port()}",
            "--v=1",
        ],
    )
    _spawn(
        "kubelet",
        [
            f"{bins}/kubelet",
            f"--config={_kubelet_config()}",
            f"--kubeconfig={kubeconfig}",
            f"--node-ip={NODE_IP}",
            f"--hostname-override={NODE_NAME}",
            f"--root-dir={STATE / 'kubelet'}",
            f"--cert-dir={STATE / 'kubelet-pki'}",
            "--v=1",
        ],
    )

    def node_ready() -> bool:
        node = json.loads(_kubectl("get", "node", NODE_NAME, "-o", "json"))
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        taints = [
            t for t in node["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/not-ready")
        ]
        return bool(ready and ready[0]["status"] == "True" and not taints)

    _wait("the node", node_ready, timeout, "kubelet.log")
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


def _kill_containers() -> None:
    sock = STATE / "run" / "containerd.sock"
    if not sock.exists():
        return
    tasks = _ctr("tasks", "ls", "-q", check=False).split()
    for task in tasks:
        _ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
    time.sleep(1 if tasks else 0)
    for task in tasks:
        _ctr("tasks", "rm", "-f", task, check=False)
    for container in _ctr("containers", "ls", "-q", check=False).split():
        _ctr("containers", "rm", container, check=False)


def down() -> None:
    pids = _pids()
    for name in ("kubelet", "kube-proxy"):
        if name in pids:
            _stop(name, pids.pop(name))
    _kill_containers()
    for name in reversed(COMPONENTS):
        if name in pids:
            _stop(name, pids.pop(name))
    # containerd shims of our socket that outlived containerd
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "containerd-shim" in cmdline and str(STATE) in cmdline:
                _stop("shim", int(proc.name), timeout=3)
    (STATE / "pids.json").unlink(missing_ok=True)
    _unmount_all(STATE)
    _iptables_clean()
    _network_down()
    for sub in ("kubelet", "run", "containerd", "cni", "etcd", "dns", "kubelet-pki", "volumes"):
        shutil.rmtree(STATE / sub, ignore_errors=True)
    _log("node down")


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
    for name in COMPONENTS:
        pid = pids.get(name)
        print(f"{name:25} {'running' if pid and _alive(pid) else 'STOPPED'} {pid or ''}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("up", "down", "status", "restart"))
    p.add_argument("component", nargs="?", choices=COMPONENTS, help="restart: the component")
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
    if args.command == "up":
        imports = args.imports or sorted(
            p
            for p in IMAGES.glob("*.oci.tar")
            if not p.name.startswith("pko-pause")  # the current one is imported first, always
        )
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
        if not args.component:
            p.error("restart needs a component")
        print(restart(args.component, signal.Signals[f"SIG{args.signal}"], args.down_for))
        return 0
    return status()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback: etcd + kube-apiserver (+ kube-controller-manager).

Used by the test suite (test/conftest.py) and by `hack/cluster-up.sh` / `hack/cluster-down.sh`.
Standard library only, so it runs before the project's virtualenv exists.

Why hand-rolled rather than kind/envtest: no container engine or registry is reachable on our
machines; the binaries (Kubernetes and etcd, at the versions in `hack/versions.env`) are built once
from their Go modules by `hack/build-kubernetes.sh` and cached outside the repo (see docs/development.md).

Every port is picked free at start, so two runs never collide. State (pids, ports) is written to
`<dir>/state.json` so a later process can stop a cluster it did not start.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pko.devtools.builds import built
from pko.devtools.pki import Cert, apiserver_sans, ensure_pki
from pko.devtools.waiting import NotReached, until

REPO_DIR = Path(__file__).resolve().parents[2]
HACK_DIR = REPO_DIR / "hack"
DEFAULT_DIR = REPO_DIR / ".cluster"
SERVICE_CIDR = "10.0.0.0/24"
# Audiences the apiserver accepts by default for TokenReview; tests mint tokens with their own.
API_AUDIENCES = "https://kubernetes.default.svc,pko-test"


def _log(msg: str) -> None:
    print(f"localcluster: {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _apt_install(*packages: str) -> None:
    """Install the Debian packages missing here. Callers run at once (hack/test.sh boots the node while
    the unit suite's tests install theirs), and apt refuses a second caller outright, so they take turns
    on one lock file."""

    def absent(names: Iterable[str]) -> list[str]:
        return [p for p in names if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]

    missing = absent(packages)
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    with open(Path(tempfile.gettempdir()) / "pko-apt.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = absent(missing)  # installed by the caller we waited for
        if not missing:
            return
        _log(f"installing {' '.join(missing)}")
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True)
        subprocess.run(
            [*sudo, "apt-get", "install", "-y", "-qq", *missing],
            check=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )


def ensure_binaries() -> Path:
    """Return the directory holding the Kubernetes and etcd binaries, building them once if needed."""
    _apt_install("openssl")
    override = os.environ.get("PKO_KUBE_BIN_DIR")
    if override:
        return Path(override)
    return built("build-kubernetes.sh", show_stderr=True)


# The control plane's PKI (pki.py): the apiserver's serving cert (serverAuth and clientAuth) for the
# loopback and for the `kubernetes` Service's address (the first of SERVICE_CIDR).
CA_CN = "pko-local-ca"
CERTS = (
    Cert("apiserver", "/CN=kube-apiserver", "serverAuth,clientAuth", apiserver_sans("127.0.0.1", "10.0.0.1")),
)


class PortTaken(RuntimeError):
    """A component could not bind the port picked for it."""


@dataclass
class ClusterState:
    dir: str
    bin_dir: str
    etcd_port: int
    etcd_peer_port: int
    apiserver_port: int
    admin_token: str
    extra_apiserver_args: list[str] = field(default_factory=list)
    with_controller_manager: bool = True
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"


class LocalCluster:
    """One control plane. `start()` is idempotent per instance; `stop()` kills what it started."""

    def __init__(
        self,
        directory: Path | str = DEFAULT_DIR,
        *,
        extra_apiserver_args: list[str] | None = None,
        with_controller_manager: bool = True,
    ) -> None:
        self.dir = Path(directory).resolve()
        self._extra = list(extra_apiserver_args or [])
        self._with_kcm = with_controller_manager
        self.state: ClusterState | None = None
        # Children this instance started: kept so they are reaped (and Python does not warn).
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        # Where each child's output starts in its (appended) log, to read only this run's lines.
        self._log_start: dict[str, int] = {}

    # -- public handles -------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.dir / "pki" / "ca.crt"

    @property
    def server(self) -> str:
        return self._st.server

    @property
    def admin_token(self) -> str:
        return self._st.admin_token

    @property
    def etcd_url(self) -> str:
        return self._st.etcd_url

    @property
    def _st(self) -> ClusterState:
        if self.state is None:
            raise RuntimeError("cluster not started")
        return self.state

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 120.0, attempts: int = 3) -> LocalCluster:
        bin_dir = ensure_binaries()
        self.dir.mkdir(parents=True, exist_ok=True)
        ensure_pki(self.dir / "pki", CA_CN, CERTS)
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(bin_dir, timeout)
                return self
            except PortTaken as e:
                # free_port() cannot reserve a port: another process may bind it before we do.
                self.stop()
                if attempt == attempts:
                    raise RuntimeError(f"could not bind the control plane's ports: {e}") from e
                _log(f"{e}; retrying with new ports")
            except BaseException:
                self.stop()  # never leave half a control plane running
                raise
        raise AssertionError("unreachable")

    def _start_once(self, bin_dir: Path, timeout: float) -> None:
        self.state = ClusterState(
            dir=str(self.dir),
            bin_dir=str(bin_dir),
            etcd_port=free_port(),
            etcd_peer_port=free_port(),
            apiserver_port=free_port(),
            admin_token=secrets.token_hex(24),
            extra_apiserver_args=self._extra,
            with_controller_manager=self._with_kcm,
        )
        (self.dir / "tokens.csv").write_text(f'{self._st.admin_token},admin,admin,"system:masters"\n')
        self._write_kubeconfig()
        self._start_etcd()
        self._wait_etcd(timeout)
        self.start_apiserver(timeout)
        if self._with_kcm:
            self._start_kcm()
        self._save()

    def stop(self) -> None:
        if self.state is None:
            return
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            self._kill(name)
        self._save()

    def stop_apiserver(self) -> None:
        self._kill("kube-apiserver")
        self._save()

    def start_apiserver(self, timeout: float = 120.0) -> None:
        st = self._st
        pki = self.dir / "pki"
        args = [
            f"{st.bin_dir}/kube-apiserver",
            f"--etcd-servers={st.etcd_url}",
            f"--secure-port={st.apiserver_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.dir / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--api-audiences={API_AUDIENCES}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
            "--v=1",
            *st.extra_apiserver_args,
        ]
        self._spawn("kube-apiserver", args)
        self._wait_ready(timeout)
        self._save()

    def restart_apiserver(self, timeout: float = 120.0) -> None:
        self.stop_apiserver()
        self.start_apiserver(timeout)

    # -- internals ------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")
        self._log_start[name] = log.tell()
        proc = subprocess.Popen(
            args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self._procs[name] = proc
        self._st.pids[name] = proc.pid

    def _kill(self, name: str, timeout: float = 30.0) -> None:
        pid = self._st.pids.pop(name, None)
        proc = self._procs.pop(name, None)
        if pid is None:
            return
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    return
            except ChildProcessError:  # not our child: poll for existence
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def _start_etcd(self) -> None:
        st = self._st
        peer = f"http://127.0.0.1:{st.etcd_peer_port}"
        data = self.dir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        self._spawn(
            "etcd",
            [
                f"{st.bin_dir}/etcd",
                "--name=pko",
                f"--data-dir={data}",
                f"--listen-client-urls={st.etcd_url}",
                f"--advertise-client-urls={st.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=pko={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _wait_etcd(self, timeout: float) -> None:
        def healthy() -> bool:
            self._check_alive("etcd")
            with urllib.request.urlopen(f"{self._st.etcd_url}/health", timeout=2) as r:
                return bool(json.load(r).get("health") == "true")

        try:
            until("etcd healthy", healthy, within=timeout, interval=0.2, transient=(OSError, ValueError))
        except NotReached as e:
            raise TimeoutError(f"{e}; see {self.dir / 'etcd.log'}") from None

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        req = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )

        def ready() -> bool:
            self._check_alive("kube-apiserver")
            with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                return bool(r.status == 200)

        try:
            until("kube-apiserver ready", ready, within=timeout, interval=0.3, transient=(OSError,))
        except NotReached as e:
            raise TimeoutError(f"{e}; see {self.dir / 'kube-apiserver.log'}") from None

    def _check_alive(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is None:
            return
        status = proc.poll()
        if status is not None:
            with open(self.dir / f"{name}.log", "rb") as f:
                f.seek(self._log_start.get(name, 0))
                output = f.read().decode(errors="replace")
            tail = output[-2000:]
            if "address already in use" in output:
                raise PortTaken(f"{name}: address already in use")
            raise RuntimeError(f"{name} exited with status {status}:\n{tail}")

    def _start_kcm(self) -> None:
        st = self._st
        pki = self.dir / "pki"
        self._spawn(
            "kube-controller-manager",
            [
                f"{st.bin_dir}/kube-controller-manager",
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--controllers=*,-nodeipam,-ttl,-nodelifecycle,-csrsigning,-bootstrapsigner,-tokencleaner",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                f"--secure-port={free_port()}",
                "--bind-address=127.0.0.1",
                "--v=1",
            ],
        )

    def _write_kubeconfig(self) -> None:
        st = self._st
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "pko-local", "cluster": {"server": st.server, "certificate-authority-data": ca}}
            ],
            "users": [{"name": "admin", "user": {"token": st.admin_token}}],
            "contexts": [{"name": "pko-local", "context": {"cluster": "pko-local", "user": "admin"}}],
            "current-context": "pko-local",
        }
        # JSON is valid YAML; kubectl and kubernetes-asyncio both read it.
        self.kubeconfig.write_text(json.dumps(cfg, indent=2))
        self.kubeconfig.chmod(0o600)

    def _save(self) -> None:
        (self.dir / "state.json").write_text(json.dumps(asdict(self._st), indent=2))

    @classmethod
    def load(cls, directory: Path | str = DEFAULT_DIR) -> LocalCluster:
        """Attach to a cluster started by another process (for `down` and `status`)."""
        c = cls(directory)
        raw = json.loads((c.dir / "state.json").read_text())
        c.state = ClusterState(**raw)
        return c


@contextlib.contextmanager
def private_cluster(prefix: str, *apiserver_args: str) -> Iterator[LocalCluster]:
    """A control plane of the caller's own (no controller-manager) in a temporary directory named with
    ``prefix``, its apiserver run with ``apiserver_args``; stopped and removed afterwards. For a test
    whose apiserver must differ from the session's shared one (other flags, no CRDs)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        c = LocalCluster(d, extra_apiserver_args=list(apiserver_args), with_controller_manager=False)
        try:
            c.start()
            yield c
        finally:
            c.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("command", choices=["up", "down", "build", "status"])
    p.add_argument("--dir", default=os.environ.get("PKO_CLUSTER_DIR", str(DEFAULT_DIR)))
    p.add_argument("--no-controller-manager", action="store_true")
    args = p.parse_args(argv)
    if args.command == "build":
        print(ensure_binaries())
        return 0
    if args.command == "down":
        try:
            LocalCluster.load(args.dir).stop()
        except FileNotFoundError:
            _log(f"no cluster state in {args.dir}")
        return 0
    if args.command == "status":
        c = LocalCluster.load(args.dir)
        print(json.dumps({"server": c.server, "kubeconfig": str(c.kubeconfig), "pids": c._st.pids}))
        return 0
    try:
        LocalCluster.load(args.dir).stop()  # a stale cluster from an earlier `up`
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        pass
    c = LocalCluster(args.dir, with_controller_manager=not args.no_controller_manager).start()
    print(f"export KUBECONFIG={c.kubeconfig}")
    _log(f"control plane up at {c.server}; logs in {c.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

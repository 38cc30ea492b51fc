"""The node's images: the pause image compiled from the Kubernetes module of the node's release,
containerd's snapshotter, the images imported from ``~/.cache/pko/images`` (at boot, or into the running
node) and removed by pattern, and the registries containerd trusts (``certs.d``)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
from pathlib import Path

from pko.devtools.localnode.node import (
    CERTS_D,
    HACK,
    IMAGES,
    NODE1,
    NODE2,
    STATE,
    _log,
    sh,
)
from pko.devtools.localnode.processes import (
    _alive,
    _pids,
)
from pko.devtools.versions import versions
from pko.devtools.waiting import until

LOG_TAIL = 3000  # of a failed late import's log: enough to see why


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


class LateImportFailed(RuntimeError):
    """The build or import of images the node did not boot with failed (see :func:`wait_late_import`)."""


def wait_late_import(status: Path, within: float) -> None:
    """Wait for images that another process builds and imports into the running node after its boot
    (hack/test.sh: the images only some e2e modules need, built beside the first modules). That process
    writes its exit status to ``status`` when done and its output to ``status.with_suffix(".log")``.
    Returns once the status is 0; raises :class:`LateImportFailed` with the end of that log when it is
    not, and :class:`pko.devtools.waiting.NotReached` when no status is written within ``within`` s."""
    log = status.with_suffix(".log")
    code = until(
        f"the images imported after boot ({status} written; their build's log: {log})",
        lambda: status.read_text().strip() if status.exists() else "",
        within=within,
        interval=2,
    )
    if code != "0":
        said = log.read_text(errors="replace")[-LOG_TAIL:] if log.exists() else "(no log)"
        raise LateImportFailed(
            f"the images imported after boot failed (exit {code}); the end of {log}:\n" + said
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

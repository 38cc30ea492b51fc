#!/usr/bin/env python3
"""Make a release of pko: the three images pushed by digest, and ``dist/VERSION/`` (see docs/releasing.md).

    hack/release.sh VERSION --registry HOST[:PORT]/PATH [--ca-file CA] [--source-url URL] [--download-url URL]

Credentials for the registry: ``PKO_REGISTRY_USERNAME`` and ``PKO_REGISTRY_PASSWORD`` (none: anonymous).

Everything that can refuse is asked before anything is pushed, and each refusal says which: a version that
is not SemVer 0.N.M or not the tree's (pko/version.py) or has no CHANGELOG.md entry, a tree with changes
or untracked files, a ``dist/VERSION`` that exists, a tag that exists in the registry (an image's or the
chart's), a registry that refuses pushes. Then the images are built from a clean worktree of HEAD
(hack/build-images.sh, whose cache makes a release of an already-built commit cost only the push), pushed
with their OCI labels, and the files written: ``install.yaml``, ``quickstart.yaml``, the chart (packaged
with the pins as defaults, and pushed to ``oci://HOST/PATH/charts``), ``kubectl-pko`` and its archive with
the krew manifest ``plugins/pko.yaml``, ``images.txt`` and ``SHA256SUMS``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from pko.devtools.build_plugin import build_plugin
from pko.devtools.builds import BuildError, built
from pko.devtools.ociclient import Registry, RegistryError, RegistryRef
from pko.devtools.ocilayout import push_archive
from pko.devtools.releasefiles import (
    IMAGES,
    Pins,
    install_objects,
    krew_manifest,
    oci_labels,
    pin_values,
    quickstart_objects,
    sha256_of,
    sha256sums,
    to_yaml,
    validate_version,
)
from pko.devtools.versions import cache_dir
from pko.version import VERSION

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"

CHART_REPOSITORY = "charts/pko"


class ReleaseError(RuntimeError):
    """A reason to stop; printed as ``release: <reason>`` with exit code 1."""


def git(*args: str, cwd: Path = REPO) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def run(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, input=stdin, env={**os.environ, **(env or {})}
    )
    if proc.returncode != 0:
        raise ReleaseError(
            f"{' '.join(args[:3])} ... failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    return proc.stdout


def say(text: str) -> None:
    print(f"release: {text}", file=sys.stderr, flush=True)


# --- the questions asked before anything is pushed ---------------------------------------------------


def check_changelog(version: str) -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    if f"## [{version}]" not in text:
        raise ReleaseError(
            f"CHANGELOG.md has no entry `## [{version}] - DATE`: say what users of it must know"
        )


def check_clean_tree() -> str:
    """HEAD's commit, when the tree holds nothing else (no change, no untracked file)."""
    status = git("status", "--porcelain", "--untracked-files=all")
    if status:
        shown = "\n  ".join(status.splitlines()[:20])
        raise ReleaseError(f"the tree is not clean (commit or remove these first):\n  {shown}")
    return git("rev-parse", "HEAD")


def check_registry(registry: Registry, ref: RegistryRef, version: str) -> None:
    for name in (*IMAGES, CHART_REPOSITORY):
        repository = ref.repository(name)
        try:
            registry.check_push(repository)
            existing = registry.manifest_digest(repository, version)
            if existing:
                raise ReleaseError(
                    f"{ref.host}/{repository}:{version} exists ({existing}): a release is never replaced"
                )
        except RegistryError as exc:
            raise ReleaseError(str(exc)) from None


# --- building ------------------------------------------------------------------------------------


@contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A detached worktree of ``revision``: the release builds from exactly the commit, whatever else is
    in this checkout (ignored files, build output)."""
    path = Path(tempfile.mkdtemp(prefix="pko-release-tree-"))
    git("worktree", "add", "--detach", str(path), revision)
    try:
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))
        shutil.rmtree(path, ignore_errors=True)


def build_images(tree: Path, out: Path) -> dict[str, Path]:
    """hack/build-images.sh of ``tree`` into ``out``, seeded with the development cache's archives (hard
    links): an image whose inputs match is not rebuilt, and an image this tree changes is rebuilt into
    ``out`` only, so the development cache keeps its own."""
    cache = cache_dir() / "images"
    out.mkdir(parents=True, exist_ok=True)
    for path in cache.glob("*") if cache.is_dir() else []:
        if path.suffix in (".tar", ".hash") and not (out / path.name).exists():
            os.link(path, out / path.name)
    python = os.environ.get("PYTHON") or str(REPO / ".venv" / "bin" / "python")
    run("bash", str(tree / "hack" / "build-images.sh"), str(out), cwd=tree, env={"PYTHON": python})
    archives = {name: out / f"{archive}.oci.tar" for name, archive in IMAGES.items()}
    for name, path in archives.items():
        if not path.is_file():
            raise ReleaseError(f"hack/build-images.sh wrote no {path.name} for {name}")
    return archives


def kustomize(tree: Path, kubectl: str, directory: str) -> list[dict[str, object]]:
    return [o for o in yaml.safe_load_all(run(kubectl, "kustomize", str(tree / directory))) if o]


def helm_binary() -> str:
    """The pinned helm: hack/build-helm.sh prints the directory whose bin/helm it built (or found cached)."""
    try:
        return str(built("build-helm.sh") / "bin" / "helm")
    except BuildError as exc:
        raise ReleaseError(str(exc)) from None


# --- the release -----------------------------------------------------------------------------------


def release(args: argparse.Namespace) -> Path:
    version = validate_version(args.version, VERSION)
    check_changelog(version)
    ref = RegistryRef.parse(args.registry)
    revision = check_clean_tree()
    dist = Path(args.dist or REPO / "dist") / version
    if dist.exists():
        raise ReleaseError(f"{dist} exists: a release is written once (remove it to make it again)")
    source = args.source_url or _default_source()
    registry = Registry(
        ref.host,
        username=os.environ.get("PKO_REGISTRY_USERNAME", ""),
        password=os.environ.get("PKO_REGISTRY_PASSWORD", ""),
        ca_file=Path(args.ca_file) if args.ca_file else None,
        plain_http=args.plain_http,
    )
    say(f"checking {ref} (tags {version} absent, pushes allowed)")
    check_registry(registry, ref, version)

    kubectl = args.kubectl or shutil.which("kubectl") or ""
    if not kubectl:
        raise ReleaseError("kubectl (for `kubectl kustomize`) is not on PATH; say --kubectl")
    helm = helm_binary()
    # Under the cache: the image archives are hard links into it (the same filesystem).
    (cache_dir() / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="release-", dir=cache_dir() / "tmp"))
    try:
        with worktree(revision) as tree:
            say(f"building the images of {revision[:12]} (hack/build-images.sh)")
            archives = build_images(tree, work / "images")
            default = kustomize(tree, kubectl, "config/default")
            quickstart = kustomize(tree, kubectl, "config/quickstart")
            shutil.copytree(tree / "charts" / "pko", work / "chart")
            plugin = build_plugin(work / "plugin", repo=tree)

        labels = oci_labels(version, revision, source)
        pinned: dict[str, str] = {}
        for name, archive in archives.items():
            say(f"pushing {ref}/{name}:{version}")
            try:
                pinned[name] = push_archive(archive, registry, ref.repository(name), version, labels).pinned
            except RegistryError as exc:
                raise ReleaseError(f"pushing {name}: {exc}") from None
        pins = Pins.from_pushed(pinned)

        staging = work / "dist"
        staging.mkdir()
        header = f"pko {version} ({revision}): kubectl apply --server-side -f"
        (staging / "install.yaml").write_text(
            to_yaml(install_objects(default, pins, version), f"{header} install.yaml")
        )
        (staging / "quickstart.yaml").write_text(
            to_yaml(
                quickstart_objects(quickstart, default, version),
                f"{header} quickstart.yaml (after install.yaml)",
            )
        )
        (staging / "images.txt").write_text("".join(f"{p}\n" for p in pinned.values()))

        values = work / "chart" / "values.yaml"
        values.write_text(pin_values(values.read_text(), pins))
        run(
            helm,
            "package",
            str(work / "chart"),
            "--version",
            version,
            "--app-version",
            version,
            "-d",
            str(staging),
        )
        package = staging / f"pko-{version}.tgz"
        say(f"pushing the chart to oci://{ref}/charts")
        _helm_push(helm, package, ref, registry, work)

        shutil.copy2(plugin, staging / "kubectl-pko")
        archive_name = "kubectl-pko.tar.gz"
        _plugin_archive(staging / "kubectl-pko", staging / archive_name)
        download = (args.download_url or f"{source}/releases/download/v{version}").rstrip("/")
        (staging / "plugins").mkdir()
        (staging / "plugins" / "pko.yaml").write_text(
            krew_manifest(version, f"{download}/{archive_name}", sha256_of(staging / archive_name), source)
        )
        (staging / "SHA256SUMS").write_text(sha256sums(staging))
        dist.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(staging, dist)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dist


def _default_source() -> str:
    """The repository's public address: from GitHub Actions, else an https ``origin``."""
    if os.environ.get("GITHUB_REPOSITORY"):
        return (
            f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ['GITHUB_REPOSITORY']}"
        )
    proc = subprocess.run(["git", "remote", "get-url", "origin"], cwd=REPO, capture_output=True, text=True)
    url = proc.stdout.strip().removesuffix(".git")
    if proc.returncode == 0 and url.startswith("https://"):
        return url
    raise ReleaseError(
        "cannot tell the repository's public address: say --source-url https://github.com/OWNER/REPO"
    )


def _helm_push(helm: str, package: Path, ref: RegistryRef, registry: Registry, work: Path) -> None:
    """``helm push`` with a registry config of its own (the user's helm login is neither read nor changed)."""
    config = ["--registry-config", str(work / "helm-registry.json")]
    tls = ["--ca-file", str(registry.ca_file)] if registry.ca_file else []
    tls += ["--plain-http"] if registry.plain_http else []
    if registry.username:
        login_tls = [a for a in tls if a != "--plain-http"] + (["--insecure"] if registry.plain_http else [])
        run(helm, "registry", "login", ref.host, "--username", registry.username, "--password-stdin",
            *login_tls, *config, stdin=registry.password)  # fmt: skip
    run(helm, "push", str(package), f"oci://{ref}/charts", *tls, *config)


def _plugin_archive(plugin: Path, archive: Path) -> None:
    """The krew archive: the plugin and the LICENSE, with fixed owners and times (same bytes each time)."""

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with archive.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            tar.add(plugin, "kubectl-pko", filter=fixed)
            tar.add(REPO / "LICENSE", "LICENSE", filter=fixed)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="hack/release.sh", description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    p.add_argument(
        "version", metavar="VERSION", help="the version to release, e.g. v0.1.0 (pko/version.py's)"
    )
    p.add_argument(
        "--registry", required=True, metavar="HOST[:PORT]/PATH", help="where the images and chart go"
    )
    p.add_argument("--ca-file", metavar="FILE", help="the CA a private registry's certificate is signed by")
    p.add_argument(
        "--plain-http", action="store_true", help="talk HTTP, not HTTPS, to the registry (a loopback one)"
    )
    p.add_argument("--source-url", metavar="URL", help="the repository's address (OCI label, krew homepage)")
    p.add_argument(
        "--download-url", metavar="URL", help="where the release's files are downloaded from (krew)"
    )
    p.add_argument("--dist", metavar="DIR", help="where dist/VERSION goes (default: the repository's dist/)")
    p.add_argument("--kubectl", metavar="PATH", help="the kubectl whose kustomize renders config/")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        dist = release(args)
    except (ReleaseError, ValueError) as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(dist)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The source archives hack/build-sources.sh builds from (and fetches for hack/build-peer.sh) agree with
their pins in hack/versions.env, and an archive that does not is refused before anything is built
(`hack/build-sources.sh verify` builds nothing and reads no network; `get` only extracts)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pko.devtools.versions import versions

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "hack" / "build-sources.sh"


def _shared_sources() -> Path | None:
    """The archives' directory the script reads by default: $PKO_SOURCES or ../shared/sources."""
    explicit = os.environ.get("PKO_SOURCES")
    path = Path(explicit) if explicit else REPO.parent / "shared" / "sources"
    return path if path.is_dir() else None


def _archives() -> dict[str, tuple[str, str, str]]:
    """Each pinned archive's file name -> (versions.env prefix, commit, sha256), named as the script names
    them."""
    v = versions()
    names = {
        "PULUMI_RANDOM": f"pulumi-random-v{v['PULUMI_RANDOM_VERSION']}.tar.gz",
        "PULUMI_RANDOM_YAML": f"pulumi-yaml-{v['PULUMI_RANDOM_YAML_COMMIT'][:12]}.tar.gz",
        "PULUMI_RANDOM_DOTNET": f"pulumi-dotnet-{v['PULUMI_RANDOM_DOTNET_COMMIT'][:12]}.tar.gz",
        "PULUMI_COMMAND": f"pulumi-command-v{v['PULUMI_COMMAND_VERSION']}.tar.gz",
        "PULUMI_LANGUAGE_HOSTS": f"pulumi-v{v['PULUMI_LANGUAGE_HOSTS_VERSION']}-language-hosts.tar.gz",
        # Fetched for hack/build-peer.sh (`get operator`), not built by build-sources.sh.
        "PULUMI_KUBERNETES_OPERATOR": (
            f"pulumi-kubernetes-operator-v{v['PULUMI_KUBERNETES_OPERATOR_VERSION']}.tar.gz"
        ),
    }
    return {name: (pin, v[f"{pin}_COMMIT"], v[f"{pin}_SHA256"]) for pin, name in names.items()}


def _run(sources: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PKO_SOURCES": str(sources)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def _verify(sources: Path) -> subprocess.CompletedProcess[str]:
    return _run(sources, "verify")


def test_every_pin_is_complete() -> None:
    v = versions()
    for pin, commit, sha in _archives().values():
        assert len(commit) == 40 and int(commit, 16) >= 0, pin
        assert len(sha) == 64 and int(sha, 16) >= 0, pin
        assert v[f"{pin}_REPOSITORY"].startswith("https://github.com/pulumi/"), pin


def test_a_tampered_archive_is_refused_naming_it_and_its_pin(tmp_path: Path) -> None:
    name, (pin, _commit, sha) = next(iter(_archives().items()))
    shared = _shared_sources()
    if shared is not None and (shared / name).is_file():
        shutil.copyfile(shared / name, tmp_path / name)  # the real archive, one byte added
        with (tmp_path / name).open("ab") as f:
            f.write(b"\0")
    else:
        (tmp_path / name).write_bytes(b"not the pinned archive")
    result = _verify(tmp_path)
    assert result.returncode == 1, result
    assert "sha256 mismatch" in result.stderr
    assert str(tmp_path / name) in result.stderr
    assert f"{pin}_SHA256={sha}" in result.stderr
    assert "refusing" in result.stderr


def test_absent_archives_are_cloned_instead(tmp_path: Path) -> None:
    result = _verify(tmp_path)
    assert result.returncode == 0, result.stderr
    v = versions()
    for name, (pin, _commit, _sha) in _archives().items():
        assert f"{name}: absent (the build clones {v[f'{pin}_REPOSITORY']} at " in result.stdout


def test_the_shared_archives_match_the_pins() -> None:
    shared = _shared_sources()
    if shared is None:
        pytest.skip("no source archives here (PKO_SOURCES, ../shared/sources): the build clones the pins")
    result = _verify(shared)
    assert result.returncode == 0, result.stderr
    present = [name for name in _archives() if (shared / name).is_file()]
    assert present, f"none of the pinned archives is in {shared}"
    for name in present:
        assert f"{name}: ok" in result.stdout
    # The archives' MANIFEST (file, repository, ref, commit, paths, sha256) says the same commits.
    manifest = shared / "MANIFEST"
    if manifest.is_file():
        rows = {
            cols[0]: cols
            for line in manifest.read_text().splitlines()
            if not line.startswith("#") and len(cols := line.split("\t")) >= 6
        }
        v = versions()
        for name in present:
            pin, commit, sha = _archives()[name]
            assert rows[name][3] == commit and rows[name][5] == sha, name
            assert f"https://{rows[name][1]}" == v[f"{pin}_REPOSITORY"], name


def _operator_archive() -> tuple[str, str]:
    name = next(n for n, (pin, _c, _s) in _archives().items() if pin == "PULUMI_KUBERNETES_OPERATOR")
    return name, versions()["PULUMI_KUBERNETES_OPERATOR_SHA256"]


def test_get_refuses_an_unknown_source_without_touching_dest(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    result = _run(tmp_path, "get", "no-such-source", str(dest))
    assert result.returncode == 1, result
    assert "no source named no-such-source" in result.stderr
    assert (dest / "keep").read_text() == "mine"


def test_get_refuses_a_tampered_operator_archive(tmp_path: Path) -> None:
    name, sha = _operator_archive()
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / name).write_bytes(b"not the pinned archive")
    result = _run(sources, "get", "operator", str(tmp_path / "src"))
    assert result.returncode == 1, result
    assert f"PULUMI_KUBERNETES_OPERATOR_SHA256={sha}" in result.stderr
    assert not (tmp_path / "src" / "go.mod").exists()


def test_get_extracts_the_operator_source_hack_build_peer_builds(tmp_path: Path) -> None:
    """The paths hack/build-peer.sh builds, stamps and copies are in the pinned archive."""
    name, _sha = _operator_archive()
    shared = _shared_sources()
    if shared is None or not (shared / name).is_file():
        pytest.skip(f"no {name} here: the build clones the pinned tag")
    dest = tmp_path / "src"
    result = _run(shared, "get", "operator", str(dest))
    assert result.returncode == 0, result.stderr
    assert f"{name} (sha256 verified)" in result.stderr
    assert result.stdout == ""
    assert "module github.com/pulumi/pulumi-kubernetes-operator/v2\n" in (dest / "go.mod").read_text()
    for path in ("operator/cmd/main.go", "agent/main.go"):
        assert (dest / path).is_file(), path
    for pkg in ("operator/version", "agent/version"):
        assert "\nvar Version string" in (dest / pkg / "version.go").read_text(), pkg
    for path in ("crd/kustomization.yaml", "rbac/kustomization.yaml", "manager/manager.yaml"):
        assert (dest / "operator/config" / path).is_file(), path

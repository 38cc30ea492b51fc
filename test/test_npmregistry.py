"""pko/devtools/npmregistry.py with the real npm client on loopback: installs from test-made packages and from
the workspace image's lockfile fed by the npm cache, npm's own E404 for a package it lacks, and
:func:`lockfile_subset` on a hand-written tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pko.devtools.npmregistry import MissingTarball, Registry, lockfile_subset, make_package, serve_registry
from pko.devtools.versions import cache_dir

REPO = Path(__file__).resolve().parents[1]
IMAGE_LOCK = REPO / "images" / "workspace" / "nodejs" / "package-lock.json"
NPM = shutil.which("npm")
needs_npm = pytest.mark.skipif(NPM is None, reason="npm is not installed on this host")


def npm(args: list[str], cwd: Path, registry: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The real npm in ``cwd``, its only registry ours, a fresh cache of the test's own (so each
    package is downloaded from us), no user or global npmrc, nothing else on the network."""
    for config in ("user-npmrc", "global-npmrc"):
        (cwd.parent / config).touch()
    env = {
        k: v for k, v in os.environ.items() if not k.lower().startswith(("npm_", "http_proxy", "https_proxy"))
    }
    env |= {
        "NPM_CONFIG_REGISTRY": registry + "/",
        "npm_config_cache": str(cwd.parent / "cache"),
        "npm_config_userconfig": str(cwd.parent / "user-npmrc"),
        "npm_config_globalconfig": str(cwd.parent / "global-npmrc"),
        "npm_config_omit_lockfile_registry_resolved": "true",  # as the image's lockfile was written
        "npm_config_update_notifier": "false",
        "npm_config_fetch_retries": "0",
    }
    flags = ["--no-audit", "--no-fund", "--ignore-scripts", "--prefer-online"]
    done = subprocess.run(
        [NPM or "npm", *args, *flags], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    if check and done.returncode != 0:
        raise AssertionError(f"npm {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def program(tmp_path: Path, dependencies: dict[str, str], lock: dict[str, Any] | None = None) -> Path:
    """A program directory with a package.json depending on ``dependencies`` (and ``lock``)."""
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "package.json").write_text(json.dumps({"name": "prog", "dependencies": dependencies}))
    if lock is not None:
        (prog / "package-lock.json").write_text(json.dumps(lock))
    return prog


def node(prog: Path, expression: str) -> str:
    done = subprocess.run(["node", "-p", expression], cwd=prog, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def greeting() -> Iterator[tuple[Registry, str]]:
    """A registry holding pko-e2e-greeting@1.0.0, which depends on pko-e2e-name@^2.0.0 (both test-made)."""
    registry = Registry()
    registry.add_tarball(make_package("pko-e2e-name", "2.0.0", {"index.js": "module.exports = 'pko';\n"}))
    registry.add_tarball(
        make_package(
            "pko-e2e-greeting",
            "1.0.0",
            {"index.js": "module.exports = () => 'hello, ' + require('pko-e2e-name');\n"},
            dependencies={"pko-e2e-name": "^2.0.0"},
        )
    )
    with serve_registry(registry) as url:
        yield registry, url


@needs_npm
def test_test_made_packages_install_with_npm_install_then_npm_ci(
    greeting: tuple[Registry, str], tmp_path: Path
) -> None:
    registry, url = greeting
    prog = program(tmp_path, {"pko-e2e-greeting": "1.0.0"})
    npm(["install"], prog, url)
    assert node(prog, "require('pko-e2e-greeting')()") == "hello, pko"
    lock = json.loads((prog / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/pko-e2e-name"]["version"] == "2.0.0"
    assert "resolved" not in lock["packages"]["node_modules/pko-e2e-name"]

    shutil.rmtree(prog / "node_modules")
    shutil.rmtree(tmp_path / "cache")
    registry.requests.clear()
    npm(["ci"], prog, url)
    assert node(prog, "require('pko-e2e-greeting')()") == "hello, pko"
    assert ("GET", "/pko-e2e-name/-/pko-e2e-name-2.0.0.tgz", 200) in registry.requests
    assert all(status == 200 for _, _, status in registry.requests), registry.requests


@needs_npm
def test_a_package_the_registry_lacks_is_npms_own_e404(
    greeting: tuple[Registry, str], tmp_path: Path
) -> None:
    registry, url = greeting
    prog = program(tmp_path, {"pko-e2e-greeting": "1.0.0", "pko-e2e-absent": "1.0.0"})
    done = npm(["install"], prog, url, check=False)
    assert done.returncode != 0
    assert "E404" in done.stderr and "pko-e2e-absent" in done.stderr, done.stderr
    # npm 11: "The requested resource 'pko-e2e-absent@1.0.0' could not be found or you do not have
    # permission to access it."; npm 6 to 10: "'pko-e2e-absent@1.0.0' is not in this registry."
    assert "'pko-e2e-absent@1.0.0'" in done.stderr, done.stderr
    assert ("GET", "/pko-e2e-absent", 404) in registry.requests


@needs_npm
def test_the_image_lockfiles_pulumi_sdk_installs_offline_from_the_npm_cache(tmp_path: Path) -> None:
    if not IMAGE_LOCK.is_file():
        pytest.skip(f"no {IMAGE_LOCK.relative_to(REPO)} (the workspace image's Node.js SDK set)")
    lock = lockfile_subset(json.loads(IMAGE_LOCK.read_text()), {"@pulumi/pulumi": "3.259.0"}, "prog")
    registry = Registry()
    try:
        registry.add_lockfile(lock, cache_dir() / "npm")
    except MissingTarball as missing:
        pytest.skip(
            f"the npm cache lacks the image lockfile's tarballs (hack/build-runtimes.sh fills it): {missing}"
        )
    prog = program(tmp_path, {"@pulumi/pulumi": "3.259.0"}, lock)
    with serve_registry(registry) as url:
        npm(["ci"], prog, url)
    assert node(prog, "require('@pulumi/pulumi/package.json').version") == "3.259.0"
    assert registry.requests, "npm asked our registry for nothing"
    assert all(method == "GET" and status == 200 for method, _, status in registry.requests), [
        r for r in registry.requests if r[2] != 200
    ]
    assert ("GET", "/@pulumi/pulumi/-/pulumi-3.259.0.tgz", 200) in registry.requests


def test_registry_paths_and_404s() -> None:
    registry = Registry()
    registry.add_tarball(make_package("@pko/scoped", "1.0.0", {"index.js": ""}))
    registry.add_tarball(make_package("@pko/scoped", "1.10.0", {"index.js": ""}))
    env = {"wsgi.url_scheme": "http", "HTTP_HOST": "10.0.0.7:4873", "REQUEST_METHOD": "GET"}

    def get(path: str, method: str = "GET") -> tuple[str, bytes]:
        answer: list[str] = []
        body = b"".join(
            registry(env | {"PATH_INFO": path, "REQUEST_METHOD": method}, lambda s, h: answer.append(s))
        )
        return answer[0], body

    for path in ("/@pko/scoped", "/@pko%2fscoped", "/@pko%2Fscoped"):
        status, body = get(path)
        doc = json.loads(body)
        assert status == "200 OK" and doc["dist-tags"]["latest"] == "1.10.0"
    assert (
        doc["versions"]["1.0.0"]["dist"]["tarball"] == "http://10.0.0.7:4873/@pko/scoped/-/scoped-1.0.0.tgz"
    )
    assert get("/@pko/scoped/-/scoped-1.0.0.tgz")[0] == "200 OK"
    for path in ("/@pko/scoped/-/scoped-9.9.9.tgz", "/absent", "/@pko/absent", "/-/npm/v1/security/audits"):
        assert get(path) == ("404 Not Found", b'{"error":"Not found"}')
    assert get("/@pko/scoped", "POST")[0] == "404 Not Found"
    assert [r[2] for r in registry.requests] == [200, 200, 200, 200, 404, 404, 404, 404, 404]


def test_add_lockfile_names_a_tarball_the_cache_lacks(tmp_path: Path) -> None:
    lock = {"packages": {"": {}, "node_modules/left-pad": {"version": "1.3.0", "integrity": "sha512-AAAA"}}}
    with pytest.raises(MissingTarball, match=rf"left-pad@1\.3\.0 .*{tmp_path}"):
        Registry().add_lockfile(lock, tmp_path)


def test_lockfile_subset_resolves_like_node() -> None:
    def entry(version: str, **more: Any) -> dict[str, Any]:
        return {"version": version, "integrity": f"sha512-{version}", **more}

    lock: dict[str, Any] = {
        "name": "big",
        "lockfileVersion": 3,
        "packages": {
            "": {"name": "big", "dependencies": {"a": "1.0.0", "c": "1.0.0", "unrelated": "1.0.0"}},
            "node_modules/a": entry("1.0.0", dependencies={"b": "^2", "shared": "^1"}),
            "node_modules/a/node_modules/b": entry("2.0.0", dependencies={"shared": "^1"}),
            "node_modules/b": entry("1.0.0"),  # another b: a's own (nested) one wins
            "node_modules/c": entry(
                "1.0.0",
                dependencies={"shared": "^1"},
                optionalDependencies={"gone": "^1", "opt": "^1"},
                peerDependencies={"peer": "*", "nopeer": "*", "optpeer": "*"},
                peerDependenciesMeta={"nopeer": {"optional": True}, "optpeer": {"optional": True}},
            ),
            "node_modules/shared": entry("1.0.0"),  # hoisted: a, a's b and c all find it
            "node_modules/opt": entry("1.0.0", optional=True),
            "node_modules/peer": entry("1.0.0"),
            "node_modules/optpeer": entry("1.0.0"),  # an optional peer: npm installs it for no one
            "node_modules/unrelated": entry("1.0.0"),
        },
    }
    subset = lockfile_subset(lock, {"a": "1.0.0", "c": "1.0.0"}, "small")
    assert subset["name"] == "small" and subset["lockfileVersion"] == 3
    assert subset["packages"][""] == {"name": "small", "dependencies": {"a": "1.0.0", "c": "1.0.0"}}
    assert set(subset["packages"]) == {
        "",
        "node_modules/a",
        "node_modules/a/node_modules/b",
        "node_modules/c",
        "node_modules/shared",
        "node_modules/opt",
        "node_modules/peer",
    }
    assert subset["packages"]["node_modules/opt"] == lock["packages"]["node_modules/opt"]
    assert lockfile_subset(lock, {"a": "1.0.0"}, "s")["packages"].keys() == {
        "",
        "node_modules/a",
        "node_modules/a/node_modules/b",
        "node_modules/shared",
    }
    with pytest.raises(ValueError, match=r"a@2\.0\.0"):
        lockfile_subset(lock, {"a": "2.0.0"}, "s")
    del lock["packages"]["node_modules/shared"]
    with pytest.raises(ValueError, match="needs shared"):
        lockfile_subset(lock, {"a": "1.0.0"}, "s")

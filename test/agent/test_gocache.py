"""The bound on the Go caches a workspace keeps across pods (agent/gocache.py): which caches are
cleared, the limit on a small volume, and clearing real caches written by the real ``go`` toolchain
(read-only module files included) while keeping their directories."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from pko.agent.gocache import GO_CACHE_MAX_BYTES, bound_go_caches, cache_limit, dir_bytes, to_clear

GiB = 1024**3


def test_the_build_cache_goes_first_and_the_modules_only_if_still_over() -> None:
    assert to_clear({"GOCACHE": 1 * GiB, "GOMODCACHE": 1 * GiB}, 3 * GiB) == []
    assert to_clear({"GOCACHE": 2 * GiB, "GOMODCACHE": 2 * GiB}, 3 * GiB) == ["GOCACHE"]
    assert to_clear({"GOCACHE": 1 * GiB, "GOMODCACHE": 4 * GiB}, 3 * GiB) == ["GOCACHE", "GOMODCACHE"]
    assert to_clear({"GOMODCACHE": 4 * GiB}, 3 * GiB) == ["GOMODCACHE"]


def test_the_limit_is_lower_on_a_small_volume() -> None:
    assert cache_limit(None) == GO_CACHE_MAX_BYTES
    assert cache_limit(100 * GiB) == GO_CACHE_MAX_BYTES
    assert cache_limit(2 * GiB) == int(1.6 * GiB)


def _module_cache(root: Path) -> None:
    """A module cache as Go leaves one: read-only files in read-only directories."""
    module = root / "example.com" / "m@v1.0.0"
    module.mkdir(parents=True)
    (module / "go.mod").write_text("module example.com/m\n" * 100)
    (module / "go.mod").chmod(0o444)
    module.chmod(0o555)


def test_caches_over_the_bound_are_emptied_and_their_directories_kept(tmp_path: Path) -> None:
    build, modules = tmp_path / "go-build", tmp_path / "go-mod"
    (build / "00").mkdir(parents=True)
    (build / "00" / "entry-a").write_bytes(b"x" * 4000)
    _module_cache(modules)
    env = {"GOCACHE": str(build), "GOMODCACHE": str(modules)}
    assert bound_go_caches(env, max_bytes=10_000) == []  # under: nothing touched
    assert dir_bytes(build) == 4000
    assert bound_go_caches(env, max_bytes=3000) == ["GOCACHE"]  # the modules (2,100 bytes) then fit
    assert build.is_dir() and list(build.iterdir()) == [] and dir_bytes(modules) == 2100
    assert bound_go_caches(env, max_bytes=1000) == ["GOMODCACHE"]  # read-only files and all
    assert modules.is_dir() and list(modules.iterdir()) == []
    assert bound_go_caches({"GOCACHE": str(tmp_path / "absent")}, max_bytes=0) == []


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the go toolchain")
def test_a_new_checkout_on_a_kept_cache_compiles_nothing_and_a_cleared_one_compiles_again(
    tmp_path: Path,
) -> None:
    """What the cache volume buys a new pod, with the real toolchain: the program checked out again at
    the same path (a new pod's fresh checkout) on the same GOCACHE compiles none of its packages.
    Two packages without imports stand in for the Pulumi SDK (the standard library would take minutes)."""
    env = {
        **os.environ,
        "GOCACHE": str(tmp_path / "cache" / "go-build"),
        "GOMODCACHE": str(tmp_path / "cache" / "go-mod"),
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }
    src = tmp_path / "workspace"

    def compiled_in_a_new_pod() -> int:
        shutil.rmtree(src, ignore_errors=True)
        (src / "sdk").mkdir(parents=True)
        (src / "go.mod").write_text("module example.com/prog\n\ngo 1.21\n")
        (src / "sdk" / "sdk.go").write_text("package sdk\n\nfunc Answer() int { return 42 }\n")
        (src / "prog.go").write_text(
            'package prog\n\nimport "example.com/prog/sdk"\n\nvar X = sdk.Answer()\n'
        )
        done = subprocess.run(
            ["go", "build", "-x", "./..."], cwd=src, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return sum(1 for line in done.stderr.splitlines() if "/compile " in line)

    assert compiled_in_a_new_pod() == 2
    assert compiled_in_a_new_pod() == 0
    cache = {k: env[k] for k in ("GOCACHE", "GOMODCACHE")}
    assert bound_go_caches(cache, max_bytes=1) == ["GOCACHE"]
    assert stat.S_ISDIR(os.stat(env["GOCACHE"]).st_mode)
    assert compiled_in_a_new_pod() == 2

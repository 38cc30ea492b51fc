"""The hash-pinned locks the images install from (hack/lock.sh writes them, hack/locks.py reads them).

requirements.lock pins pyproject.toml's runtime dependencies and all they pull in; requirements-build.lock
pins what the agent's build runs (PyInstaller, the build backend). Checked offline, against what is
written in the repository and installed in this venv: each lock satisfies pyproject.toml's specifiers,
is closed under dependencies (the images install it with --no-deps, so a missing package would only
show in a pod), hash-checks every entry, and this venv holds exactly the locked versions (the offline
agent image is bundled from it); every pip install of the two images' Dockerfiles is hash-checked from a
lock or adds the project alone.

Not here: `hack/lock.sh --check`, which re-resolves against the package index. The suite talks to
nothing but loopback, and re-resolving is for people who change the dependencies: the lock records its
resolution cutoff (`exclude-newer`), so the check is stable against new uploads, but it still needs the
index. Run it by hand after editing pyproject.toml's dependencies.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import tomllib
from collections import deque
from collections.abc import Callable
from datetime import datetime
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent


def _load_locks() -> ModuleType:
    """hack/locks.py, loaded by its location: it stays a standalone script (standard library only, no
    pko), since the agent image's build runs it on its own (agent/Dockerfile)."""
    spec = importlib.util.spec_from_file_location("locks", REPO / "hack" / "locks.py")
    assert spec is not None and spec.loader is not None
    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


locks = _load_locks()
RUNTIME, BUILD = locks.LOCKS
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def runtime_requirements() -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def build_requirements() -> list[Requirement]:
    """What hack/lock.sh feeds the build lock: the build backend and the dev extras' PyInstaller."""
    dev = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]]
    pyinstaller = [r for r in dev if canonicalize_name(r.name) == "pyinstaller"]
    assert pyinstaller, "the dev extras name pyinstaller"
    return [*(Requirement(r) for r in PYPROJECT["build-system"]["requires"]), *pyinstaller]


def _satisfies(pins: dict[str, locks.Pin], req: Requirement, lock: Path) -> locks.Pin:
    pin = pins.get(canonicalize_name(req.name))
    assert pin is not None, f"{lock.name} lacks {req}"
    assert req.specifier.contains(pin.version, prereleases=True), (
        f"{lock.name}: {pin.name}=={pin.version}, not {req}"
    )
    return pin


@pytest.mark.parametrize(("lock", "wanted"), [(RUNTIME, runtime_requirements), (BUILD, build_requirements)])
def test_lock_pins_what_pyproject_asks_for_with_hashes(
    lock: Path, wanted: Callable[[], list[Requirement]]
) -> None:
    pins = locks.read_lock(lock)
    for req in wanted():
        _satisfies(pins, req, lock)
    for pin in pins.values():
        assert pin.hashes, f"{lock.name}: {pin.name} has no hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), pin
    cutoffs = re.findall(r"^# exclude-newer: (\S+)$", lock.read_text(), re.M)
    assert len(cutoffs) == 1, f"{lock.name} records its resolution cutoff once"
    datetime.strptime(cutoffs[0], "%Y-%m-%dT%H:%M:%SZ")


def test_the_locks_agree_where_they_overlap() -> None:
    """The agent's venv gets both: a package in both must be the same file set, and the cutoffs one."""
    runtime, build = locks.read_lock(RUNTIME), locks.read_lock(BUILD)
    for name in runtime.keys() & build.keys():
        assert runtime[name] == build[name], name
    header = [
        [line for line in p.read_text().splitlines() if line.startswith("# exclude-newer:")]
        for p in locks.LOCKS
    ]
    assert header[0] == header[1]


@pytest.mark.parametrize(("lock", "wanted"), [(RUNTIME, runtime_requirements), (BUILD, build_requirements)])
def test_lock_is_closed_under_dependencies(lock: Path, wanted: Callable[[], list[Requirement]]) -> None:
    """Every requirement of every locked package (as installed here, at the locked version) is locked."""
    pins = locks.read_lock(lock)
    environment: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    todo: deque[Requirement] = deque(wanted())
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.popleft()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        pin = _satisfies(pins, req, lock)
        dist = metadata.distribution(pin.name)
        assert dist.version == pin.version, f"{pin.name} {dist.version} installed: run hack/venv.sh"
        for raw in dist.requires or []:
            dep = Requirement(raw)
            extras = {"", *req.extras}
            if dep.marker is None or any(dep.marker.evaluate({**environment, "extra": e}) for e in extras):
                todo.append(dep)
    reached = {name for name, _ in seen}
    assert reached == set(pins), f"{lock.name} pins what nothing needs: {set(pins) - reached}"


def test_this_venv_holds_exactly_the_locked_versions() -> None:
    """hack/venv.sh installs the locks first, then the dev extras constrained to them."""
    assert locks.installed_mismatches() == []


def test_the_reader_refuses_what_pip_would_not_hash_check(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("a==1 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via b\nb>=2\n")
    with pytest.raises(ValueError, match="not an exact pin"):
        locks.read_lock(lock)
    lock.write_text("a==1 \\\n    --index-url x\n")
    with pytest.raises(ValueError, match="not --hash"):
        locks.read_lock(lock)
    lock.write_text("A_b==1 \\\n    --hash=sha256:" + "1" * 64 + "\n")
    assert locks.read_lock(lock) == {"a-b": locks.Pin("a-b", "1", ("sha256:" + "1" * 64,))}


def pip_installs(dockerfile: Path) -> list[list[str]]:
    """The arguments after `pip install` of each pip install a Dockerfile's RUN steps run."""
    text = dockerfile.read_text().replace("\\\n", " ")
    runs = [line.strip()[4:] for line in text.splitlines() if line.strip().startswith("RUN ")]
    out = []
    for run in runs:
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if re.fullmatch(r"(\S*/)?pip3?", words[i]) and words[i + 1] == "install":
                    out.append(words[i + 2 :])
    return out


@pytest.mark.parametrize(
    ("dockerfile", "wanted"),
    [
        ("Dockerfile", ["requirements.lock"]),
        ("agent/Dockerfile", ["requirements.lock", "requirements-build.lock"]),
    ],
)
def test_images_install_only_from_the_locks(dockerfile: str, wanted: list[str]) -> None:
    installs = pip_installs(REPO / dockerfile)
    assert installs, f"{dockerfile} runs no pip install"
    from_locks = []
    for args in installs:
        assert "--no-deps" in args, f"{dockerfile}: pip install {shlex.join(args)} resolves dependencies"
        if "-r" in args:
            assert "--require-hashes" in args, (
                f"{dockerfile}: pip install {shlex.join(args)} is not hash-checked"
            )
            files = [args[i + 1] for i, a in enumerate(args) if a == "-r"]
            assert len(files) == len([a for a in args if not a.startswith("-")]), args
            from_locks += files
        else:
            targets = [a for a in args if not a.startswith("-")]
            assert targets == ["."], f"{dockerfile}: pip install {shlex.join(args)} installs more than pko"
    assert from_locks == wanted
    # The locks are in the build context (agent/Dockerfile's own allow-list; the operator's is checked
    # by test_dockerfile.py's matcher).
    ignore = (REPO / f"{dockerfile}.dockerignore").read_text().split() if "/" in dockerfile else None
    if ignore is not None:
        assert {f"!{lock}" for lock in wanted} <= set(ignore)


WORKSPACE = REPO / "requirements-workspace.lock"


def test_the_workspace_lock_pins_the_sdk_of_versions_env_as_the_runtime_lock_does() -> None:
    from pko.devtools.versions import versions

    pins, runtime = locks.read_lock(WORKSPACE), locks.read_lock(RUNTIME)
    assert pins["pulumi"].version == versions()["PULUMI_SDK_VERSION"]
    assert {"pip", "setuptools", "wheel"} <= set(pins), "the wheelhouse's packaging tools"
    assert all(pin.hashes for pin in pins.values())
    for name in pins.keys() & runtime.keys():
        assert pins[name] == runtime[name], f"{name}: the workspace's and the agent's SDK stacks differ"


def test_the_workspace_image_installs_and_downloads_only_its_locks() -> None:
    """The programs' SDK environment from requirements-workspace.lock, the policy packs' environment from
    requirements-policy.lock: every pip download and install hash-checked, no dependency resolved."""
    dockerfile = REPO / "images" / "workspace" / "Dockerfile"
    text = dockerfile.read_text()
    ignore = (REPO / "images/workspace/Dockerfile.dockerignore").read_text()
    assert "COPY requirements-workspace.lock /opt/pulumi/requirements.lock" in text
    assert "COPY requirements-policy.lock /opt/pulumi/policy.lock" in text
    assert "!requirements-workspace.lock" in ignore and "!requirements-policy.lock" in ignore
    flat = text.replace("\\\n", " ")
    steps = [
        s for s in re.split(r"&&|;|\n", flat) if re.search(r"\bpip (?:--python \S+ )?(install|download)\b", s)
    ]
    assert len(steps) == 4, steps
    locks_read = []
    for step in steps:
        words = shlex.split(step)
        assert {"--no-deps", "--require-hashes"} <= set(words), step
        locks_read.append(words[words.index("-r") + 1])
    assert locks_read == ["/opt/pulumi/requirements.lock"] * 2 + ["/opt/pulumi/policy.lock"] * 2


POLICY = REPO / "requirements-policy.lock"


def test_the_policy_lock_pins_pulumi_policy_and_the_sdk_of_versions_env() -> None:
    """What the image's /opt/pulumi/policy holds: pulumi-policy at hack/lock.sh's pin with the workspace's
    SDK, every entry hash-checked, resolved at the other locks' cutoff (its protobuf is its own: 5.29)."""
    from pko.devtools.versions import versions

    pins = locks.read_lock(POLICY)
    assert pins["pulumi"].version == versions()["PULUMI_SDK_VERSION"]
    pinned = re.search(r"^POLICY_SDK_VERSION=(\S+)", (REPO / "hack/lock.sh").read_text(), re.M)
    assert pinned and pins["pulumi-policy"].version == pinned.group(1)
    assert pins["pulumi"] == locks.read_lock(WORKSPACE)["pulumi"]
    assert all(pin.hashes for pin in pins.values())
    cutoff = [line for line in POLICY.read_text().splitlines() if line.startswith("# exclude-newer:")]
    assert cutoff == [
        line for line in RUNTIME.read_text().splitlines() if line.startswith("# exclude-newer:")
    ]

"""The operator image (Dockerfile + .dockerignore) ships the package and nothing else.

No container engine or base image is reachable here, so the image is checked statically: the
build context that .dockerignore lets through (Docker's matching rules, re-implemented below) must
hold every file the Dockerfile copies and the wheel build needs, and none of the tests, e2e or hack
tooling (in particular the Pulumi CLI stand-in under test/fakepulumi). The image runs `pko` as
uid 65532.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Never part of a build context, whatever .dockerignore says (Docker sends the working tree).
# Never sources, and never walked: a running local node keeps gigabytes in .node, changing under a walk.
NOT_SOURCE = {
    ".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".cluster", ".node", "build", "dist",
}  # fmt: skip


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's .dockerignore pattern (Go filepath.Match plus `**`) as a regex over a relative path."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"  # zero or more directories
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


@cache
def _rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        rules.append((negate, _pattern_regex(pattern)))
    return tuple(rules)


def in_context(rel: str) -> bool:
    """Whether Docker sends `rel` (a path relative to the repo) to the build.

    As in Docker: a path is excluded when a pattern matches it or one of its parent directories;
    the last matching pattern wins and `!` re-includes.
    """
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex in _rules():
        if any(regex.match(p) for p in prefixes):
            excluded = not negate
    return not excluded


def context_files() -> list[str]:
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in NOT_SOURCE]
        for name in names:
            rel = (Path(root) / name).relative_to(REPO)
            if in_context(rel.as_posix()):
                files.append(rel.as_posix())
    return sorted(files)


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_matcher_follows_docker_semantics() -> None:
    assert not in_context("test/test_kustomize.py")
    assert not in_context("test/fakepulumi/cli.py")
    assert in_context("pko/__main__.py")
    assert not in_context("pko/__pycache__/x.cpython-311.pyc")


def test_context_holds_the_package_and_no_tests_or_tooling() -> None:
    files = context_files()
    assert "pyproject.toml" in files and "README.md" in files
    for root in ("pko", "api", "agent"):
        sources = {
            p.relative_to(REPO).as_posix()
            for p in (REPO / root).rglob("*.py")
            if "__pycache__" not in p.parts and not p.is_relative_to(REPO / "pko" / "devtools")
        }
        assert sources and sources <= set(files), f"{root}/ sources missing from the build context"
    leaked = [
        f
        for f in files
        if f.split("/")[0] in ("test", "e2e", "hack", "config")
        or "fakepulumi" in f
        or f.startswith("pko/devtools/")
    ]
    assert not leaked, f"must not be in the operator image's build context: {leaked[:10]}"


def test_every_copied_path_is_in_the_context() -> None:
    copies = [shlex.split(rest) for word, rest in dockerfile_instructions() if word == "COPY"]
    local = [args for args in copies if not any(a.startswith("--from") for a in args)]
    assert local, "the build stage copies the sources"
    for args in local:
        *sources, _dest = [a for a in args if not a.startswith("--")]
        for src in sources:
            path = src.rstrip("/")
            assert (REPO / path).exists(), f"COPY {src}: no such path"
            assert in_context(path), f"COPY {src}: excluded by .dockerignore"
            assert path.split("/")[0] not in ("test", "e2e", "hack")


def test_image_runs_pko_as_non_root() -> None:
    instructions = dockerfile_instructions()
    final_stage = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM") :]
    users = [rest for word, rest in final_stage if word == "USER"]
    assert users == ["65532:65532"]
    entrypoints = [rest for word, rest in final_stage if word == "ENTRYPOINT"]
    assert entrypoints == ['["pko"]']
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "pko" in scripts, "the image's entry point is the `pko` console script"
    # The manager's restricted pod securityContext runs as the same uid (config/manager).
    assert "runAsUser: 65532" in (REPO / "config" / "manager" / "manager.yaml").read_text()


def test_stages_build_on_python_slim() -> None:
    instructions = dockerfile_instructions()
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    image = args.get("PYTHON_IMAGE", "")
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", image), image
    froms = [rest.split()[0] for word, rest in instructions if word == "FROM"]
    assert len(froms) >= 2 and all(f == "${PYTHON_IMAGE}" for f in froms), froms


def test_dependencies_install_from_the_lock_before_the_project() -> None:
    """Nothing is resolved at build time: the dependencies come hash-checked from requirements.lock
    (hack/lock.sh; test_lock.py checks it and every pip install of the image), then the project adds none."""
    assert "requirements.lock" in context_files()
    installs = [
        " ".join(rest.split())
        for word, rest in dockerfile_instructions()
        if word == "RUN" and "pip install" in rest
    ]
    assert len(installs) == 2, installs
    assert "pip install --require-hashes --no-deps -r requirements.lock" in installs[0]
    assert "pip install --no-deps ." in installs[1]

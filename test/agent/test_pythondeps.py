"""agent/pythondeps.py: which Python projects the agent installs itself (those on pip), where their
packages go (a virtualenv the project names, else the Python on PATH), and the install with the real
pip and venv from a test index on loopback: a fresh venv stands in for the workspace image's Python,
the requirement lands where the program's Python imports it, and a missing one fails in pip's words,
which the Stack's condition then quotes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pko.agent import failures, pythondeps
from pulumi import automation as auto

from pko.devtools.pypiindex import Index, make_wheel, serve_index

PROJECT = Path("/share/workspace")


@pytest.mark.parametrize(
    ("runtime", "setup"),
    [
        ("python", pythondeps.PythonSetup(None)),
        (auto.ProjectRuntimeInfo("python"), pythondeps.PythonSetup(None)),
        (auto.ProjectRuntimeInfo("python", {"toolchain": "pip"}), pythondeps.PythonSetup(None)),
        (auto.ProjectRuntimeInfo("python", {"virtualenv": "venv"}), pythondeps.PythonSetup(PROJECT / "venv")),
        (
            auto.ProjectRuntimeInfo("python", {"virtualenv": "/opt/env"}),
            pythondeps.PythonSetup(Path("/opt/env")),
        ),
        (auto.ProjectRuntimeInfo("python", {"toolchain": "poetry"}), None),
        ("nodejs", None),
        (auto.ProjectRuntimeInfo("yaml"), None),
    ],
)
def test_python_projects_on_pip_are_the_agents_to_install(runtime: Any, setup: Any) -> None:
    assert pythondeps.python_setup(auto.ProjectSettings(name="p", runtime=runtime), PROJECT) == setup


def test_a_virtualenv_is_activated_for_the_pulumi_commands() -> None:
    assert pythondeps.activation(pythondeps.PythonSetup(None), "/usr/bin") == {}
    assert pythondeps.activation(pythondeps.PythonSetup(PROJECT / "venv"), "/opt/bin:/usr/bin") == {
        "VIRTUAL_ENV": "/share/workspace/venv",
        "PATH": "/share/workspace/venv/bin:/opt/bin:/usr/bin",
    }


def test_the_python_is_the_one_the_language_host_runs(tmp_path: Path) -> None:
    assert pythondeps.python_command({"PULUMI_PYTHON_CMD": "/opt/py/bin/python"}) == "/opt/py/bin/python"
    (tmp_path / "python3").write_text("#!/bin/sh\n")
    (tmp_path / "python3").chmod(0o755)
    assert pythondeps.python_command({"PATH": str(tmp_path)}) == str(tmp_path / "python3")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fresh venv first on PATH as the image's Python, and none of the host's pip settings."""
    for key in [k for k in os.environ if k.upper().startswith("PIP_")]:
        monkeypatch.delenv(key)
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(image)], check=True, capture_output=True, timeout=120)
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(image / "bin"), os.environ.get("PATH", os.defpath)]),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",
    }


@pytest.fixture
def index(tmp_path: Path) -> Index:
    served = Index()
    served.add_wheel(
        make_wheel(tmp_path / "wheels", "pko-test-greeting", "1.0.0", {"pko_test_greeting.py": "HI = 'hi'\n"})
    )
    return served


def _program(tmp_path: Path, requirements: str | None) -> Path:
    program = tmp_path / "program"
    program.mkdir()
    if requirements is not None:
        (program / "requirements.txt").write_text(requirements)
    return program


def _imports(python: Path | str) -> str:
    code = "import pko_test_greeting, sys; print(pko_test_greeting.HI, sys.prefix)"
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_program_without_requirements_or_virtualenv_installs_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    program = _program(tmp_path, None)
    assert (
        pythondeps.install(pythondeps.PythonSetup(None), program, {"PULUMI_PYTHON_CMD": "/none"}, said.append)
        is False
    )
    assert said == []


def test_without_a_virtualenv_requirements_land_in_the_python_on_path(
    tmp_path: Path, env: dict[str, str], index: Index
) -> None:
    program = _program(tmp_path, "pko-test-greeting==1.0.0\n")
    said: list[str] = []
    with serve_index(index) as url:
        installed = pythondeps.install(
            pythondeps.PythonSetup(None), program, {**env, "PIP_INDEX_URL": url}, said.append
        )
    assert installed is True
    assert any("Successfully installed pko-test-greeting-1.0.0" in line for line in said), said
    assert _imports(tmp_path / "image" / "bin" / "python") == f"hi {tmp_path / 'image'}"


def test_a_virtualenv_is_made_once_and_holds_the_requirements(
    tmp_path: Path, env: dict[str, str], index: Index
) -> None:
    program = _program(tmp_path, "pko-test-greeting==1.0.0\n")
    setup = pythondeps.PythonSetup(program / "venv")
    active = {**env, **pythondeps.activation(setup, env["PATH"])}
    with serve_index(index) as url:
        assert pythondeps.install(setup, program, {**active, "PIP_INDEX_URL": url}, lambda line: None) is True
        marker = program / "venv" / "made-before"
        marker.write_text("")
        assert pythondeps.install(setup, program, {**active, "PIP_INDEX_URL": url}, lambda line: None) is True
    assert marker.exists()  # the second install reused the virtualenv
    # What the language host runs: the python3 first on the activated PATH.
    assert pythondeps.python_command(active) == str(program / "venv" / "bin" / "python3")
    assert _imports(pythondeps.python_command(active)) == f"hi {program / 'venv'}"
    with pytest.raises(subprocess.CalledProcessError):
        _imports(tmp_path / "image" / "bin" / "python")


def test_a_missing_requirement_fails_in_pips_words(tmp_path: Path, env: dict[str, str]) -> None:
    program = _program(tmp_path, "pko-test-absent==1.0\n")
    with serve_index(Index()) as url, pytest.raises(pythondeps.RequirementsFailed) as raised:
        pythondeps.install(
            pythondeps.PythonSetup(None), program, {**env, "PIP_INDEX_URL": url}, lambda line: None
        )
    message = failures.install_message(raised.value.text, ["python"])
    assert message.startswith(
        "`python -m pip install --requirement requirements.txt` exited with status 1: "
    ), message
    assert "No matching distribution found for pko-test-absent==1.0" in message, message


def test_a_python_that_cannot_start_is_named(tmp_path: Path) -> None:
    program = _program(tmp_path, "anything\n")
    with pytest.raises(pythondeps.RequirementsFailed) as raised:
        pythondeps.install(
            pythondeps.PythonSetup(None), program, {"PULUMI_PYTHON_CMD": str(tmp_path / "none")}, print
        )
    assert str(tmp_path / "none") in failures.install_message(raised.value.text, ["python"])

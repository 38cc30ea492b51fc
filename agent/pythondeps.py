"""A Python program's ``requirements.txt``, installed by the agent where the program runs.

The Python language host we can build (v3.78, the newest the Go module proxy serves) predates the way
the CLI we run hands it ``Pulumi.yaml``'s runtime options, so it never sees ``virtualenv``: at ``pulumi
install`` it makes a virtualenv in the program's own folder, upgrades pip, setuptools and wheel there
from the package index, installs the requirements into it, and then runs the program with the
``python3`` on PATH, which never sees them. So for a Python project on pip (the only toolchain that host
knows) the agent does what newer hosts do, with pip and the pod's environment (``PIP_INDEX_URL``,
``PIP_FIND_LINKS``, ...):

* no ``virtualenv``: the requirements go into the Python on PATH (the image's, the pod's own: a
  workspace pod serves one Stack);
* ``virtualenv: DIR`` (relative to the project): DIR is made when it is not a virtualenv yet, the
  requirements go into it, and every Pulumi command runs with it activated (``VIRTUAL_ENV``, its
  ``bin`` first on PATH), so the host and the dynamic-provider shim run its ``python3``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pulumi import automation as auto

REQUIREMENTS = "requirements.txt"


class RequirementsFailed(Exception):
    """pip (or venv) failed; ``text`` holds its output and a last ``error:`` line."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class PythonSetup:
    """Where a pip project's packages go: ``virtualenv``, or the Python on PATH when None."""

    virtualenv: Path | None


def python_setup(settings: auto.ProjectSettings, project_dir: Path) -> PythonSetup | None:
    """The agent's plan for a Python project on pip; None for any other project (the language host's
    own ``pulumi install`` serves it)."""
    runtime = settings.runtime
    if isinstance(runtime, str):
        return PythonSetup(None) if runtime == "python" else None
    if runtime is None or runtime.name != "python":
        return None
    options = runtime.options or {}
    if options.get("toolchain") not in (None, "", "pip"):
        return None
    virtualenv = options.get("virtualenv")
    return PythonSetup(project_dir / str(virtualenv) if virtualenv else None)


def activation(setup: PythonSetup, path: str) -> dict[str, str]:
    """The variables that activate the setup's virtualenv for the Pulumi commands (none without one)."""
    if setup.virtualenv is None:
        return {}
    return {
        "VIRTUAL_ENV": str(setup.virtualenv),
        "PATH": os.pathsep.join([str(setup.virtualenv / "bin"), path]),
    }


def python_command(env: Mapping[str, str]) -> str:
    """The Python the language host runs programs with: ``PULUMI_PYTHON_CMD``, else ``python3`` (then
    ``python``) on PATH, as the host looks it up."""
    chosen = env.get("PULUMI_PYTHON_CMD")
    if chosen:
        return chosen
    path = env.get("PATH")
    return shutil.which("python3", path=path) or shutil.which("python", path=path) or "python3"


def _run(command: list[str], cwd: Path, env: Mapping[str, str], on_output: Callable[[str], None]) -> None:
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise RequirementsFailed(f"error: running {command[0]}: {exc.strerror or exc}") from None
    for line in done.stdout.splitlines():
        on_output(line)
    if done.returncode != 0:
        said = " ".join(["python", *command[1:]])
        raise RequirementsFailed(f"{done.stdout}\nerror: `{said}` exited with status {done.returncode}")


def install(
    setup: PythonSetup, project_dir: Path, env: Mapping[str, str], on_output: Callable[[str], None]
) -> bool:
    """Make the virtualenv if there is one to make, then ``pip install --requirement requirements.txt``
    into the Python the program runs with; False when there is nothing to install (no requirements
    file, no virtualenv to make). ``env``: the whole environment of the Pulumi commands."""
    python = python_command(env)
    made = False
    if setup.virtualenv is not None:
        if not (setup.virtualenv / "pyvenv.cfg").is_file():
            _run([python, "-m", "venv", str(setup.virtualenv)], project_dir, env, on_output)
            made = True
        python = str(setup.virtualenv / "bin" / "python")
    if not (project_dir / REQUIREMENTS).is_file():
        return made
    _run([python, "-m", "pip", "install", "--requirement", REQUIREMENTS], project_dir, env, on_output)
    return True

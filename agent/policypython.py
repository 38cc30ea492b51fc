"""A Python policy pack, launched by the agent: the executable ``--policy-pack`` names, and the pack's
virtualenv made from its ``requirements.txt`` when the pack names one that is not there yet.

Why a launcher: the Python language host we can build (v3.78, the newest the Go module proxy serves)
cannot run a pack for the v3.274 engine (its ``RunPlugin`` runs the request's ``program`` field, which
that engine no longer sets, and never the policy runner). The engine also runs a binary analyzer: given
an executable instead of a directory, it starts it with its own address and reads the port it prints
(pkg/resource/plugin/analyzer_plugin.go). So the agent writes, per operation, a script running
``python -u -m pulumi.policy ADDRESS PACK_DIR`` (the pulumi SDK's policy runner, as the retired
``pulumi-analyzer-policy-python`` plugin did), with beside it a copy of the pack's PulumiPolicy.yaml,
where the engine reads the pack's version and description.

Which Python: the virtualenv ``runtime.options.virtualenv`` names (relative to the pack, or absolute:
one the image ships), made by the agent as it makes a program's (:mod:`pko.agent.pythondeps`: ``python
-m venv``, then ``pip install --requirement requirements.txt`` with the pod's pip settings) when it is
missing and the pack has a ``requirements.txt``; without ``virtualenv``, the image's policy environment
(``PKO_POLICY_PYTHON``: the workspace image sets it to /opt/pulumi/policy/bin/python, a virtualenv of
``pulumi-policy`` and the ``pulumi`` SDK beside the programs' one, whose protobuf ``pulumi-policy`` cannot
use), so a pack from git brings none; without that either, the Python the language host runs programs
with (``PULUMI_PYTHON_CMD``, else ``python3`` on PATH).
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import yaml
from pko.agent.pythondeps import REQUIREMENTS, PythonSetup, RequirementsFailed, install, python_command
from pko.api.generated.pko.agent import v1 as pb

log = structlog.get_logger("pko.agent.policypython")

POLICY_PROJECT = "PulumiPolicy.yaml"
LAUNCHER = "pack"  # the launcher's file name in its directory
POLICY_PYTHON = "PKO_POLICY_PYTHON"  # the image's python with pulumi-policy, for packs naming no virtualenv


def python_options(directory: Path) -> dict[str, Any] | None:
    """The runtime options of the Python pack in ``directory`` ({} without any), or None when it is
    not a readable Python pack (the engine then reports the pack in its own words)."""
    try:
        project = yaml.safe_load((directory / POLICY_PROJECT).read_text())
    except (OSError, yaml.YAMLError):
        return None
    runtime = project.get("runtime") if isinstance(project, dict) else None
    if runtime == "python":
        return {}
    if isinstance(runtime, dict) and runtime.get("name") == "python":
        options = runtime.get("options")
        return options if isinstance(options, dict) else {}
    return None


def _is_virtualenv(venv: Path) -> bool:
    return (venv / "pyvenv.cfg").is_file() and (venv / "bin" / "python").exists()


def _pip_words(text: str) -> str:
    """pip's own error lines (``ERROR: ...``), else the last line it wrote."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return "; ".join(dict.fromkeys(errors)) or (lines[-1] if lines else "pip failed")


def virtualenv_python(pack: pb.PolicyPack, directory: Path, virtualenv: str, env: Mapping[str, str]) -> str:
    """The python of the pack's virtualenv, made from its requirements first when it is not there;
    ValueError naming the pack (and pip's words) when there is none to be had."""
    venv = directory / virtualenv
    if not _is_virtualenv(venv) and (directory / REQUIREMENTS).is_file():
        log.info("installing a policy pack's requirements", pack=pack.name, virtualenv=str(venv))
        try:
            install(
                PythonSetup(venv),
                directory,
                env,
                lambda line: log.info("pip", pack=pack.name, line=line),
            )
        except RequirementsFailed as exc:
            raise ValueError(
                f"policy pack {pack.name!r}: installing its {REQUIREMENTS} failed: {_pip_words(exc.text)}"
            ) from None
    if not _is_virtualenv(venv):
        raise ValueError(
            f"policy pack {pack.name!r}: its virtualenv {venv} (runtime.options.virtualenv in "
            f"{POLICY_PROJECT}) is not a virtualenv, and the pack has no {REQUIREMENTS} to make it from"
        )
    return str(venv / "bin" / "python")


def default_python(env: Mapping[str, str]) -> str:
    """The python a pack that names no virtualenv runs with: the image's policy environment
    (``PKO_POLICY_PYTHON``), else the one the language host runs programs with."""
    return env.get(POLICY_PYTHON) or python_command(env)


def launcher(pack: pb.PolicyPack, directory: Path, launch_dir: Path, env: Mapping[str, str]) -> Path | None:
    """Write the executable the engine runs for the Python pack in ``directory`` into ``launch_dir``
    (None for a pack of another runtime); ``env``: the Pulumi commands' environment."""
    options = python_options(directory)
    if options is None:
        return None
    virtualenv = options.get("virtualenv")
    command = virtualenv_python(pack, directory, str(virtualenv), env) if virtualenv else default_python(env)
    launch_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(directory / POLICY_PROJECT, launch_dir / POLICY_PROJECT)
    script = launch_dir / LAUNCHER
    run = " ".join(shlex.quote(a) for a in (command, "-u", "-m", "pulumi.policy"))
    script.write_text(f'#!/bin/sh\nexec {run} "$@" {shlex.quote(str(directory))}\n')
    script.chmod(0o755)
    return script

"""The local workspace: project file, stack settings files, current stack, backend URL.

Modelled on sdk/go/common/workspace and pkg/workspace: ``Pulumi.yaml`` (or .yml/.json) is found by
walking up from the working directory; ``Pulumi.<stack>.yaml`` sits next to it; the selected stack is
remembered under ``$PULUMI_HOME/workspaces``; the backend URL comes from ``PULUMI_BACKEND_URL``, the
project's ``backend.url``, or ``$PULUMI_HOME/credentials.json`` (``pulumi login``), in that order.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import CliError

PROJECT_FILES = ("Pulumi.yaml", "Pulumi.yml", "Pulumi.json")


@dataclass
class Project:
    """A parsed project file; ``body`` keeps everything (the YAML program lives there too)."""

    name: str
    runtime: str
    path: Path
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.path.parent


def pulumi_home() -> Path:
    home = os.environ.get("PULUMI_HOME")
    return Path(home) if home else Path.home() / ".pulumi"


def _load_file(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def find_project(cwd: Path) -> Project | None:
    for directory in (cwd, *cwd.parents):
        for name in PROJECT_FILES:
            candidate = directory / name
            if candidate.is_file():
                return load_project(candidate)
    return None


def load_project(path: Path) -> Project:
    body = _load_file(path)
    if not isinstance(body, dict):
        raise CliError(f"could not read project file {path}: expected a mapping")
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise CliError(f"could not read project file {path}: project is missing a 'name' attribute")
    runtime = body.get("runtime")
    if isinstance(runtime, dict):
        runtime = runtime.get("name")
    if not isinstance(runtime, str) or not runtime:
        raise CliError(f"could not read project file {path}: project is missing a 'runtime' attribute")
    return Project(name=name, runtime=runtime, path=path, body=body)


def require_project(cwd: Path) -> Project:
    project = find_project(cwd)
    if project is None:
        raise CliError(
            f"no Pulumi.yaml project file found (searching upwards from {cwd}). If you have not created a "
            "project yet, use `pulumi new` to do so"
        )
    return project


def stack_settings_path(project: Project, stack: str) -> Path:
    for ext in (".yaml", ".yml", ".json"):
        candidate = project.root / f"Pulumi.{stack}{ext}"
        if candidate.exists():
            return candidate
    return project.root / f"Pulumi.{stack}.yaml"


def load_stack_settings(project: Project, stack: str) -> dict[str, Any]:
    path = stack_settings_path(project, stack)
    if not path.exists():
        return {}
    body = _load_file(path)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise CliError(f"could not read stack settings {path}: expected a mapping")
    return body


def save_stack_settings(project: Project, stack: str, settings: dict[str, Any]) -> None:
    path = stack_settings_path(project, stack)
    clean = {k: v for k, v in settings.items() if v not in (None, {}, [])}
    if path.suffix == ".json":
        path.write_text(json.dumps(clean, indent=4) + "\n", encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(clean, sort_keys=True, default_flow_style=False), encoding="utf-8")


def _workspace_file(project: Project) -> Path:
    digest = hashlib.sha1(str(project.path).encode("utf-8")).hexdigest()
    return pulumi_home() / "workspaces" / f"{project.name}-{digest}-workspace.json"


def current_stack(project: Project) -> str | None:
    path = _workspace_file(project)
    if not path.exists():
        return None
    stack = json.loads(path.read_text(encoding="utf-8")).get("stack")
    return stack if isinstance(stack, str) and stack else None


def set_current_stack(project: Project, fq_name: str | None) -> None:
    path = _workspace_file(project)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stack": fq_name or ""}, indent=4) + "\n", encoding="utf-8")


def _credentials_path() -> Path:
    return pulumi_home() / "credentials.json"


def read_credentials() -> dict[str, Any]:
    path = _credentials_path()
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def write_credentials(data: dict[str, Any]) -> None:
    path = _credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def backend_url(project: Project | None) -> str:
    """The backend URL in the real CLI's precedence order; only ``file://`` backends are modelled."""
    url = os.environ.get("PULUMI_BACKEND_URL")
    if not url and project is not None:
        backend = project.body.get("backend")
        if isinstance(backend, dict) and isinstance(backend.get("url"), str):
            url = backend["url"]
    if not url:
        current = read_credentials().get("current")
        url = current if isinstance(current, str) else None
    if not url:
        raise CliError("PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions")
    if not url.startswith("file://"):
        raise CliError(f"the fake pulumi CLI only models file:// backends, not {url!r}")
    return url


def backend_root(url: str, cwd: Path) -> Path:
    """The directory a ``file://`` URL names (``~`` and relative paths as the real CLI resolves them)."""
    raw = url[len("file://") :].split("?", 1)[0]
    if raw in ("", "~") or raw.startswith("~/"):
        return Path.home() / raw[2:] if raw.startswith("~/") else Path.home()
    path = Path(raw)
    return path if path.is_absolute() else (cwd / path).resolve()

"""The file (DIY) state backend, laid out like pkg/backend/diy with project-scoped stacks.

Under the backend root::

    .pulumi/meta.yaml                                       version: 1
    .pulumi/stacks/<project>/<stack>.json                    {"version": 3, "checkpoint": {...}}
    .pulumi/history/<project>/<stack>/<stack>-<ns>.history.json   (and .checkpoint.json)
    .pulumi/backups/<project>/<stack>/<stack>.<ns>.json
    .pulumi/locks/organization/<project>/<stack>/<lock-id>.json   {"pid", "username", "hostname", "timestamp"}

Locking follows diy/lock.go: a writer first checks for other lock files, writes its own, checks
again; ``pulumi cancel`` deletes every lock file of the stack. A lock left by a dead process stays
until cancelled, exactly as in the real CLI, and the error lists each owner.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from .errors import CliError, StackAlreadyExists, StackNotFound


def current_user() -> str:
    """The user name for locks and ``whoami``; containers often run as a uid with no passwd entry
    (the restricted profile's 1000), where ``getpass.getuser()`` raises: the real CLI copes, so must we."""
    for var in ("USER", "LOGNAME"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return f"uid-{os.getuid()}"


BOOKKEEPING = ".pulumi"
SERVICE_CONFLICT = (
    "[409] Conflict: Another update is currently in progress.\nTo learn more about possible reasons and "
    "resolution, visit https://www.pulumi.com/docs/support/troubleshooting/common-issues/update-conflicts/"
)


@dataclass(frozen=True)
class StackRef:
    project: str
    name: str

    @property
    def fq_name(self) -> str:
        return f"organization/{self.project}/{self.name}"

    def display(self, current_project: str | None) -> str:
        return self.name if current_project == self.project else self.fq_name


def parse_stack_ref(text: str, current_project: str | None) -> StackRef:
    """Accept ``stack``, ``organization/stack`` and ``organization/project/stack``, as diy does."""
    if not text:
        raise CliError("stack name must not be empty")
    parts = text.split("/")
    if len(parts) > 3:
        raise CliError(f"could not parse stack reference '{text}'")
    org = parts[0] if len(parts) >= 2 else "organization"
    project = parts[1] if len(parts) == 3 else current_project
    if org != "organization":
        raise CliError("organization name must be 'organization'")
    if not project:
        raise CliError(
            "no Pulumi.yaml project file found; either run this command from a directory containing a Pulumi "
            "project, or pass the fully qualified stack name (organization/project/stack)"
        )
    name = parts[-1]
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise CliError(
            "a stack name may only contain alphanumeric, hyphens, underscores, or periods: invalid character "
            f"in '{name}'"
        )
    return StackRef(project=project, name=name)


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _write_json(path: Path, data: Any) -> None:
    """Write atomically so a reader (or a crash) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class FileBackend:
    def __init__(self, url: str, root: Path) -> None:
        self.url = url.rstrip("/")
        self.root = root
        self.lock_id = str(uuid.uuid4())
        meta = root / BOOKKEEPING / "meta.yaml"
        if not meta.exists():
            meta.parent.mkdir(parents=True, exist_ok=True)
            meta.write_text(yaml.safe_dump({"version": 1}), encoding="utf-8")

    # -- paths --------------------------------------------------------------------------------------
    def stack_path(self, ref: StackRef) -> Path:
        return self.root / BOOKKEEPING / "stacks" / ref.project / f"{ref.name}.json"

    def history_dir(self, ref: StackRef) -> Path:
        return self.root / BOOKKEEPING / "history" / ref.project / ref.name

    def backup_dir(self, ref: StackRef) -> Path:
        return self.root / BOOKKEEPING / "backups" / ref.project / ref.name

    def lock_dir(self, ref: StackRef) -> Path:
        return self.root / BOOKKEEPING / "locks" / "organization" / ref.project / ref.name

    # -- stacks -------------------------------------------------------------------------------------
    def exists(self, ref: StackRef) -> bool:
        return self.stack_path(ref).exists()

    def require(self, ref: StackRef, shown: str) -> None:
        if not self.exists(ref):
            raise StackNotFound(shown)

    def list_stacks(self, project: str | None) -> list[StackRef]:
        base = self.root / BOOKKEEPING / "stacks"
        if not base.is_dir():
            return []
        refs: list[StackRef] = []
        for proj_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            if project is not None and proj_dir.name != project:
                continue
            refs.extend(StackRef(proj_dir.name, f.stem) for f in sorted(proj_dir.glob("*.json")))
        return refs

    def create(self, ref: StackRef, shown: str, secrets_state: dict[str, Any] | None) -> None:
        self.lock(ref)
        try:
            if self.exists(ref):
                raise StackAlreadyExists(shown)
            deployment: dict[str, Any] = {"manifest": self._manifest()}
            if secrets_state is not None:
                deployment["secrets_providers"] = secrets_state
            self.save_checkpoint(ref, deployment)
        finally:
            self.unlock(ref)

    def remove(self, ref: StackRef, force: bool) -> None:
        self.lock(ref)
        try:
            resources = self.load_deployment(ref).get("resources") or []
            if (
                not force
                and resources
                and (len(resources) > 1 or resources[0].get("type") != "pulumi:pulumi:Stack")
            ):
                raise CliError(
                    f"'{ref.name}' still has resources; removal rejected. Possible actions:\n"
                    "- Make sure that 'pulumi destroy' was run\n"
                    "- Run 'pulumi stack rm --force' to remove the stack and keep its resources"
                )
            self.stack_path(ref).unlink()
        finally:
            self.unlock(ref)

    # -- checkpoints --------------------------------------------------------------------------------
    @staticmethod
    def _manifest() -> dict[str, Any]:
        from .version import cli_version

        return {"time": now_rfc3339(), "magic": "", "version": f"v{cli_version()}"}

    def load_deployment(self, ref: StackRef) -> dict[str, Any]:
        path = self.stack_path(ref)
        if not path.exists():
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
        latest = (data.get("checkpoint") or {}).get("latest")
        return latest if isinstance(latest, dict) else {}

    def save_checkpoint(self, ref: StackRef, deployment: dict[str, Any]) -> None:
        deployment = {**deployment, "manifest": self._manifest()}
        _write_json(
            self.stack_path(ref), {"version": 3, "checkpoint": {"stack": ref.fq_name, "latest": deployment}}
        )

    def backup(self, ref: StackRef) -> None:
        path = self.stack_path(ref)
        if path.exists():
            target = self.backup_dir(ref) / f"{ref.name}.{time.time_ns()}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())

    # -- history ------------------------------------------------------------------------------------
    def add_history(self, ref: StackRef, info: dict[str, Any]) -> None:
        stamp = time.time_ns()
        base = self.history_dir(ref)
        _write_json(base / f"{ref.name}-{stamp}.history.json", info)
        path = self.stack_path(ref)
        if path.exists():
            (base / f"{ref.name}-{stamp}.checkpoint.json").write_bytes(path.read_bytes())

    def history(self, ref: StackRef) -> list[dict[str, Any]]:
        """Updates, newest first, each with its 1-based ``version``."""
        base = self.history_dir(ref)
        files = sorted(base.glob("*.history.json"), key=lambda p: int(p.name.rsplit("-", 1)[1].split(".")[0]))
        entries = []
        for version, path in enumerate(files, start=1):
            info = json.loads(path.read_text(encoding="utf-8"))
            info["version"] = version
            entries.append(info)
        return list(reversed(entries))

    # -- locks --------------------------------------------------------------------------------------
    def _lock_file(self, ref: StackRef) -> Path:
        return self.lock_dir(ref) / f"{self.lock_id}.json"

    def _check_locks(self, ref: StackRef) -> None:
        directory = self.lock_dir(ref)
        if not directory.is_dir():
            return
        others = sorted(p for p in directory.iterdir() if p.is_file() and p != self._lock_file(ref))
        if not others:
            return
        if os.environ.get("PULUMI_FAKE_LOCK_MESSAGE") == "service":
            raise CliError(SERVICE_CONFLICT)
        lines = [
            f"the stack is currently locked by {len(others)} lock(s). Either wait for the other process(es) "
            "to end or delete the lock file with `pulumi cancel`."
        ]
        for path in others:
            try:
                content = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                content = {}
            rel = path.relative_to(self.root).as_posix()
            lines.append(
                f"  {self.url}/{rel}: created by {content.get('username')}@{content.get('hostname')} "
                f"(pid {content.get('pid')}) at {content.get('timestamp')}"
            )
        raise CliError("\n".join(lines))

    def lock(self, ref: StackRef) -> None:
        self._check_locks(ref)
        content = {
            "pid": os.getpid(),
            "username": current_user(),
            "hostname": socket.gethostname(),
            "timestamp": datetime.now(UTC).astimezone().isoformat(timespec="seconds"),
        }
        _write_json(self._lock_file(ref), content)
        try:
            self._check_locks(ref)
        except CliError:
            self.unlock(ref)
            raise

    def unlock(self, ref: StackRef) -> None:
        self._lock_file(ref).unlink(missing_ok=True)

    def cancel(self, ref: StackRef) -> None:
        directory = self.lock_dir(ref)
        if directory.is_dir():
            for path in directory.iterdir():
                if path.is_file():
                    path.unlink(missing_ok=True)

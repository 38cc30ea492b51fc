"""The stack settings file (``Pulumi.<stack>.yaml``): where the CLI keeps it, and the program's own
version of it, so a live workspace can start its config over.

Why: on a config change the operator re-initializes the running agent (SelectStack, SetAllConfig,
AddEnvironments) instead of re-creating the workspace pod. SetAllConfig and AddEnvironments only add
to the file, so a key or an ESC environment removed from the Stack would stay in it; a fresh pod
starts from the checkout's file instead. ``SnapshotStore`` records the file as it was (its bytes, or
that it was absent) the first time the agent selected the stack, and puts it back on request, before
the operator sets the config again.

Where the file is: as the CLI, which reads and writes it, resolves it (pkg/v3 ``workspace.
ProjectStackPath``): ``Pulumi.<name>`` with the project file's extension (``Pulumi.json``,
``Pulumi.yaml``, ``Pulumi.yml``, searched in that order), ``<name>`` the last component of a fully
qualified ``org/project/stack`` (``pulumi.automation``'s own ``get_stack_settings_name``), in the
project's ``stackConfigDir`` (or the legacy ``config: <dir>``) when it sets one, else beside the
project file. ``LocalWorkspace.stack_settings`` is not used: it ignores ``stackConfigDir`` and tries
``.yaml``/``.yml``/``.json`` whatever the project file's extension, so it can name a file the CLI never
reads.

Where the snapshots are: one file per settings file, in a directory of the agent's own that outlives
an agent restart in the same pod (``/share`` is an emptyDir) and is not in the program directory (the
user's checkout, which language toolchains scan). A snapshot is keyed by the settings file's path,
hashed, so any stack name is safe as a key and ``dev`` and ``org/proj/dev``, which name the same file,
share one snapshot (a second snapshot would record the file after the first name's config was set).
A snapshot is never overwritten: it is written to a temporary file and linked into place. When the
directory cannot be written, the snapshot is kept in memory (with a warning): resets work until the
agent restarts.

What a restore keeps: the stack's secrets-provider settings (``secretsprovider``, ``encryptedkey``,
``encryptionsalt``, which ``pulumi stack init`` writes) belong to the stack, not to its config. When
the program's own file sets none of them, the current file's are carried over: without them the CLI
falls back to the backend's default secrets manager (a passphrase for a file or cloud-storage
backend) and would encrypt the config, and re-encrypt the state, with it instead of the stack's KMS
key. A passphrase salt alone could be dropped (the CLI makes a new one, as in a fresh pod); it is kept
for the same rule everywhere.

Secrets: the files hold config, some of it plaintext. Their content is never logged; snapshots are
mode 0600 in a 0700 directory.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml
from pko.agent.journal import agent_state_dir
from pulumi.automation._local_workspace import get_stack_settings_name

log = structlog.get_logger("pko.agent.stacksettings")

# The CLI's order (sdk/v3 go/common/encoding.Exts); the stack settings file takes the project file's.
PROJECT_FILE_EXTENSIONS = (".json", ".yaml", ".yml")
SECRETS_PROVIDER_KEYS = ("secretsprovider", "encryptedkey", "encryptionsalt")
SNAPSHOT_FORMAT = 1


class StackSettingsError(Exception):
    """The settings file or its snapshot cannot be read or written; the message names the file, never
    its content."""


def default_snapshot_dir(work_dir: Path) -> Path:
    """``stack-settings`` in the agent's state directory, beside its operation journal:
    ``/share/.agent/stack-settings`` in a workspace pod whose program is the fetched source's root."""
    return agent_state_dir(work_dir) / "stack-settings"


def _load_markup(path: Path) -> Any:
    with path.open("rb") as f:
        data = f.read()
    return json.loads(data) if path.suffix == ".json" else yaml.safe_load(data)


def project_file(work_dir: Path) -> Path:
    """The project file the CLI reads in ``work_dir`` (the Automation API runs it there)."""
    for ext in PROJECT_FILE_EXTENSIONS:
        candidate = work_dir / f"Pulumi{ext}"
        if candidate.is_file():
            return candidate
    raise StackSettingsError(f"no Pulumi project file in {work_dir}")


def settings_path(work_dir: Path, stack_name: str) -> Path:
    """The stack settings file the CLI uses for ``stack_name`` in the project at ``work_dir``."""
    project = project_file(work_dir)
    try:
        doc = _load_markup(project)
    except (OSError, ValueError, yaml.YAMLError):
        raise StackSettingsError(f"cannot read the project file {project}") from None
    doc = doc if isinstance(doc, dict) else {}
    config_dir = doc.get("stackConfigDir")
    if not isinstance(config_dir, str) or not config_dir:
        legacy = doc.get("config")  # before stackConfigDir, `config: <dir>` said the same
        config_dir = legacy if isinstance(legacy, str) else ""
    name = get_stack_settings_name(stack_name).replace("/", "-")  # the CLI's qnameFileName
    # Go's filepath.Join(dir, stackConfigDir, file): joined, then cleaned (even an absolute
    # stackConfigDir stays under the project's directory).
    parts = [str(project.parent.absolute()), config_dir.lstrip("/"), f"Pulumi.{name}{project.suffix}"]
    return Path(os.path.normpath(os.path.join(*[p for p in parts if p])))


@dataclass(frozen=True)
class Snapshot:
    """A settings file as it was: ``content`` None when it did not exist."""

    path: Path
    content: bytes | None
    mode: int | None


def _read(path: Path) -> Snapshot:
    try:
        with path.open("rb") as f:
            return Snapshot(path, f.read(), os.fstat(f.fileno()).st_mode & 0o777)
    except FileNotFoundError:
        return Snapshot(path, None, None)
    except OSError as exc:
        raise StackSettingsError(f"cannot read the stack settings file {path}: {exc.strerror}") from None


def _parse(content: bytes, is_json: bool) -> dict[str, Any] | None:
    """The settings document as a mapping ({} for an empty YAML file); None when it is not one."""
    try:
        doc = json.loads(content) if is_json else yaml.safe_load(content)
    except (ValueError, yaml.YAMLError):
        return None
    if doc is None and not is_json:
        return {}
    return doc if isinstance(doc, dict) else None


def _dump(doc: dict[str, Any], is_json: bool) -> bytes:
    if is_json:
        return (json.dumps(doc, indent=4) + "\n").encode()
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).encode()


def restored_content(snapshot: bytes | None, current: bytes | None, is_json: bool) -> bytes | None:
    """What the file should hold after a restore: the snapshot's bytes, plus the current file's
    secrets-provider settings when the snapshot sets none of them (see the module docstring)."""
    current_doc = _parse(current, is_json) if current is not None else None
    carried = {
        key: value
        for key, value in (current_doc or {}).items()
        if key in SECRETS_PROVIDER_KEYS and isinstance(value, str) and value
    }
    if not carried:
        return snapshot
    if snapshot is None:
        return _dump(carried, is_json)
    own = _parse(snapshot, is_json)
    if own is None or any(own.get(key) for key in SECRETS_PROVIDER_KEYS):
        return snapshot  # the program's own settings decide (or the CLI will refuse the file anyway)
    merged = {**own, **carried}
    if not is_json:
        # Keep the program's text (comments, order) and append the keys, when that reads back right.
        text = snapshot.rstrip(b"\r\n")
        appended = (text + b"\n" if text.strip() else b"") + _dump(carried, is_json)
        if _parse(appended, is_json) == merged:
            return appended
    return _dump(merged, is_json)


def _write(path: Path, content: bytes | None, mode: int | None) -> None:
    """Put ``content`` at ``path`` atomically (a reader sees the old file or the new one), or remove it."""
    if content is None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            message = f"cannot remove the stack settings file {path}: {exc.strerror}"
            raise StackSettingsError(message) from None
        return
    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise StackSettingsError(f"cannot write the stack settings file {path}: {exc.strerror}") from None


class SnapshotStore:
    """Snapshots of stack settings files, taken once and restored on request (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._memory: dict[str, Snapshot] = {}
        self._lock = threading.RLock()

    def _key(self, path: Path) -> str:
        return hashlib.sha256(str(path).encode()).hexdigest()

    def _file(self, path: Path) -> Path:
        return self.directory / f"{self._key(path)}.json"

    def get(self, path: Path) -> Snapshot | None:
        """The snapshot of ``path``, if one was taken (by this process or an earlier one)."""
        key = self._key(path)
        if key in self._memory:
            return self._memory[key]
        stored = self._file(path)
        try:
            raw = stored.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StackSettingsError(f"cannot read the settings snapshot {stored}: {exc.strerror}") from None
        try:
            doc = json.loads(raw)
            content, mode = doc["content"], doc.get("mode")
            if mode is not None and not isinstance(mode, int):
                raise TypeError(mode)
            snapshot = Snapshot(
                path=Path(doc["path"]),
                content=None if content is None else base64.b64decode(content, validate=True),
                mode=mode,
            )
        except (ValueError, KeyError, TypeError):
            raise StackSettingsError(f"the settings snapshot {stored} is unreadable") from None
        if snapshot.path != path:
            raise StackSettingsError(f"the settings snapshot {stored} is of another file")
        self._memory[key] = snapshot
        return snapshot

    def take(self, path: Path, stack_name: str) -> bool:
        """Record ``path`` as it is now, unless a snapshot of it exists. True when one was taken."""
        with self._lock:
            if self.get(path) is not None:
                return False
            snapshot = _read(path)
            self._memory[self._key(path)] = snapshot
            self._persist(snapshot, stack_name)
            log.info(
                "recorded the stack settings file",
                stack_name=stack_name,
                file=str(path),
                existed=snapshot.content is not None,
            )
            return True

    def restore(self, path: Path, stack_name: str) -> bool:
        """Put ``path`` back as its snapshot recorded it (keeping the stack's secrets-provider settings,
        see the module docstring). Without a snapshot there is nothing to restore: one is taken and
        False returned."""
        with self._lock:
            snapshot = self.get(path)
            if snapshot is None:
                self.take(path, stack_name)
                return False
            current = _read(path)
            content = restored_content(snapshot.content, current.content, path.suffix == ".json")
            if content != current.content:
                _write(path, content, snapshot.mode if snapshot.mode is not None else current.mode)
            log.info(
                "restored the stack settings file",
                stack_name=stack_name,
                file=str(path),
                exists=content is not None,
                changed=content != current.content,
            )
            return True

    def _persist(self, snapshot: Snapshot, stack_name: str) -> None:
        """Write ``snapshot`` to the directory without ever replacing one there; on failure it stays
        in memory only."""
        final = self._file(snapshot.path)
        doc = {
            "format": SNAPSHOT_FORMAT,
            "path": str(snapshot.path),
            "stack": stack_name,  # the name it was first selected by, for a human reading the file
            "mode": snapshot.mode,
            "content": None if snapshot.content is None else base64.b64encode(snapshot.content).decode(),
        }
        tmp = ""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".snapshot-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(doc).encode())
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)  # fails if a snapshot is there: never overwritten
            except FileExistsError:
                raise
            except OSError:
                if not final.exists():  # a filesystem without hard links
                    os.replace(tmp, final)
        except FileExistsError:
            # Another process recorded it first: its snapshot is the older one, use it.
            self._memory.pop(self._key(snapshot.path), None)
            self.get(snapshot.path)
        except OSError as exc:
            log.warning(
                "cannot keep the stack settings snapshot on disk; it lasts until the agent restarts",
                directory=str(self.directory),
                error=exc.strerror,
            )
        finally:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

"""The on-disk record of operations, under ``/share/.agent/operations`` by default.

One directory per operation id::

    <root>/<id>/operation.json   {"id", "type", "request", "created"}   written once, at start
    <root>/<id>/events.jsonl     one {"sequence": n, "event": {...}} per line, appended in order
    <root>/<id>/result.json      the OperationResult (proto JSON), written atomically at the end

Invariants: an operation without ``result.json`` had not finished when it was last journaled;
sequence numbers start at 1 and increase by one per line; a torn last line (the agent died while
writing it) is ignored on load. ``/share`` is an emptyDir, so the journal survives an agent
(container) restart within the pod, which is what re-attachment needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pko.api.generated.pko.agent import v1 as pb


def agent_state_dir(work_dir: Path) -> Path:
    """The agent's own state (its operation journal, the stack settings snapshots): ``.agent`` beside
    the program directory, ``/share/.agent`` in a workspace pod whose program is the fetched source's
    root, on the pod's emptyDir (it outlives an agent restart) and outside the user's program."""
    return work_dir.parent / ".agent"


OPERATION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def valid_operation_id(operation_id: str) -> bool:
    return bool(OPERATION_ID.match(operation_id)) and operation_id not in {".", ".."}


@dataclass(frozen=True)
class JournaledOperation:
    id: str
    type: pb.OperationType
    request: dict[str, Any]
    created: float


def _write_atomic(path: Path, data: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Journal:
    """Reads and writes operation records under ``root``; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._event_files: dict[str, IO[str]] = {}

    def _dir(self, operation_id: str) -> Path:
        if not valid_operation_id(operation_id):
            raise ValueError(f"invalid operation id: {operation_id!r}")
        return self.root / operation_id

    def create(self, operation_id: str, type_: pb.OperationType, request: dict[str, Any]) -> None:
        d = self._dir(operation_id)
        d.mkdir(parents=True, exist_ok=False)
        record = {"id": operation_id, "type": type_.name, "request": request, "created": time.time()}
        _write_atomic(d / "operation.json", json.dumps(record))

    def append_event(self, operation_id: str, sequence: int, event: dict[str, Any]) -> None:
        f = self._event_files.get(operation_id)
        if f is None:
            f = open(self._dir(operation_id) / "events.jsonl", "a", encoding="utf-8")
            self._event_files[operation_id] = f
        f.write(json.dumps({"sequence": sequence, "event": event}, separators=(",", ":")) + "\n")
        f.flush()

    def write_result(self, result: pb.OperationResult) -> None:
        f = self._event_files.pop(result.operation_id, None)
        if f is not None:
            f.close()
        _write_atomic(self._dir(result.operation_id) / "result.json", result.to_json())

    def close(self) -> None:
        for f in self._event_files.values():
            f.close()
        self._event_files.clear()

    def ids(self) -> list[str]:
        """Journaled operation ids, oldest first."""
        found = [d for d in self.root.iterdir() if d.is_dir() and (d / "operation.json").exists()]
        found.sort(key=lambda d: (d / "operation.json").stat().st_mtime)
        return [d.name for d in found]

    def load(self, operation_id: str) -> JournaledOperation | None:
        try:
            raw = json.loads((self._dir(operation_id) / "operation.json").read_text())
        except (OSError, ValueError):
            return None
        return JournaledOperation(
            id=raw["id"], type=pb.OperationType[raw["type"]], request=raw["request"], created=raw["created"]
        )

    def events(self, operation_id: str) -> Iterator[tuple[int, dict[str, Any]]]:
        path = self._dir(operation_id) / "events.jsonl"
        if not path.exists():
            return
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    return  # torn write
                try:
                    record = json.loads(line)
                except ValueError:
                    return
                yield int(record["sequence"]), record["event"]

    def result(self, operation_id: str) -> pb.OperationResult | None:
        try:
            return pb.OperationResult.from_json((self._dir(operation_id) / "result.json").read_text())
        except FileNotFoundError:
            return None

    def remove(self, operation_id: str) -> None:
        f = self._event_files.pop(operation_id, None)
        if f is not None:
            f.close()
        shutil.rmtree(self._dir(operation_id), ignore_errors=True)

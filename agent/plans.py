"""Update plans a preview saved (``pulumi preview --save-plan``) for a later ``pulumi up --plan``.

A plan is the engine's record of every step a preview proposed; an up given it refuses any step the
plan lacks, so what was approved is what runs. Plans live in the workspace pod, under the agent's
state directory (``/share/.agent/plans/<preview operation id>.json``, on the pod's emptyDir): a
replaced pod has none, and an up naming one then fails PlanNotFound (the caller previews again).

Invariants: a plan file exists only for a preview that succeeded (the engine writes a partial file,
renamed on success, removed otherwise); an up deletes the plan it applied once it is spent (the up
succeeded, or the program no longer matches it); at most ``keep`` plans are kept, newest first. The
plan holds the stack's secrets encrypted with its secrets provider, as the state does.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from pko.agent.journal import agent_state_dir, valid_operation_id

PLANS_KEPT = 5


def default_plans_dir(work_dir: Path) -> Path:
    return agent_state_dir(work_dir) / "plans"


@dataclass(frozen=True)
class PlanStore:
    """The saved plans of one workspace, by the id of the preview that saved them."""

    root: Path
    keep: int = PLANS_KEPT

    def path(self, operation_id: str) -> Path:
        if not valid_operation_id(operation_id):
            raise ValueError(f"invalid operation id: {operation_id!r}")
        return self.root / f"{operation_id}.json"

    def partial(self, operation_id: str) -> Path:
        """Where a running preview has the engine write its plan."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / f".{operation_id}.json.partial"

    def commit(self, operation_id: str) -> bool:
        """Keep the plan of a preview that succeeded, then prune; False when the engine wrote none."""
        try:
            os.replace(self.partial(operation_id), self.path(operation_id))
        except FileNotFoundError:
            return False
        self.prune()
        return True

    def discard(self, operation_id: str) -> None:
        """Drop what a preview that failed may have written."""
        self.partial(operation_id).unlink(missing_ok=True)

    def find(self, operation_id: str) -> Path | None:
        """The saved plan of preview ``operation_id``, or None (never saved, pruned, or another pod)."""
        if not valid_operation_id(operation_id):
            return None
        path = self.path(operation_id)
        return path if path.is_file() else None

    def remove(self, operation_id: str) -> None:
        if valid_operation_id(operation_id):
            self.path(operation_id).unlink(missing_ok=True)

    def ids(self) -> list[str]:
        """Saved plans, newest first."""
        if not self.root.is_dir():
            return []
        found: list[tuple[float, str]] = []
        for entry in self.root.iterdir():
            if entry.suffix == ".json" and not entry.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    found.append((entry.stat().st_mtime, entry.stem))
        return [name for _, name in sorted(found, reverse=True)]

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep`` plans, and partial files of previews that ended without
        settling (the agent died; one operation runs at a time, so none is being written now: prune
        runs as a preview commits its own); returns the ids of the plans deleted."""
        dropped = self.ids()[self.keep :]
        for operation_id in dropped:
            self.remove(operation_id)
        for stale in self.root.glob(".*.json.partial"):
            stale.unlink(missing_ok=True)
        return dropped

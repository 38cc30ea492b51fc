"""The runner's edits of a stack's state outside operations: classifying a failed command (with the
pending operations the state holds), removing a stale lock of this pod, and clearing pending
operations an operation that succeeded made stale (pendingops), through ``pulumi stack export`` and
``pulumi stack import``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import structlog
from pko.agent import failures, pendingops
from pko.agent.operations import OperationRequest
from pko.agent.pulumicommand import TrackingPulumiCommand
from pko.agent.runnerresults import error_text
from pko.api.generated.pko.agent import v1 as pb
from pulumi import automation as auto
from pulumi.automation import CommandResult
from pulumi.automation import errors as auto_errors

log = structlog.get_logger("pko.agent.pulumi")


class StackState:
    """The CLI commands on the selected stack's state, run in the runner's workspace."""

    def __init__(self, workspace: auto.LocalWorkspace, command: TrackingPulumiCommand, started: datetime):
        self._ws = workspace
        self._command = command
        # Locks taken on this host before now belong to dead processes (see failures.stale_own_lock).
        self._started = started

    def classify(
        self,
        exc: auto_errors.CommandError,
        observations: failures.RunObservations,
        stack: auto.Stack | None = None,
    ) -> pb.Failure:
        """The Failure of a failed command; with ``stack``, the pending operations its state holds."""
        stdout, stderr = error_text(exc)
        pending: list[pb.PendingOperation] = []
        if stack is not None:
            pending = self._pending_operations(stack)
        return failures.classify(
            error_class=type(exc).__name__,
            error_text=f"{stdout}\n{stderr}",  # the CLI writes its error last, on stderr
            observations=observations,
            pending=pending,
        )

    def release_stale_lock(self, stack: auto.Stack, failure: pb.Failure) -> pb.RemovedLock | None:
        """Remove the lock of a StackLocked ``failure`` when a dead process of this pod left it
        (``pulumi cancel``; failures.stale_own_lock): what was removed, with the pending operations the
        interrupted update left (the failure's), for the user to check those resources; None when the
        lock is not such a lock, or could not be removed (the failure stands as it is)."""
        lock = failure.lock
        if failure.reason != "StackLocked" or lock is None:
            return None
        if not failures.stale_own_lock(lock, socket.gethostname(), self._started):
            return None
        try:
            stack.cancel()
        except auto_errors.CommandError as exc:
            log.warning("could not remove a stale lock", owner=lock.owner, error=error_text(exc)[1])
            return None
        pending = list(failure.pending_operations)
        log.warning(
            "removed a stale lock of this pod",
            owner=lock.owner,
            acquired=lock.acquired.isoformat() if lock.acquired else "",
            pending=[f"{p.type} {p.urn}" for p in pending],
        )
        return pb.RemovedLock(lock=lock, pending_operations=pending)

    def settle_pending(self, stack: auto.Stack, request: OperationRequest, out: pb.OperationResult) -> None:
        """After an up, refresh or destroy that succeeded: clear the pending operations it left stale
        (pendingops: the engine keeps an interrupted create forever, even once the resource exists
        again) with ``stack export`` and ``stack import``, as the CLI's own state edits do: the import
        takes the backend's stack lock, so it fails (and reports the operations as remaining) while
        another update runs; no other operation of this agent runs meanwhile; only a writer outside pko
        that started and ended between the two commands would be overwritten, as with ``pulumi state``.
        Puts in ``out`` what was cleared and what remains. Costs one ``stack export`` (an import only
        when there is something to clear); when the state cannot be read, ``out`` says nothing."""
        try:
            exported = self._export(stack)
        except (auto_errors.CommandError, ValueError) as exc:
            log.warning("could not read the state for pending operations", error=error_text(exc)[1])
            return
        deployment = exported.get("deployment")
        if not isinstance(deployment, dict):
            return
        pending = failures.pending_operations(deployment)
        if not pending:
            return
        settled = pendingops.settle(
            pending, out.type, pendingops.live_urns(deployment), targeted=bool(request.target)
        )
        out.pending_operations = list(settled.keep)
        if not settled.clear:
            log.warning("pending operations remain", pending=[f"{p.type} {p.urn}" for p in settled.keep])
            return
        try:
            self._import(stack, {**exported, "deployment": pendingops.without_pending(deployment)})
        except auto_errors.CommandError as exc:
            log.warning("could not clear stale pending operations", error=error_text(exc)[1])
            out.pending_operations = pending
            return
        out.cleared_pending_operations = list(settled.clear)
        log.warning(
            "cleared stale pending operations; what the interrupted attempt made may exist outside the state",
            cleared=[f"{p.type} {p.urn}" for p in settled.clear],
        )

    def _pending_operations(self, stack: auto.Stack) -> list[pb.PendingOperation]:
        try:
            deployment = self._export(stack).get("deployment")
        except (auto_errors.CommandError, ValueError):
            return []
        return failures.pending_operations(deployment if isinstance(deployment, dict) else None)

    def _pulumi(self, args: list[str]) -> CommandResult:
        """A CLI command in the workspace, as the Automation API runs its own (same env, same home)."""
        env = {"PULUMI_HOME": self._ws.pulumi_home} if self._ws.pulumi_home else {}
        return self._command.run(args, self._ws.work_dir, {**env, **self._ws.env_vars})

    def _export(self, stack: auto.Stack) -> dict[str, Any]:
        """``pulumi stack export``: the checkpoint with its secrets still encrypted (the Automation API's
        export_stack decrypts them, and its import_stack writes them to a file in plaintext)."""
        exported = json.loads(self._pulumi(["stack", "export", "--stack", stack.name]).stdout)
        if not isinstance(exported, dict):
            raise ValueError("`pulumi stack export` printed no deployment")
        return exported

    def _import(self, stack: auto.Stack, exported: Mapping[str, Any]) -> None:
        """``pulumi stack import`` of what ``_export`` read (edited): the backend checks the state's
        integrity and takes the stack's lock to write it."""
        fd, path = tempfile.mkstemp(prefix="pko-state-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(exported, f)
            self._pulumi(["stack", "import", "--file", path, "--stack", stack.name])
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)

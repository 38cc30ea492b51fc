"""Classify a failed Pulumi operation into a structured ``Failure`` a controller can act on.

The Automation API raises typed errors (``ConcurrentUpdateError``, ``RuntimeError``, ...) and the
engine reports structured diagnostics; both are used first. Two facts have no structured source and
are read from the CLI's error text, as the Go agent does: the known Pulumi Cloud errors (conflict,
invalid token) and the owner of a DIY backend's lock. Pending operations come from the exported
deployment (``pending_operations``), never from text.

Reasons (a closed set): UpdateConflict, InvalidAccessToken, StackLocked, PendingOperations,
PlanMismatch, PlanNotFound, ProgramError, ResourceOperationFailed, Cancelled, Terminated,
AgentRestarted, OperationFailed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pko.api.generated.pko.agent import v1 as pb

# Snippets of CLI error text -> (reason, message, code); the same table as the Go agent.
KNOWN_ERRORS: tuple[tuple[str, str, str, int], ...] = (
    (
        "Conflict: Another update is currently in progress",
        "UpdateConflict",
        "Another update is currently in progress",
        409,
    ),
    (
        "invalid access token",
        "InvalidAccessToken",
        "Invalid access token used to authenticate with Pulumi Cloud",
        401,
    ),
)

_DIY_LOCKED = re.compile(r"the stack is currently locked by (\d+) lock\(s\)")
# "  file:///x/.pulumi/locks/org/proj/dev/<uuid>.json: created by user@host (pid 42) at 2024-...Z"
_DIY_LOCK_LINE = re.compile(
    r"^\s*(?P<location>\S+): created by (?P<who>\S+) \(pid (?P<pid>\d+)\) at (?P<at>\S+)\s*$", re.M
)
_PENDING_TEXT = re.compile(r"resource\(s\) with pending operations")
# The engine refusing a step its update plan (`up --plan`) lacks (pkg/resource/deploy, v3.274): "create
# is not allowed by the plan: no steps were expected for this resource", "resource <urn> violates plan:
# properties changed: ~~label[{one}!={two}]", "no plan for resource <urn>".
_PLAN_VIOLATION = re.compile(r"is not allowed by the plan|violates plan|no plan for resource")
REASON_PLAN_MISMATCH = "PlanMismatch"
REASON_PLAN_NOT_FOUND = "PlanNotFound"
# Terminal colour and cursor sequences: language hosts colour their errors even when the CLI runs with
# --color never, and a Stack's message is read in kubectl, not a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_DETAIL_LINES = 20


@dataclass
class RunObservations:
    """What the engine reported during a run, gathered from its events."""

    error_diagnostics: list[tuple[str, str]] = field(default_factory=list)  # (urn or "", message)
    failed_resources: list[str] = field(default_factory=list)
    summary_seen: bool = False  # the engine's summary: it ran the deployment to its end

    def applied_silently(self, stderr: str) -> bool:
        """Whether a run that exited with an error ran to its end without reporting one: the engine's
        summary came, no error diagnostic, no failed step, nothing on stderr (the caller knows
        whether it was interrupted; the engine's ``cancelEvent`` only marks the end of every run).
        (pulumi 3.274's ``up --plan`` ends so after applying every step when a stack output the
        preview could not know, e.g. a Kubernetes object's ``metadata.uid``, differs from the plan.)"""
        return (
            self.summary_seen
            and not self.error_diagnostics
            and not self.failed_resources
            and not stderr.strip()
        )

    def observe(self, event: Mapping[str, Any]) -> None:
        if "summaryEvent" in event:
            self.summary_seen = True
        diag = event.get("diagnosticEvent")
        if isinstance(diag, Mapping) and diag.get("severity") == "error":
            message = _ANSI.sub("", str(diag.get("message", ""))).strip()
            if message:
                self.error_diagnostics.append((str(diag.get("urn") or ""), message))
        failed = event.get("resOpFailedEvent")
        if isinstance(failed, Mapping):
            metadata = failed.get("metadata")
            if isinstance(metadata, Mapping):
                self.failed_resources.append(str(metadata.get("urn", "")))


def tail(text: str, lines: int = _DETAIL_LINES) -> str:
    kept = [line for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def parse_lock(text: str) -> pb.LockInfo | None:
    """The lock a DIY backend reported in its error text, or None if the text names no lock."""
    if not _DIY_LOCKED.search(text):
        return None
    m = _DIY_LOCK_LINE.search(text)
    if m is None:
        return pb.LockInfo()
    acquired: datetime | None = None
    try:
        acquired = datetime.fromisoformat(m["at"].replace("Z", "+00:00"))
    except ValueError:
        acquired = None
    return pb.LockInfo(owner=f"{m['who']} (pid {m['pid']})", location=m["location"], acquired=acquired)


def pending_operations(deployment: Mapping[str, Any] | None) -> list[pb.PendingOperation]:
    """Pending operations recorded in an exported deployment (``stack export``)."""
    if not deployment:
        return []
    out = []
    for op in deployment.get("pending_operations") or []:
        resource = op.get("resource") or {}
        out.append(pb.PendingOperation(urn=str(resource.get("urn", "")), type=str(op.get("type", ""))))
    return out


def plan_violation(diagnostics: Iterable[tuple[str, str]], error_text: str) -> str | None:
    """The engine's words for the first step the update plan did not allow (with the resource's URN
    when the line lacks it), or None when the run broke no plan. A Python program that the engine
    stops mid-registration also fails with a RuntimeError: this comes first, or that would read as
    a program error."""
    for urn, message in diagnostics:
        if _PLAN_VIOLATION.search(message):
            line = message.splitlines()[0]
            return line if not urn or urn in line else f"{urn}: {line}"
    for line in error_text.splitlines():
        if _PLAN_VIOLATION.search(line):
            return line.strip().removeprefix("error:").strip()
    return None


def _first_program_error(diagnostics: Iterable[tuple[str, str]]) -> str | None:
    for urn, message in diagnostics:
        # Program (not resource) errors are reported on the stack resource or on no resource.
        if not urn or "::pulumi:pulumi:Stack::" in urn:
            return message
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs in this pid namespace (one of another user counts). A zombie
    is dead: a killed process whose parent died too waits for an init to reap it, and a container's
    init (or a VM's) may be slow to, or never do."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs to ask: it answered the signal, so it exists
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def stale_own_lock(
    lock: pb.LockInfo | None,
    hostname: str,
    started: datetime,
    alive: Callable[[int], bool] = pid_alive,
) -> bool:
    """Whether ``lock`` was left by a dead process of this very pod: taken on this host (a workspace
    pod's hostname is its name) either before this agent started, or by a process that no longer
    exists. Every process of an earlier incarnation of the pod, or of this container before a restart,
    is gone (kill -9, a lost node, an OOM kill), and one workspace serves one stack, so no live process
    can hold that lock: removing it loses nothing. Any other lock (another host, or taken since this
    agent started by a process still running, such as an exec'd ``pulumi import``) is left for its owner.

    The engine prints a lock's time to the whole second, so a lock taken in the second the agent
    started reads as earlier than ``started``: compare against that second, erring towards "live".
    That second is what the pid decides: the pod's only running container is the agent's, so a pid
    of this host's lock that names no process here is a dead one. A reused pid reads as live, the safe
    side; so does a lock whose owner shows no pid."""
    if lock is None or lock.acquired is None or not lock.owner:
        return False
    who, _, pid = lock.owner.partition(" (pid ")
    if who.rpartition("@")[2] != hostname:
        return False
    if lock.acquired < started.replace(microsecond=0):
        return True
    pid = pid.removesuffix(")")
    return pid.isdigit() and not alive(int(pid))


def classify(
    *,
    error_class: str,
    error_text: str,
    observations: RunObservations,
    pending: list[pb.PendingOperation],
) -> pb.Failure:
    """Build the Failure for a run that raised ``error_class`` (an Automation API error name)."""
    error_text = _ANSI.sub("", error_text)
    detail = tail(error_text)
    first_line = detail.splitlines()[-1] if detail else ""
    for snippet, reason, message, code in KNOWN_ERRORS:
        if snippet in error_text:
            return pb.Failure(
                reason=reason, message=message, code=code, pending_operations=pending, detail=detail
            )
    lock = parse_lock(error_text)
    if lock is not None:
        owner = f" by {lock.owner}" if lock.owner else ""
        return pb.Failure(
            reason="StackLocked",
            message=f"the stack is locked{owner}",
            code=409,
            lock=lock,
            pending_operations=pending,
            detail=detail,
        )
    if pending and _PENDING_TEXT.search(error_text):
        return pb.Failure(
            reason="PendingOperations",
            message=f"the stack has {len(pending)} pending operation(s)",
            pending_operations=pending,
            detail=detail,
        )
    violation = plan_violation(observations.error_diagnostics, error_text)
    if violation is not None:
        return pb.Failure(
            reason=REASON_PLAN_MISMATCH,
            message=f"the update does not match its plan: {violation}",
            pending_operations=pending,
            detail=detail,
        )
    program_error = _first_program_error(observations.error_diagnostics)
    if error_class in {"RuntimeError", "CompilationError", "InlineSourceRuntimeError"} or (
        program_error is not None and not observations.failed_resources
    ):
        return pb.Failure(
            reason="ProgramError",
            message=program_error or first_line or "the program failed",
            pending_operations=pending,
            detail=detail,
        )
    if observations.failed_resources:
        message = next((m for _, m in observations.error_diagnostics), first_line)
        return pb.Failure(
            reason="ResourceOperationFailed",
            message=message or f"{len(observations.failed_resources)} resource operation(s) failed",
            pending_operations=pending,
            detail=detail,
        )
    return pb.Failure(
        reason="OperationFailed",
        message=first_line or "the operation failed",
        pending_operations=pending,
        detail=detail,
    )


# What a package manager or toolchain says when `pulumi install` fails: npm's, yarn's and pnpm's error
# lines, go's and pip's. The engine's own last line only says the tool's exit status.
_TOOL_LINE = re.compile(r"^(?:npm (?:error|ERR!)|yarn error|ERR_PNPM\w*|go: |ERROR: )\s*(?P<text>.*)$")
_TOOL_NOISE = (
    "A complete log of this run",
    "Note that you can also install from a",
    "tarball, folder, http url",
)
_TOOL_LINES = 6
_NO_HOST = re.compile(r"no language plugin 'pulumi-language-(?P<runtime>[^']+)' found")


def install_message(error_text: str, runtimes: Iterable[str]) -> str:
    """What a user reads when `pulumi install` failed: the package manager's or compiler's own error
    lines (the package and the registry's answer for npm, the module for go), after the engine's line;
    for a runtime no language host in the image serves (a misspelled or missing one), which runtimes
    the image has and the two ways out."""
    text = _ANSI.sub("", error_text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    engine = next((line for line in reversed(lines) if line.startswith("error:")), lines[-1] if lines else "")
    engine = engine.removeprefix("error:").strip() or "the install failed"
    missing = _NO_HOST.search(text)
    if missing:
        have = ", ".join(sorted(set(runtimes))) or "none"
        return (
            f"runtime '{missing['runtime']}' has no language host in this workspace image (it runs: {have}); "
            f"set `runtime` in Pulumi.yaml to one of those, or the Stack's workspaceTemplate image to one "
            f"with pulumi-language-{missing['runtime']} ({engine})"
        )
    said: list[str] = []
    in_tool = False  # an indented line continues the tool's line before it (go's import chains)
    for raw in text.splitlines():
        match = _TOOL_LINE.match(raw.strip())
        if match is None and in_tool and raw[:1].isspace() and raw.strip() and said:
            said[-1] += " " + raw.strip()
            continue
        found = match["text"].strip() if match else ""
        in_tool = bool(found)
        if found and not any(noise in found for noise in _TOOL_NOISE) and found not in said:
            said.append(found)
    if not said:
        return engine
    return f"{engine}: " + "; ".join(said[:_TOOL_LINES])

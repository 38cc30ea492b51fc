"""``kubectl pko status`` (pure): a table of Stacks, one Stack in detail, or either as a document.

The document (``-o json|yaml``) is a summary for scripts, not the Stack itself (``kubectl get -o
yaml`` gives that): readiness as :mod:`pko.kubectl.stackview` decides it, the status fields a
person asks about, and outputs with every secret masked. The fields of issue 29 are shown when the
operator writes them and not mentioned otherwise: ``status.plan`` (the plan awaiting approval, its
counts and digest, and how to approve it), ``status.drift`` (the last drift check, each drifted
resource with its paths) and the refresh and cancel requests still pending.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import yaml

from pko.kubectl.actions import REQUESTS, annotation, refresh_retrying
from pko.kubectl.approval import approved_digest, awaiting_approval, plan_of, summary_text
from pko.kubectl.exitcodes import ExitCode
from pko.kubectl.stackview import (
    Obj,
    conditions,
    deleting,
    masked,
    readiness,
    status_of,
    suspended,
    time_since,
    time_until,
)

__all__ = ["OPTIONAL_FIELDS", "details", "document", "exit_code", "summary", "table"]

OPTIONAL_FIELDS: Final = ("plan", "drift", "observedRefreshRequest", "observedCancelRequest")
"""Status fields in the document only when present."""
_VALUE_COLUMN: Final = 17


def summary(stack: Mapping[str, Any], update: Mapping[str, Any] | None = None) -> Obj:
    """The machine-readable status of one Stack; ``update``: its last Update, when read, adds
    ``startTime``, ``endTime`` and ``resourceChanges`` to ``lastUpdate``."""
    meta = stack.get("metadata") or {}
    status = status_of(stack)
    state = readiness(stack)
    last = dict(status.get("lastUpdate") or {}) or None
    if last is not None and update is not None:
        upd_status = update.get("status") or {}
        for key in ("startTime", "endTime", "resourceChanges"):
            if upd_status.get(key) is not None:
                last[key] = upd_status[key]
    doc: Obj = {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "stack": (stack.get("spec") or {}).get("stack"),
        "ready": state.ready,
        "state": state.state,
        "reason": state.reason,
        "message": state.message,
        "suspended": suspended(stack),
        "deleting": deleting(stack),
        "conditions": conditions(stack),
        "lastUpdate": last,
        "currentUpdate": status.get("currentUpdate"),
        "lastFailure": status.get("lastFailure"),
        "nextRetryTime": status.get("nextRetryTime"),
        "resourceCount": status.get("resourceCount"),
        "outputs": masked(status.get("outputs") or {}),
    }
    for field in OPTIONAL_FIELDS:
        if status.get(field) is not None:
            doc[field] = masked(status[field])
    if approved_digest(stack):
        doc["approvedPlan"] = approved_digest(stack)
    return doc


def document(summaries: Sequence[Obj], *, single: bool, fmt: str) -> str:
    """``summaries`` as JSON or YAML: the one summary, or ``{"items": [...]}`` for a listing."""
    body: Any = summaries[0] if single else {"items": list(summaries)}
    if fmt == "json":
        return json.dumps(body, indent=2) + "\n"
    return str(yaml.safe_dump(body, sort_keys=False, default_flow_style=False))


def exit_code(stacks: Iterable[Mapping[str, Any]]) -> ExitCode:
    """1 when any Stack shown is not Ready."""
    return ExitCode.OK if all(readiness(s).ready for s in stacks) else ExitCode.NOT_READY


def _columns(rows: Sequence[Sequence[str]]) -> str:
    """Rows padded into columns of three spaces, as ``kubectl get`` prints them."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n"
        for row in rows
    )


def _last_update(stack: Mapping[str, Any]) -> str:
    last = status_of(stack).get("lastUpdate") or {}
    return " ".join(str(last[k]) for k in ("type", "state") if last.get(k)) or "<none>"


def table(stacks: Sequence[Mapping[str, Any]], now: datetime, *, all_namespaces: bool) -> str:
    """One line per Stack: where, readiness, the last Update and how long ago it ran."""
    header = ["NAME", "STACK", "STATE", "REASON", "LAST UPDATE", "UPDATED"]
    rows: list[list[str]] = []
    for stack in stacks:
        meta = stack.get("metadata") or {}
        state = readiness(stack)
        last = status_of(stack).get("lastUpdate") or {}
        row = [
            str(meta.get("name", "")),
            str((stack.get("spec") or {}).get("stack") or ""),
            state.state
            + (" (deleting)" if deleting(stack) else "")
            + (" (drifted)" if _drifted(stack) else ""),
            state.reason,
            _last_update(stack) + (" (running)" if status_of(stack).get("currentUpdate") else ""),
            time_since(last.get("lastResyncTime"), now) or "<none>",
        ]
        rows.append([str(meta.get("namespace", "")), *row] if all_namespaces else row)
    return _columns([["NAMESPACE", *header] if all_namespaces else header, *rows])


def _field(label: str, value: str, indent: int = 0) -> str:
    """``Label:  value``, continuation lines of a multi-line value aligned under the first."""
    head = " " * indent + f"{label + ':':<{_VALUE_COLUMN - indent - 1}} "
    lines = value.splitlines() or [""]
    return "".join([head + lines[0] + "\n", *(" " * len(head) + line + "\n" for line in lines[1:])])


def _scalar(value: Any) -> str:
    """A string as it is (``[secret]`` unquoted), anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _drifted(stack: Mapping[str, Any]) -> bool:
    drift = status_of(stack).get("drift")
    return isinstance(drift, Mapping) and bool(drift.get("detected"))


def _at(when: Any, now: datetime) -> str:
    """``<time> (5m ago)``."""
    ago = time_since(when, now)
    return f"{when} ({ago} ago)" if ago else str(when)


def _plan(stack: Mapping[str, Any], now: datetime) -> str:
    """The recorded plan: its digest, preview Update, counts, and whether (and how) to approve it."""
    plan = plan_of(stack)
    if plan is None:
        return ""
    meta = stack.get("metadata") or {}
    approved = approved_digest(stack)
    out = [
        _field("Plan", plan.digest),
        _field("Changes", summary_text(plan.summary), 2),
        _field("Update", plan.update or "<none>", 2),
    ]
    if plan.time:
        out.append(_field("Recorded", _at(plan.time, now), 2))
    if plan.commit:
        out.append(_field("Commit", plan.commit, 2))
    if approved == plan.digest:
        approval = "approved: the operator applies this plan"
    elif awaiting_approval(stack):
        approval = f"awaiting approval: kubectl pko approve {meta.get('name')} -n {meta.get('namespace')}"
        if approved:
            approval += f"\n(the approved digest {approved} is another plan's)"
    else:
        approval = "not awaiting approval"
    out.append(_field("Approval", approval, 2))
    return "".join(out)


def _drift(stack: Mapping[str, Any], now: datetime) -> str:
    """The last drift check: when, what it found, each drifted resource with its paths."""
    drift = status_of(stack).get("drift")
    if not isinstance(drift, Mapping):
        return ""
    resources = [r for r in drift.get("resources") or [] if isinstance(r, Mapping)]
    ago = time_since(drift.get("lastCheckTime"), now)
    checked = f" (checked {ago} ago)" if ago else ""
    if drift.get("detected"):
        head = f"detected in {_plural(len(resources), 'resource')}{checked}"
    elif drift.get("lastCheckTime"):
        head = f"none{checked}"
    else:
        head = "not checked yet"
    out = [_field("Drift", head)]
    if drift.get("message"):
        out.append(_field("Message", str(drift["message"]), 2))
    for resource in resources:
        out.append(f"  {resource.get('urn', '')}\n")
        out.append(_field("Type", str(resource.get("type") or ""), 4))
        paths = [str(p) for p in resource.get("paths") or []]
        out.append(_field("Paths", ", ".join(paths) if paths else "(none: the resource is gone)", 4))
        if resource.get("firstSeen"):
            out.append(_field("First seen", _at(resource["firstSeen"], now), 4))
    return "".join(out)


def _requests(stack: Mapping[str, Any]) -> str:
    """Refresh and cancel requests the operator has not carried out yet."""
    out: list[str] = []
    for request in (REQUESTS["refresh"], REQUESTS["cancel"]):
        token = annotation(stack, request.annotation)
        if token and token != status_of(stack).get(request.observed):
            retrying = refresh_retrying(stack, token) if request.command == "refresh" else ""
            said = f"{token} (pending: {retrying})" if retrying else f"{token} (pending)"
            out.append(_field(f"{request.command.capitalize()} request", said))
    return "".join(out)


def details(stack: Mapping[str, Any], update: Mapping[str, Any] | None, now: datetime) -> str:
    """One Stack for a person: readiness, conditions, the last and current Update, the failure and
    its retry, outputs, and the plan, drift and pending requests when there are any."""
    meta = stack.get("metadata") or {}
    status = status_of(stack)
    state = readiness(stack)
    out = [
        _field("Name", str(meta.get("name", ""))),
        _field("Namespace", str(meta.get("namespace", ""))),
        _field("Stack", str((stack.get("spec") or {}).get("stack") or "")),
        _field(
            "State",
            f"{state.state} ({state.reason})" if state.reason not in ("", state.state) else state.state,
        ),
    ]
    if state.message:
        out.append(_field("Message", state.message))
    if suspended(stack):
        out.append(_field("Suspended", "spec.suspend is set: no new operation starts"))
    if deleting(stack):
        out.append(_field("Deleting", f"since {meta.get('deletionTimestamp')}"))
    conds = conditions(stack)
    if conds:
        rows = [["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]] + [
            [
                str(c.get("type", "")),
                str(c.get("status", "")),
                str(c.get("reason", "")),
                time_since(c.get("lastTransitionTime"), now),
                " ".join(str(c.get("message") or "").split()),
            ]
            for c in conds
        ]
        out.append("Conditions:\n" + "".join(f"  {line}\n" for line in _columns(rows).splitlines()))
    last = status.get("lastUpdate") or {}
    if last:
        ago = time_since(last.get("lastResyncTime"), now)
        text = f"{last.get('name', '')}: {_last_update(stack)}" + (f" {ago} ago" if ago else "")
        if last.get("state") == "failed" and last.get("failures"):
            text += f" ({_plural(int(last['failures']) + 1, 'failure')} in a row)"
        out.append(_field("Last update", text))
        if last.get("permalink"):
            out.append(_field("Permalink", str(last["permalink"]), 2))
        changes = ((update or {}).get("status") or {}).get("resourceChanges")
        if isinstance(changes, Mapping) and changes:
            out.append(_field("Changes", ", ".join(f"{k}={v}" for k, v in changes.items()), 2))
        if last.get("message"):
            out.append(_field("Message", str(last["message"]), 2))
    current = status.get("currentUpdate") or {}
    if current.get("name"):
        extra = ", ".join(
            f"{k} {current[k]}"
            for k in ("kind", "generation", "commit", "reconcileRequest")
            if current.get(k)
        )
        doing = (
            f"cancelling on request {current['cancelRequest']}" if current.get("cancelRequest") else "running"
        )
        out.append(_field("Current update", f"{current['name']} ({doing}{', ' + extra if extra else ''})"))
    failure = status.get("lastFailure") or {}
    if failure:
        kind = "transient" if failure.get("transient") else "deterministic"
        counted = failure.get("countedFailures")
        text = f"{failure.get('reason', '')} ({kind}" + (f", {counted} counted)" if counted else ")")
        out.append(_field("Last failure", text))
        if failure.get("lockOwner"):
            out.append(_field("Lock owner", str(failure["lockOwner"]), 2))
        for urn in failure.get("pendingOperations") or []:
            out.append(_field("Pending", str(urn), 2))
    if status.get("nextRetryTime"):
        when = status["nextRetryTime"]
        out.append(_field("Next retry", f"{when} ({time_until(when, now)})"))
    if status.get("resourceCount") is not None:
        out.append(_field("Resources", str(status["resourceCount"])))
    outputs = masked(status.get("outputs") or {})
    if isinstance(outputs, Mapping) and outputs:
        out.append("Outputs:\n" + "".join(f"  {k}: {_scalar(v)}\n" for k, v in outputs.items()))
    out += [_plan(stack, now), _drift(stack, now), _requests(stack)]
    return "".join(out)

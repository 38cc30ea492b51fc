"""Each command's run: read through :class:`~pko.kubectl.cluster.Cluster`, decide and format with
the command's pure module, print, and return the exit code.

:data:`RUNNERS` maps a command name (:data:`pko.kubectl.args.COMMANDS`) to its runner; a new
command is a runner here and a :class:`~pko.kubectl.args.CommandSpec` there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TextIO

from pko.kubectl import actions, approval, status, versions, why
from pko.kubectl.apiserver import ApiError
from pko.kubectl.args import Options
from pko.kubectl.cluster import Cluster
from pko.kubectl.exitcodes import ExitCode, PluginError
from pko.kubectl.logs import PULUMI_CONTAINER, chosen_update, engine_lines, workspace_pod
from pko.kubectl.stackview import Obj, status_of

__all__ = ["RUNNERS", "Context", "Runner"]


@dataclass(frozen=True, slots=True)
class Context:
    """What a runner works with: the cluster, the namespace the options resolve to, the streams,
    and the clock (tests fix it)."""

    cluster: Cluster
    namespace: str
    out: TextIO
    err: TextIO
    now: Callable[[], datetime]


Runner = Callable[[Options, Context], ExitCode]


def _stack(options: Options, ctx: Context) -> Obj:
    """The named Stack, or exit 3."""
    assert options.name is not None  # the parser requires it for every command but status
    found = ctx.cluster.stack(ctx.namespace, options.name)
    if found is None:
        raise PluginError(
            ExitCode.NOT_FOUND, f'stack "{options.name}" not found in namespace "{ctx.namespace}"'
        )
    return found


def _named_update(ctx: Context, name: Any) -> Obj | None:
    return ctx.cluster.update(ctx.namespace, str(name)) if name else None


def run_status(options: Options, ctx: Context) -> ExitCode:
    if options.name:
        stack = _stack(options, ctx)
        update = _named_update(ctx, (status_of(stack).get("lastUpdate") or {}).get("name"))
        if options.output:
            ctx.out.write(status.document([status.summary(stack, update)], single=True, fmt=options.output))
        else:
            ctx.out.write(status.details(stack, update, ctx.now()))
        return status.exit_code([stack])
    where = None if options.all_namespaces else ctx.namespace
    stacks = sorted(
        ctx.cluster.stacks(where),
        key=lambda s: ((s.get("metadata") or {}).get("namespace", ""), (s.get("metadata") or {}).get("name")),
    )
    if options.output:
        summaries = [status.summary(s) for s in stacks]
        ctx.out.write(status.document(summaries, single=False, fmt=options.output))
    elif not stacks:
        ctx.err.write("No Stacks found" + (".\n" if where is None else f' in namespace "{where}".\n'))
    else:
        ctx.out.write(status.table(stacks, ctx.now(), all_namespaces=where is None))
    return status.exit_code(stacks)


def run_why(options: Options, ctx: Context) -> ExitCode:
    stack = _stack(options, ctx)
    stat = status_of(stack)
    current_name = (stat.get("currentUpdate") or {}).get("name")
    last_name = (stat.get("lastUpdate") or {}).get("name")
    current, last = _named_update(ctx, current_name), _named_update(ctx, last_name)
    ws_name = str(((current or {}).get("spec") or {}).get("workspaceName") or options.name)
    workspace = ctx.cluster.workspace(ctx.namespace, ws_name)
    said = why.explain(stack, workspace=workspace, last_update=last, current_update=current, now=ctx.now())
    if options.output:
        doc = {"name": options.name, "namespace": ctx.namespace, "ready": said.ready, "why": said.text}
        ctx.out.write(status.document([doc], single=True, fmt=options.output))
    else:
        ctx.out.write(said.text + "\n")
    return ExitCode.OK if said.ready else ExitCode.NOT_READY


def run_logs(options: Options, ctx: Context) -> ExitCode:
    stack = _stack(options, ctx)
    name = chosen_update(stack, options.update)
    if name is None:
        raise PluginError(ExitCode.NOT_FOUND, f"stack {options.name!r} has run no Update yet")
    update = ctx.cluster.update(ctx.namespace, name)
    if update is None:
        recorded = str((status_of(stack).get("lastUpdate") or {}).get("message") or "")
        if recorded and name == (status_of(stack).get("lastUpdate") or {}).get("name"):
            ctx.err.write(f"Update {name} no longer exists; its message as the Stack recorded it:\n")
            ctx.out.write(recorded.rstrip("\n") + "\n")
            return ExitCode.OK
        raise PluginError(ExitCode.NOT_FOUND, f'update "{name}" not found in namespace "{ctx.namespace}"')
    uid = str((update.get("metadata") or {}).get("uid") or "")
    _, pod = workspace_pod(update, str(options.name))
    unavailable = ""
    for previous in (False, True):
        read = ctx.cluster.pod_log(ctx.namespace, pod, PULUMI_CONTAINER, previous=previous)
        if read.text is None:
            unavailable = unavailable or read.unavailable
            continue
        lines = engine_lines(read.text, uid)
        if lines:
            ctx.out.write("".join(line + "\n" for line in lines))
            return ExitCode.OK
        unavailable = unavailable or "it holds no output of this Update"
    message = str(status_of(update).get("message") or "")
    if not message:
        raise PluginError(
            ExitCode.NOT_FOUND,
            f"no engine output of Update {name}: the log of pod {pod} is unavailable ({unavailable}) "
            "and the Update has no message",
        )
    ctx.err.write(f"The log of pod {pod} is unavailable ({unavailable}); the message of Update {name}:\n")
    ctx.out.write(message.rstrip("\n") + "\n")
    return ExitCode.OK


def _request_runner(command: str) -> Runner:
    """``retry``, ``refresh``, ``cancel``: a fresh token in the request's annotation, what to know
    about when it runs, and with ``--wait`` (refresh, cancel) the wait until it was carried out."""
    request = actions.REQUESTS[command]

    def run(options: Options, ctx: Context) -> ExitCode:
        stack = _stack(options, ctx)
        token = actions.retry_value(ctx.now(), actions.annotation(stack, request.annotation))
        patched = ctx.cluster.annotate(ctx.namespace, str(options.name), request.annotation, token)
        ctx.out.write(f"stack.pulumi.com/{options.name} {command} requested ({request.annotation}={token})\n")
        for note in actions.notes(command, stack):
            ctx.err.write(note + "\n")
        if not options.wait:
            return ExitCode.OK
        final, done = ctx.cluster.wait_stack(
            patched, lambda s: actions.done(command, s, token), options.timeout
        )
        if not done:
            observed = status_of(final).get(request.observed) or "unset"
            retrying = actions.refresh_retrying(final, token) if command == "refresh" else ""
            raise PluginError(
                ExitCode.TIMEOUT,
                f"timed out after {options.timeout:g}s waiting for the operator to carry out "
                f"{request.annotation}={token} (status.{request.observed} is {observed})"
                + (f"; the refresh {retrying}" if retrying else ""),
            )
        said = actions.outcome(command, final, token, stack)
        ctx.out.write(said.text + "\n")
        return ExitCode.NOT_READY if said.failed else ExitCode.OK

    return run


def run_approve(options: Options, ctx: Context) -> ExitCode:
    stack = _stack(options, ctx)
    plan = approval.check_approvable(stack, options.digest)
    ctx.out.write(approval.describe(plan, ctx.now()) + "\n")
    if plan.update:
        try:
            preview = ctx.cluster.update(ctx.namespace, plan.update)
        except ApiError as exc:  # e.g. no read access to Updates: the counts must do
            preview = None
            ctx.err.write(
                f"The plan's changes are not shown: reading Update {plan.update}: {exc.status} {exc.reason}\n"
            )
        ctx.out.write("".join(line + "\n" for line in approval.change_lines(preview)))
    annotation = approval.APPROVED_PLAN_ANNOTATION
    if approval.approved_digest(stack) == plan.digest:
        ctx.out.write(f"stack.pulumi.com/{options.name} plan already approved ({annotation}={plan.digest})\n")
        return ExitCode.OK
    ctx.cluster.annotate(ctx.namespace, str(options.name), annotation, plan.digest)
    ctx.out.write(f"stack.pulumi.com/{options.name} plan approved ({annotation}={plan.digest})\n")
    return ExitCode.OK


def operators(cluster: Cluster) -> list[versions.Operator]:
    """The operators the user can see: listed in every namespace, else (403) in the operator's."""
    try:
        found = cluster.deployments(None, versions.OPERATOR_SELECTOR)
    except ApiError as exc:
        if exc.status != 403:
            raise
        found = cluster.deployments(versions.OPERATOR_NAMESPACE, versions.OPERATOR_SELECTOR)
    return versions.operators(found)


def run_version(options: Options, ctx: Context) -> ExitCode:
    """The client's version, and the operators found (connected: the caller handles the
    unreachable cluster, see :func:`print_version`)."""
    found = operators(ctx.cluster)
    print_version(options, ctx.out, found)
    return ExitCode.NOT_FOUND if options.server_required and not found else ExitCode.OK


def print_version(
    options: Options, out: TextIO, found: list[versions.Operator] | None, unknown: str = ""
) -> None:
    """``version``'s output: ``found`` None when the server's version is unknown (``unknown``: why)."""
    client_only = options.client_only
    if options.output:
        doc = versions.document(found, unknown, client_only=client_only)
        out.write(status.document([doc], single=True, fmt=options.output))
    else:
        out.write(versions.text(found, unknown, client_only=client_only))


RUNNERS: Final[dict[str, Runner]] = {
    "status": run_status,
    "why": run_why,
    "logs": run_logs,
    "retry": _request_runner("retry"),
    "refresh": _request_runner("refresh"),
    "cancel": _request_runner("cancel"),
    "approve": run_approve,
    "version": run_version,
}

"""The runner's long operations (preview, up, refresh, destroy): one Automation API call each, its
answer or its failure turned into a result, and the update plan a preview saves or an up applies.

A failed operation is a result with a structured Failure, not an exception; an up, refresh or
destroy that succeeded leaves no pending operation in the state that it made stale (stackstate).

An operation stopped by a stale lock of this pod (a dead process of it left the lock: an update
interrupted by a killed engine, a replaced pod; failures.stale_own_lock) removes the lock and runs
once more, within the same operation, so it ends with one result, that second attempt's; the result
names the lock removed and the pending operations the interrupted update left (``removed_lock``).
Any other lock fails the operation StackLocked, for the operator's retry.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from pko.agent import failures, plans, policypacks
from pko.agent.engineevents import ChangeSet, engine_event_to_json
from pko.agent.journal import agent_state_dir
from pko.agent.operations import EventSink, OperationRequest, operation_type
from pko.agent.pulumicommand import TrackingPulumiCommand
from pko.agent.runnerresults import (
    capped,
    change_counts,
    done_counts,
    error_text,
    log_changes,
    output_values,
    permalink,
    plan_not_found,
    update_summary,
    writes_state,
)
from pko.agent.stackstate import StackState
from pko.api.generated.pko.agent import v1 as pb
from pulumi import automation as auto
from pulumi.automation import errors as auto_errors
from pulumi.automation.events import EngineEvent

if TYPE_CHECKING:
    from pko.agent.pulumirunner import RunnerSettings

log = structlog.get_logger("pko.agent.pulumi")


def _request_packs(request: OperationRequest) -> list[pb.PolicyPack]:
    """The policy packs a preview or an up runs (other operations run none)."""
    return list(request.policy_pack) if isinstance(request, (pb.PreviewRequest, pb.UpRequest)) else []


@dataclass(frozen=True)
class _Run:
    """One operation as the runner runs it, each attempt alike (see :meth:`RunnerOperations._attempt`)."""

    stack: auto.Stack
    operation_id: str
    request: OperationRequest
    common: dict[str, Any]  # the Automation API call's arguments, but ``on_event``
    base: pb.OperationResult  # the result, filled in by the attempts
    started: datetime
    plan: str | None  # the update plan file a preview saves or an up applies
    packs: policypacks.PackArgs
    sink: EventSink


class _Attempt:
    """What one run of an operation's CLI reports, gathered from its engine events as they reach the
    sink (each attempt of an operation starts afresh; the sink journals every event)."""

    def __init__(self, sink: EventSink) -> None:
        self.observations = failures.RunObservations()
        self.changes = ChangeSet()
        self.policies = policypacks.PolicyObservations()
        self._sink = sink

    def on_event(self, event: EngineEvent) -> None:
        data = engine_event_to_json(event)
        self.observations.observe(data)
        self.policies.observe(data)
        self.changes.observe(data)
        self._sink(data)


class RunnerOperations:
    """The operations half of :class:`pko.agent.pulumirunner.PulumiRunner`, which sets these."""

    settings: RunnerSettings
    project_info: pb.ProjectInfo
    _stack: auto.Stack | None
    _confirmed: str | None
    _select_lock: threading.Lock
    _plans: plans.PlanStore
    _state: StackState
    _command: TrackingPulumiCommand

    def _run_sync(
        self, stack: auto.Stack, operation_id: str, request: OperationRequest, sink: EventSink
    ) -> pb.OperationResult:
        kind = operation_type(request)

        def on_output(line: str) -> None:
            log.info("pulumi", operation=operation_id, line=line)

        def on_error(line: str) -> None:
            log.warning("pulumi", operation=operation_id, line=line)

        common: dict[str, Any] = {
            "on_output": on_output,
            "on_error": on_error,
            "color": "never",
            "parallel": request.parallel,
            "message": request.message,
            "target": list(request.target) or None,
        }
        if self.settings.pulumi_log_level > 0:
            common.update(log_verbosity=self.settings.pulumi_log_level, log_to_std_err=True, log_flow=True)
        base = pb.OperationResult(operation_id=operation_id, type=kind, project_info=self.project_info)
        started = datetime.now(UTC)
        log.info("operation started", operation=operation_id, type=kind.name.lower(), stack_name=stack.name)
        plan = self._plan_file(operation_id, request)
        if isinstance(request, pb.UpRequest) and request.plan and plan is None:
            return plan_not_found(base, request.plan, started, self._plans.keep)
        packs = _request_packs(request)
        config_dir = agent_state_dir(self.settings.work_dir) / "policy-config"
        try:
            env = {**os.environ, **stack.workspace.env_vars}
            pack_args = policypacks.pack_args(
                packs, self.settings.work_dir, config_dir, operation_id, env, self.settings.policy_dir
            )
        except ValueError as exc:
            return policypacks.refused(base, str(exc), started)
        run = _Run(stack, operation_id, request, common, base, started, plan, pack_args, sink)
        try:
            result = self._attempt(run)
            if result is None:
                # A stale lock of this pod stopped the first attempt and is removed: the operation runs
                # once more, as the retry the operator would otherwise schedule would, in this result.
                log.warning(
                    "running the operation again after removing a stale lock of this pod",
                    operation=operation_id,
                )
                result = self._attempt(run, last=True)
            assert result is not None
            return result
        finally:
            pack_args.remove()

    def _attempt(self, run: _Run, *, last: bool = False) -> pb.OperationResult | None:
        """Run the operation once: its result, or None when a stale lock of this pod stopped it and was
        removed (recorded in ``removed_lock``), unless this is the ``last`` attempt: the caller then runs
        it once more. Any other lock, one that could not be removed, or a cancel meanwhile, fails
        StackLocked as it is."""
        stack, operation_id, request, base = run.stack, run.operation_id, run.request, run.base
        attempt = _Attempt(run.sink)
        observations, policies = attempt.observations, attempt.policies
        try:
            self._invoke(
                stack, request, {**run.common, "on_event": attempt.on_event}, base, run.plan, run.packs
            )
        except auto_errors.CommandError as exc:
            stdout, stderr = error_text(exc)
            if (
                run.plan is not None
                and isinstance(request, pb.UpRequest)
                and observations.applied_silently(stderr)
            ):
                # Every planned step applied and the engine reported no error: a success whose
                # outputs and summary the Automation API never read (it raised first).
                log.warning(
                    "pulumi up --plan exited with an error it did not report after applying the plan; "
                    "recorded as succeeded",
                    operation=operation_id,
                )
                self._read_back(stack, base, stdout, stderr)
                self._record_outputs(stack, operation_id, run.common, base)
                return self._succeeded(stack, operation_id, request, base, attempt.changes, run.started)
            failure = policypacks.failure(
                stderr,
                observations.error_diagnostics,
                policies,
                _request_packs(request),
                self.settings.work_dir,
                run.packs.paths,
                self.settings.policy_dir,
            ) or self._state.classify(exc, observations, stack)
            if failure.reason == "StackLocked" and not self._command.interrupted:
                removed = self._state.release_stale_lock(stack, failure)
                if removed is not None and not last:
                    base.removed_lock = removed
                    return None
                if removed is not None:
                    failure.message += (
                        "; it was left by a process of this workspace pod that no longer runs, and has been"
                        " removed: the next attempt proceeds"
                    )
            base.stdout, base.stderr = capped(stdout), capped(stderr)
            base.permalink = permalink(stdout)
            return self._failed(run, failure, attempt.changes)
        finally:
            base.policy_violations = policies.violations
        return self._succeeded(stack, operation_id, request, base, attempt.changes, run.started)

    def _failed(self, run: _Run, failure: pb.Failure, changes: ChangeSet) -> pb.OperationResult:
        base = run.base
        base.state = pb.OperationState.FAILED
        self._confirmed = None  # whatever failed, the next selection asks the CLI again
        base.failure = failure
        base.summary = pb.UpdateSummary(
            start_time=run.started, end_time=datetime.now(UTC), result="failed", message=failure.message
        )
        base.changes = changes.changes()
        log_changes(run.operation_id, base.changes)
        base.pending_operations = list(failure.pending_operations)
        self._settle_plan(run.operation_id, run.request, base)
        log.warning(
            "operation failed", operation=run.operation_id, reason=failure.reason, message=failure.message
        )
        return base

    def _succeeded(
        self,
        stack: auto.Stack,
        operation_id: str,
        request: OperationRequest,
        base: pb.OperationResult,
        changes: ChangeSet,
        started: datetime,
    ) -> pb.OperationResult:
        base.state = pb.OperationState.SUCCEEDED
        base.changes = changes.changes()
        log_changes(operation_id, base.changes)
        if base.summary is None:
            base.summary = pb.UpdateSummary(
                start_time=started, end_time=datetime.now(UTC), result="succeeded"
            )
        self._settle_plan(operation_id, request, base)
        if writes_state(request):
            self._state.settle_pending(stack, request, base)
        log.info("operation succeeded", operation=operation_id, type=operation_type(request).name.lower())
        return base

    def _record_outputs(
        self, stack: auto.Stack, operation_id: str, common: dict[str, Any], out: pb.OperationResult
    ) -> None:
        """After an up whose plan the engine held the stack's outputs to (it keeps the old ones when
        an output the preview could not know came out otherwise): plan again, now that every
        resource is known, and apply that plan only if it changes no resource (the engine enforces
        it), so the outputs are recorded in the same operation. Otherwise the state keeps its
        outputs and the next update records them."""
        quiet = {k: v for k, v in common.items() if k not in ("on_event", "message")}
        quiet["message"] = "record the stack outputs of the approved plan"
        follow = self._plans.partial(f"{operation_id}-outputs")
        try:
            preview = stack.preview(**quiet, plan=str(follow))
            changed = {
                str(getattr(op, "value", op)) for op, n in (preview.change_summary or {}).items() if n
            } - {"same"}
            if changed:
                log.warning(
                    "outputs not recorded: the plan moved", operation=operation_id, ops=sorted(changed)
                )
            else:
                stack.up(**quiet, plan=str(follow), suppress_progress=True)
        except auto_errors.CommandError as exc:
            log.warning("outputs not recorded", operation=operation_id, error=error_text(exc)[1][-300:])
        finally:
            follow.unlink(missing_ok=True)
        out.outputs = output_values(stack.outputs())  # recorded now, or the state's as they were

    def _read_back(self, stack: auto.Stack, out: pb.OperationResult, stdout: str, stderr: str) -> None:
        """What ``stack.up`` returns, read from the stack after an up it reported as failed (the
        outputs: :meth:`_record_outputs`)."""
        out.stdout, out.stderr = capped(stdout), capped(stderr)
        out.permalink = permalink(stdout)
        info = stack.info()
        out.summary = update_summary(info)
        if out.summary is not None:  # the history says "failed": the CLI's exit code
            out.summary.result = "succeeded"
            out.summary.message = "applied every planned step; the engine exited 1 without an error"
        out.change_summary = done_counts(info)

    def _plan_file(self, operation_id: str, request: OperationRequest) -> str | None:
        """The update plan file the CLI gets: where a preview saves its plan (``--save-plan``), the
        saved plan an up applies (``--plan``; None when this pod has none)."""
        if isinstance(request, pb.PreviewRequest) and request.save_plan:
            return str(self._plans.partial(operation_id))
        if isinstance(request, pb.UpRequest) and request.plan:
            found = self._plans.find(request.plan)
            return str(found) if found is not None else None
        return None

    def _settle_plan(self, operation_id: str, request: OperationRequest, result: pb.OperationResult) -> None:
        """Keep the plan of a preview that succeeded (no other); delete a plan an up has spent: it
        succeeded (the state moved on), or the program no longer matches it. An up that failed
        otherwise (a lock, a provider error) keeps it, for its retry."""
        succeeded = result.state == pb.OperationState.SUCCEEDED
        if isinstance(request, pb.PreviewRequest) and request.save_plan:
            if not succeeded:
                self._plans.discard(operation_id)
            elif not self._plans.commit(operation_id):
                log.warning("the preview saved no update plan", operation=operation_id)
        elif isinstance(request, pb.UpRequest) and request.plan:
            reason = result.failure.reason if result.failure is not None else ""
            if succeeded or reason == failures.REASON_PLAN_MISMATCH:
                self._plans.remove(request.plan)

    def _invoke(
        self,
        stack: auto.Stack,
        request: OperationRequest,
        common: dict[str, Any],
        out: pb.OperationResult,
        plan: str | None = None,
        packs: policypacks.PackArgs | None = None,
    ) -> None:
        """Run the Automation API call for ``request`` and copy its answer into ``out``; ``plan``: the
        update plan file a preview saves or an up applies; ``packs``: the policy packs it runs."""
        paths, configs = (packs.paths, packs.configs) if packs is not None else ([], [])
        if isinstance(request, pb.PreviewRequest):
            res_p = stack.preview(
                **common,
                expect_no_changes=request.expect_no_changes,
                replace=list(request.replace) or None,
                target_dependents=request.target_dependents,
                policy_packs=paths or None,
                policy_pack_configs=configs or None,
                refresh=request.refresh,
                diff=True,
                plan=plan,
            )
            out.stdout, out.stderr = capped(res_p.stdout), capped(res_p.stderr)
            out.change_summary = change_counts(res_p.change_summary)
            out.permalink = permalink(res_p.stdout)
        elif isinstance(request, pb.UpRequest):
            res_u = stack.up(
                **common,
                expect_no_changes=request.expect_no_changes,
                replace=list(request.replace) or None,
                target_dependents=request.target_dependents,
                policy_packs=paths or None,
                policy_pack_configs=configs or None,
                refresh=request.refresh,
                continue_on_error=request.continue_on_error,
                suppress_progress=True,
                diff=True,
                plan=plan,
            )
            out.stdout, out.stderr = capped(res_u.stdout), capped(res_u.stderr)
            out.summary = update_summary(res_u.summary)
            out.change_summary = done_counts(res_u.summary)
            out.permalink = permalink(res_u.stdout)
            out.outputs = output_values(res_u.outputs)
        elif isinstance(request, pb.RefreshRequest) and request.preview_only:
            # `refresh --preview-only`: reads every resource back, writes nothing; the drift is in the
            # events (see engineevents.ChangeSet) and the would-be counts in the change summary.
            res_pr = stack.preview_refresh(
                **common,
                expect_no_changes=request.expect_no_changes,
                run_program=request.run_program,
                diff=True,
            )
            out.stdout, out.stderr = capped(res_pr.stdout), capped(res_pr.stderr)
            out.change_summary = change_counts(res_pr.change_summary)
            out.permalink = permalink(res_pr.stdout)
        elif isinstance(request, pb.RefreshRequest):
            res_r = stack.refresh(
                **common,
                expect_no_changes=request.expect_no_changes,
                run_program=request.run_program,
            )
            out.stdout, out.stderr = capped(res_r.stdout), capped(res_r.stderr)
            out.summary = update_summary(res_r.summary)
            out.change_summary = done_counts(res_r.summary)
            out.permalink = permalink(res_r.stdout)
        else:
            res_d = stack.destroy(
                **common,
                target_dependents=request.target_dependents,
                refresh=request.refresh,
                continue_on_error=request.continue_on_error,
                remove=request.remove,
                run_program=request.run_program,
            )
            out.stdout, out.stderr = capped(res_d.stdout), capped(res_d.stderr)
            out.summary = update_summary(res_d.summary)
            out.change_summary = done_counts(res_d.summary)
            out.permalink = permalink(res_d.stdout)
            if request.remove:
                with self._select_lock:
                    self._stack = None
                    self._confirmed = None

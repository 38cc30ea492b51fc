"""Everything the agent does with Pulumi, through ``pulumi.automation`` over one LocalWorkspace.

The Automation API is synchronous (it runs the CLI as a subprocess and waits), so every call here
runs in a worker thread and the event loop stays free. Engine events arrive on Automation API
threads; they are converted to the CLI's JSON shape and handed to the caller's sink there.

Invariants:
* at most one long operation (preview/up/refresh/destroy) runs at a time; the operation registry
  guarantees it, this module does not queue;
* every CLI process the Automation API starts goes through ``TrackingPulumiCommand``, so an
  interrupt reaches exactly the Pulumi processes this runner started (never other children of the
  agent) and a cancel that arrives before the operation's process starts still stops it;
* a failed operation is a result with a structured Failure, not an exception;
* an up, refresh or destroy that succeeded leaves no pending operation in the state that it made
  stale (pendingops); its result lists those it cleared and those that remain.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from pko.agent import failures, pendingops, plans, pythondeps, stackconfig, stacksettings
from pko.agent.engineevents import ChangeSet, engine_event_to_json
from pko.agent.errors import redact_url
from pko.agent.operations import EventSink, OperationRequest, operation_type
from pko.api.generated.pko.agent import v1 as pb
from pulumi import automation as auto
from pulumi.automation import CommandResult, OnOutput
from pulumi.automation import errors as auto_errors
from pulumi.automation.events import EngineEvent

log = structlog.get_logger("pko.agent.pulumi")

USER_AGENT = "pulumi-kubernetes-operator-python"
OPERATION_VERBS = frozenset({"up", "preview", "refresh", "destroy"})
# Bounds on captured CLI output kept in a result (the tail is kept).
MAX_CAPTURED_OUTPUT = 256 * 1024


class RunnerError(Exception):
    """A request the runner refuses or a Pulumi call that failed outside an operation."""


class NoStackSelected(RunnerError):
    def __init__(self) -> None:
        super().__init__("no stack is selected")


class StackNotFound(RunnerError):
    """The stack is not in the backend (and was not to be created). The message names both, so
    a destroy that finds no state says where it looked instead of creating an empty stack."""

    def __init__(self, name: str = "", backend: str = "") -> None:
        where = f" in backend {backend}" if backend else ""
        super().__init__(f"stack {name!r} not found{where}" if name else f"stack not found{where}")
        self.name = name
        self.backend = backend


class InvalidArgument(RunnerError):
    pass


class Unsupported(RunnerError):
    """The installed Pulumi CLI cannot do what was asked."""


class SettingsFileFailed(RunnerError):
    """The stack settings file or its snapshot could not be read or restored (stacksettings)."""


class CommandFailed(RunnerError):
    """A non-operation Pulumi command failed; ``failure`` classifies it."""

    def __init__(self, what: str, failure: pb.Failure) -> None:
        super().__init__(f"{what} failed: {failure.message}")
        self.failure = failure


def _tail(text: str, limit: int = MAX_CAPTURED_OUTPUT) -> str:
    return text if len(text) <= limit else text[-limit:]


def _error_text(exc: BaseException) -> tuple[str, str]:
    """(stdout, stderr) of a failed CLI command, when the error carries them."""
    result = getattr(exc, "command_result", None)
    if isinstance(result, CommandResult):
        return result.stdout, result.stderr
    return "", str(exc)


def _truthy(value: str | None) -> bool:
    """How the Pulumi CLI reads a boolean environment variable."""
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _child_environ() -> dict[str, str]:
    """The agent's environment as Pulumi should see it.

    A PyInstaller one-file agent runs with LD_LIBRARY_PATH pointing at its bundled libraries; Pulumi
    and its plugins must get the library path the agent was started with (PyInstaller keeps it in
    LD_LIBRARY_PATH_ORIG), or they would load our OpenSSL instead of their own.
    """
    env = dict(os.environ)
    if getattr(sys, "frozen", False):
        original = env.pop("LD_LIBRARY_PATH_ORIG", None)
        if original is None:
            env.pop("LD_LIBRARY_PATH", None)
        else:
            env["LD_LIBRARY_PATH"] = original
    return env


class TrackingPulumiCommand(auto.PulumiCommand):
    """A PulumiCommand that knows the processes it runs, so they can be interrupted.

    ``run`` behaves like the Automation API's (non-interactive, ``PULUMI_AUTOMATION_API`` set,
    bundled plugins first on PATH) but starts each CLI in its own session, so a signal meant for
    the agent never reaches Pulumi directly: the agent decides when Pulumi sees CTRL-C. A failed
    command raises the Automation API's typed error with the CommandResult attached as
    ``command_result``.
    """

    def __init__(self, root: str | None = None, skip_version_check: bool = False) -> None:
        super().__init__(root=root, skip_version_check=skip_version_check)
        self._lock = threading.Lock()
        self._running: dict[int, tuple[subprocess.Popen[str], bool]] = {}
        self._interrupt = threading.Event()

    def reset_interrupt(self) -> None:
        self._interrupt.clear()

    @property
    def interrupted(self) -> bool:
        """Whether the running operation was asked to stop (CTRL-C) since the last reset."""
        return self._interrupt.is_set()

    def interrupt_operations(self) -> int:
        """Send SIGINT to running operation processes; later ones are refused. Returns how many."""
        self._interrupt.set()
        return self._signal(signal.SIGINT)

    def kill_operations(self) -> int:
        return self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> int:
        with self._lock:
            targets = [p for p, is_op in self._running.values() if is_op and p.poll() is None]
        for proc in targets:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        if targets:
            log.info("signalled pulumi", signal=sig.name, pids=[p.pid for p in targets])
        return len(targets)

    def run(
        self,
        args: list[str],
        cwd: str,
        additional_env: Mapping[str, str],
        on_output: OnOutput | None = None,
        on_error: OnOutput | None = None,
    ) -> CommandResult:
        end = args.index("--") if "--" in args else len(args)
        if "--non-interactive" not in args[:end]:
            args.insert(0, "--non-interactive")
        verb = next((a for a in args if not a.startswith("-")), "")
        is_op = verb in OPERATION_VERBS
        env = {**_child_environ(), **additional_env, "PULUMI_AUTOMATION_API": "true"}
        if os.path.isabs(self.command):
            env["PATH"] = os.pathsep.join([os.path.dirname(self.command), env.get("PATH", "")])
        stdout: list[str] = []
        stderr: list[str] = []

        def pump(stream: Any, callback: OnOutput | None, sink: list[str]) -> None:
            for line in iter(stream.readline, ""):
                line = line.rstrip()
                sink.append(line)
                if callback is not None:
                    callback(line)
            stream.close()

        with self._lock:
            if is_op and self._interrupt.is_set():
                cancelled = CommandResult("", "error: the operation was cancelled before it started", -1)
                err = auto_errors.create_command_error(cancelled)
                err.command_result = cancelled  # type: ignore[attr-defined]
                raise err
            proc = subprocess.Popen(
                [self.command, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,
            )
            self._running[proc.pid] = (proc, is_op)
        try:
            readers = [
                threading.Thread(target=pump, args=(proc.stdout, on_output, stdout), daemon=True),
                threading.Thread(target=pump, args=(proc.stderr, on_error, stderr), daemon=True),
            ]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
            code = proc.wait()
        finally:
            with self._lock:
                self._running.pop(proc.pid, None)
        result = CommandResult(stdout="\n".join(stdout), stderr="\n".join(stderr), code=code)
        if code != 0:
            err = auto_errors.create_command_error(result)
            err.command_result = result  # type: ignore[attr-defined]
            raise err
        return result


@dataclass(frozen=True)
class RunnerSettings:
    """How to open the workspace; mirrors the agent's ``serve`` flags."""

    work_dir: Path
    env_vars: Mapping[str, str] = field(default_factory=dict)
    pulumi_root: Path | None = None  # a directory holding bin/pulumi; None: pulumi from PATH
    pulumi_home: Path | None = None
    pulumi_log_level: int = 0
    backend_url: str | None = None
    secrets_provider: str | None = None  # used when a stack is created
    stack_name: str | None = None  # selected (or created) when the runner opens
    # Where the program's own stack settings files are recorded for SelectStack's reset_config; None:
    # stacksettings.default_snapshot_dir(work_dir), i.e. /share/.agent/stack-settings in a pod.
    settings_snapshot_dir: Path | None = None
    # Where previews save update plans for a later `up --plan`; None: plans.default_plans_dir(work_dir),
    # i.e. /share/.agent/plans in a pod.
    plans_dir: Path | None = None


def _project_info(settings: auto.ProjectSettings) -> pb.ProjectInfo:
    runtime = settings.runtime
    name = runtime if isinstance(runtime, str) else (runtime.name if runtime is not None else "")
    return pb.ProjectInfo(name=settings.name, runtime=name or "")


def _summary(s: auto.StackSummary) -> pb.StackSummary:
    return pb.StackSummary(
        name=s.name,
        last_update=s.last_update.replace(tzinfo=UTC)
        if s.last_update and not s.last_update.tzinfo
        else s.last_update,
        update_in_progress=bool(s.update_in_progress),
        resource_count=s.resource_count,
        url=s.url,
    )


def _update_summary(s: auto.UpdateSummary | None) -> pb.UpdateSummary | None:
    if s is None:
        return None

    def aware(t: datetime | None) -> datetime | None:
        return t.replace(tzinfo=UTC) if t is not None and t.tzinfo is None else t

    return pb.UpdateSummary(
        start_time=aware(s.start_time),
        end_time=aware(s.end_time),
        result=s.result or "",
        message=s.message or "",
    )


def _changes(changes: Mapping[Any, int] | None) -> dict[str, int]:
    """Resource counts by operation ("create", "same", "delete", ...): for a preview what it
    would do, for an update what it did (the operator keeps what a destroy is expected to delete)."""
    return {str(getattr(k, "value", k)): int(v) for k, v in (changes or {}).items()}


def _output_values(outputs: auto.OutputMap) -> dict[str, pb.OutputValue]:
    """Stack outputs as the result carries them (JSON values, secrecy kept)."""
    return {
        k: pb.OutputValue(value=json.dumps(v.value).encode(), secret=bool(v.secret))
        for k, v in outputs.items()
    }


def _done(s: auto.UpdateSummary | None) -> dict[str, int]:
    """What an up, refresh or destroy did, from its summary (empty when the history had none)."""
    return _changes(s.resource_changes if s is not None else None)


def _permalink(stdout: str) -> str | None:
    # The Automation API for Python has no permalink accessor; the CLI prints it as the Go SDK reads it.
    for line in stdout.splitlines():
        for marker in ("View in Browser (Ctrl+O): ", "View Live: ", "Permalink: "):
            if marker in line:
                return line.split(marker, 1)[1].strip() or None
    return None


class PulumiRunner:
    """The agent's one LocalWorkspace and its selected stack; see the module docstring."""

    def __init__(
        self, settings: RunnerSettings, workspace: auto.LocalWorkspace, command: TrackingPulumiCommand
    ):
        self.settings = settings
        self._ws = workspace
        self._command = command
        self._stack: auto.Stack | None = None
        # The stack this process last selected through the CLI with nothing since that could have
        # removed it (a failed operation, a destroy with remove): selecting it again with ``create``
        # needs no CLI run (_select_sync).
        self._confirmed: str | None = None
        self._select_lock = threading.Lock()
        self._snapshots = stacksettings.SnapshotStore(
            settings.settings_snapshot_dir or stacksettings.default_snapshot_dir(Path(workspace.work_dir))
        )
        self._plans = plans.PlanStore(settings.plans_dir or plans.default_plans_dir(Path(workspace.work_dir)))
        project = workspace.project_settings()
        self.project_info = _project_info(project)
        # A pip project's packages are the agent's to install, and its virtualenv active (pythondeps).
        self._python = pythondeps.python_setup(project, Path(workspace.work_dir))
        if self._python is not None:
            active = pythondeps.activation(self._python, self._env_lookup("PATH") or os.defpath)
            workspace.env_vars = {**workspace.env_vars, **active}
        # Locks taken on this host before now belong to dead processes (see failures.stale_own_lock).
        self._started = datetime.now(UTC)

    @classmethod
    async def open(cls, settings: RunnerSettings) -> PulumiRunner:
        """Open the workspace (runs ``pulumi version``) and select the configured stack, if any."""
        runner = await asyncio.to_thread(cls._open_sync, settings)
        if settings.stack_name:
            await runner.select_stack(
                settings.stack_name, create=True, secrets_provider=settings.secrets_provider, summary=False
            )
        return runner

    @classmethod
    def _open_sync(cls, settings: RunnerSettings) -> PulumiRunner:
        env = dict(settings.env_vars)
        if settings.backend_url:
            env["PULUMI_BACKEND_URL"] = settings.backend_url
        env.setdefault("PULUMI_SKIP_UPDATE_CHECK", "true")
        try:
            command = TrackingPulumiCommand(root=str(settings.pulumi_root) if settings.pulumi_root else None)
        except FileNotFoundError:
            where = settings.pulumi_root / "bin" if settings.pulumi_root else Path("$PATH")
            raise RunnerError(f"the pulumi CLI was not found in {where}") from None
        except subprocess.CalledProcessError as exc:
            raise RunnerError(f"`pulumi version` failed with exit code {exc.returncode}") from None
        ws = auto.LocalWorkspace(
            work_dir=str(settings.work_dir),
            pulumi_home=str(settings.pulumi_home) if settings.pulumi_home else None,
            env_vars=env,
            secrets_provider=settings.secrets_provider,
            pulumi_command=command,
        )
        try:
            return cls(settings, ws, command)
        except FileNotFoundError:
            raise RunnerError(f"no Pulumi project file in {settings.work_dir}") from None

    # -- simple calls ---------------------------------------------------------------------------
    @property
    def pulumi_version(self) -> str:
        return str(self._ws.pulumi_version)

    def backend(self) -> str:
        """Where stacks live, safe to print: the backend URL without credentials, or Pulumi Cloud."""
        url = self._env_lookup("PULUMI_BACKEND_URL")
        return redact_url(url) if url else "Pulumi Cloud (the default backend)"

    def _env_lookup(self, name: str) -> str | None:
        value = self._ws.env_vars.get(name)
        return value if value is not None else os.environ.get(name)

    async def who_am_i(self) -> pb.WhoAmIResult:
        try:
            who = await asyncio.to_thread(self._ws.who_am_i)
        except auto_errors.CommandError as exc:
            raise CommandFailed("whoami", self._classify(exc, failures.RunObservations())) from None
        return pb.WhoAmIResult(user=who.user, organizations=list(who.organizations or []), url=who.url or "")

    async def select_stack(
        self,
        name: str,
        *,
        create: bool = False,
        secrets_provider: str | None = None,
        reset_config: bool = False,
        summary: bool = True,
    ) -> pb.StackSummary | None:
        """Select ``name`` (creating it when ``create``). The first selection of a stack records its
        settings file as the program has it (stacksettings); ``reset_config`` first puts that back, so
        the config set afterwards is the whole config, as in a fresh pod. The caller must make sure no
        operation runs then: the engine reads the file while it runs. ``summary``: False answers None
        instead of the stack's summary, without the ``pulumi stack ls`` that costs."""
        if not name:
            raise InvalidArgument("invalid stack name")
        select = functools.partial(self._select_sync, reset_config=reset_config, snapshot=True)
        await asyncio.to_thread(select, name, create, secrets_provider)
        return await self.info() if summary else None

    def _settings_file(self, name: str, *, reset: bool) -> None:
        """Record the stack's settings file the first time, or restore it (``reset``)."""
        try:
            path = stacksettings.settings_path(Path(self._ws.work_dir), name)
            if reset:
                self._snapshots.restore(path, name)
            else:
                self._snapshots.take(path, name)
        except stacksettings.StackSettingsError as exc:
            raise SettingsFileFailed(str(exc)) from None

    def _select_sync(
        self,
        name: str,
        create: bool,
        secrets_provider: str | None,
        *,
        reset_config: bool = False,
        snapshot: bool = False,
    ) -> None:
        """``snapshot``: record (or with ``reset_config`` restore) the settings file first; False for
        the implicit re-selection after an agent restart, which must not record a file that config
        was already set in.

        Selecting, with ``create``, the stack this process already selected through the CLI runs no
        CLI (``pulumi stack select`` costs 0.1 s, twice per config change): the operator selects before
        each up and each re-initialization. Without ``create`` (a destroy or a refresh, which need the
        state that is there) the CLI always looks, so a stack removed behind the agent's back is
        StackNotFound; with ``create`` such a stack makes the operation fail (no stack named ...), which
        forgets the confirmation, and the next selection creates it as before."""
        with self._select_lock:
            if snapshot:
                self._settings_file(name, reset=reset_config)
            if create and self._confirmed == name and self._stack is not None and self._stack.name == name:
                log.info("selected stack", stack_name=name, cached=True)
                return
            self._confirmed = None
            try:
                stack = auto.Stack.select(name, self._ws)
            except auto_errors.StackNotFoundError:
                if not create:
                    raise StackNotFound(name, self.backend()) from None
                self._ws.secrets_provider = secrets_provider or self.settings.secrets_provider
                try:
                    stack = auto.Stack.create(name, self._ws)
                except auto_errors.CommandError as exc:
                    # Raised inside this handler, the outer `except CommandError` would not see it:
                    # without this the caller got a bare INTERNAL "Internal Server Error".
                    observed = failures.RunObservations()
                    raise CommandFailed("create stack", self._classify(exc, observed)) from None
                finally:
                    self._ws.secrets_provider = self.settings.secrets_provider
                log.info("created stack", stack_name=name)
            except auto_errors.CommandError as exc:
                raise CommandFailed("select stack", self._classify(exc, failures.RunObservations())) from None
            self._stack = stack
            self._confirmed = name
            log.info("selected stack", stack_name=name)

    @property
    def selected_stack_name(self) -> str | None:
        return self._stack.name if self._stack is not None else None

    async def require_stack(self) -> auto.Stack:
        """The selected stack; after an agent restart, the workspace's current stack."""
        if self._stack is not None:
            return self._stack
        current = await asyncio.to_thread(self._ws.stack)
        if current is None:
            raise NoStackSelected()
        await asyncio.to_thread(self._select_sync, current.name, False, None)
        assert self._stack is not None
        return self._stack

    async def info(self) -> pb.StackSummary:
        stack = await self.require_stack()
        stacks = await asyncio.to_thread(self._ws.list_stacks)
        for s in stacks:
            if s.name == stack.name:
                return _summary(s)
        raise StackNotFound(stack.name, self.backend())

    async def set_all_config(self, items: list[pb.ConfigItem]) -> None:
        stack = await self.require_stack()
        try:
            plan = stackconfig.plan(self.project_info.name, items, self._env_lookup)
        except stackconfig.ConfigError as exc:
            raise InvalidArgument(str(exc)) from None
        if not plan_values(plan):
            return
        if isinstance(plan, stackconfig.JsonConfig):
            version = self._command.version
            if version is not None and version.to_tuple()[:3] < stackconfig.MIN_JSON_CONFIG_VERSION:
                raise Unsupported("structured config needs Pulumi CLI 3.202.0 or newer")
            call: Callable[[], None] = lambda: stack.set_all_config_json(plan.document)  # noqa: E731
        else:
            call = lambda: stack.set_all_config(plan.values, path=True)  # noqa: E731
        try:
            await asyncio.to_thread(call)
        except auto_errors.CommandError as exc:
            raise CommandFailed("set config", self._classify(exc, failures.RunObservations())) from None

    async def add_environments(self, names: list[str]) -> None:
        stack = await self.require_stack()
        if not names:
            return
        try:
            await asyncio.to_thread(stack.add_environments, *names)
        except auto_errors.CommandError as exc:
            raise CommandFailed("add environments", self._classify(exc, failures.RunObservations())) from None

    async def install(self) -> None:
        """``pulumi install``: the program's dependencies, and its plugins unless the image says plugins
        are never downloaded (PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION, as pko's workspace image
        does): `install` resolves a plugin that names no version against the network even when one is
        installed, so it would fail offline; the operation then finds the installed plugins, and names
        a missing one in the engine's words. A Python project on pip gets its packages from the agent
        (pythondeps: the language host we run would put them where the program never looks)."""

        def on_output(line: str) -> None:
            log.info("pulumi install", line=line)

        no_plugins = _truthy(self._env_lookup("PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION"))
        python = self._python
        try:
            if not (no_plugins and python is not None):
                install = functools.partial(self._ws.install, no_plugins=no_plugins, on_output=on_output)
                await asyncio.to_thread(install, no_dependencies=python is not None)
            if python is not None:
                env = {**os.environ, **self._ws.env_vars}
                project = Path(self._ws.work_dir)
                await asyncio.to_thread(pythondeps.install, python, project, env, on_output)
        except auto_errors.CommandError as exc:
            raise self._install_failed("\n".join(_error_text(exc))) from None
        except pythondeps.RequirementsFailed as exc:
            raise self._install_failed(exc.text) from None

    def _install_failed(self, text: str) -> CommandFailed:
        message = failures.install_message(text, self._language_runtimes())
        return CommandFailed(
            "install", pb.Failure(reason="InstallationFailed", message=message, detail=failures.tail(text))
        )

    def _language_runtimes(self) -> list[str]:
        """The runtimes the image's language hosts serve: ``pulumi-language-<runtime>`` on PATH."""
        found = []
        for folder in (self._env_lookup("PATH") or "").split(os.pathsep):
            with contextlib.suppress(OSError):
                found += [
                    entry.name.removeprefix("pulumi-language-")
                    for entry in os.scandir(folder or ".")
                    if entry.name.startswith("pulumi-language-")
                    and os.access(entry.path, os.X_OK)
                    and not entry.name.endswith("-exec")
                ]
        return found

    # -- operations -----------------------------------------------------------------------------
    def interrupt(self) -> int:
        """CTRL-C for the running operation (and one about to start). Returns processes signalled."""
        return self._command.interrupt_operations()

    def kill(self) -> int:
        return self._command.kill_operations()

    async def run(self, operation_id: str, request: OperationRequest, sink: EventSink) -> pb.OperationResult:
        """Run one operation to its end; failures come back as a result, never as an exception."""
        stack = await self.require_stack()
        self._command.reset_interrupt()
        return await asyncio.to_thread(self._run_sync, stack, operation_id, request, sink)

    def _run_sync(
        self, stack: auto.Stack, operation_id: str, request: OperationRequest, sink: EventSink
    ) -> pb.OperationResult:
        kind = operation_type(request)
        observations = failures.RunObservations()
        changes = ChangeSet()

        def on_event(event: EngineEvent) -> None:
            data = engine_event_to_json(event)
            observations.observe(data)
            changes.observe(data)
            sink(data)

        def on_output(line: str) -> None:
            log.info("pulumi", operation=operation_id, line=line)

        def on_error(line: str) -> None:
            log.warning("pulumi", operation=operation_id, line=line)

        common: dict[str, Any] = {
            "on_event": on_event,
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
            return _plan_not_found(base, request.plan, started, self._plans.keep)
        try:
            self._invoke(stack, request, common, base, plan)
        except auto_errors.CommandError as exc:
            stdout, stderr = _error_text(exc)
            if (
                plan is not None
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
                self._record_outputs(stack, operation_id, common, base)
                return self._succeeded(stack, operation_id, request, base, changes, started)
            base.state = pb.OperationState.FAILED
            self._confirmed = None  # whatever failed, the next selection asks the CLI again
            base.stdout, base.stderr = _tail(stdout), _tail(stderr)
            base.failure = self._classify(exc, observations, stack)
            base.summary = pb.UpdateSummary(
                start_time=started, end_time=datetime.now(UTC), result="failed", message=base.failure.message
            )
            base.permalink = _permalink(stdout)
            base.changes = changes.changes()
            base.pending_operations = list(base.failure.pending_operations)
            self._settle_plan(operation_id, request, base)
            log.warning(
                "operation failed",
                operation=operation_id,
                reason=base.failure.reason,
                message=base.failure.message,
            )
            return base
        return self._succeeded(stack, operation_id, request, base, changes, started)

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
        if base.summary is None:
            base.summary = pb.UpdateSummary(
                start_time=started, end_time=datetime.now(UTC), result="succeeded"
            )
        self._settle_plan(operation_id, request, base)
        if _writes_state(request):
            self._settle_pending(stack, request, base)
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
            log.warning("outputs not recorded", operation=operation_id, error=_error_text(exc)[1][-300:])
        finally:
            follow.unlink(missing_ok=True)
        out.outputs = _output_values(stack.outputs())  # recorded now, or the state's as they were

    def _read_back(self, stack: auto.Stack, out: pb.OperationResult, stdout: str, stderr: str) -> None:
        """What ``stack.up`` returns, read from the stack after an up it reported as failed (the
        outputs: :meth:`_record_outputs`)."""
        out.stdout, out.stderr = _tail(stdout), _tail(stderr)
        out.permalink = _permalink(stdout)
        info = stack.info()
        out.summary = _update_summary(info)
        if out.summary is not None:  # the history says "failed": the CLI's exit code
            out.summary.result = "succeeded"
            out.summary.message = "applied every planned step; the engine exited 1 without an error"
        out.change_summary = _done(info)

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
    ) -> None:
        """Run the Automation API call for ``request`` and copy its answer into ``out``; ``plan``: the
        update plan file a preview saves or an up applies."""
        if isinstance(request, pb.PreviewRequest):
            res_p = stack.preview(
                **common,
                expect_no_changes=request.expect_no_changes,
                replace=list(request.replace) or None,
                target_dependents=request.target_dependents,
                policy_packs=[p.name for p in request.policy_pack] or None,
                refresh=request.refresh,
                diff=True,
                plan=plan,
            )
            out.stdout, out.stderr = _tail(res_p.stdout), _tail(res_p.stderr)
            out.change_summary = _changes(res_p.change_summary)
            out.permalink = _permalink(res_p.stdout)
        elif isinstance(request, pb.UpRequest):
            res_u = stack.up(
                **common,
                expect_no_changes=request.expect_no_changes,
                replace=list(request.replace) or None,
                target_dependents=request.target_dependents,
                policy_packs=[p.name for p in request.policy_pack] or None,
                refresh=request.refresh,
                continue_on_error=request.continue_on_error,
                suppress_progress=True,
                diff=True,
                plan=plan,
            )
            out.stdout, out.stderr = _tail(res_u.stdout), _tail(res_u.stderr)
            out.summary = _update_summary(res_u.summary)
            out.change_summary = _done(res_u.summary)
            out.permalink = _permalink(res_u.stdout)
            out.outputs = _output_values(res_u.outputs)
        elif isinstance(request, pb.RefreshRequest) and request.preview_only:
            # `refresh --preview-only`: reads every resource back, writes nothing; the drift is in the
            # events (see engineevents.ChangeSet) and the would-be counts in the change summary.
            res_pr = stack.preview_refresh(
                **common,
                expect_no_changes=request.expect_no_changes,
                run_program=request.run_program,
                diff=True,
            )
            out.stdout, out.stderr = _tail(res_pr.stdout), _tail(res_pr.stderr)
            out.change_summary = _changes(res_pr.change_summary)
            out.permalink = _permalink(res_pr.stdout)
        elif isinstance(request, pb.RefreshRequest):
            res_r = stack.refresh(
                **common,
                expect_no_changes=request.expect_no_changes,
                run_program=request.run_program,
            )
            out.stdout, out.stderr = _tail(res_r.stdout), _tail(res_r.stderr)
            out.summary = _update_summary(res_r.summary)
            out.change_summary = _done(res_r.summary)
            out.permalink = _permalink(res_r.stdout)
        else:
            res_d = stack.destroy(
                **common,
                target_dependents=request.target_dependents,
                refresh=request.refresh,
                continue_on_error=request.continue_on_error,
                remove=request.remove,
                run_program=request.run_program,
            )
            out.stdout, out.stderr = _tail(res_d.stdout), _tail(res_d.stderr)
            out.summary = _update_summary(res_d.summary)
            out.change_summary = _done(res_d.summary)
            out.permalink = _permalink(res_d.stdout)
            if request.remove:
                with self._select_lock:
                    self._stack = None
                    self._confirmed = None

    def _classify(
        self,
        exc: auto_errors.CommandError,
        observations: failures.RunObservations,
        stack: auto.Stack | None = None,
    ) -> pb.Failure:
        stdout, stderr = _error_text(exc)
        pending: list[pb.PendingOperation] = []
        if stack is not None:
            pending = self._pending_operations(stack)
        failure = failures.classify(
            error_class=type(exc).__name__,
            error_text=f"{stdout}\n{stderr}",  # the CLI writes its error last, on stderr
            observations=observations,
            pending=pending,
        )
        if stack is not None and failure.reason == "StackLocked":
            self._release_stale_lock(stack, failure)
        return failure

    def _release_stale_lock(self, stack: auto.Stack, failure: pb.Failure) -> None:
        """Remove a lock a dead process of this pod left (``pulumi cancel``), so the retry the
        operator schedules for StackLocked runs; the failure still reports the lock and the pending
        operations the interrupted update left, for the user to check those resources."""
        lock = failure.lock
        if lock is None or not failures.stale_own_lock(lock, socket.gethostname(), self._started):
            return
        try:
            stack.cancel()
        except auto_errors.CommandError as exc:
            log.warning("could not remove a stale lock", owner=lock.owner, error=_error_text(exc)[1])
            return
        log.warning(
            "removed a stale lock of this pod", owner=lock.owner, pending=len(failure.pending_operations)
        )
        failure.message += (
            "; it was left by a process of this workspace pod that no longer runs, and has been removed:"
            " the next attempt proceeds"
        )
        if failure.pending_operations:
            failure.message += (
                f" (check the {len(failure.pending_operations)} resource(s) the interrupted update left"
                " pending: " + ", ".join(p.urn for p in failure.pending_operations) + ")"
            )

    def _settle_pending(self, stack: auto.Stack, request: OperationRequest, out: pb.OperationResult) -> None:
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
            log.warning("could not read the state for pending operations", error=_error_text(exc)[1])
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
            log.warning("could not clear stale pending operations", error=_error_text(exc)[1])
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


def _writes_state(request: OperationRequest) -> bool:
    """Whether ``request`` writes the stack's state and leaves it in place: an up, a refresh that is
    not a preview, a destroy that keeps the stack."""
    if isinstance(request, pb.RefreshRequest):
        return not request.preview_only
    if isinstance(request, pb.DestroyRequest):
        return not request.remove
    return isinstance(request, pb.UpRequest)


def _plan_not_found(out: pb.OperationResult, plan: str, started: datetime, kept: int) -> pb.OperationResult:
    """The result of an up whose plan this pod does not hold (no CLI ran)."""
    message = (
        f"no update plan of preview {plan!r} in this workspace pod: plans live in the pod (a replaced "
        f"pod has none), an up that used one deleted it, and only the newest {kept} are kept; preview again"
    )
    out.state = pb.OperationState.FAILED
    out.failure = pb.Failure(reason=failures.REASON_PLAN_NOT_FOUND, message=message)
    out.summary = pb.UpdateSummary(
        start_time=started, end_time=datetime.now(UTC), result="failed", message=message
    )
    log.warning("operation failed", operation=out.operation_id, reason=out.failure.reason, message=message)
    return out


def plan_values(plan: stackconfig.PathConfig | stackconfig.JsonConfig) -> bool:
    """Whether the plan sets anything (an empty set-all is skipped)."""
    if isinstance(plan, stackconfig.PathConfig):
        return bool(plan.values)
    return plan.document != "{}"

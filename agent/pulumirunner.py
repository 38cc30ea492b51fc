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
  stale (pendingops); its result lists those it cleared and those that remain;
* an operation stopped by a stale lock of this pod (failures.stale_own_lock) removes it and runs once
  more in the same operation: one result, naming the lock removed (runneroperations).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import structlog
from pko.agent import failures, plans, pythondeps, stackconfig, stacksettings
from pko.agent.errors import redact_url
from pko.agent.operations import EventSink, OperationRequest
from pko.agent.pulumicommand import OPERATION_VERBS, TrackingPulumiCommand
from pko.agent.runneroperations import RunnerOperations
from pko.agent.runnerresults import MAX_CAPTURED_OUTPUT, error_text, project_info_of, stack_summary
from pko.agent.stackstate import StackState
from pko.api.generated.pko.agent import v1 as pb
from pulumi import automation as auto
from pulumi.automation import errors as auto_errors

__all__ = [
    "MAX_CAPTURED_OUTPUT",
    "OPERATION_VERBS",
    "USER_AGENT",
    "CommandFailed",
    "InvalidArgument",
    "NoStackSelected",
    "PulumiRunner",
    "RunnerError",
    "RunnerSettings",
    "SettingsFileFailed",
    "StackNotFound",
    "TrackingPulumiCommand",
    "Unsupported",
    "plan_values",
]

log = structlog.get_logger("pko.agent.pulumi")

USER_AGENT = "pulumi-kubernetes-operator-python"


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


def _truthy(value: str | None) -> bool:
    """How the Pulumi CLI reads a boolean environment variable."""
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


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
    # Where the workspace pod fetched the policy packs from git of their own (one directory per pack):
    # ``policy`` beside the --workspace path as given, /share/policy in a pod (work_dir is that path
    # resolved, the program's directory in the fetched source). None: beside work_dir.
    policy_dir: Path | None = None


class PulumiRunner(RunnerOperations):
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
        self.project_info = project_info_of(project)
        # A pip project's packages are the agent's to install, and its virtualenv active (pythondeps).
        self._python = pythondeps.python_setup(project, Path(workspace.work_dir))
        if self._python is not None:
            active = pythondeps.activation(self._python, self._env_lookup("PATH") or os.defpath)
            workspace.env_vars = {**workspace.env_vars, **active}
        self._state = StackState(workspace, command, datetime.now(UTC))

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
            raise CommandFailed("whoami", self._state.classify(exc, failures.RunObservations())) from None
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
                    raise CommandFailed("create stack", self._state.classify(exc, observed)) from None
                finally:
                    self._ws.secrets_provider = self.settings.secrets_provider
                log.info("created stack", stack_name=name)
            except auto_errors.CommandError as exc:
                raise CommandFailed(
                    "select stack", self._state.classify(exc, failures.RunObservations())
                ) from None
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
                return stack_summary(s)
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
            raise CommandFailed("set config", self._state.classify(exc, failures.RunObservations())) from None

    async def add_environments(self, names: list[str]) -> None:
        stack = await self.require_stack()
        if not names:
            return
        try:
            await asyncio.to_thread(stack.add_environments, *names)
        except auto_errors.CommandError as exc:
            raise CommandFailed(
                "add environments", self._state.classify(exc, failures.RunObservations())
            ) from None

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
            raise self._install_failed("\n".join(error_text(exc))) from None
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


def plan_values(plan: stackconfig.PathConfig | stackconfig.JsonConfig) -> bool:
    """Whether the plan sets anything (an empty set-all is skipped)."""
    if isinstance(plan, stackconfig.PathConfig):
        return bool(plan.values)
    return plan.document != "{}"

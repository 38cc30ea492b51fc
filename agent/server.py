"""The agent's gRPC service (grpclib) and the ``serve`` lifecycle.

``AutomationService`` translates RPCs to ``PulumiRunner`` calls and ``OperationRegistry``
operations and maps their errors to gRPC codes the way the Go agent does:
FAILED_PRECONDITION "no stack is selected", NOT_FOUND "stack not found", INVALID_ARGUMENT for bad
config, ABORTED for an install failure or a busy agent, UNKNOWN "<what> failed: ..." otherwise.
Long operations never fail with a gRPC error once started: their result carries the Failure.

While an operation runs, calls that would change what it runs against (config, environments,
install, selecting another stack, resetting the stack's settings file) are refused with
FAILED_PRECONDITION.

``serve`` runs until SIGTERM/SIGINT, then: health turns NOT_SERVING, the running operation gets
CTRL-C and up to ``shutdown_grace`` seconds to finish (then SIGKILL), its outcome is journaled,
watchers receive the result, and the server closes. A second signal repeats the CTRL-C (Pulumi
treats a second one as "stop now").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.check import ServiceStatus
from grpclib.health.service import Health
from pko.agent import gocache
from pko.agent import operations as ops
from pko.agent import pulumirunner as pr
from pko.agent.auth import KubeAuthorizer
from pko.agent.h2guard import DEFAULT_IDLE_TIMEOUT, DEFAULT_KEEPALIVE_TIME, GuardedServer
from pko.agent.journal import Journal
from pko.agent.proctime import seconds_since_start
from pko.api.generated.pko.agent import v1 as pb

log = structlog.get_logger("pko.agent.server")


@contextlib.contextmanager
def _grpc_errors(what: str) -> Iterator[None]:
    """Map runner and registry errors to gRPC statuses."""
    try:
        yield
    except GRPCError:
        raise
    except pr.NoStackSelected as exc:
        raise GRPCError(Status.FAILED_PRECONDITION, str(exc)) from None
    except pr.StackNotFound as exc:
        raise GRPCError(Status.NOT_FOUND, str(exc)) from None
    except pr.InvalidArgument as exc:
        raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
    except pr.Unsupported as exc:
        raise GRPCError(Status.FAILED_PRECONDITION, str(exc)) from None
    except pr.CommandFailed as exc:
        code = Status.ABORTED if what == "install" else Status.UNKNOWN
        raise GRPCError(code, f"{what} failed: {exc.failure.message}") from None
    except pr.SettingsFileFailed as exc:
        raise GRPCError(Status.UNKNOWN, f"{what} failed: {exc}") from None
    except ops.OperationNotFound as exc:
        raise GRPCError(Status.NOT_FOUND, str(exc)) from None
    except ops.InvalidOperationId as exc:
        raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
    except ops.OperationConflict as exc:
        raise GRPCError(Status.ALREADY_EXISTS, str(exc)) from None
    except ops.OperationBusy as exc:
        raise GRPCError(Status.ABORTED, str(exc)) from None
    except ops.ShuttingDown as exc:
        raise GRPCError(Status.UNAVAILABLE, str(exc)) from None


class AutomationService(pb.AutomationServiceBase):
    """The RPC surface of api/agent.proto; see the module docstring."""

    def __init__(self, runner: pr.PulumiRunner, registry: ops.OperationRegistry) -> None:
        self._runner = runner
        self._registry = registry

    def _refuse_while_running(self, what: str) -> None:
        running = self._registry.running
        if running is not None:
            raise GRPCError(
                Status.FAILED_PRECONDITION, f"cannot {what} while operation {running.id!r} is in progress"
            )

    async def who_am_i(self, message: pb.WhoAmIRequest) -> pb.WhoAmIResult:
        with _grpc_errors("whoami"):
            return await self._runner.who_am_i()

    async def select_stack(self, message: pb.SelectStackRequest) -> pb.SelectStackResult:
        if message.reset_config:
            # Rewriting the settings file under a running engine would change, or corrupt, what it reads.
            self._refuse_while_running("reset the stack's config")
        elif self._registry.running is not None and message.stack_name != self._runner.selected_stack_name:
            self._refuse_while_running("select another stack")
        with _grpc_errors("select stack"):
            summary = await self._runner.select_stack(
                message.stack_name,
                create=bool(message.create),
                secrets_provider=message.secrets_provider,
                reset_config=bool(message.reset_config),
                summary=not message.skip_summary,
            )
        return pb.SelectStackResult(summary=summary)

    async def info(self, message: pb.InfoRequest) -> pb.InfoResult:
        with _grpc_errors("info"):
            return pb.InfoResult(summary=await self._runner.info())

    async def set_all_config(self, message: pb.SetAllConfigRequest) -> pb.SetAllConfigResult:
        self._refuse_while_running("set config")
        with _grpc_errors("set config"):
            await self._runner.set_all_config(list(message.config))
        return pb.SetAllConfigResult()

    async def add_environments(self, message: pb.AddEnvironmentsRequest) -> pb.AddEnvironmentsResult:
        self._refuse_while_running("add environments")
        with _grpc_errors("add environments"):
            await self._runner.add_environments(list(message.environment))
        return pb.AddEnvironmentsResult()

    async def install(self, message: pb.InstallRequest) -> pb.InstallResult:
        self._refuse_while_running("install")
        with _grpc_errors("install"):
            await self._runner.install()
        return pb.InstallResult()

    async def pulumi_version(self, message: pb.PulumiVersionRequest) -> pb.PulumiVersionResult:
        return pb.PulumiVersionResult(version=self._runner.pulumi_version)

    # -- operations -----------------------------------------------------------------------------
    async def _start_and_watch(self, request: ops.OperationRequest) -> AsyncIterator[pb.OperationEvent]:
        with _grpc_errors("start"):
            op, _ = await self._registry.start(request)
        async for event in self._registry.watch(op.id, 1):
            yield event

    async def preview(self, message: pb.PreviewRequest) -> AsyncIterator[pb.OperationEvent]:
        async for event in self._start_and_watch(message):
            yield event

    async def refresh(self, message: pb.RefreshRequest) -> AsyncIterator[pb.OperationEvent]:
        async for event in self._start_and_watch(message):
            yield event

    async def up(self, message: pb.UpRequest) -> AsyncIterator[pb.OperationEvent]:
        async for event in self._start_and_watch(message):
            yield event

    async def destroy(self, message: pb.DestroyRequest) -> AsyncIterator[pb.OperationEvent]:
        async for event in self._start_and_watch(message):
            yield event

    async def start_operation(self, message: pb.StartOperationRequest) -> pb.OperationStatus:
        request = message.preview or message.up or message.refresh or message.destroy
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "no operation given")
        with _grpc_errors("start"):
            op, attached = await self._registry.start(request)
        return op.status(attached=attached)

    async def watch_operation(self, message: pb.WatchOperationRequest) -> AsyncIterator[pb.OperationEvent]:
        with _grpc_errors("watch"):
            self._registry.get(message.operation_id)
        async for event in self._registry.watch(message.operation_id, message.from_sequence):
            yield event

    async def get_operation(self, message: pb.GetOperationRequest) -> pb.OperationStatus:
        with _grpc_errors("get"):
            return self._registry.get(message.operation_id).status()

    async def cancel_operation(self, message: pb.CancelOperationRequest) -> pb.OperationStatus:
        with _grpc_errors("cancel"):
            return self._registry.cancel(message.operation_id).status()


@dataclass
class ServeOptions:
    """What ``agent serve`` needs beyond the runner settings."""

    runner: pr.RunnerSettings
    host: str = "0.0.0.0"
    port: int = 50051
    journal_dir: Path = Path("/share/.agent/operations")
    shutdown_grace: float = 570.0  # the pod's terminationGracePeriodSeconds is 600
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    keepalive_time: float = DEFAULT_KEEPALIVE_TIME
    skip_install: bool = True
    authorizer: KubeAuthorizer | None = None
    # The agent's /metrics (pko.agent.metricsserver): "0" not served; secure needs the authorizer's
    # apiserver client.
    metrics_address: str = "0"
    metrics_secure: bool = True
    metrics_cert_dir: Path | None = None
    # Set once the server listens: (host, port). Tests and callers read it.
    bound: asyncio.Future[tuple[str, int]] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def serve(
    options: ServeOptions, install_signal_handlers: bool = True, runner: pr.PulumiRunner | None = None
) -> int:
    """Run the agent until ``options.stop`` is set or SIGTERM/SIGINT arrives; returns an exit code.

    ``runner``: the workspace, already opened from ``options.runner`` (the CLI opens it while it
    imports the rest); opened here when None."""
    if runner is None:
        runner = await pr.PulumiRunner.open(options.runner)
    log.info(
        "opened workspace",
        workspace=str(options.runner.work_dir),
        project=runner.project_info.name,
        runtime=runner.project_info.runtime,
        pulumi=runner.pulumi_version,
    )
    if runner.project_info.runtime == "go":
        # Before anything builds: the caches a claim keeps across pods stay bounded (agent/gocache.py).
        await asyncio.to_thread(gocache.bound_go_caches, os.environ)
    if not options.skip_install:
        log.info("installing project dependencies")
        await runner.install()
    registry = ops.OperationRegistry(runner, Journal(options.journal_dir))
    registry.recover()
    service = AutomationService(runner, registry)
    serving = ServiceStatus()
    server = GuardedServer(
        [service, Health({service: [serving]})],
        idle_timeout=options.idle_timeout,
        keepalive_time=options.keepalive_time,
    )
    if options.authorizer is not None:
        options.authorizer.install(server)
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    sock = socket.create_server((options.host, options.port), family=family)
    await server.start(sock=sock)
    host, port = sock.getsockname()[:2]
    if options.bound is not None and not options.bound.done():
        options.bound.set_result((host, port))
    serving.set(True)
    log.info(
        "server listening",
        host=host,
        port=port,
        auth="kube" if options.authorizer else "none",
        startup_seconds=seconds_since_start(),
    )

    metrics = None
    if options.metrics_address not in ("", "0"):
        # Imported only when asked for (the operator asks in every workspace pod unless
        # --workspace-metrics=off).
        from pko.agent.metricsserver import start_metrics_server

        try:
            metrics = start_metrics_server(
                options.metrics_address,
                api=options.authorizer.api if options.authorizer is not None else None,
                secure=options.metrics_secure,
                cert_dir=options.metrics_cert_dir,
            )
        except (OSError, ValueError) as exc:
            # Metrics are the operator's default in every workspace pod: a port a pod template's
            # sidecar holds, or an unreadable certificate, costs the metrics, never the agent.
            error = f"{type(exc).__name__}: {exc}"
            log.error("metrics not served", address=options.metrics_address, error=error)
        else:
            log.info("serving metrics", port=metrics.port if metrics else None, secure=options.metrics_secure)

    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal signals
        signals += 1
        log.info("signal received", signal=sig.name, count=signals)
        if signals == 1:
            options.stop.set()
        else:
            runner.interrupt()

    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        await options.stop.wait()
    finally:
        log.info("shutting down")
        serving.set(False)
        await registry.shutdown(options.shutdown_grace)
        # Give watchers a moment to receive the final result before their streams are closed.
        await asyncio.sleep(0.2)
        server.close()
        await server.wait_closed()
        if metrics is not None:
            await asyncio.to_thread(metrics.stop)
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        log.info("server stopped")
    return 0

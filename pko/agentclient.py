"""The operator's client for a workspace agent (``api/agent.proto``) over grpclib.

One ``AgentClient`` talks to one agent. Every call carries ``authorization: Bearer <token>`` for the
agent's audience ``<ws>.<ns>``, taken from a shared ``TokenSource`` per call, so a refreshed token
is picked up without reconnecting. A token the agent refuses is dropped and minted again once. A
refresh that fails while the cached token is still valid does not fail the call: ``TokenSource``
keeps using that token and retries the TokenRequest with backoff.

Failures surface as ``AgentError`` with the grpclib status name in ``code``, a reason in
``reason`` and ``transient`` telling a controller whether to retry quietly or report. Reasons are
the gRPC code names in Go's spelling (``codes.Code.String()``), which is what the Go operator
writes into conditions:

=====================  ======================  =========  ==========================================
code                   reason                  transient  where it comes from
=====================  ======================  =========  ==========================================
UNAVAILABLE            Unavailable             yes        cannot connect (refused, unreachable,
                                                          connect timeout), connection lost, agent
                                                          shutting down, SAR call failed (network)
DEADLINE_EXCEEDED      DeadlineExceeded        yes        the call's deadline passed
CANCELLED              Canceled                yes        the stream was reset
RESOURCE_EXHAUSTED     ResourceExhausted       no         a message over ``max_message_size``
ABORTED                Aborted                 yes        another operation is running; install failed
INTERNAL               Internal                yes        the agent's SubjectAccessReview call failed
UNAUTHENTICATED        Unauthenticated         no         token refused (wrong audience, TokenReview
                                                          unavailable to the agent: no
                                                          ``system:auth-delegator``)
UNAUTHENTICATED        the TokenError's        if the     no token could be minted for us:
                       (ServiceAccountNotFound,  apiserver ``pko.tokens.TokenError``
                       TokenRequestForbidden,  failed
                       TokenRequestFailed)
PERMISSION_DENIED      PermissionDenied        no         no RBAC ``use`` on ``workspaces/rpc``
NOT_FOUND              NotFound                no         unknown operation id or stack
FAILED_PRECONDITION    FailedPrecondition      no         no stack selected, busy with an operation
INVALID_ARGUMENT       InvalidArgument         no         bad config, invalid operation id
ALREADY_EXISTS         AlreadyExists           no         the id exists with another operation type
UNKNOWN                Unknown                 no         a Pulumi command failed
(others)               Go's name               no
=====================  ======================  =========  ==========================================

Only UNAVAILABLE is retried inside a call (gRPC's rule: the request did not run), with short
exponential backoff (0.1 s doubling, at most 2 s) within ``retry_budget`` seconds; every RPC here
is idempotent by design (operations are attached by id), so a retry after a lost reply is safe too.
``watch_operation`` retries only until the stream opens; once events have flowed, a break raises a
transient ``AgentError`` and the caller resumes from the last sequence it recorded.

A call answered FAILED_PRECONDITION "no stack is selected" after this client selected one (the agent
restarted and lost its in-memory selection) re-selects the stack and is retried once.

Connections: grpclib has no connect timeout, so connecting is bounded by ``connect_timeout``; HTTP/2
keepalive pings find a dead peer (pod deleted, no RST) within about 50 s even on a silent watch.
grpclib enforces no receive size limit at all (gRPC-Go's default is 4 MiB, which upstream raised to
400 MiB after its issue 1160: big engine events and outputs); we enforce the same 400 MiB so a
message that large fails with a clear error instead of an unbounded allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, cast

import betterproto2
import h2.exceptions
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, StreamTerminatedError

from pko.api.generated.google.protobuf import Struct
from pko.api.generated.pko.agent import v1 as pb
from pko.tokens import TokenError, TokenSource

WORKSPACE_PORT: Final = 50051
MAX_MESSAGE_SIZE: Final = 400 * 1024 * 1024

AddressMode = Literal["dns", "pod-ip", "static"]
Obj = dict[str, Any]
T = TypeVar("T")
WATCH_OPERATION: Final = "/pko.agent.v1.AutomationService/WatchOperation"


@dataclass(eq=False, repr=False)
class WatchedEvent(betterproto2.Message):
    """A :class:`pb.OperationEvent` as :meth:`AgentClient.watch_operation` receives it: the same
    fields on the wire, its engine event left encoded until :attr:`engine_event` is read. The
    operator logs engine events only at ``--engine-event-log-level`` (debug by default), and
    betterproto2 decodes a ``Struct`` in Python, about 35 times what the rest of the message costs."""

    sequence: int = betterproto2.field(1, betterproto2.TYPE_UINT64)
    engine_event_data: bytes | None = betterproto2.field(
        2, betterproto2.TYPE_BYTES, optional=True, group="kind"
    )
    result: pb.OperationResult | None = betterproto2.field(  # noqa: RUF009 - as generated (api/generated)
        3, betterproto2.TYPE_MESSAGE, optional=True, group="kind"
    )

    @property
    def engine_event(self) -> Struct | None:
        """The engine event, decoded (again at each read), or None when the event is the result."""
        return None if self.engine_event_data is None else Struct.parse(self.engine_event_data)


# Go's codes.Code.String() names (note "Canceled").
_REASONS: Final[dict[Status, str]] = {
    Status.OK: "OK",
    Status.CANCELLED: "Canceled",
    Status.UNKNOWN: "Unknown",
    Status.INVALID_ARGUMENT: "InvalidArgument",
    Status.DEADLINE_EXCEEDED: "DeadlineExceeded",
    Status.NOT_FOUND: "NotFound",
    Status.ALREADY_EXISTS: "AlreadyExists",
    Status.PERMISSION_DENIED: "PermissionDenied",
    Status.RESOURCE_EXHAUSTED: "ResourceExhausted",
    Status.FAILED_PRECONDITION: "FailedPrecondition",
    Status.ABORTED: "Aborted",
    Status.OUT_OF_RANGE: "OutOfRange",
    Status.UNIMPLEMENTED: "Unimplemented",
    Status.INTERNAL: "Internal",
    Status.UNAVAILABLE: "Unavailable",
    Status.DATA_LOSS: "DataLoss",
    Status.UNAUTHENTICATED: "Unauthenticated",
}
_TRANSIENT: Final = frozenset(
    {Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.CANCELLED, Status.ABORTED, Status.INTERNAL}
)
_NO_STACK = "no stack is selected"
_BACKOFF_START: Final = 0.1
_BACKOFF_MAX: Final = 2.0


# -- addresses -------------------------------------------------------------------------------------
def service_address(ws_name: str, namespace: str) -> str:
    """The agent behind the workspace's headless Service: ``status.address``, as the seed's ADDRESS
    column shows it (the Go operator's fully qualified Service name)."""
    return f"{ws_name}-workspace.{namespace}.svc.cluster.local:{WORKSPACE_PORT}"


def audience(ws_name: str, namespace: str) -> str:
    """The token audience the workspace's agent accepts (``--kube-audience``)."""
    return f"{ws_name}.{namespace}"


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve_address(
    ws_name: str, namespace: str, *, mode: AddressMode, pod: Obj | None = None, static: str | None = None
) -> str | None:
    """Where to reach the agent: the Service DNS name, the pod's IP, or one fixed address.

    ``pod-ip`` serves clusters without DNS for the operator and tests; ``static`` is the Go operator's
    ``WORKSPACE_LOCALHOST`` (a port-forward when the operator runs outside the cluster). None means
    the pod has no IP yet.
    """
    if mode == "dns":
        return service_address(ws_name, namespace)
    if mode == "pod-ip":
        ip = ((pod or {}).get("status") or {}).get("podIP")
        return _host_port(str(ip), WORKSPACE_PORT) if ip else None
    if mode == "static":
        if not static:
            raise ValueError("static address mode needs an address (WORKSPACE_LOCALHOST)")
        return static
    raise ValueError(f"unknown address mode {mode!r}")


def split_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host (port 50051) -> (host, port)."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else WORKSPACE_PORT
    with contextlib.suppress(ValueError):
        ipaddress.IPv6Address(address)
        return address, WORKSPACE_PORT
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, WORKSPACE_PORT
    return host, int(port)


# -- errors ----------------------------------------------------------------------------------------
class AgentError(Exception):
    """A failed call to an agent; see the module docstring for codes, reasons and ``transient``."""

    def __init__(self, code: str, reason: str, message: str, *, transient: bool) -> None:
        super().__init__(f"{reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.transient = transient

    @classmethod
    def from_status(cls, status: Status, message: str | None) -> AgentError:
        return cls(
            status.name,
            _REASONS.get(status, status.name.title().replace("_", "")),
            message or status.name.lower().replace("_", " "),
            transient=status in _TRANSIENT,
        )

    @classmethod
    def unavailable(cls, message: str) -> AgentError:
        return cls.from_status(Status.UNAVAILABLE, message)


def translate(exc: BaseException, address: str) -> AgentError | None:
    """The AgentError for a transport or gRPC exception, or None when it is not one of ours."""
    if isinstance(exc, AgentError):
        return exc
    if isinstance(exc, GRPCError):
        return AgentError.from_status(exc.status, exc.message)
    if isinstance(exc, TimeoutError):
        return AgentError.from_status(Status.DEADLINE_EXCEEDED, f"call to the agent at {address} timed out")
    if isinstance(exc, (OSError, EOFError, StreamTerminatedError, h2.exceptions.H2Error)):
        detail = str(exc) or type(exc).__name__
        return AgentError.unavailable(f"agent at {address}: {detail}")
    if isinstance(exc, TokenError):
        # Our side could not authenticate: the reason names the fix (ServiceAccountNotFound, ...).
        return AgentError(Status.UNAUTHENTICATED.name, exc.reason, exc.message, transient=exc.transient)
    return None


class _LimitedCodec(ProtoCodec):
    """The proto codec with a receive size limit (grpclib has none)."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_size:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"received message larger than max ({len(data)} vs. {self.max_size})",
            )
        return super().decode(data, message_type)


def _generator(stream: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """The generated stubs' streams are async generators typed as iterators; closing one resets the stream."""
    return cast(AsyncGenerator[T, None], stream)


def _channel_config() -> Configuration:
    # Ping every 30 s while a call is open, drop the connection 20 s after an unanswered ping. A watch
    # sends no data after its request, so lift grpclib's limits on pings without data.
    return Configuration(
        _keepalive_time=30.0,
        _keepalive_timeout=20.0,
        _keepalive_permit_without_calls=False,
        _http2_max_pings_without_data=0,
        _http2_min_sent_ping_interval_without_data=30.0,
    )


# -- the client ------------------------------------------------------------------------------------
class AgentClient:
    """Calls to one workspace agent; see the module docstring. Use as ``async with``."""

    def __init__(
        self,
        address: str,
        audience: str,
        tokens: TokenSource,
        *,
        connect_timeout: float = 10.0,
        max_message_size: int = MAX_MESSAGE_SIZE,
        retry_budget: float = 15.0,
        call_timeout: float | None = 300.0,
    ) -> None:
        self.address = address
        self.audience = audience
        self.tokens = tokens
        self.connect_timeout = connect_timeout
        self.max_message_size = max_message_size
        self.retry_budget = retry_budget
        self.call_timeout = call_timeout
        self._host, self._port = split_address(address)
        self._channel: Channel | None = None
        self._selection: pb.SelectStackRequest | None = None

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # -- plumbing ----------------------------------------------------------------------------------
    async def _stub(self) -> tuple[pb.AutomationServiceStub, dict[str, str]]:
        """A connected stub and this call's metadata; raises AgentError."""
        token = await self.tokens.token(self.audience)  # TokenError: translated by the callers
        if self._channel is None:
            self._channel = Channel(
                self._host, self._port, codec=_LimitedCodec(self.max_message_size), config=_channel_config()
            )
        try:
            await asyncio.wait_for(self._channel.__connect__(), self.connect_timeout)
        except TimeoutError:
            raise AgentError.unavailable(
                f"cannot connect to the agent at {self.address} within {self.connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise AgentError.unavailable(f"cannot connect to the agent at {self.address}: {exc}") from None
        return pb.AutomationServiceStub(self._channel), {"authorization": f"Bearer {token}"}

    async def _call(
        self, fn: Callable[[pb.AutomationServiceStub, dict[str, str]], Awaitable[T]], *, reselect: bool = True
    ) -> T:
        """Run one unary call with retries (UNAVAILABLE), token renewal and stack re-selection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_budget
        delay = _BACKOFF_START
        renewed = reselected = False
        while True:
            try:
                stub, metadata = await self._stub()
                return await fn(stub, metadata)
            except Exception as exc:
                err = translate(exc, self.address)
                if err is None:
                    raise
                failure = err
            if failure.reason == _REASONS[Status.UNAUTHENTICATED] and not renewed:
                renewed = True
                self.tokens.invalidate(self.audience)
                continue
            if (
                reselect
                and not reselected
                and self._selection is not None
                and failure.code == Status.FAILED_PRECONDITION.name
                and failure.message == _NO_STACK
            ):
                reselected = True
                await self._reselect(self._selection)
                continue
            if failure.code != Status.UNAVAILABLE.name or loop.time() + delay > deadline:
                raise failure from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _reselect(self, req: pb.SelectStackRequest) -> None:
        await self._call(
            lambda s, m: s.select_stack(req, metadata=m, timeout=self.call_timeout), reselect=False
        )

    # -- RPCs --------------------------------------------------------------------------------------
    async def pulumi_version(self) -> str:
        res = await self._call(lambda s, m: s.pulumi_version(metadata=m, timeout=self.call_timeout))
        return res.version

    async def whoami(self) -> pb.WhoAmIResult:
        return await self._call(lambda s, m: s.who_am_i(metadata=m, timeout=self.call_timeout))

    async def info(self) -> pb.StackSummary:
        res = await self._call(lambda s, m: s.info(metadata=m, timeout=self.call_timeout))
        return res.summary or pb.StackSummary()

    async def select_stack(
        self,
        name: str,
        *,
        create: bool | None = None,
        secrets_provider: str | None = None,
        reset_config: bool = False,
        summary: bool = True,
    ) -> pb.StackSummary | None:
        """Select (or create) a stack; remembered so it is re-selected if the agent restarts.
        ``summary``: False when the caller does not read the stack's summary (None then): the agent
        skips the ``pulumi stack ls`` it costs.

        ``reset_config``: the agent first restores the stack's settings file to the program's own (as
        a fresh workspace pod has it), so the config and environments set next are the whole of them;
        refused (FailedPrecondition) while an operation runs. The remembered selection never resets:
        re-selecting after an agent restart must keep the config set since."""
        req = pb.SelectStackRequest(
            stack_name=name,
            create=create,
            secrets_provider=secrets_provider,
            reset_config=True if reset_config else None,
            skip_summary=None if summary else True,
        )
        res = await self._call(
            lambda s, m: s.select_stack(req, metadata=m, timeout=self.call_timeout), reselect=False
        )
        self._selection = pb.SelectStackRequest(
            stack_name=name, create=create, secrets_provider=secrets_provider, skip_summary=True
        )
        return (res.summary or pb.StackSummary()) if summary else None

    async def set_all_config(self, items: list[pb.ConfigItem]) -> None:
        req = pb.SetAllConfigRequest(config=items)
        await self._call(lambda s, m: s.set_all_config(req, metadata=m, timeout=self.call_timeout))

    async def add_environments(self, envs: list[str]) -> None:
        req = pb.AddEnvironmentsRequest(environment=envs)
        await self._call(lambda s, m: s.add_environments(req, metadata=m, timeout=self.call_timeout))

    async def install(self) -> None:
        """``pulumi install``: no deadline, plugin downloads can take long."""
        await self._call(lambda s, m: s.install(metadata=m))

    async def start_operation(self, req: pb.StartOperationRequest) -> pb.OperationStatus:
        """Start the operation, or attach to the one with the same id (so retrying is safe)."""
        return await self._call(lambda s, m: s.start_operation(req, metadata=m, timeout=self.call_timeout))

    async def get_operation(self, op_id: str) -> pb.OperationStatus:
        req = pb.GetOperationRequest(operation_id=op_id)
        return await self._call(lambda s, m: s.get_operation(req, metadata=m, timeout=self.call_timeout))

    async def cancel_operation(self, op_id: str) -> pb.OperationStatus:
        req = pb.CancelOperationRequest(operation_id=op_id)
        return await self._call(lambda s, m: s.cancel_operation(req, metadata=m, timeout=self.call_timeout))

    async def watch_operation(self, op_id: str, from_sequence: int = 0) -> AsyncIterator[WatchedEvent]:
        """Events with sequence >= ``from_sequence``, live, ending after the result event.

        Opening the stream is retried like a unary call; a stream that breaks (or ends) before the
        result raises a transient AgentError, and the caller resumes from its last sequence + 1.
        """
        req = pb.WatchOperationRequest(operation_id=op_id, from_sequence=from_sequence)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_budget
        delay = _BACKOFF_START
        renewed = False
        while True:
            received = False
            try:
                stub, metadata = await self._stub()
                async with contextlib.aclosing(
                    # The generated stub's call, with the lazy message (the same route and types).
                    _generator(stub._unary_stream(WATCH_OPERATION, req, WatchedEvent, metadata=metadata))
                ) as stream:
                    async for event in stream:
                        received = True
                        yield event
                        if event.result is not None:
                            return
                raise AgentError.unavailable(f"the agent at {self.address} ended the watch before the result")
            except Exception as exc:
                err = translate(exc, self.address)
                if err is None:
                    raise
                failure = err
            if received:
                raise AgentError(failure.code, failure.reason, failure.message, transient=True) from None
            if failure.reason == _REASONS[Status.UNAUTHENTICATED] and not renewed:
                renewed = True
                self.tokens.invalidate(self.audience)
                continue
            if failure.code != Status.UNAVAILABLE.name or loop.time() + delay > deadline:
                raise failure from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

"""Addresses and the gRPC-code mapping: pure functions, no cluster."""

from __future__ import annotations

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from pko.agentclient import (
    WORKSPACE_PORT,
    AgentError,
    audience,
    resolve_address,
    service_address,
    split_address,
    translate,
)
from pko.tokens import TokenError


def test_the_service_address_and_audience_follow_the_go_operator() -> None:
    assert service_address("ws", "ns") == "ws-workspace.ns.svc.cluster.local:50051"
    assert audience("ws", "ns") == "ws.ns"
    assert WORKSPACE_PORT == 50051


def test_each_address_mode() -> None:
    pod = {"status": {"podIP": "10.1.2.3"}}
    assert resolve_address("ws", "ns", mode="dns") == "ws-workspace.ns.svc.cluster.local:50051"
    assert resolve_address("ws", "ns", mode="pod-ip", pod=pod) == "10.1.2.3:50051"
    assert (
        resolve_address("ws", "ns", mode="pod-ip", pod={"status": {"podIP": "fd00::5"}}) == "[fd00::5]:50051"
    )
    assert resolve_address("ws", "ns", mode="pod-ip", pod={"status": {}}) is None
    assert resolve_address("ws", "ns", mode="pod-ip", pod=None) is None
    assert resolve_address("ws", "ns", mode="static", static="localhost:50051") == "localhost:50051"
    with pytest.raises(ValueError, match="WORKSPACE_LOCALHOST"):
        resolve_address("ws", "ns", mode="static")


def test_split_address() -> None:
    assert split_address("ws-workspace.ns:50051") == ("ws-workspace.ns", 50051)
    assert split_address("[fd00::5]:6000") == ("fd00::5", 6000)
    assert split_address("fd00::5") == ("fd00::5", 50051)
    assert split_address("localhost") == ("localhost", 50051)


def test_grpc_codes_become_go_reasons_and_transience() -> None:
    cases = {
        Status.UNAUTHENTICATED: ("Unauthenticated", False),
        Status.PERMISSION_DENIED: ("PermissionDenied", False),
        Status.UNAVAILABLE: ("Unavailable", True),
        Status.DEADLINE_EXCEEDED: ("DeadlineExceeded", True),
        Status.CANCELLED: ("Canceled", True),
        Status.ABORTED: ("Aborted", True),
        Status.INTERNAL: ("Internal", True),
        Status.NOT_FOUND: ("NotFound", False),
        Status.FAILED_PRECONDITION: ("FailedPrecondition", False),
        Status.RESOURCE_EXHAUSTED: ("ResourceExhausted", False),
        Status.UNKNOWN: ("Unknown", False),
    }
    for status, (reason, transient) in cases.items():
        err = translate(GRPCError(status, "m"), "a:1")
        assert err is not None
        assert (err.code, err.reason, err.message, err.transient) == (status.name, reason, "m", transient)


def test_transport_failures_are_unavailable_and_token_failures_name_their_cause() -> None:
    for exc in (ConnectionRefusedError("refused"), StreamTerminatedError("reset"), EOFError()):
        err = translate(exc, "a:1")
        assert err is not None and (err.code, err.reason, err.transient) == (
            "UNAVAILABLE",
            "Unavailable",
            True,
        )
        assert "a:1" in err.message
    timeout = translate(TimeoutError(), "a:1")
    assert timeout is not None and timeout.reason == "DeadlineExceeded" and timeout.transient
    token = translate(TokenError("TokenRequestForbidden", "grant it", transient=False), "a:1")
    assert token is not None
    assert (token.code, token.reason, token.message, token.transient) == (
        "UNAUTHENTICATED",
        "TokenRequestForbidden",
        "grant it",
        False,
    )
    assert translate(ValueError("bug"), "a:1") is None
    assert str(AgentError.unavailable("x")) == "Unavailable: x"

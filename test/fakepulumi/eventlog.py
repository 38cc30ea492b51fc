"""Where engine events go: the ``--event-log`` file or a ``tcp://`` gRPC Events server.

Mirrors startEventLogger in pkg/backend/display/display.go: each event is stamped with a sequence
number (from 0) and a Unix timestamp in seconds, encoded as one compact JSON object (no HTML
escaping) and either appended to the file as a line or sent as ``pulumirpc.EventRequest{event}`` on
the ``/pulumirpc.Events/StreamEvents`` client stream. The stream ends after the ``cancelEvent``.
"""

from __future__ import annotations

import json
import queue
import time
from typing import Any, Protocol

_END = object()


class EventSink(Protocol):
    def send(self, line: str) -> None: ...

    def close(self) -> None: ...


class _NullSink:
    def send(self, line: str) -> None:
        return None

    def close(self) -> None:
        return None


class _FileSink:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")

    def send(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _encode_request(event: str) -> bytes:
    """Hand-encode ``EventRequest{string event = 1}`` so we need grpcio but no generated code."""
    data = event.encode("utf-8")
    length = len(data)
    varint = bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"\x0a" + bytes(varint) + data


class _GrpcSink:
    def __init__(self, address: str) -> None:
        import grpc  # type: ignore[import-untyped]

        self._channel = grpc.insecure_channel(address)
        self._queue: queue.Queue[Any] = queue.Queue()
        call = self._channel.stream_unary(
            "/pulumirpc.Events/StreamEvents",
            request_serializer=_encode_request,
            response_deserializer=lambda data: data,
        )
        self._future = call.future(iter(self._queue.get, _END))

    def send(self, line: str) -> None:
        self._queue.put(line)

    def close(self) -> None:
        self._queue.put(_END)
        try:
            self._future.result(timeout=30)
        except Exception:
            pass
        self._channel.close()


class EventLog:
    """Stamps and writes engine events; ``emit`` takes the event body, e.g. ``{"cancelEvent": {}}``."""

    def __init__(self, target: str | None) -> None:
        self._sequence = 0
        self._sink: EventSink
        if not target:
            self._sink = _NullSink()
        elif target.startswith("tcp://"):
            self._sink = _GrpcSink(target[len("tcp://") :])
        else:
            self._sink = _FileSink(target)
        self.closed = False

    def emit(self, body: dict[str, Any]) -> None:
        if self.closed:
            return
        event = {"sequence": self._sequence, "timestamp": int(time.time()), **body}
        self._sequence += 1
        self._sink.send(json.dumps(event, separators=(",", ":"), ensure_ascii=False))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sink.close()

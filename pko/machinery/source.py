"""Event sources that are not informers (controller-runtime's ``pkg/source``).

An informer is the usual source of a controller's keys; its events reach the queue through a
handler (:mod:`pko.machinery.handler`). A :class:`KeyChannel` is the other kind: keys sent by
code that learned something a reconcile must act on (controller-runtime's ``source.Channel``).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["KeyChannel"]


class KeyChannel:
    """Keys sent from outside the informers, e.g. by a background task that learned something a
    reconcile must act on. The manager connects it to the controller's queue while the controller
    runs (this replica leads); a key sent otherwise is dropped, which is safe because a starting
    controller reconciles every cached object anyway."""

    __slots__ = ("_sink",)

    def __init__(self) -> None:
        self._sink: Callable[[str], None] | None = None

    def send(self, key: str) -> None:
        if self._sink is not None:
            self._sink(key)

    def connect(self, sink: Callable[[str], None]) -> None:
        """Deliver keys to ``sink`` (the controller's ``queue.add``) from now on."""
        self._sink = sink

    def disconnect(self) -> None:
        """Drop keys from now on (the controller stopped)."""
        self._sink = None

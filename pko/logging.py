"""Process-wide log setup: structlog for our code, the stdlib ``logging`` of libraries routed through it.

The manager calls :func:`configure_logging` once at start. ``json`` is for clusters: one object
per line with zap's keys (``level``, ``ts``, ``msg``), which is what log pipelines built for the Go
operator parse; ``console`` is for people. Both merge structlog's contextvars, so the controller
name and object key a worker binds appear on every line logged during a reconcile, including
lines logged by the reconciler itself. Library records (kubernetes_asyncio, aiohttp, ...) get the
same rendering and the same threshold.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import Processor

__all__ = ["configure_logging"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


class _PkoHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the root handler we installed, so reconfiguring replaces it and nothing else."""


def _level(level: str) -> int:
    try:
        return _LEVELS[level.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}") from None


def configure_logging(
    level: str = "info",
    fmt: Literal["json", "console"] = "json",
    *,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog and the stdlib root logger to write ``fmt`` lines at ``level`` and above.

    ``stream`` defaults to stderr. Safe to call again (e.g. tests, or a level change).
    """
    threshold = _level(level)
    if fmt not in ("json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; use 'json' or 'console'")
    out = stream if stream is not None else sys.stderr

    renderer: Processor
    if fmt == "json":
        timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")
        tail: list[Processor] = [
            structlog.processors.format_exc_info,
            structlog.processors.EventRenamer("msg"),
        ]
        renderer = structlog.processors.JSONRenderer()
    else:
        timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
        tail = []
        renderer = structlog.dev.ConsoleRenderer(colors=False)

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        timestamper,
        structlog.processors.StackInfoRenderer(),
    ]
    structlog.configure(
        processors=[*shared, *tail, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        # Loggers created before this call (module-level get_logger()) must see the new config.
        cache_logger_on_first_use=False,
    )

    handler = _PkoHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _PkoHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(threshold)
